"""Lab 01's exercises, registered with :mod:`labkit.workbench.exercises`; solutions in ``solutions/``.

* ``01.guard`` and ``01.scratch`` (fix) run the learner's launcher among two pretend GPUs
  (:mod:`labkit.labs.wrong_device.pretend`): its tensors on one, the other current, and the add-one
  kernel's launch recorded instead of run. The check reads, for every launch, the device that was
  current and the devices of its tensors (all must be the data's), and the current device after the
  call (it must be the caller's again). With two real GPUs, ``01.guard`` also runs the seed's
  regression through ``labkit.check.device_independence``: inputs on each GPU while the other is
  current, bit-identical to the call with the data's GPU current.
* ``01.matrix`` (predict) is judged by the recorded device-confusion matrix
  (``reference/h200x2/wrong_device.json``).
"""

from __future__ import annotations

import torch

from labkit.labs.wrong_device import catch, pretend
from labkit.labs.wrong_device.experiments import OUTCOMES, _add_one_kernel
from labkit.workbench import results, tier
from labkit.workbench.exercises import Wrong, exercise, expect_choices

#: (the tensors' device, the current device): the story's case, and the other way round
CASES = ((1, 0), (0, 1))


def _add_one(x, out, numel, *rest) -> None:
    """What the add-one kernel computes, in place of its launch."""
    out.view(-1)[:numel].copy_(x.reshape(-1)[:numel] + 1)


def _watch(call, data: int, current: int, make_out: bool):
    """Run ``call`` among two pretend GPUs, the data on cuda:``data``, cuda:``current`` current;
    returns (x, the output, the world)."""
    x = pretend.on(torch.arange(6, dtype=torch.float32), data)
    with pretend.pretend_gpus(_add_one_kernel, _add_one, current=current) as world:
        try:
            if make_out:
                out = pretend.on(torch.zeros(6), data)
                call(x, out)
            else:
                out = call(x)
        except Exception as e:
            raise Wrong(
                f"with the data on cuda:{data} and cuda:{current} current, your function raised "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e
    return x, out, world


def _judge_launches(world, data: int, current: int) -> None:
    where = f"with the data on cuda:{data} and cuda:{current} current"
    if not world.launches:
        raise Wrong(f"{where}, the add-one kernel was never launched.")
    for launch in world.launches:
        if launch.current != data:
            raise Wrong(
                f"{where}, the kernel was launched while cuda:{launch.current} was current: Triton "
                f"launches on the current device, not on the tensors'."
            )
        strays = [d for d in launch.devices if d != f"cuda:{data}"]
        if strays:
            raise Wrong(
                f"{where}, the kernel was given tensors on {sorted(set(strays))}: its output is on the wrong GPU."
            )
    if world.current != current:
        raise Wrong(
            f"{where}, the call left cuda:{world.current} current: the caller's device must be current "
            f"again afterwards."
        )


def _regression_on_two_gpus(launch) -> str:
    """The seed's regression test, with two real GPUs: ``labkit.check.device_independence`` (in
    this process: the learner's launcher lives in the notebook); '' elsewhere."""
    if tier.interpreted() or torch.cuda.device_count() < 2:
        return ""
    from labkit.check import device_independence

    r = device_independence(launch, catch.inputs, isolate=False)
    if not r.ok:
        raise Wrong(f"on two GPUs, labkit.check.device_independence says: {r.outcome}: {r.message}")
    return " On two real GPUs, labkit.check.device_independence passes: bit-identical on either GPU's data."


@exercise(
    "01.guard",
    kind="fix",
    question="Make the raw launcher launch on its tensors' device, whatever device is current, and leave "
    "the caller's device current",
    answer="launch",
    hint="Triton launches on torch.cuda.current_device(). For the length of the launch, make the tensors' "
    "device current, and give the caller back its own afterwards (section 1 shows one way).",
)
def judge_guard(launch) -> str:
    if not callable(launch):
        raise Wrong(f"`launch` must be a function (x, out); got {launch!r:.60}.")
    for data, current in CASES:
        x, out, world = _watch(launch, data, current, make_out=True)
        _judge_launches(world, data, current)
        if not torch.equal(pretend.plain(out), pretend.plain(x) + 1):
            raise Wrong("the launches ran where they should, but out != x + 1.")
    return (
        f"every launch ran with its tensors' device current (data on cuda:1 with cuda:0 current, and the other "
        f"way round), and the caller's device was current again after.{_regression_on_two_gpus(launch)}"
    )


@exercise(
    "01.scratch",
    kind="fix",
    question="Make add_one(x) put its output on x's device and launch there, whatever device is current",
    answer="add_one",
    hint='device="cuda" means the current device, not the data\'s. Both the allocation and the launch must '
    "happen on x's device, and the caller's device must be current again afterwards.",
)
def judge_scratch(add_one) -> str:
    if not callable(add_one):
        raise Wrong(f"`add_one` must be a function x -> out; got {add_one!r:.60}.")
    for data, current in CASES:
        x, out, world = _watch(add_one, data, current, make_out=False)
        if not isinstance(out, torch.Tensor) or out.device != torch.device("cuda", data):
            where = out.device if isinstance(out, torch.Tensor) else type(out).__name__
            raise Wrong(f"with the data on cuda:{data} and cuda:{current} current, the output is on {where}.")
        _judge_launches(world, data, current)
        if not torch.equal(pretend.plain(out), pretend.plain(x) + 1):
            raise Wrong("the output and the launch are on the data's device, but out != x + 1.")
    return (
        "the output was made on x's device and the kernel launched there, with either GPU current; the "
        "caller's device was current again after."
    )


#: the recorded matrix 01.matrix is judged by, and the cells it asks about (pattern, peer access, guarded)
MATRIX_MACHINE = "h200x2"
MATRIX_CELLS = {
    "triton launch, peer off": ("triton_launch", False, False),
    "triton launch, peer on": ("triton_launch", True, False),
    "graph wrong device, peer on": ("graph_wrong_device", True, False),
    "triton launch, guarded, peer on": ("triton_launch", True, True),
}


def recorded_cells(records: list[dict]) -> dict[str, str]:
    """The recorded outcome of each of MATRIX_CELLS."""
    found = {}
    for key, (pattern, peer, guarded) in MATRIX_CELLS.items():
        rows = [
            r for r in records if (r.get("pattern"), r.get("peer_access"), r.get("guarded")) == (pattern, peer, guarded)
        ]
        if not rows:
            raise ValueError(f"recorded_cells: records: no cell {pattern}, peer {peer}, guarded {guarded}")
        found[key] = rows[0]["outcome"]
    return found


@exercise(
    "01.matrix",
    kind="predict",
    question="Predict the outcome of four cells of the device-confusion matrix recorded on two H200s",
    answer="prediction",
    hint="With peer access off, cuda:0 cannot map cuda:1's memory at all; with it on, an unguarded launch "
    "runs on cuda:0's stream, unordered with cuda:1's. A graph records the device current at capture.",
)
def judge_matrix(prediction) -> str:
    expect_choices("prediction", prediction, MATRIX_CELLS, OUTCOMES)
    refs = results.load_references("wrong_device")
    if MATRIX_MACHINE not in refs:
        raise Wrong(
            f"the recorded matrix (reference/{MATRIX_MACHINE}/wrong_device.json) is missing from this checkout."
        )
    recorded = recorded_cells(refs[MATRIX_MACHINE].records)
    wrong = [k for k in MATRIX_CELLS if prediction[k] != recorded[k]]
    if wrong:
        raise Wrong(
            f"{len(wrong)} of {len(MATRIX_CELLS)} differ from the matrix recorded on {MATRIX_MACHINE} "
            f"(wrong: {'; '.join(wrong)})."
        )
    return f"all {len(MATRIX_CELLS)} agree with the matrix recorded on {MATRIX_MACHINE}: " + "; ".join(
        f"{k}: {v}" for k, v in recorded.items()
    )
