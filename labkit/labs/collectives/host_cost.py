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

The host µs of one call of each public all-reduce side by side is ``host_calls`` (``call_costs``,
``call_costs_summary``, ``HOST_CALLS``, ``where_it_ran``), importable from here too.
"""

from __future__ import annotations

import statistics
import textwrap
import time

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import plan as P
from labkit.kernels.comm import symm
from labkit.labs.collectives.host_calls import HOST_CALLS, call_costs, call_costs_summary, where_it_ran
from labkit.labs.collectives.rank_timing import line_up as _line_up
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


def _plan_cache_key(out, algorithm: str) -> tuple:
    """The key ``collectives.all_reduce`` keeps its plan under in the buffer's cache (what its
    cached path builds on every call)."""
    return C.plan_key("all_reduce", out, algorithm=algorithm)


def _unplanned_stages(buf, out, algorithm: str, reps: int) -> tuple:
    """The host-only stages before any plan: nothing launched, nothing to line up. Returns the
    checked call, its choice, and stage -> µs: "checks", "config", "guard", "plan guard" (the
    guard of a known device) and "alloc out" (None unless the call allocates its output)."""
    x = buf.tensor
    dev = x.device
    checks = _median_us(lambda: C.check_all_reduce(buf, out, algorithm), reps)
    checked = C.check_all_reduce(buf, out, algorithm)
    config = _median_us(lambda: C.choose_all_reduce(checked.buf, checked.in_place, algorithm), reps)
    choice = C.choose_all_reduce(checked.buf, checked.in_place, algorithm)

    def enter_leave():
        with on_device_of(buf=x, out=checked.out):
            pass

    guard = _median_us(enter_leave, reps)
    known = on_device(dev)

    def enter_known():
        with known:
            pass

    plan_guard = _median_us(enter_known, reps)
    shape = tuple(x.shape)
    alloc = None
    if checked.out is None and not checked.in_place:
        alloc = _median_us(lambda: torch.empty(shape, dtype=x.dtype, device=dev), reps)
    us = {"checks": checks, "config": config, "guard": guard, "plan guard": plan_guard, "alloc out": alloc}
    return checked, choice, us


def _planned_checks(buf, out, algorithm: str, held, reps: int) -> tuple[float, float]:
    """µs of the per-call checks of the two planned paths: the cache key, lookup and checks of the
    plan ``all_reduce`` keeps on ``buf``, and the checks of the plan ``held`` by the caller."""
    key = _plan_cache_key(out, algorithm)
    if key not in buf._plans:
        raise RuntimeError(
            f"host_cost: the cache key written here, {key}, is not the one all_reduce used "
            f"({list(buf._plans)}): update breakdown"
        )

    def lookup():
        p = buf._plans.get(_plan_cache_key(out, algorithm))
        return p.stale()

    cache_checks = _median_us(lookup, reps)
    plan_out = held.out

    def plan_checks():
        held.stale()
        if plan_out is not None:
            plan_out.data_ptr() == held._out_ptr and plan_out.shape == held._out_shape

    return cache_checks, _median_us(plan_checks, reps)


def _launch_stages(buf, out, algorithm: str, held, choice, target, launch_reps: int) -> dict:
    """The stages that launch: a collective each, the same count on every rank, ranks lined up.
    stage -> µs: "triton launch", "plan launch", the three whole calls, and "graph replay" (None
    unless the plan replays its kernels from a CUDA graph)."""
    dev = buf.tensor.device
    known = on_device(dev)

    def timed(fn, guarded=False):
        _line_up(dev)
        if guarded:
            with known:
                return _median_us(fn, launch_reps)
        return _median_us(fn, launch_reps)

    us = {
        "triton launch": timed(lambda: _triton_launches(choice.steps, target), guarded=True),
        "plan launch": timed(lambda: [s(target) for s in held.steps], guarded=True),
        "eager whole": timed(lambda: eager_uncached(buf, out, algorithm)),
        "cached whole": timed(lambda: C.all_reduce(buf, out, algorithm=algorithm)),
        "plan whole": timed(held),
    }
    # a plan into a fixed output replays its kernels from a CUDA graph once settled
    # (labkit.kernels.comm.graph_launch): then that replay is its launch, guard included
    replay_key = target.data_ptr()
    us["graph replay"] = timed(lambda: held._graph.replay(replay_key)) if held._graph.graph is not None else None
    return us


def _path_stages(us: dict, reps: int, launch_reps: int) -> dict:
    """path -> [(stage, µs, repetitions)] of ``PATHS`` from the timed stages ``us``."""
    allocs = allocs_for(us["alloc out"], reps)
    replays = us["graph replay"] is not None
    plan_stages = (
        [("graph replay", us["graph replay"], launch_reps)]
        if replays
        else [("guard", us["plan guard"], reps), *allocs, ("plan launch", us["plan launch"], launch_reps)]
    )
    # beside a replay, what its launches cost without it (guard and launch): not a stage of the call
    aside = [(ASIDE, us["plan guard"] + us["plan launch"], launch_reps)] if replays else []
    return {
        "eager call": [
            ("checks", us["checks"], reps),
            ("config", us["config"], reps),
            ("guard", us["guard"], reps),
            *allocs,
            ("triton launch", us["triton launch"], launch_reps),
            ("whole call", us["eager whole"], launch_reps),
        ],
        "all_reduce, cached plan": [
            ("cache lookup + checks", us["cache lookup + checks"], reps),
            *plan_stages,
            ("whole call", us["cached whole"], launch_reps),
        ],
        "plan()": [
            ("plan checks", us["plan checks"], reps),
            *plan_stages,
            ("whole call", us["plan whole"], launch_reps),
            *aside,
        ],
    }


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

    checked, choice, us = _unplanned_stages(buf, out, algorithm, reps)
    buf, checked_out, in_place = checked.buf, checked.out, checked.in_place
    target = x if in_place else (checked_out if checked_out is not None else torch.empty_like(x))
    held = C.all_reduce_plan(buf, out, algorithm=algorithm)
    for _ in range(warmup):  # compiles, arms the fast path, fills the buffer's plan cache, captures
        _triton_launches(choice.steps, target)
        C.all_reduce(buf, out, algorithm=algorithm)
        held()
    us["cache lookup + checks"], us["plan checks"] = _planned_checks(buf, out, algorithm, held, reps)
    us.update(_launch_stages(buf, out, algorithm, held, choice, target, launch_reps))
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
    records = []
    for path, rows in _path_stages(us, reps, launch_reps).items():
        if kernel is not None:
            rows = rows + [("kernel", kernel, 5)]
        records += [dict(base, path=path, stage=stage, us=t, reps=n) for stage, t, n in rows]
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


__all__ = [
    "ASIDE",
    "BENCH_CASES",
    "HOST_CALLS",
    "HOST_STAGES",
    "PATHS",
    "REQUIRED",
    "STAGES",
    "allocs_for",
    "breakdown",
    "call_costs",
    "call_costs_summary",
    "cases",
    "eager_uncached",
    "host_cost_figure",
    "host_only",
    "measure",
    "measure_cases",
    "plot_host_cost",
    "select",
    "totals",
    "verdict",
    "where_it_ran",
]
