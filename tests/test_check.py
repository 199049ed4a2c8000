"""``labkit.check``: each checker catches its lab's seed bug and two variants, passes the fix, and
flags none of five correct functions; bad input is refused with the checker and argument named.
CPU tier here; the tests marked ``gpu`` / ``multigpu`` run the GPU branches (1 and 2 GPUs)."""

import types

import pytest
import torch

import labkit
from labkit import check
from labkit.kernels.check import devices
from labkit.kernels.check import report as R
from labkit.labs.collectives import catch as c2
from labkit.labs.grouped_gemm import catch as c4
from labkit.labs.stream_races import catch as c3
from labkit.labs.wrong_device import catch as c1
from labkit.labs.wrong_device import pretend
from labkit.workbench import sandbox, tier
from labkit.workbench.errors import UsageError

FNS = "check_fns"  # tests/check_fns.py, importable by a child process (PYTHONPATH below)
ONE_GPU = pytest.mark.skipif(not (tier.TIER == "gpu"), reason="needs a CUDA GPU with compiled kernels")


def fn(name):
    return f"{FNS}:{name}"


@pytest.fixture(autouse=True)
def _tests_importable(monkeypatch):
    from pathlib import Path

    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", here + ":" + __import__("os").environ.get("PYTHONPATH", ""))


def test_labkit_check_is_the_kernels_package_and_lazy():
    assert labkit.check is check and set(check.CHECKERS) == {
        "device_independence",
        "stream_safety",
        "no_host_sync",
        "graph_safe",
        "collective",
    }


# --- watch_launches (lab 01), among two pretend GPUs on the CPU tier -------------------------


def _watch(launch, *args, mode="record"):
    with pretend.pretend_gpus(types.SimpleNamespace(), None, current=0):
        with check.watch_launches(on_mismatch=mode) as w:
            try:
                out = launch(*args)
            except check.WrongDeviceLaunch as e:
                return w, e
    return w, out


def _on1(n=6):
    return pretend.on(torch.randn(n), 1)


@pytest.mark.parametrize("launch", [c1.launch_seed, __import__("check_fns").launch_with_kwargs])
def test_watch_launches_names_kernel_and_argument_of_the_seed(launch):
    x, out = _on1(), pretend.on(torch.zeros(6), 1)
    w, _ = _watch(launch, x, out)
    assert {(f.kernel, f.argument, f.device, f.current) for f in w.findings} == {
        ("_add_one_kernel", "x_ptr", "cuda:1", "cuda:0"),
        ("_add_one_kernel", "out_ptr", "cuda:1", "cuda:0"),
    }
    assert torch.equal(pretend.plain(out), pretend.plain(x) + 1)  # "record": the launch ran
    w, err = _watch(launch, x, pretend.on(torch.zeros(6), 1), mode="raise")
    assert isinstance(err, check.WrongDeviceLaunch) and "x_ptr is on cuda:1 but cuda:0 is current" in str(err)


def test_watch_launches_catches_the_scratch_variant_and_passes_the_fixes():
    w, _ = _watch(c1.scratch_seed, _on1())
    assert [f.argument for f in w.findings] == ["x_ptr"]  # out was made on cuda:0, the current one
    for launch, args in ((c1.launch_fixed, (_on1(), pretend.on(torch.zeros(6), 1))), (c1.scratch_fixed, (_on1(),))):
        w, out = _watch(launch, *args)
        assert w.ok and w.launches == 1, w.findings
    with pytest.raises(UsageError, match="on_mismatch='x'"):
        with check.watch_launches(on_mismatch="x"):
            pass


def test_watch_launches_restores_the_launch_paths():
    from triton.runtime import interpreter, jit

    from labkit.kernels.comm import plan

    before = (jit.JITFunction.run, interpreter.InterpretedFunction.run, plan.KernelLaunch.__call__)
    with check.watch_launches(), check.watch_launches():
        pass
    assert (jit.JITFunction.run, interpreter.InterpretedFunction.run, plan.KernelLaunch.__call__) == before


# --- device_independence (lab 01) ----------------------------------------------------------


def test_device_independence_says_what_it_needs_on_one_line():
    r = check.device_independence(c1.launch_seed, c1.inputs)
    if tier.TIER == "gpu" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 GPUs: the multigpu tests run the check")
    assert r.status == "skipped" and "needs 2 GPUs, found" in r.message and "\n" not in r.summary()
    assert r.raise_for_status() is r  # a skip is not a failure


def test_device_independence_refuses_what_a_child_cannot_import():
    with pytest.raises(UsageError, match=r"device_independence: fn=.*lambda"):
        check.device_independence(lambda x: x, c1.inputs)
    with pytest.raises(UsageError, match=r"device_independence: make_inputs='nope': expected a callable"):
        check.device_independence(c1.launch_fixed, "nope")
    with pytest.raises(UsageError, match=r"make_inputs='no_module_here:f': cannot be imported"):
        check.device_independence(c1.launch_fixed, "no_module_here:f")
    with pytest.raises(UsageError, match="timeout=0"):
        check.device_independence(c1.launch_fixed, c1.inputs, timeout=0)


def test_device_independence_reads_a_crash_and_a_hang_from_the_child():
    """The parent's reading of a child that died or hung (the GPU tests provoke both)."""
    steps = "labkit.check.step: 0 1\nlabkit.check.watch_launches: kernel k: argument x is on cuda:0 but cuda:1\n"
    r = devices._crash_report("f", sandbox.SandboxResult("illegal_memory_access", stdout=steps, seconds=1.0))
    assert r.status == "failed" and r.outcome == "illegal memory access"
    assert r.message.startswith("data on cuda:0, cuda:1 current") and r.details == [
        "kernel k: argument x is on cuda:0 but cuda:1"
    ]
    r = devices._crash_report("f", sandbox.SandboxResult("timeout", stdout=steps, seconds=30.0))
    assert r.outcome == "hang" and "timeout" in r.message
    r = devices._crash_report(
        "f",
        sandbox.SandboxResult(
            "exception", error_type="labkit.workbench.errors.UsageError", message="device_independence: make_inputs bad"
        ),
    )
    assert r.status == "error" and "make_inputs bad" in r.message
    rows = [
        {
            "data": 0,
            "current": 1,
            "outcome": "launches on the current device",
            "diffs": ["output: 3 of 9 differ"],
            "moved": [],
            "findings": [],
        }
    ]
    assert devices._report("f", rows).outcome == "launches on the current device"
    assert devices._report("f", [{"data": 0, "current": 1, "outcome": "independent"}]).ok


def test_the_sandbox_path_of_device_independence_runs_its_child():
    """The child entry point is importable by name and reports a bad input as such (no GPU needed:
    it fails at make_inputs before touching a device)."""
    res = sandbox.run_isolated(devices._child, fn("torch_add"), fn("no_tensor"), timeout=120)
    if torch.cuda.device_count() == 0:
        assert res.ok and res.value == []  # no GPU: no pair to run
    r = devices._crash_report(
        "x", sandbox.run_isolated(devices._child, fn("torch_add"), "check_fns:absent", timeout=120)
    )
    assert r.status == "error" and "absent" in r.message


# --- no_host_sync (lab 04) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "target, inputs, op",
    [
        (c4.experts_seed, c4.moe_inputs, "tolist"),
        (fn("sync_item"), fn("vec"), "item"),
        (fn("sync_bool_mask"), fn("vec"), "x[bool mask]"),
        (fn("sync_nonzero"), fn("vec"), "nonzero"),
        (fn("sync_if"), fn("vec"), "__bool__"),
    ],
)
def test_no_host_sync_catches_host_reads_naming_op_and_line(target, inputs, op):
    r = check.no_host_sync(target, inputs)
    assert r.status == "failed" and r.outcome == "host sync", r
    if not (tier.TIER == "gpu"):
        assert r.details[0].startswith(f"{op} at ") and ("catch.py" in r.details[0] or "check_fns.py" in r.details[0])
        assert "CPU tier" in r.message


@pytest.mark.parametrize("name, inputs", __import__("check_fns").CORRECT + [("labkit_grouped", None)])
def test_no_host_sync_passes_correct_functions(name, inputs):
    r = check.no_host_sync(fn(name), fn(inputs) if inputs else c4.moe_inputs)
    assert r.ok, r


def test_no_host_sync_passes_the_fix_and_flags_a_requested_check():
    assert check.no_host_sync(c4.experts_fixed, c4.moe_inputs).ok
    r = check.no_host_sync(
        lambda x, w, m: __import__("labkit").kernels.grouped_gemm.grouped_mm(x, w, m, check_splits=True), c4.moe_inputs
    )
    assert r.status == "failed", r


# --- graph_safe (lab 04) -------------------------------------------------------------------


def test_graph_safe_catches_the_staging_buffer_and_passes_its_fix():
    r = check.graph_safe(c4.staged_seed, c4.weights_inputs, c4.other_layer)
    assert r.status == "failed" and r.outcome == "replay differs from eager", r
    assert r.details and "output" in r.details[0]
    assert check.graph_safe(c4.staged_fixed, c4.weights_inputs, c4.other_layer).ok


@pytest.mark.parametrize(
    "target, inputs, outcome",
    [
        (c4.experts_seed, c4.moe_inputs, "not capturable"),
        (fn("epoch_on_host"), fn("vec"), "host state"),
        (fn("count_baked"), fn("counts_inputs"), "not capturable"),
    ],
)
def test_graph_safe_catches_host_values_baked_into_a_graph(target, inputs, outcome):
    r = check.graph_safe(target, inputs)
    assert r.status == "failed" and r.outcome == outcome, r


@pytest.mark.parametrize("name, inputs", __import__("check_fns").CORRECT)
def test_graph_safe_passes_correct_functions(name, inputs):
    r = check.graph_safe(fn(name), fn(inputs))
    assert r.ok, r


def test_graph_safe_passes_the_grouped_gemm_and_calls_random_numbers_inconclusive():
    assert check.graph_safe(c4.experts_fixed, c4.moe_inputs).ok
    r = check.graph_safe(fn("random_dropout"), fn("vec"))
    assert r.status == "inconclusive" and r.outcome == "non-deterministic", r
    r = check.graph_safe(fn("torch_add"), fn("vec"), vary=lambda a, k, s: None)
    assert r.status == "inconclusive" and r.outcome == "inputs never changed"


def test_the_emulated_graph_replays_on_the_same_memory_with_values_baked():
    x, k = torch.ones(4), 3
    g = check.EmulatedGraph()
    with g.capture():
        y = x * k + 1
    x.fill_(2.0)
    k = 100  # a Python value: the graph keeps 3
    g.replay()
    assert torch.equal(y, torch.full((4,), 7.0))
    with pytest.raises(RuntimeError, match="host read"):
        with check.EmulatedGraph().capture():
            x.sum().item()


# --- stream_safety (lab 03) ----------------------------------------------------------------


@pytest.mark.parametrize("target", [c3.wgrad_seed, fn("dlpack_output"), fn("numpy_output")])
def test_stream_safety_names_outputs_the_allocator_does_not_own(target):
    r = check.stream_safety(target, c3.inputs if target is c3.wgrad_seed else fn("vec"))
    assert r.status == "failed", r
    if tier.TIER != "gpu":
        assert r.outcome == "record_stream cannot protect" and "not owned by torch's caching allocator" in r.message


@pytest.mark.parametrize("name, inputs", __import__("check_fns").CORRECT)
def test_stream_safety_passes_correct_functions(name, inputs):
    assert check.stream_safety(fn(name), fn(inputs)).ok


def test_stream_safety_passes_the_fix():
    assert check.stream_safety(c3.wgrad_fixed, c3.inputs).ok


# --- bad input, every checker ----------------------------------------------------------------

IN_PROCESS = ["no_host_sync", "graph_safe", "stream_safety"]


@pytest.mark.parametrize("name", IN_PROCESS)
def test_a_function_that_raises_is_an_error_report(name):
    r = check.CHECKERS[name](fn("raises"), fn("vec"))
    assert r.status == "error" and "ValueError: planted failure" in r.message, r
    with pytest.raises(check.CheckFailed, match="planted failure"):
        r.raise_for_status()


@pytest.mark.parametrize("name", IN_PROCESS)
def test_bad_functions_and_inputs_are_refused_naming_the_argument(name):
    checker = check.CHECKERS[name]
    with pytest.raises(UsageError, match=rf"{name}: fn returned str"):
        checker(fn("returns_string"), fn("vec"))
    with pytest.raises(UsageError, match=rf"{name}: make_inputs\('cpu'\) gave no tensor: fn takes no tensor"):
        checker(fn("torch_add"), fn("no_tensor"))
    with pytest.raises(UsageError, match=rf"{name}: make_inputs\('cpu'\) must return \(args, kwargs\)"):
        checker(fn("torch_add"), fn("bad_pair"))
    with pytest.raises(UsageError, match=rf"{name}: fn: expected a callable"):
        checker(3, fn("vec"))


def test_host_state_is_reported_as_such():
    r = check.graph_safe(fn("nondeterministic"), fn("vec"))
    assert r.outcome == "host state" and "two eager calls on identical inputs" in r.message


# --- collective (lab 02): the emulated world on the CPU tier ---------------------------------


def test_collective_catches_the_missing_end_barrier_in_labkit_and_in_plain_torch():
    for seed in (c2.one_shot_seed, c2.peers_seed):
        r = check.collective(seed, 2, c2.inputs)
        assert r.status == "failed" and r.outcome == "wrong elements", r
        assert r.message.startswith("round ") and "against fp64" in r.message


def test_collective_catches_a_wrong_sum_and_passes_the_fixes():
    r = check.collective(fn("wrong_sum"), 2, fn("coll_inputs"), rounds=3)
    assert r.status == "failed" and "elements wrong" in r.message, r
    for fixed in (c2.one_shot_fixed, c2.peers_fixed):
        r = check.collective(fixed, 2, c2.inputs)
        assert r.ok, r


def test_collective_turns_a_hang_into_a_report_within_the_timeout():
    r = check.collective(fn("lonely_barrier"), 2, fn("coll_inputs"), rounds=1, timeout=40)
    assert r.status == "failed" and r.outcome == "hang" and "40 s" in r.message, r


def test_collective_refuses_bad_input(monkeypatch):
    with pytest.raises(UsageError, match="collective: world_size=1: expected an int >= 2"):
        check.collective(c2.one_shot_fixed, 1, c2.inputs)
    with pytest.raises(UsageError, match="collective: reference='max'"):
        check.collective(c2.one_shot_fixed, 2, c2.inputs, reference="max")
    with pytest.raises(UsageError, match="collective: fn=.*lambda"):
        check.collective(lambda buf: buf, 2, c2.inputs)
    monkeypatch.setattr(tier, "TIER", "gpu")
    monkeypatch.setattr(R, "cuda_count", lambda: 2)
    with pytest.raises(UsageError, match="collective: world_size=4: this machine has 2 GPUs"):
        check.collective(c2.one_shot_fixed, 4, c2.inputs)


def test_collective_reports_an_exception_in_fn():
    r = check.collective(fn("raises"), 2, fn("coll_inputs"), rounds=1)
    assert r.status == "failed" and r.outcome == "exception" and "planted failure" in r.message, r


# --- the GPU tier ----------------------------------------------------------------------------


@pytest.mark.multigpu
@pytest.mark.parametrize("seed", [c1.launch_seed, c1.scratch_seed, c1.stream_seed, fn("launch_with_kwargs")])
def test_device_independence_catches_the_seed_and_its_variants_on_two_gpus(seed):
    inputs = c1.inputs if seed in (c1.launch_seed, fn("launch_with_kwargs")) else c1.x_inputs
    r = check.device_independence(seed, inputs)
    assert r.status == "failed" and r.outcome in (
        "launches on the current device",
        "illegal memory access",
        "exception",
        "CUDA error",
    ), r


@pytest.mark.multigpu
@pytest.mark.parametrize(
    "target, inputs",
    [(c1.launch_fixed, c1.inputs), (c1.scratch_fixed, c1.x_inputs), (c1.stream_fixed, c1.x_inputs)]
    + [(fn(n), fn(i)) for n, i in __import__("check_fns").CORRECT],
)
def test_device_independence_passes_fixes_and_correct_functions_on_two_gpus(target, inputs):
    r = check.device_independence(target, inputs)
    assert r.ok, r
    assert check.device_independence(target, inputs, isolate=False).ok


@pytest.mark.multigpu
def test_device_independence_on_two_gpus_bad_functions():
    assert check.device_independence(fn("raises"), fn("vec")).status == "error"
    r = check.device_independence(fn("sleeps"), fn("vec"), timeout=20)
    assert r.outcome == "hang"
    r = check.device_independence(fn("random_dropout"), fn("vec"))
    assert r.status == "inconclusive" and r.outcome == "non-deterministic"


@pytest.mark.gpu
def test_stream_safety_catches_the_race_on_a_gpu():
    r = check.stream_safety(c3.wgrad_seed, c3.inputs)
    assert r.status == "failed" and any("not owned" in d for d in [r.message] + r.details), r
    assert check.stream_safety(c3.wgrad_fixed, c3.inputs).ok


@pytest.mark.gpu
def test_no_host_sync_and_graph_safe_use_sync_debug_and_a_cuda_graph():
    r = check.no_host_sync(c4.experts_seed, c4.moe_inputs)
    assert r.status == "failed" and "catch.py" in r.message, r
    assert check.no_host_sync(c4.experts_fixed, c4.moe_inputs).ok
    assert check.graph_safe(c4.experts_fixed, c4.moe_inputs).ok
    assert check.graph_safe(c4.experts_seed, c4.moe_inputs).outcome == "not capturable"
    assert check.graph_safe(c4.staged_seed, c4.weights_inputs, c4.other_layer).status == "failed"
    assert check.graph_safe(c4.staged_fixed, c4.weights_inputs, c4.other_layer).ok


@pytest.mark.multigpu
def test_collective_on_two_gpus_with_its_graph_round():
    r = check.collective(c2.one_shot_fixed, 2, c2.inputs)
    assert r.ok and "captured graph replayed right" in r.message, r
    r = check.collective(fn("wrong_sum"), 2, fn("coll_inputs"), rounds=3)
    assert r.status == "failed"
