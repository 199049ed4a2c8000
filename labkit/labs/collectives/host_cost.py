"""Where the host time of one eager collective call goes, and what a plan saves.

Called from Python without a plan, ``all_reduce(buf, out)`` takes several times as long per call
as torch's symmetric-memory ops at small sizes, although the kernels themselves, replayed from a
CUDA graph, are as fast (reference/h200x2/collectives.json, kind "eager": path "eager_uncached"
against "torch_eager", field ``us``). The difference is host work before the kernel starts.
``breakdown`` times each stage of that work on its own (``time.perf_counter_ns`` around every
repetition, the median of many), for three ways to make the same call:

* ``eager call``: the call without a plan, stage by stage: the argument checks
  (``collectives.check_all_reduce``), the choice of algorithm, launch configuration and grid
  (``collectives.choose_all_reduce``), the device guard (``workbench.guard.on_device_of``,
  entered and left), the output's allocation (out=None only), and Triton's launch
  (``kernel[grid](...)``: binding, specialisation key, cache lookup, the launcher);
* ``all_reduce, cached plan``: ``collectives.all_reduce`` as it is now: the cache key, the
  lookup and the per-call checks of the plan it keeps on the buffer, the guard of a known device
  (``workbench.guard.on_device``), the plan's launch;
* ``plan()``: a plan held by the caller (``labkit.kernels.comm.collectives.all_reduce_plan``): its
  per-call checks, the guard, its launch (Triton's compiled launcher where
  ``plan.fast_launch_status()`` allows, else Triton's normal path).

A plan into a fixed output (in place, or the out it was made for) replays its kernels from a CUDA
graph once its launches are settled (``labkit.kernels.comm.graph_launch``); on GPUs both plan
paths then have one stage "graph replay" (the replay with its per-call conditions, the device
entered by the replay itself) in place of "guard" and "plan launch", and the plan() path a record
beside its stages (``ASIDE``): the guard and launches timed without the graph, the work the replay
stands in for.

Each path also gets a "whole call" record: the call timed whole, which the stages should add up
to (they are timed apart, so they are a model of the call; the whole call is the measurement).
On GPUs a last stage, ``kernel``, is the kernel's own time on the device (a CUDA graph of many
calls replayed, divided by the calls), the floor no host work can lower. Under the Triton
interpreter (the CPU tier) the "launch" stages run the kernel itself in Python, so they measure
the interpreter, not a launch; records carry ``interpreted`` and the plot says so.

Every stage that launches is a collective: call ``breakdown`` on every rank (``measure`` is the
rank function for ``run_ranks``), with the same arguments.
"""

from __future__ import annotations

import os
import statistics
import textwrap
import time

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import plan as P
from labkit.kernels.comm import symm
from labkit.workbench import tier
from labkit.workbench.guard import on_device, on_device_of

PATHS = ("eager call", "all_reduce, cached plan", "plan()")
#: stage -> (what it is, colour)
STAGES = {
    "checks": ("argument checks (check_all_reduce)", "tab:blue"),
    "config": ("algorithm, launch config, grid (choose_all_reduce)", "tab:orange"),
    "cache lookup + checks": ("cache key, lookup, the plan's per-call checks", "tab:purple"),
    "plan checks": ("the plan's per-call checks (buffer, out)", "tab:cyan"),
    "guard": ("device guard, entered and left", "tab:green"),
    "alloc out": ("allocating the output", "tab:olive"),
    "triton launch": ("Triton's launch path, kernel[grid](...)", "tab:red"),
    "plan launch": ("the plan's launch (compiled launcher where possible)", "tab:pink"),
    "graph replay": ("the plan's kernels replayed from a CUDA graph, with its per-call checks", "tab:brown"),
    "kernel": ("the kernel on the GPU (graph replay)", "0.55"),
}
#: a record beside the stages, not one of them: where a plan replays a CUDA graph, its guard and
#: launches timed without the graph (what the replay stands in for); not drawn, not added up
ASIDE = "guard + launch, not replayed"
#: the stages that launch nothing: the same Python work whatever runs the kernels (under the
#: interpreter, the launch stages run the kernel itself and dwarf them)
HOST_STAGES = ("checks", "config", "cache lookup + checks", "plan checks", "guard", "alloc out")
REQUIRED = ("path", "stage", "us", "reps", "op", "algorithm", "bytes", "world_size", "rank", "interpreted")


def _median_us(fn, reps: int) -> float:
    """Median µs of ``reps`` calls of ``fn``, each timed on its own."""
    samples = []
    clock = time.perf_counter_ns
    for _ in range(reps):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1e3


def _line_up(device: torch.device) -> None:
    """Every rank starts the next timed loop of launches together, its GPU idle."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _triton_launches(steps, out) -> None:
    """The steps through Triton's own launch path (what the eager call did before plans)."""
    for s in steps:
        if isinstance(s, P.KernelLaunch):
            args = s.args if s.out_pos < 0 else s.args[: s.out_pos] + (out,) + s.args[s.out_pos + 1 :]
            s.kernel[s.grid](*args, **s.kwargs)
        else:
            s(out)


def eager_uncached(buf, out: torch.Tensor | None = None, algorithm: str = "auto") -> torch.Tensor:
    """``all_reduce(buf, out, algorithm=algorithm)`` as it was before plans: every call runs the
    argument checks, the choices (algorithm, launch, grid), the device guard and Triton's own launch
    path (``kernel[grid](...)``). The breakdown's "eager call" and the sweep's ``eager_uncached``
    series; the same checks and choices as a plan's, so the same kernels with the same launch."""
    checked = C.check_all_reduce(buf, out, algorithm)
    choice = C.choose_all_reduce(checked.buf, checked.in_place, algorithm)
    x, o = checked.buf.tensor, checked.out
    with on_device_of(buf=x, out=o):
        target = (
            x if checked.in_place else (o if o is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device))
        )
        _triton_launches(choice.steps, target)
    return target


def _kernel_us(p: P.CollectivePlan, device: torch.device, iters: int = 20, rounds: int = 5) -> float:
    """GPU µs per call: ``iters`` calls of the plan captured in a CUDA graph, replayed ``rounds``
    times with every rank lined up; the median round."""
    from labkit.labs.collectives.rank_timing import samples_us

    return statistics.median(samples_us(p, iters, rounds, graph=True))


def breakdown(
    buf,
    out: torch.Tensor | None = None,
    *,
    algorithm: str = "one_shot",
    reps: int | None = None,
    launch_reps: int | None = None,
    warmup: int = 3,
) -> list[dict]:
    """Median µs of each stage of ``all_reduce(buf, out, algorithm=algorithm)`` on this rank, for
    each of ``PATHS`` (see the module docstring); one record per (path, stage), and one per path
    with stage "whole call": the call timed whole, a check on the sum of its stages.

    reps: repetitions of the stages that launch nothing (default 2000 on GPUs, 200 interpreted);
    launch_reps: of the stages that launch, every one a collective (default 500 on GPUs, 3
    interpreted: an interpreted launch runs the kernel, tens of milliseconds). Call on every rank."""
    interp = tier.interpreted()
    reps = reps or (200 if interp else 2000)
    launch_reps = launch_reps or (3 if interp else 500)
    buf = symm.check_buffer("buf", buf)
    x = buf.tensor
    dev = x.device
    nbytes = x.numel() * x.element_size()

    # the host-only stages: nothing launched, nothing to line up
    checks = _median_us(lambda: C.check_all_reduce(buf, out, algorithm), reps)
    checked = C.check_all_reduce(buf, out, algorithm)
    buf, checked_out, in_place = checked.buf, checked.out, checked.in_place
    config = _median_us(lambda: C.choose_all_reduce(buf, in_place, algorithm), reps)
    choice = C.choose_all_reduce(buf, in_place, algorithm)

    def enter_leave():
        with on_device_of(buf=x, out=checked_out):
            pass

    guard = _median_us(enter_leave, reps)
    known = on_device(dev)

    def enter_known():
        with known:
            pass

    plan_guard = _median_us(enter_known, reps)
    shape = tuple(x.shape)
    alloc = None
    if checked_out is None and not in_place:
        alloc = _median_us(lambda: torch.empty(shape, dtype=x.dtype, device=dev), reps)
    target = x if in_place else (checked_out if checked_out is not None else torch.empty_like(x))

    held = C.all_reduce_plan(buf, out, algorithm=algorithm)
    for _ in range(warmup):  # compiles, arms the fast path, fills the buffer's plan cache, captures
        _triton_launches(choice.steps, target)
        C.all_reduce(buf, out, algorithm=algorithm)
        held()
    key = C.plan_key("all_reduce", out, algorithm=algorithm)
    if key not in buf._plans:
        raise RuntimeError(
            f"host_cost: the cache key written here, {key}, is not the one all_reduce used "
            f"({list(buf._plans)}): update breakdown"
        )

    def lookup():
        p = buf._plans.get(C.plan_key("all_reduce", out, algorithm=algorithm))
        return p.stale()

    cache_checks = _median_us(lookup, reps)
    plan_out = held.out

    def plan_checks():
        held.stale()
        if plan_out is not None:
            plan_out.data_ptr() == held._out_ptr and plan_out.shape == held._out_shape

    plan_checks_us = _median_us(plan_checks, reps)

    # the stages that launch: a collective each, the same count on every rank, ranks lined up
    def timed(fn, guarded=False):
        _line_up(dev)
        if guarded:
            with known:
                return _median_us(fn, launch_reps)
        return _median_us(fn, launch_reps)

    launch = timed(lambda: _triton_launches(choice.steps, target), guarded=True)
    plan_launch = timed(lambda: [s(target) for s in held.steps], guarded=True)
    eager_whole = timed(lambda: eager_uncached(buf, out, algorithm))
    cached_whole = timed(lambda: C.all_reduce(buf, out, algorithm=algorithm))
    plan_whole = timed(held)
    # a plan into a fixed output replays its kernels from a CUDA graph once settled
    # (labkit.kernels.comm.graph_launch): then that replay is its launch, guard included
    replays = held._graph.graph is not None
    replay_key = target.data_ptr()
    replay = timed(lambda: held._graph.replay(replay_key)) if replays else None
    plan_stages = (
        [("graph replay", replay, launch_reps)]
        if replays
        else [("guard", plan_guard, reps), *allocs_for(alloc, reps), ("plan launch", plan_launch, launch_reps)]
    )
    # beside a replay, what its launches cost without it (guard and launch): not a stage of the call
    aside = [(ASIDE, plan_guard + plan_launch, launch_reps)] if replays else []
    kernel = None if interp or dev.type != "cuda" else _kernel_us(held, dev)
    _line_up(dev)

    base = {
        "op": "all_reduce",
        "algorithm": choice.algorithm,
        "bytes": nbytes,
        "dtype": str(x.dtype).replace("torch.", ""),
        "world_size": buf.world_size,
        "rank": buf.rank,
        "interpreted": interp,
        "in_place": in_place,
        "out": "in place" if in_place else ("given" if out is not None else "new"),
        "launch_path": held.launch_path,
    }
    allocs = allocs_for(alloc, reps)
    stages = {
        "eager call": [
            ("checks", checks, reps),
            ("config", config, reps),
            ("guard", guard, reps),
            *allocs,
            ("triton launch", launch, launch_reps),
            ("whole call", eager_whole, launch_reps),
        ],
        "all_reduce, cached plan": [
            ("cache lookup + checks", cache_checks, reps),
            *plan_stages,
            ("whole call", cached_whole, launch_reps),
        ],
        "plan()": [
            ("plan checks", plan_checks_us, reps),
            *plan_stages,
            ("whole call", plan_whole, launch_reps),
            *aside,
        ],
    }
    records = []
    for path, rows in stages.items():
        if kernel is not None:
            rows = rows + [("kernel", kernel, 5)]
        records += [dict(base, path=path, stage=stage, us=us, reps=n) for stage, us, n in rows]
    return records


def allocs_for(alloc_us: float | None, reps: int) -> list[tuple]:
    """The "alloc out" stage row, where the call allocates its output (out=None)."""
    return [("alloc out", alloc_us, reps)] if alloc_us is not None else []


def measure(
    ctx,
    n: int = 2048,
    dtype_name: str = "bfloat16",
    algorithm: str = "one_shot",
    out: str = "given",
    reps: int | None = None,
    launch_reps: int | None = None,
) -> list[dict]:
    """Rank function (``run_ranks(measure, W, ...)``): a buffer of ``n`` elements, random
    inputs, then ``breakdown``. out: "given" (a tensor made once, as a training loop would pass),
    "new" (out=None: one allocated per call) or "in_place" (out=buf.tensor)."""
    if out not in ("given", "new", "in_place"):
        raise ValueError(f"out: {out!r} is not 'given', 'new' or 'in_place'")
    dtype = getattr(torch, dtype_name)
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    g = torch.Generator().manual_seed(ctx.rank)
    buf.tensor.copy_(torch.randn(n, generator=g).to(dtype))
    target = {
        "given": lambda: torch.empty(n, dtype=dtype, device=ctx.device),
        "new": lambda: None,
        "in_place": lambda: buf.tensor,
    }[out]()
    return breakdown(buf, target, algorithm=algorithm, reps=reps, launch_reps=launch_reps)


#: the breakdowns ``labkit bench collectives`` records, (elements per rank, algorithm, out): 4 KiB and
#: 1 MiB of bf16, into a given out and in place, the algorithm the chooser picks
BENCH_CASES = (
    (2048, "auto", "given"),
    (2048, "auto", "in_place"),
    (1 << 19, "auto", "given"),
    (1 << 19, "auto", "in_place"),
)


def measure_cases(
    ctx, cases=BENCH_CASES, dtype_name: str = "bfloat16", reps: int | None = None, launch_reps: int | None = None
) -> list[dict]:
    """Rank function: ``measure`` for each of ``cases`` (elements, algorithm, out) in one world."""
    records = []
    for n, algorithm, out in cases:
        records += measure(ctx, n, dtype_name, algorithm, out, reps, launch_reps)
    return records


def cases(records: list[dict]) -> list[tuple]:
    """The (bytes, out) of each breakdown in ``records``, in order of size, then out."""
    return sorted({(r["bytes"], r["out"]) for r in records if "stage" in r})


def select(records: list[dict], nbytes: int, out: str) -> list[dict]:
    """The records of one breakdown (``cases``), every rank's: what ``plot_host_cost`` draws."""
    return [r for r in records if "stage" in r and r["bytes"] == nbytes and r["out"] == out]


def host_only(records: list[dict]) -> list[dict]:
    """The records of ``HOST_STAGES`` only (no launch, no kernel, no whole call): what the
    breakdown under the interpreter can show of a call's host work."""
    return [r for r in records if r["stage"] in HOST_STAGES]


def totals(records: list[dict]) -> dict:
    """path -> µs of its host stages added up (the kernel left out: it overlaps the next call's
    host work when calls are back to back; the "whole call" check left out)."""
    out = {}
    for r in records:
        if r["stage"] not in ("kernel", "whole call", ASIDE):
            out[r["path"]] = out.get(r["path"], 0.0) + r["us"]
    return out


def _mine(records: list[dict]) -> tuple[int, list[dict]]:
    rank = min(r["rank"] for r in records)
    return rank, [r for r in records if r["rank"] == rank]


def verdict(records: list[dict]) -> str:
    """One line: each path's host µs (stages added up, and timed whole), and the kernel's."""
    if not records:
        return "no host-cost records"
    rank, mine = _mine(records)
    t = totals(mine)
    whole = {r["path"]: r["us"] for r in mine if r["stage"] == "whole call"}
    kernel = next((r["us"] for r in mine if r["stage"] == "kernel"), None)
    head = mine[0]
    where = "Triton interpreter (launches run the kernel in Python)" if head["interpreted"] else "GPU"
    parts = [f"{p} {t[p]:.1f} µs" + (f" (whole {whole[p]:.1f})" if p in whole else "") for p in PATHS if p in t]
    text = (
        f"{head['op']} {head['algorithm']} {head['bytes']} B, W={head['world_size']}, rank {rank}, {where}: "
        + ", ".join(parts)
    )
    if kernel is not None:
        text += f"; kernel {kernel:.1f} µs on the GPU"
    replay = next((r["us"] for r in mine if r["path"] == "plan()" and r["stage"] == "graph replay"), None)
    aside = next((r["us"] for r in mine if r["path"] == "plan()" and r["stage"] == ASIDE), None)
    if replay is not None and aside is not None:
        text += f"; the graph replay {replay:.1f} µs where its guard and launches take {aside:.1f}"
    return text + f"; plan launches via {head['launch_path']}"


def plot_host_cost(records: list[dict], ax, title: str = "") -> int:
    """A horizontal stacked bar per path (rank 0's records, or the lowest rank's): each stage a
    segment in µs, its value written in it where it fits, the kernel hatched; a black tick where
    the call timed whole ends, and the host total at the end of the bar. Returns the number of bars."""
    if not records:
        ax.text(0.5, 0.5, "no host-cost records", ha="center", va="center", transform=ax.transAxes)
        ax.axis("off")
        return 0
    rank, mine = _mine(records)
    paths = [p for p in PATHS if any(r["path"] == p for r in mine)]
    sums = totals(mine)
    kernel_us = max((r["us"] for r in mine if r["stage"] == "kernel"), default=0.0)
    whole = {r["path"]: r["us"] for r in mine if r["stage"] == "whole call"}
    widest = max([sums[p] + kernel_us for p in paths] + list(whole.values()))
    shown = set()
    for y, path in enumerate(paths):
        left = 0.0
        for stage, (label, colour) in STAGES.items():
            rec = next((r for r in mine if r["path"] == path and r["stage"] == stage), None)
            if rec is None:
                continue
            ax.barh(
                y,
                rec["us"],
                left=left,
                color=colour,
                edgecolor="white",
                hatch="//" if stage == "kernel" else None,
                label=None if stage in shown else f"{stage}: {label}",
            )
            shown.add(stage)
            if rec["us"] >= 0.06 * widest:
                ax.text(left + rec["us"] / 2, y, f"{rec['us']:.1f}", ha="center", va="center", fontsize=7)
            left += rec["us"]
        if path in whole:
            ax.plot(
                [whole[path]],
                [y],
                marker="|",
                ms=22,
                mew=2,
                color="black",
                label=None if "whole" in shown else "the call timed whole (host)",
            )
            shown.add("whole")
        text = f"host {sums[path]:.1f} µs" + (f" (whole {whole[path]:.1f})" if path in whole else "")
        ax.text(max(left, whole.get(path, 0.0)) + 0.01 * widest, y, text, va="center", fontsize=8)
    ax.set_yticks(range(len(paths)))
    ax.set_yticklabels(paths)
    ax.invert_yaxis()
    ax.set_xlim(0, widest * 1.35)
    head = mine[0]
    reps = max(r["reps"] for r in mine)
    ax.set_xlabel(
        f"µs per call (median of up to {reps} calls each), rank {rank}"
        + (" -- Triton interpreter: not GPU numbers" if head["interpreted"] else "")
    )
    what = textwrap.fill(
        f"{head['op']} {head['algorithm']}, {head['bytes']} B {head['dtype']}, "
        f"W={head['world_size']}, out {head['out']}; plan launches via {head['launch_path']}",
        100,
    )
    ax.set_title(f"{title}\n{what}" if title else what, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return len(paths)


def host_cost_figure(
    records: list[dict],
    stamp: dict | None = None,
    name: str = "host_cost",
    folder=None,
    title: str = "Host time of one call",
    refs: dict | None = None,
):
    """The stacked bars with the caption naming the machine and versions (``workbench.plot.caption``:
    ``stamp`` the reader's run, ``refs`` {machine: ResultSet} a recorded one), saved as ``name``.png
    in ``folder`` (default: the notebook's output folder) and shown once."""
    from labkit.workbench import plot

    fig, (ax,) = plot.new_figure(width=10.0, height=5.2)
    plot_host_cost(records, ax, title)
    text = plot.caption(fig, yours=stamp, refs=refs, adjust=False)
    # the bars, their labels and the legend under them, above the caption's band at the bottom
    fig.tight_layout(rect=(0, min(0.3, (0.1 + 0.14 * len(text.splitlines())) / fig.get_figheight()), 1, 1))
    plot.save(fig, name, folder)
    return fig


# ---- per-call host time of the public calls, side by side ----

#: the calls ``call_costs`` times: impl -> what it is
HOST_CALLS = {
    "labkit_push": "push.all_reduce(x, box, out): the push one-shot, its launch kept on the inbox",
    "labkit_fid": "flag_in_data.all_reduce(x, box, out): the flag-in-data one-shot, its launch kept on the inbox",
    "labkit_all_reduce_fid": "collectives.all_reduce(buf, out, algorithm='flag_in_data'): the plan kept on the buffer",
    "labkit_all_reduce": "collectives.all_reduce(buf, out) on a buffer without an inbox (auto): the plan kept on it",
    "torch_two_shot": "torch.ops.symm_mem.two_shot_all_reduce_(t, 'sum', group): torch's in-place op",
}


def _host_call_candidates(ctx, n: int, dtype) -> tuple[dict, dict]:
    """impl -> (call, this rank's result tensor) for ``HOST_CALLS``, each on buffers of its own
    holding this rank's input; impl -> why it is absent (torch's op off GPUs or in a torch
    without it)."""
    from labkit.kernels.comm import flag_in_data, push

    dev = ctx.device
    scratch = getattr(ctx, "scratch_dir", None)
    pbox = push.inbox(n, dtype, device=dev, scratch_dir=scratch)
    fbox = flag_in_data.inbox(n, dtype, device=dev, scratch_dir=scratch)
    ibuf = symm.empty(n, dtype, device=dev, scratch_dir=scratch)
    flag_in_data.attach(ibuf, fbox)  # shares the inbox: one stream
    buf = symm.empty(n, dtype, device=dev, scratch_dir=scratch)
    x, p_out, f_out, i_out, a_out = (torch.empty(n, dtype=dtype, device=dev) for _ in range(5))
    cands = {
        "labkit_push": (lambda: push.all_reduce(x, pbox, p_out), x),
        "labkit_fid": (lambda: flag_in_data.all_reduce(x, fbox, f_out), x),
        "labkit_all_reduce_fid": (lambda: C.all_reduce(ibuf, i_out, algorithm="flag_in_data"), ibuf.tensor),
        "labkit_all_reduce": (lambda: C.all_reduce(buf, a_out), buf.tensor),
    }
    absent = {}
    two = getattr(torch.ops.symm_mem, "two_shot_all_reduce_", None) if dev.type == "cuda" else None
    if two is not None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD.group_name
        st = symm_mem.empty(n, dtype=dtype, device=dev)
        symm_mem.rendezvous(st, group)
        cands["torch_two_shot"] = (lambda: two(st, "sum", group), st)
    else:
        absent["torch_two_shot"] = (
            "torch's symmetric-memory ops need CUDA GPUs" if dev.type != "cuda" else "this torch lacks the op"
        )
    return cands, absent


def call_costs(
    ctx,
    n: int = 2048,
    dtype_name: str = "bfloat16",
    rounds: int | None = None,
    calls: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """Rank function (``run_ranks(call_costs, W)``): the host µs of one call of each of
    ``HOST_CALLS`` at ``n`` elements, in one process, interleaved.

    Every candidate is first checked once against the fp64 sum of every rank's input (no
    collective trusted to check a collective) and called a few times (compiled, its launch kept).
    Then ``rounds`` rounds; in each, the candidates in an order rotated by one per round, each
    after the ranks line up (a barrier, the GPU idle): ``calls`` calls back to back, each timed
    on its own with ``time.perf_counter_ns`` (the host's time until the call returns; its kernel
    runs asynchronously, and at a few µs per kernel the GPU keeps up, so the queue never blocks
    the host). A round's value is the median of its calls; a record has the median over rounds
    (``us``), their quartiles and the slowest and fastest round. Under the interpreter (the CPU
    tier) a call runs its kernel in Python: the numbers say nothing about GPUs there
    (``interpreted``). Every rank makes the same calls: call on every rank alike.

    rounds, calls: default 15 and 200 on GPUs, 3 and 2 under the interpreter."""
    from labkit.labs.collectives import experiments

    interp = tier.interpreted()
    rounds = rounds or (3 if interp else 15)
    calls = calls or (2 if interp else 200)
    dtype = getattr(torch, dtype_name)
    dev = ctx.device
    cands, absent = _host_call_candidates(ctx, n, dtype)
    mine, everyone = experiments.rank_inputs(ctx, n, dtype, seed)
    correct = {}
    for name, (call, source) in cands.items():
        source.copy_(mine)
        y = call()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        correct[name] = experiments.close_to_sum(y, everyone, dtype, ctx.world_size)
        for _ in range(2):  # compiled, launch kept, fast path armed
            call()
    names = list(cands)
    per_round: dict = {name: [] for name in names}
    clock = time.perf_counter_ns
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            call = cands[name][0]
            _line_up(dev)
            samples = []
            for _ in range(calls):
                t0 = clock()
                call()
                samples.append(clock() - t0)
            per_round[name].append(statistics.median(samples) / 1e3)
    _line_up(dev)
    base = {
        "op": "all_reduce",
        "bytes": n * dtype.itemsize,
        "dtype": dtype_name,
        "world_size": ctx.world_size,
        "rank": ctx.rank,
        "interpreted": interp,
        "rounds": rounds,
        "calls": calls,
        **where_it_ran(),
    }
    records = []
    for name in HOST_CALLS:
        if name in cands:
            v = sorted(per_round[name])
            q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
            records.append(
                dict(
                    base,
                    impl=name,
                    what=HOST_CALLS[name],
                    correct=correct[name],
                    us=statistics.median(v),
                    us_p25=q[0],
                    us_p75=q[2],
                    us_min=v[0],
                    us_max=v[-1],
                )
            )
        else:
            records.append(dict(base, impl=name, what=HOST_CALLS[name], correct=None, us=None, absent=absent[name]))
    return records


def where_it_ran() -> dict:
    """Where this process runs on the host, beside its host times: ``cpu`` (the core it was on at
    the end, from /proc/self/stat; None elsewhere) and ``cpus_allowed`` (how many cores its
    affinity allows). One rank's calls can take far longer than the others' on the same machine,
    torch's too; these fields let the records say whether placement goes with it."""
    cpu = None
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = int(fields[36])  # field 39 of proc(5), counted from the state (field 3)
    except (OSError, IndexError, ValueError):
        pass
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count()
    return {"cpu": cpu, "cpus_allowed": allowed}


def call_costs_summary(records: list[dict]) -> list[str]:
    """One line per size: each call's host µs, median over rounds with its quartiles, from
    ``call_costs`` records (kind "host_call" in a reference file), the lowest rank's. A failed
    run's record (no rank) is left out."""
    recs = [
        r for r in records if r.get("impl") in HOST_CALLS and "rank" in r and r.get("kind", "host_call") == "host_call"
    ]
    if not recs:
        return []
    rank = min(r["rank"] for r in recs)
    lines = []
    for nbytes in sorted({r["bytes"] for r in recs}):
        mine = [r for r in recs if r["rank"] == rank and r["bytes"] == nbytes]
        parts = [
            f"{r['impl']} {r['us']:.2f} µs ({r['us_p25']:.2f}..{r['us_p75']:.2f})"
            if r.get("us") is not None
            else f"{r['impl']} absent ({r.get('absent')})"
            for r in mine
        ]
        where = "interpreter" if mine[0]["interpreted"] else "GPU"
        lines.append(f"{nbytes} B, W={mine[0]['world_size']}, rank {rank}, {where}: " + "; ".join(parts))
    return lines
