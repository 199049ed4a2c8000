"""Launch plans (labkit.kernels.comm.plan) and the host-cost breakdown of lab 02
(labkit.labs.collectives.host_cost).

CPU tier: plans and the eager calls' plan cache on an emulated world against fp64 sums; stale
plans refused; the fallback launch path under the interpreter; the fast path's call into
Triton's compiled launcher checked against a stand-in compiled kernel and against the installed
Triton's own JIT path; the breakdown and its plot. GPU tier (marked): the fast path itself."""

import importlib
import inspect
import types

import plan_fns
import pytest
import torch
from worlds import skip_without_a_world

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm import graph_launch as G
from labkit.kernels.comm import plan as P
from labkit.kernels.comm.ranks import run_ranks
from labkit.workbench import tier
from labkit.workbench.errors import UsageError

#: under pytest-xdist (make test) every test of this file runs in one worker: the worlds of its module fixtures
#: runs once, not once per worker
pytestmark = pytest.mark.xdist_group("plan")


@pytest.fixture(scope="module")
def world():
    """One start of a 2-rank world for all the plan checks (each start costs seconds)."""
    skip_without_a_world()
    return run_ranks(plan_fns.plans_and_cache, 2, timeout=300).unwrap()


def test_plans_sum_right(world):
    for found in world:
        for k in (
            "plan with out",
            "plan new outs",
            "plan in place",
            "tree plan",
            "tree plan sums",
            "reduce_scatter plan",
            "all_gather plan",
        ):
            assert found[k] is True, (k, found)
        assert found["repr"].startswith("CollectivePlan(all_reduce, one_shot, rank ")


def test_eager_calls_keep_one_plan_per_arguments(world):
    for found in world:
        for k in (
            "cached sums",
            "cached plan reused",
            "cached plans hold the buffer weakly",
            "another out",
            "bounded cache",
            "shard ops cached",
            "other buffer",
            "cache off",
        ):
            assert found[k] is True, (k, found)
        # one_shot new, one_shot into out, two_shot new, in place
        assert found["cached plans"] == 4


def test_bad_arguments_still_reach_their_checks(world):
    for found in world:
        assert found["unhashable config"].startswith("TypeError: config: expected a labkit.kernels.comm")
        assert found["out not a tensor"] == "TypeError: out: expected a torch.Tensor, got list"


def test_stale_plans_are_refused(world):
    for found in world:
        assert found["plan out moved"].startswith("UsageError: plan: its out tensor moved")
        assert found["plan buffer re-assigned"].startswith("UsageError: plan: buf.tensor is no longer the tensor")
        assert found["plan buffer moved"].startswith("UsageError: plan: buf.tensor moved or changed shape")
        for k in ("eager on re-assigned buffer", "eager on moved buffer"):
            assert found[k].startswith("UsageError: buf: buf.tensor is no longer the symmetric allocation"), found[k]
        assert found["cached plan after free"].startswith("UsageError: plan: its symmetric buffer has been freed")
        assert found["standalone plan keeps its buffer"] is True


@pytest.mark.skipif(not tier.interpreted(), reason="the interpreter's fallback: the CPU tier")
def test_the_interpreter_takes_the_normal_launch(world, monkeypatch):
    for found in world:
        assert found["launch_path"] == "triton (not launched yet)"
        assert (
            found["launch_path after"]
            == "triton (Triton interpreter: kernels run in Python, there is no compiled launcher)"
        )
    assert P.fast_launch_status() == (False, "Triton interpreter: kernels run in Python, there is no compiled launcher")
    monkeypatch.setattr(P, "FAST_LAUNCH", False)
    assert P.fast_launch_status()[1].startswith("switched off")


def test_triton_versions_are_read():
    assert P._version("3.6.0") == (3, 6) and P._version("3.4.0+git1a2b") == (3, 4) and P._version("3.10.1") == (3, 10)
    assert P._version("3.3.1") < P.MIN_TRITON <= P._version("3.4.0")


# ---- the fast path's call into CompiledKernel.run, against a stand-in compiled kernel


class _Compiled:
    """What Triton's JIT path hands back (a CompiledKernel), recording every launch."""

    def __init__(self):
        self.function, self.packed_metadata, self.calls, self.meta_calls = "fn-handle", "packed", [], []

    def run(self, *args):
        self.calls.append(args)

    def launch_metadata(self, grid, stream, *args):
        self.meta_calls.append((grid, stream, args))
        return "metadata"


class _Kernel:
    """A JITFunction's surface: params (name, is_constexpr, default) and kernel[grid](...)."""

    def __init__(self):
        p = types.SimpleNamespace
        self.params = [
            p(name="src", is_constexpr=False, default=None),
            p(name="out", is_constexpr=False, default=None),
            p(name="n", is_constexpr=False, default=None),
            p(name="BLOCK", is_constexpr=True, default=None),
            p(name="FLAG", is_constexpr=True, default=7),
        ]
        self.compiled, self.slow = _Compiled(), []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.slow.append((grid, args, kwargs))
            return self.compiled

        return launch


def _fast_launch(monkeypatch):
    monkeypatch.setattr(P, "fast_launch_status", lambda: (True, "test"))
    monkeypatch.setattr(P, "_stream_getter", lambda: lambda index: 1234 + (index or 0))
    monkeypatch.setattr(P, "_hooks", lambda: (None, None))
    k = _Kernel()
    src = torch.zeros(8)
    launch = P.KernelLaunch(k, (3,), (src, P.OUT, 8), {"BLOCK": 4, "num_warps": 2}, torch.device("cpu"))
    return k, src, launch


def test_the_fast_path_passes_what_tritons_jit_path_passes(monkeypatch):
    k, src, launch = _fast_launch(monkeypatch)
    out1, out2 = torch.zeros(8), torch.zeros(8)
    launch(out1)  # the first launch: Triton's path, which hands back the compiled kernel
    assert k.slow == [((3,), (src, out1, 8), {"BLOCK": 4, "num_warps": 2})] and launch.fast
    launch(out2)  # then the compiled launcher: grid as 3 ints, stream, handle, metadata, hooks, ALL params
    (call,) = k.compiled.calls
    assert call[:9] == (3, 1, 1, 1234, "fn-handle", "packed", None, None, None)
    # pointers as addresses, constexprs and defaults too
    assert call[9:] == (src.data_ptr(), out2.data_ptr(), 8, 4, 7)
    assert len(k.slow) == 1
    # the stand-in has no C launch function to call directly: the wrapper stays, and says why
    assert not launch.direct and "has no launch function" in launch.direct_reason


def test_the_fast_path_passes_hooks_and_metadata_when_a_profiler_listens(monkeypatch):
    k, src, launch = _fast_launch(monkeypatch)
    launch(torch.zeros(8))

    def enter(meta):
        pass

    monkeypatch.setattr(P, "_hooks", lambda: (enter, None))
    out = torch.zeros(8)
    launch(out)
    (call,) = k.compiled.calls
    assert call[6:9] == ("metadata", enter, None)
    assert k.compiled.meta_calls == [((3, 1, 1), 1234, (src, out, 8, 4, 7))]


class _Launcher:
    """Triton's launcher wrapper (CompiledKernel.run): Python that sets up scratch memory, then
    calls its C function ``launch``. ``style``: "splat" (the kernel's arguments spread out, as
    triton 3.4-3.6 pass them), "tuple" (one tuple, with signature tables before it, as later
    versions do), "scratch" (a fresh allocation per launch in the middle)."""

    def __init__(self, style: str):
        self.style, self.calls, self.signature = style, [], ("*fp32", "*fp32", "i32")
        self.launch = lambda *a: self.calls.append(a)

    def __call__(self, gx, gy, gz, stream, function, meta, launch_meta, enter, leave, *args):
        scratch = torch.empty(4) if self.style == "scratch" else None
        head = (gx, gy, gz, stream, function, False, meta, launch_meta, enter, leave, scratch)
        if self.style == "tuple":
            self.launch(*head, self.signature, args)
        else:
            self.launch(*head, *args)


@pytest.mark.parametrize("style", ["splat", "tuple", "scratch"])
def test_the_direct_launch_repeats_what_the_wrapper_hands_its_c_function(monkeypatch, style):
    """The second fast launch records the wrapper's call into its C function; where every other
    value is a constant of the launcher, the third and later calls make that same call
    themselves (new addresses in place), and the wrapper runs no more. A wrapper that makes
    something per launch (scratch memory) stays in the path, and the reason is kept."""
    k, src, launch = _fast_launch(monkeypatch)
    launcher = _Launcher(style)
    k.compiled.run = launcher
    outs = [torch.zeros(8) for _ in range(4)]
    launch(outs[0])  # Triton's path
    launch(outs[1])  # recorded through the wrapper
    wrapper_calls = []
    launcher_call = launcher.__call__
    monkeypatch.setattr(_Launcher, "__call__", lambda self, *a: wrapper_calls.append(a) or launcher_call(*a))
    launch(outs[2])
    launch(outs[3])
    assert len(launcher.calls) == 3 and len(k.slow) == 1
    for out, call in zip(outs[1:], launcher.calls):
        args = (src.data_ptr(), out.data_ptr(), 8, 4, 7)
        assert call[:5] == (3, 1, 1, 1234, "fn-handle")
        assert (call[-1] == args) if style == "tuple" else (call[-5:] == args)
    if style == "scratch":
        assert not launch.direct and "per-launch values (Tensor" in launch.direct_reason
        assert len(wrapper_calls) == 2
    else:
        assert launch.direct and launch.direct_reason is None and wrapper_calls == []
        end = -1 if style == "tuple" else -5
        assert launcher.calls[2][5:end] == launcher.calls[1][5:end] == launcher.calls[0][5:end]  # the constants
    assert "launch" in vars(launcher)  # the recorder is gone: the launcher's own function is back
    assert launcher.launch.__name__ == "<lambda>"


def test_the_direct_launch_can_be_switched_off(monkeypatch):
    k, src, launch = _fast_launch(monkeypatch)
    monkeypatch.setattr(P, "DIRECT_LAUNCH", False)
    launcher = _Launcher("splat")
    k.compiled.run = launcher
    for _ in range(3):
        launch(torch.zeros(8))
    assert not launch.direct and launch.direct_reason == "switched off (LABKIT_DIRECT_LAUNCH=0)"
    assert len(launcher.calls) == 2


def test_an_output_of_other_alignment_goes_the_normal_way(monkeypatch):
    """The compiled kernel was specialised on a 16-byte-aligned output: an output 4 bytes in
    would break that promise, so it takes Triton's path (which specialises anew)."""
    k, src, launch = _fast_launch(monkeypatch)
    launch(torch.zeros(8))
    odd = torch.zeros(9)[1:]
    assert odd.data_ptr() % 16
    launch(odd)
    assert len(k.slow) == 2 and k.compiled.calls == []


def test_no_fast_path_without_the_compiled_kernels_surface(monkeypatch):
    k, src, launch = _fast_launch(monkeypatch)
    k.compiled = object()  # what an unknown Triton might hand back
    launch(torch.zeros(8))
    assert (
        not launch.fast
        and "without ['run', 'function', 'packed_metadata', 'launch_metadata']" in launch.fallback_reason
    )
    launch(torch.zeros(8))
    assert len(k.slow) == 2


def test_the_installed_triton_launches_as_the_fast_path_assumes():
    """The contract the fast path repeats, read from the installed Triton's JIT path: it launches
    with ``kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,
    launch_metadata, <enter hook>, <exit hook>, *bound_args.values())`` (triton >= 3.4). If this
    fails after a Triton upgrade, the fast path must be checked before it is trusted again."""
    import triton
    from triton.runtime.jit import JITFunction

    if P._version(triton.__version__) < P.MIN_TRITON:
        pytest.skip(f"triton {triton.__version__}: plans take the normal launch")
    src = " ".join(inspect.getsource(JITFunction.run).split())
    assert (
        "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata, "
        "knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound_args.values())"
    ) in src
    from triton.compiler.compiler import CompiledKernel

    assert {"run", "launch_metadata"} <= set(dir(CompiledKernel))


def test_a_plan_refuses_a_buffer_it_does_not_know():
    from labkit.kernels.comm import collectives as C

    with pytest.raises(TypeError, match="a plain tensor is not in symmetric memory"):
        C.all_reduce_plan(torch.zeros(8))
    with pytest.raises(UsageError, match="op: 'bogus'"):
        C.make_shards_plan("bogus", None)


# ---- the host-cost breakdown and its plot


@pytest.fixture(scope="module")
def host_records():
    skip_without_a_world()
    reps = (20, 3) if tier.interpreted() else (2000, 300)  # an interpreted launch runs the kernel: ~10 ms
    return [r for per_rank in run_ranks(plan_fns.host_cost, 2, 1024, *reps, timeout=300).unwrap() for r in per_rank]


def test_the_breakdown_times_every_stage_of_every_path(host_records):
    from labkit.labs.collectives import host_cost

    assert {r["rank"] for r in host_records} == {0, 1}
    mine = [r for r in host_records if r["rank"] == 0]
    stages = {(r["path"], r["stage"]) for r in mine}
    assert {("eager call", s) for s in ("checks", "config", "guard", "triton launch", "whole call")} <= stages
    # a plan into a fixed output replays a CUDA graph once settled (GPUs): that replay is its launch
    launch = ("graph replay",) if ("plan()", "graph replay") in stages else ("guard", "plan launch")
    assert {("plan()", s) for s in ("plan checks", *launch, "whole call")} <= stages
    assert {("all_reduce, cached plan", s) for s in ("cache lookup + checks", *launch)} <= stages
    assert (launch == ("graph replay",)) == (not tier.interpreted() and G.GRAPH_LAUNCH)
    if launch == ("graph replay",):  # beside it, what it stands in for, not added to the call's stages
        assert ("plan()", host_cost.ASIDE) in stages and ("all_reduce, cached plan", host_cost.ASIDE) not in stages
        assert "the graph replay" in host_cost.verdict(host_records)
    assert not any(r["stage"] == host_cost.ASIDE for r in host_cost.host_only(host_records))
    for r in mine:
        assert set(host_cost.REQUIRED) <= set(r) and r["us"] >= 0 and r["algorithm"] == "one_shot"
        assert r["interpreted"] == tier.interpreted()
    # the checks a plan makes per call cost less than the eager call's checks and choices
    us = {(r["path"], r["stage"]): r["us"] for r in mine}
    assert us[("plan()", "plan checks")] < us[("eager call", "checks")] + us[("eager call", "config")]
    line = host_cost.verdict(host_records)
    assert line.startswith("all_reduce one_shot 2048 B, W=2, rank 0") and "plan()" in line
    if tier.interpreted():
        assert "Triton interpreter" in line


def test_the_plot_stacks_the_stages(host_records, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.labs.collectives import host_cost
    from labkit.workbench import env

    fig, ax = plt.subplots()
    assert host_cost.plot_host_cost(host_records, ax, "t") == 3
    assert [t.get_text() for t in ax.get_yticklabels()] == list(host_cost.PATHS)
    assert "µs per call" in ax.get_xlabel()
    if tier.interpreted():
        assert "Triton interpreter: not GPU numbers" in ax.get_xlabel()
    ends = [t.get_text() for t in ax.texts if t.get_text().startswith("host ")]
    assert len(ends) == 3 and all("(whole " in e for e in ends)
    plt.close(fig)
    fig = host_cost.host_cost_figure(host_records, env.stamp(), folder=tmp_path)
    assert (tmp_path / "host_cost.png").exists()
    assert any("your run:" in t.get_text() for t in fig.texts)
    plt.close(fig)
    fig, ax = plt.subplots()
    assert host_cost.plot_host_cost([], ax) == 0
    plt.close(fig)
    # the stages that launch nothing (what the CPU tier's notebook draws): every path, no whole-call tick
    host = host_cost.host_only(host_records)
    assert {r["stage"] for r in host} <= set(host_cost.HOST_STAGES) and {r["path"] for r in host} == set(
        host_cost.PATHS
    )
    fig, ax = plt.subplots()
    assert host_cost.plot_host_cost(host, ax, "t") == 3
    assert not [t for t in ax.texts if "(whole " in t.get_text()]
    plt.close(fig)


def test_measure_checks_its_out():
    from labkit.labs.collectives import host_cost

    with pytest.raises(ValueError, match="out: 'elsewhere' is not"):
        host_cost.measure(types.SimpleNamespace(), out="elsewhere")


# ---- GPU tier


@pytest.mark.gpu
def test_kernel_launch_goes_fast_on_a_gpu():
    """One Triton kernel (labkit's copy) through KernelLaunch: Triton's path first, then the
    compiled launcher, the same result; a launch hook registered later is called (a profiler
    still sees the launches)."""
    from triton import knobs

    copy_module = importlib.import_module("labkit.kernels.copy")  # the package exports the function `copy`

    dev = torch.device("cuda", torch.cuda.current_device())
    src = torch.randn(1 << 20, device=dev)
    launch = P.KernelLaunch(
        copy_module._copy_kernel, (256,), (src, P.OUT, src.numel()), {"BLOCK": 4096, "num_warps": 8}, dev
    )
    outs = [torch.empty_like(src) for _ in range(5)]
    launch(outs[0])
    assert launch.fast, launch.fallback_reason
    launch(outs[1])  # recorded for the direct launch
    assert launch.direct or P.DIRECT_LAUNCH is False, launch.direct_reason
    launch(outs[3])  # direct
    seen = []
    hook = getattr(knobs.runtime, "launch_enter_hook", None)
    if hasattr(hook, "add"):  # triton >= 3.5: a HookChain
        hook.add(seen.append)
        try:
            launch(outs[2])
        finally:
            hook.remove(seen.append)
        assert len(seen) == 1
    else:
        launch(outs[2])
    launch(outs[4])  # direct again once the hook is gone
    torch.cuda.synchronize()
    assert all(torch.equal(o, src) for o in outs)


@pytest.mark.multigpu
def test_plans_go_fast_and_stay_right_on_gpus():
    for found in run_ranks(plan_fns.fast_path_on_gpu, 2, timeout=600).unwrap():
        assert found["status"][0], found["status"]
        path = found["launch_path"].removesuffix(", replayed from a CUDA graph")
        assert path in ("compiled launcher", "compiled launcher (direct)"), found["launch_path"]
        for k in (
            "plan sums",
            "two_shot",
            "tree",
            "in place",
            "side stream",
            "graph replay",
            "cached fast",
            "switched off",
        ):
            assert found[k] is True, (k, found)
        assert found.get("other device current", True) is True


@pytest.mark.multigpu
def test_a_plan_costs_less_host_time_than_the_eager_call_on_gpus(host_records):
    """On the GPU tier the same breakdown: the plan's whole call and the cached call take less
    host time than the call without a plan, and the kernel's GPU time is recorded."""
    mine = {(r["path"], r["stage"]): r["us"] for r in host_records if r["rank"] == 0}
    assert mine[("plan()", "whole call")] < mine[("eager call", "whole call")]
    assert mine[("all_reduce, cached plan", "whole call")] < mine[("eager call", "whole call")]
    assert mine[("plan()", "kernel")] > 0


def test_a_plan_for_one_call_prepares_no_fast_path(monkeypatch):
    """The eager calls that cannot cache (plan cache off, an unhashable argument) launch a plan
    once: it goes Triton's way and builds nothing for later."""
    k, src, launch = _fast_launch(monkeypatch)
    launch.armable = False
    launch(torch.zeros(8))
    assert not launch.fast and launch.fallback_reason == "a plan for one call (not cached)"


# ---- the chooser, the plans, the eager call and Graphed agree


@pytest.fixture(scope="module")
def choices():
    skip_without_a_world(3)
    return run_ranks(plan_fns.choices_agree, 3, timeout=300).unwrap()


def test_a_plan_and_the_eager_call_choose_alike(choices):
    """Held plan, the eager call's kept plan, the call without a plan and what Graphed captures:
    one algorithm (the chooser's), the same kernels with the same grid and arguments."""
    for found in choices:
        for label in ("small out", "large out", "small new", "small in place", "in place ce", "explicit launch"):
            f = found[label]
            assert f["sums"] is True, (label, f)
            assert f["held"] == f["cached"] == f["uncached"] == f["graphed"] == f["chooser"], (label, f)
            assert f["same launches"] is True, (label, f)
            # one table read by every plan: W=3 is recorded on no GPU, so the defaults, said so
            (table,) = f["tables"]
            assert table.startswith("defaults (no table for ") and table.endswith(" x3)"), (label, table)
        assert found["small out"]["held"] == "one_shot" and found["large out"]["held"] == "two_shot"
        assert found["small in place"]["held"] == "two_shot" and found["in place ce"]["held"] == "two_shot_ce"
        assert found["in place ce"]["kernels"] == ["barrier_kernel", "copies", "two_shot_ce_kernel"]
        assert found["explicit launch"]["held"] == "two_shot"
        for k in (
            "reduce_scatter same launches",
            "all_gather same launches",
            "graph_target of a plan",
            "graph_target, other callable",
        ):
            assert found[k] is True, (k, found[k])
        assert found["graph_target, bad argument"].startswith("TypeError: got an unexpected keyword argument 'bogus'")


def test_graphed_takes_no_arguments_with_a_plan():
    from labkit.kernels.comm import collectives as C

    p = object.__new__(P.CollectivePlan)
    with pytest.raises(TypeError, match="a plan takes no arguments"):
        C.graph_target(p, 1)


# ---- the sweep's eager series, on the emulated world


@pytest.fixture(scope="module")
def eager_records():
    skip_without_a_world()
    return run_ranks(plan_fns.eager_series_in_the_world, 2, timeout=300).unwrap()


def test_the_eager_series_times_every_path_in_place_and_not(eager_records):
    from labkit.labs.collectives import bench, eager_bench

    for records in eager_records:
        labkit_recs = [r for r in records if r["impl"] == "labkit_all_reduce"]
        assert {(r["path"], r["in_place"]) for r in labkit_recs} == {
            (p, ip) for p in eager_bench.EAGER_PATHS for ip in (False, True)
        }
        for r in records:
            assert set(bench.REQUIRED) <= set(r), r
            assert r["kind"] == "eager" and r["correct"] is True and r["us"] > 0 and r["op"] == "all_reduce"
            assert r["us_p25"] <= r["us"] <= r["us_p75"] and r["samples"] == 3 and r["inner"] == 1
            assert r["method"] == ("cpu_clock" if tier.interpreted() else "cuda_events")
            assert r["world_size"] == 2 and r["bytes"] == 1024 * 4 and r["dtype"] == "float32"
        for r in labkit_recs:
            assert r["baseline"] == "torch_stand_in"
            assert r["ratio_p25"] <= r["ratio_to_torch_best"] <= r["ratio_p75"]
            assert r["algorithm"] == ("two_shot" if r["in_place"] else "one_shot")
        paths = {r["path"]: r["launch_path"] for r in labkit_recs if not r["in_place"]}
        assert paths["eager_uncached"] == "triton (no plan)"
        if tier.interpreted():
            assert paths["plan"].startswith("triton (Triton interpreter") and paths["plan_cached"] == paths["plan"]
        (stand_in,) = [r for r in records if r["impl"] == "torch_stand_in"]
        assert stand_in["path"] == "torch_eager" and "ratio_to_torch_best" not in stand_in
        assert not any("target" in r for r in records)  # compared with its peers, no target carried


def test_the_eager_verdict_reads_the_ratios(eager_records):
    from labkit.labs.collectives import eager_bench

    lines = eager_bench.eager_verdicts(eager_records[0])
    assert len(lines) == 6, lines
    assert lines[0].startswith("W=2, eager_uncached, out of place: x") and "of 1 sizes" in lines[0]
    slower = [dict(r, ratio_to_torch_best=1.1) for r in eager_records[0]]
    assert all(line.endswith("faster than torch's best at 0 of 1 sizes") for line in eager_bench.eager_verdicts(slower))
    # faster: ratio < 1; level (1.0) is not faster
    for ratio, n in ((0.9, 1), (1.0, 0)):
        recs = [dict(r, ratio_to_torch_best=ratio) for r in eager_records[0]]
        lines_at = eager_bench.eager_verdicts(recs)
        assert all(line.endswith(f"faster than torch's best at {n} of 1 sizes") for line in lines_at)
    assert not any("target" in line or "within" in line for line in lines)
    none = [dict(r, ratio_to_torch_best=None) for r in eager_records[0]]
    assert "no torch eager op timed beside it" in eager_bench.eager_verdicts(none)[0]
    assert eager_bench.eager_verdicts([]) == []


def test_the_benchmark_records_the_breakdown_with_every_field():
    """``labkit bench collectives``'s host-cost records (small cases here): every field of the
    benchmark's records and of the breakdown's, every rank's, one breakdown per case."""
    skip_without_a_world()
    from labkit.labs.collectives import bench, host_cost

    cases = ((256, "auto", "given"), (256, "auto", "in_place"))
    records = bench.host_cost_records(2, cases, reps=10, launch_reps=1)
    for r in records:
        assert set(bench.REQUIRED) <= set(r) and set(host_cost.REQUIRED) <= set(r), r
        assert r["kind"] == "host_cost" and r["impl"] == "labkit_all_reduce" and r["busbw_GBps"] is None
    assert {r["rank"] for r in records} == {0, 1}
    assert host_cost.cases(records) == [(512, "given"), (512, "in place")]
    one = host_cost.select(records, 512, "in place")
    assert {r["algorithm"] for r in one} == {"two_shot"} and len(one) == len(records) // 2
    assert host_cost.verdict(one).startswith("all_reduce two_shot 512 B, W=2, rank 0")


@pytest.mark.multigpu
def test_graphed_captures_the_plan_of_its_call_on_gpus():
    for found in run_ranks(plan_fns.graphed_on_gpu, 2, timeout=600).unwrap():
        for label, f in found.items():
            assert f["replays sum"] is True and f["same as the eager call's"] is True, (label, f)
        assert found["all_reduce out"]["algorithm"] == "one_shot"  # 2 ranks: one-shot at every size
        assert found["all_reduce in place"]["algorithm"] == "two_shot"
