"""What lab 02's timed comparisons share: the message each rank reduces at one size, how many
calls a timing round makes, the check of a result against the fp32 reference, the agreement of
every rank on a check, the bus-bandwidth factors (nccl-tests' convention), and the two steps
every comparison of candidates takes: lining the ranks up before a sample, checking every
candidate once before any is timed, and timing them by graph replay and by eager calls; and the
progress lines a long run leaves behind (``progress``). Used by the sweep and the search
(``sweep_bench``, ``eager_bench``, ``tune_bench``, ``bench``) and the push and into comparisons
(``push_bench``, ``into_bench``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

BUS_FACTOR = {
    "all_reduce": lambda w: 2 * (w - 1) / w,
    "reduce_scatter": lambda w: (w - 1) / w,
    "all_gather": lambda w: (w - 1) / w,
}


def iters_for(nbytes: int) -> int:
    """Back-to-back calls per timing round: many for small messages (microseconds each)."""
    return 50 if nbytes <= (1 << 20) else (20 if nbytes <= (16 << 20) else 5)


def message(ctx, nbytes: int, dtype, seed: int):
    """This rank's input for one message size (a multiple of W elements), the fp32 sum over
    ranks and the sum over ranks of |x_r| (the scale of the rounding tolerance)."""
    n = nbytes // dtype.itemsize
    n -= n % ctx.world_size
    g = torch.Generator(device=ctx.device).manual_seed(seed)
    x = torch.randn(n, device=ctx.device, generator=g).to(dtype)
    ref = x.float()
    dist.all_reduce(ref)
    scale = x.float().abs()
    dist.all_reduce(scale)
    return n, x, ref, scale


def agreed_everywhere(ok: bool, device) -> bool:
    """True only if ``ok`` on every rank (a collective call)."""
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def close_to_ref(y, ref, w, scale) -> bool:
    """Within the rounding an all-reduce in ``y``'s dtype may do (labkit.labs.collectives.checks.
    sum_tolerance: for bf16 up to log2(W) + 1 roundings of 2^-7, for the tree) of the fp32
    reference, relative to ``scale``, the sum over ranks of |x_r| (the scale rounding errors have,
    even where the sum cancels)."""
    from labkit.labs.collectives.checks import sum_tolerance

    return bool(((y.float() - ref).abs() <= sum_tolerance(y.dtype, w) * scale + 1e-6).all())


def line_up(ctx):
    """What a timed sample starts from: every rank at a barrier, its GPU idle
    (``labkit.workbench.bench.compare``'s ``line_up``)."""

    def go():
        ctx.barrier()
        torch.cuda.synchronize(ctx.device)

    return go


def check_candidates(cands: dict, base: dict, device) -> tuple[dict, dict]:
    """Check every candidate once (``cands``: name -> (fields, call, check)), agreed on every
    rank: (name -> call for those that ran, name -> record row with ``correct``, or the error
    that stopped it, which is then not timed)."""
    ok, rows = {}, {}
    for name, (fields, call, check) in cands.items():
        rows[name] = {**base, "impl": name, **fields}
        try:
            rows[name]["correct"] = agreed_everywhere(bool(check()), device)
            ok[name] = call
        except Exception as e:
            rows[name].update(
                correct=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            )
    return ok, rows


def time_graph_and_eager(ok: dict, iters: int, ctx, baseline: str | None, warmup: int, reps: int):
    """Time the checked candidates (name -> call) twice in interleaved rounds, as the sweep does:
    yields ("graph", comparison, iters), the replay of one CUDA graph of ``iters`` back-to-back
    calls per candidate, then ("eager", comparison, 1), ``iters`` calls back to back from Python
    per sample. Divide a comparison's times by the third item for µs per call. The comparison is
    None where no candidate ran. ``baseline``: the candidate the ratios are paired with (the first
    where it did not run)."""
    from labkit.labs.collectives.rank_timing import capture
    from labkit.workbench import bench as wb

    go = line_up(ctx)
    for timing in ("graph", "eager"):
        if timing == "graph":  # one replay = `iters` calls; the graphs live until the eager timing
            timed, inner, per_call = {nm: capture(call, iters).replay for nm, call in ok.items()}, 1, iters
        else:
            timed, inner, per_call = ok, iters, 1
        cmp = (
            wb.compare(
                timed,
                baseline=baseline if baseline in timed else next(iter(timed)),
                device=ctx.device,
                warmup=warmup,
                reps=reps,
                inner=inner,
                method="cuda_events",
                line_up=go,
            )
            if timed
            else None
        )
        yield timing, cmp, per_call
        del timed


def progress(ctx, line: dict) -> None:
    """Rank 0 appends one JSON line per finished size to $LABKIT_PROGRESS_FILE, if set: a sweep
    cut short by a time limit still shows how far it got (the ranks' stdout is not streamed).
    A symbolic link at that name is refused (``gates.append_line``)."""
    import json
    import os
    import time

    from labkit.workbench import gates

    path = os.environ.get("LABKIT_PROGRESS_FILE")
    if path and ctx.rank == 0:
        gates.append_line(path, json.dumps({"time": time.time(), "world_size": ctx.world_size, **line}) + "\n")


def progress_main(line: dict) -> None:
    """``progress`` from the benchmark's own process (no world: rank 0, no world size)."""
    import types

    progress(types.SimpleNamespace(rank=0, world_size=None), line)
