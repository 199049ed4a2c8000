"""The recording ``tl`` that exercise 02.barrier is judged with, run on lab 02's own signals: it
must read back the semantics and scope each SEM variant is built with, apply the protocol to its
memory, and stop a spin loop that cannot succeed."""

import pytest

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm import signals
from labkit.labs.collectives import atomics_probe


@pytest.mark.parametrize(
    ("sem", "send", "wait"),
    [
        (signals.SEM_ACQ_REL, ("release", "sys"), ("acquire", "sys")),
        (signals.SEM_RELAXED, ("relaxed", "sys"), ("relaxed", "sys")),
        (signals.SEM_GPU_SCOPE, ("release", "gpu"), ("acquire", "gpu")),
    ],
)
def test_the_probe_reads_what_each_signal_variant_is_built_with(sem, send, wait):
    sent = atomics_probe.run_recorded(signals.send, {"slot": 0}, "slot", SEM=sem)
    assert [(op.what, op.old, op.new, op.sem, op.scope) for op in sent.ops] == [("atomic_cas", 0, 1, *send)]
    waited = atomics_probe.run_recorded(signals.wait, {"slot": 1}, "slot", SEM=sem)
    assert [(op.what, op.old, op.new, op.sem, op.scope) for op in waited.ops] == [("atomic_cas", 1, 0, *wait)]
    assert waited.memory == {"slot": 0}


def test_a_wait_that_is_never_signalled_is_a_hang_not_a_freeze():
    with pytest.raises(atomics_probe.Hang, match="never ends"):
        atomics_probe.run_recorded(signals.wait, {"slot": 0}, "slot", SEM=signals.SEM_ACQ_REL)


def test_run_recorded_checks_its_arguments():
    with pytest.raises(TypeError, match="run_recorded: jitted"):
        atomics_probe.run_recorded(len, {"slot": 0}, "slot")
    with pytest.raises(ValueError, match="run_recorded: slots"):
        atomics_probe.run_recorded(signals.send, {"slot": 0}, "other", SEM=0)
