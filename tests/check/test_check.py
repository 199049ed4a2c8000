"""``labkit.check``: each checker catches its lab's seed bug and two variants, passes the fix, and
flags none of five correct functions; bad input is refused with the checker and argument named.
CPU tier here; the tests marked ``gpu`` / ``multigpu`` run the GPU branches (1 and 2 GPUs)."""

import types

import pytest
import torch

import labkit
from labkit import check
from labkit.check import devices
from labkit.check import report as R
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

    here = str(Path(__file__).resolve().parents[1])
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


#: PretendTensor is a CPU tensor that claims a CUDA device: only the Triton interpreter runs a
#: kernel on it; the compiled launcher refuses its CPU pointer. The GPU tier runs the twins below
#: on real tensors on cuda:1.
PRETEND = pytest.mark.skipif(
    not tier.interpreted(),
    reason="pretend GPUs run kernels only under the Triton interpreter; the GPU twins use real cuda:1 tensors",
)


@PRETEND
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


@PRETEND
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
    r = check.graph_safe(fn("torch_add"), fn("vec"), vary=__import__("check_fns").keep_inputs)
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


def test_replay_with_fresh_inputs_checks_every_replay_against_a_reference():
    """The loop graph_safe, collective and the collectives' graph tests share, on the tier's graph
    (a CUDA graph on the GPU tier, the emulated one on the CPU tier): fresh inputs written in place
    each replay, compared with a float64 reference; a Python value baked in at capture shows on
    every replay after it changes; a host read during the capture is a CaptureFailed (the emulated
    graph names the read), checked in a child process so that this one keeps a working CUDA random
    generator for the tests after it."""
    on_gpu = tier.TIER == "gpu" and torch.cuda.is_available()
    dev = "cuda" if on_gpu else "cpu"
    x, out, scale = torch.randn(64, device=dev), torch.empty(64, device=dev), {"k": 3.0}

    def refill(step):
        x.copy_(torch.randn(64, device=dev))
        return x.double() * scale["k"] + 1

    def close(step, y, want):
        return None if torch.allclose(y.double(), want, rtol=1e-6, atol=1e-6) else f"replay {step} differs"

    ran = check.replay_with_fresh_inputs(lambda: torch.add(x * scale["k"], 1, out=out), refill, close, replays=3)
    assert ran.ok and ran.replays == 3 and ran.outputs is out
    assert ran.kind == ("CUDA graph" if on_gpu else "emulated graph")

    def refill_and_rescale(step):
        scale["k"] = 3.0 + step  # the graph keeps 3.0: replays 1 and 2 are wrong
        return refill(step)

    ran = check.replay_with_fresh_inputs(
        lambda: torch.add(x * scale["k"], 1, out=out), refill_and_rescale, close, replays=3
    )
    assert [step for step, _ in ran.wrong] == [1, 2] and ran.wrong[0][1] == "replay 1 differs"
    scale["k"] = 3.0
    ran = check.replay_with_fresh_inputs(
        lambda: torch.add(x * scale["k"], 1, out=out), refill_and_rescale, close, replays=3, stop_at_first=True
    )
    assert [step for step, _ in ran.wrong] == [1] and ran.replays == 2
    # in a child: a failed CUDA capture can leave this process's CUDA random generator unusable
    res = sandbox.run_isolated(fn("capture_with_a_host_read"), timeout=300)
    assert res.ok and res.value["raised"] == "CaptureFailed", res.summary()
    if not on_gpu:
        assert res.value["host_reads"] and "host read" in res.value["cause"], res.value
    for kwargs, name in (
        ({"replays": 0}, "replays"),
        ({"warmup": -1}, "warmup"),
        ({"before_capture": 3}, "before_capture"),
    ):
        with pytest.raises(ValueError, match=f"replay_with_fresh_inputs: {name}"):
            check.replay_with_fresh_inputs(lambda: x, refill, close, **kwargs)
    with pytest.raises(ValueError, match="replay_with_fresh_inputs: check"):
        check.replay_with_fresh_inputs(lambda: x, refill, None)


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
    device = r"'(cpu|cuda:\d+)'"  # the device the checker builds on: the CPU tier's, or the current GPU
    with pytest.raises(UsageError, match=rf"{name}: make_inputs\({device}\) gave no tensor: fn takes no tensor"):
        checker(fn("torch_add"), fn("no_tensor"))
    with pytest.raises(UsageError, match=rf"{name}: make_inputs\({device}\) must return \(args, kwargs\)"):
        checker(fn("torch_add"), fn("bad_pair"))
    with pytest.raises(UsageError, match=rf"{name}: fn: expected a callable"):
        checker(3, fn("vec"))


def test_host_state_is_reported_as_such():
    r = check.graph_safe(fn("nondeterministic"), fn("vec"))
    assert r.outcome == "host state" and "two eager calls on identical inputs" in r.message


# --- graph_safe on a GPU: the capture in a child process ---------------------------------------


def _child_ok(monkeypatch, value=None):
    """The GPU tier's dispatch on any machine: _on_gpu says yes, run_isolated records its call."""
    from labkit.check import graphs

    calls = []

    def run_isolated(target, *args, timeout):
        calls.append((target, args, timeout))
        return value or sandbox.SandboxResult("ok", value=R.Report("graph_safe", "t", "passed", "graph-safe", "m"))

    monkeypatch.setattr(graphs, "_on_gpu", lambda: True)
    monkeypatch.setattr(sandbox, "run_isolated", run_isolated)
    return graphs, calls


def test_graph_safe_on_a_gpu_captures_in_a_child_by_name(monkeypatch):
    graphs, calls = _child_ok(monkeypatch)
    assert check.graph_safe(fn("torch_add"), fn("vec"), timeout=42).ok
    assert check.graph_safe(c4.staged_seed, c4.weights_inputs, c4.other_layer, replays=3).ok
    (t1, a1, s1), (t2, a2, _) = calls
    assert t1 is graphs._child and t2 is graphs._child and s1 == 42
    assert a1[:4] == (fn("torch_add"), fn("vec"), None, fn("torch_add"))
    catch = "labkit.labs.grouped_gemm.catch"
    assert a2[:3] == (f"{catch}:staged_seed", f"{catch}:weights_inputs", f"{catch}:other_layer") and a2[4] == 3


def test_graph_safe_on_a_gpu_says_what_a_child_cannot_import(monkeypatch):
    import functools

    _, calls = _child_ok(monkeypatch)
    r = check.graph_safe(fn("torch_add"), fn("vec"), vary=lambda a, k, s: None)
    assert r.status == "skipped" and r.outcome == "not importable" and r.message.startswith("vary cannot"), r
    assert "isolate=False" in r.message
    r = check.graph_safe(lambda x: x + 1, functools.partial(c4.weights_inputs))
    assert r.status == "skipped" and r.message.startswith("fn and make_inputs cannot"), r
    assert calls == []  # nothing ran
    with pytest.raises(UsageError, match="graph_safe: isolate='yes': expected a bool"):
        check.graph_safe(fn("torch_add"), fn("vec"), isolate="yes")


def test_graph_safe_on_a_gpu_reads_what_its_child_left(monkeypatch):
    bad = sandbox.SandboxResult(
        "exception", error_type="labkit.workbench.errors.UsageError", message="graph_safe: make_inputs bad"
    )
    _child_ok(monkeypatch, bad)
    with pytest.raises(UsageError, match="graph_safe: make_inputs bad"):
        check.graph_safe(fn("torch_add"), fn("vec"))
    _child_ok(monkeypatch, sandbox.SandboxResult("timeout", seconds=9.0))
    r = check.graph_safe(fn("torch_add"), fn("vec"), timeout=9)
    assert r.status == "error" and r.outcome == "hang" and "9 s" in r.message, r
    _child_ok(monkeypatch, sandbox.SandboxResult("signal", signal="SIGSEGV", seconds=1.0))
    r = check.graph_safe(fn("torch_add"), fn("vec"))
    assert r.status == "error" and r.outcome == "child process ended" and "SIGSEGV" in r.message, r


def test_graph_safe_on_the_cpu_tier_runs_here_and_its_child_entry_runs_by_name(monkeypatch):
    from labkit.check import graphs

    if tier.TIER == "gpu":
        pytest.skip("the CPU tier's dispatch")
    with monkeypatch.context() as m:
        m.setattr(sandbox, "run_isolated", None)  # the emulated graph never needs a child
        r = check.graph_safe(fn("torch_add"), fn("vec"), vary=lambda a, k, s: None)
    assert r.outcome == "inputs never changed", r
    res = sandbox.run_isolated(
        graphs._child, fn("count_baked"), fn("counts_inputs"), None, "t", 2, 1e-5, 1e-6, None, timeout=120
    )
    assert res.ok and isinstance(res.value, R.Report) and res.value.outcome == "not capturable", res.summary()


@pytest.mark.gpu
def test_a_failed_capture_leaves_this_process_able_to_draw_random_numbers():
    for target, inputs in ((fn("count_baked"), fn("counts_inputs")), (c4.experts_seed, c4.moe_inputs)):
        r = check.graph_safe(target, inputs)
        assert r.status == "failed" and r.outcome == "not capturable", r
    torch.randn(16, device="cuda").sum().item()  # raised "Offset increment outside graph capture" when captured here
    assert not torch.cuda.is_current_stream_capturing()
    assert check.graph_safe(fn("torch_add"), fn("vec")).ok


@pytest.mark.gpu
def test_a_failed_capture_in_process_ends_the_capture_and_restores_the_stream():
    """isolate=False, in a child of its own: what the capture in this process leaves behind. The
    capture is ended and the caller's stream restored; torch's CUDA random generator may still be
    unusable afterwards (on 2x H200, torch 2.11: "Offset increment outside graph capture
    encountered unexpectedly" on the next randn), which is why the default runs in a child."""
    res = sandbox.run_isolated(fn("capture_here_then_draw"), fn("count_baked"), fn("counts_inputs"), timeout=300)
    assert res.ok, res.summary()
    after = dict(res.value)
    randn = after.pop("randn")
    assert after == {"outcome": "not capturable", "capturing": False, "default_stream": True}
    assert randn == "ok" or randn.startswith("Offset increment outside graph capture"), randn


# --- collective (lab 02): the emulated world on the CPU tier ---------------------------------


#: a 2-rank world: the emulated one on the CPU tier, two GPUs on the GPU tier
TWO_RANKS = pytest.mark.skipif(
    tier.TIER == "gpu" and R.cuda_count() < 2, reason="a 2-rank collective on the GPU tier needs 2 GPUs"
)


@TWO_RANKS
def test_collective_catches_the_missing_end_barrier_in_labkit_and_in_plain_torch():
    """The held rounds force the interleaving (held_reader's argument): each held rank reads its
    peer's next input, every run, whatever the late rounds happened to show. On GPUs the held
    rounds run in an emulated world beside the GPU world, and the lines say so."""
    where = " in the emulated world beside the GPUs)" if tier.TIER == "gpu" else ")"
    for seed in (c2.one_shot_seed, c2.peers_seed):
        r = check.collective(seed, 2, c2.inputs, rounds=1)
        assert r.status == "failed" and r.outcome == "wrong elements", r
        for k in (0, 1):
            (line,) = [d for d in r.details if d.startswith(f"held round (rank {k}'s") and f": rank {k}: " in d]
            assert "4096 of 4096 elements wrong" in line and "against fp64" in line, line
            assert f"next inputs{where}: rank" in line, line


def test_held_rounds_emulated_alone_catch_the_seed_and_pass_the_fix():
    """What a GPU host runs beside its GPU world (any host can run it): the seed's held ranks read
    their peers' next inputs, the fix's wait out the hold; a world that raises comes back as a
    reason, not values."""
    from labkit.check.collective import held_rounds_emulated

    specs = (R.importable("collective", "fn", c2.one_shot_seed), R.importable("collective", "make_inputs", c2.inputs))
    values, failed = held_rounds_emulated(specs, 2, "all_reduce", 0.3, 120)
    assert failed is None and sorted(v["rank"] for v in values) == [0, 1]
    wrong = {(v["rank"], h["held_rank"]): h["wrong"] for v in values for h in v["held"]}
    assert wrong[(0, 0)] == 4096 and wrong[(1, 1)] == 4096, wrong
    specs = (R.importable("collective", "fn", c2.one_shot_fixed), specs[1])
    values, failed = held_rounds_emulated(specs, 2, "all_reduce", 0.3, 120)
    assert failed is None and all(h["wrong"] == 0 for v in values for h in v["held"]), values
    assert all(h["seen"]["reached"] for v in values for h in v["held"] if h["seen"]), values
    values, failed = held_rounds_emulated((fn("raises"), fn("coll_inputs")), 2, "all_reduce", 0.3, 120)
    assert values == [] and "exception" in failed, failed


@pytest.mark.skipif(tier.TIER == "gpu", reason="plays a GPU host on the CPU tier")
def test_collective_on_gpus_says_when_the_held_rounds_could_not_run(monkeypatch):
    """A GPU host whose emulated world fails (fn needs a GPU, say): the GPU rounds' pass carries
    outcome "correct, held rounds not run" and the reason, never a plain "correct". The GPU host
    is played here: tier and GPU count patched, the emulated world's answer planted."""
    import importlib

    K = importlib.import_module("labkit.check.collective")  # the package's name is the function
    monkeypatch.setattr(tier, "TIER", "gpu")
    monkeypatch.setattr(R, "cuda_count", lambda: 2)
    monkeypatch.setattr(K, "held_rounds_emulated", lambda *a: ([], "rank 0 exception: planted (0.1 s)"))
    r = check.collective(c2.one_shot_fixed, 2, c2.inputs, rounds=1, hold_s=0.3)
    assert r.ok and r.outcome == "correct, held rounds not run", r
    assert "held rounds not run: the emulated world beside the GPUs failed: rank 0 exception: planted" in r.message


@TWO_RANKS
def test_collective_held_rounds_say_what_they_saw():
    """A fix waits out every hold and stays right; a collective whose peer reads the hold cannot
    see (the process group's all-reduce reads no peer buffer) is told they proved nothing;
    hold_s=0 runs none; a bad hold_s is refused."""
    where = " (an emulated world beside the GPUs)" if tier.TIER == "gpu" else ""
    r = check.collective(c2.peers_fixed, 2, c2.inputs, rounds=1, hold_s=0.3)
    assert r.ok and f"held rounds{where}: each rank's peer reads held in turn" in r.message, r
    assert "no peer returned while a reader was held" in r.message, r
    r = check.collective(fn("via_process_group"), 2, fn("coll_inputs"), rounds=1, hold_s=0.3)
    assert r.ok and f"held rounds{where}: 2 of 2 held ranks read no peer buffer the check could hold" in r.message, r
    r = check.collective(c2.one_shot_seed, 2, c2.inputs, rounds=1, hold_s=0, late_ms=0)
    assert all(not d.startswith("held round") for d in r.details), r
    with pytest.raises(UsageError, match="collective: hold_s"):
        check.collective(c2.one_shot_fixed, 2, c2.inputs, hold_s=-1)


def test_held_reader_releases_on_the_peers_files_or_the_timeout(tmp_path):
    """held_reader in one process: a read of a peer's buffer (a torch op, an interpreted Triton
    load) waits for the peers' files (released at once when they exist, after hold_s when they do
    not); own reads and masked-off lanes never wait."""
    import types

    from labkit.check import held_reader as H

    mine, peer = torch.zeros(8), torch.ones(8)
    buf = types.SimpleNamespace(emulated=True, rank=0, world_size=2, peers=[mine, peer])
    with H.hold_peer_reads(buf, str(tmp_path), "a", 0.2) as seen:
        (mine + 1).sum()
    assert not seen.reached
    with H.hold_peer_reads(buf, str(tmp_path), "b", 0.2) as seen:
        (peer + 1).sum()
    assert seen.reached and seen.released_by == "timeout" and seen.waited_s >= 0.2, seen.as_dict()
    H.say_next_input_written(str(tmp_path), "c", 1)
    with H.hold_peer_reads(buf, str(tmp_path), "c", 30.0) as seen:
        peer.float().sum()
    assert seen.released_by == "peers wrote their next input" and seen.waited_s < 5, seen.as_dict()
    if tier.interpreted():  # an interpreted Triton load of the peer waits; a masked-off one reads nothing
        from labkit.kernels.copy import _copy_kernel, copy

        with H.hold_peer_reads(buf, str(tmp_path), "e", 0.2) as seen:
            _copy_kernel[(1,)](peer, torch.empty(8), 0, BLOCK=8)  # every lane masked off
        assert not seen.reached, seen.as_dict()
        with H.hold_peer_reads(buf, str(tmp_path), "f", 0.2) as seen:
            assert torch.equal(copy(peer), peer)
        assert seen.reached and seen.where == "triton load" and seen.released_by == "timeout", seen.as_dict()
    with pytest.raises(ValueError, match="hold_peer_reads: buf: the emulated world only"):
        with H.hold_peer_reads(types.SimpleNamespace(emulated=False), str(tmp_path), "d", 0.1):
            pass


@TWO_RANKS
def test_collective_catches_a_wrong_sum_and_passes_the_fixes():
    r = check.collective(fn("wrong_sum"), 2, fn("coll_inputs"), rounds=3)
    assert r.status == "failed" and "elements wrong" in r.message, r
    for fixed in (c2.one_shot_fixed, c2.peers_fixed):
        r = check.collective(fixed, 2, c2.inputs)
        assert r.ok, r


@TWO_RANKS
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


@TWO_RANKS
def test_collective_says_when_the_world_did_not_start_within_the_timeout():
    """A timeout too short for the world to start was reported as the user's hang."""
    r = check.collective(c2.one_shot_fixed, 2, c2.inputs, timeout=0.01)
    assert r.status == "error" and r.outcome == "world did not start", r
    assert "the world did not start within the timeout (0.01 s" in r.message and "hang" not in r.message, r


@TWO_RANKS
def test_collective_says_the_lengths_when_the_result_and_the_reference_differ_in_length():
    """reference="all_gather" on an all_reduce said "8192 of 4096 elements wrong (max |error| inf)"."""
    r = check.collective(c2.one_shot_fixed, 2, c2.inputs, reference="all_gather", rounds=1, hold_s=0)
    assert r.outcome == "wrong elements", r
    n = c2.NUMEL
    assert f"the result has {n} elements and the all_gather reference {2 * n}" in r.message, r


@TWO_RANKS
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


def _cuda1(n=6):
    return torch.randn(n, device="cuda:1")


@pytest.mark.multigpu
@pytest.mark.parametrize("launch", [c1.launch_seed, __import__("check_fns").launch_with_kwargs])
def test_watch_launches_names_kernel_and_argument_of_the_seed_on_two_gpus(launch):
    """Data on cuda:1, cuda:0 current; "raise" stops the launch before it runs (no illegal access)."""
    x, out = _cuda1(), torch.zeros(6, device="cuda:1")
    with torch.cuda.device(0):
        with check.watch_launches(on_mismatch="raise") as w:
            with pytest.raises(check.WrongDeviceLaunch, match="x_ptr is on cuda:1 but cuda:0 is current"):
                launch(x, out)
    assert {(f.kernel, f.argument, f.device, f.current) for f in w.findings} == {
        ("_add_one_kernel", "x_ptr", "cuda:1", "cuda:0"),
        ("_add_one_kernel", "out_ptr", "cuda:1", "cuda:0"),
    }
    assert torch.equal(out.cpu(), torch.zeros(6))  # it never ran


@pytest.mark.multigpu
def test_watch_launches_catches_the_scratch_variant_and_passes_the_fixes_on_two_gpus():
    with torch.cuda.device(0):
        with check.watch_launches(on_mismatch="raise") as w:
            with pytest.raises(check.WrongDeviceLaunch):
                c1.scratch_seed(_cuda1())
        assert [f.argument for f in w.findings] == ["x_ptr"]  # out was made on cuda:0, the current one
        x = _cuda1()
        for launch, args in ((c1.launch_fixed, (x, torch.zeros(6, device="cuda:1"))), (c1.scratch_fixed, (x,))):
            with check.watch_launches(on_mismatch="raise") as w:
                out = launch(*args)
            out = args[1] if out is None else out
            assert w.ok and w.launches == 1, w.findings
            assert out.device == x.device and torch.equal(out.cpu(), x.cpu() + 1)
        assert torch.cuda.current_device() == 0


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
