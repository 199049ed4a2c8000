"""The sweep of lab 02: NCCL, PyTorch's symmetric-memory ops and labkit's kernels, every size, each
checked against NCCL's result on the same inputs before it is timed (``correct``), then the eager
series at that size (``eager_bench``). Part "sweep" of ``labkit bench collectives`` (``bench``).

Definitions (nccl-tests, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
algbw = bytes / time; busbw = algbw x 2 (W-1)/W for all-reduce, x (W-1)/W for reduce-scatter
and all-gather, where bytes is the all-reduce message, the reduce-scatter input or the
all-gather output. busbw is comparable with the link's bandwidth whatever W is.

Two latencies per point: ``us`` is the median over rounds of back-to-back calls (what a Python
caller sees, launch overhead included); ``graph_us`` replays the same calls captured in a CUDA
graph (what the GPU spends). ``crossover_bytes`` reads off the records where labkit's two-shot
all-reduce overtakes its one-shot.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import symm
from labkit.labs.collectives.eager_bench import eager_series, torch_eager_ops
from labkit.labs.collectives.messages import BUS_FACTOR
from labkit.labs.collectives.messages import agreed_everywhere as _everywhere
from labkit.labs.collectives.messages import close_to_ref as _close
from labkit.labs.collectives.messages import iters_for as _iters
from labkit.labs.collectives.messages import message as _message
from labkit.labs.collectives.messages import progress as _progress
from labkit.labs.collectives.rank_timing import median_us as _time

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def _cases(ctx, n: int, dtype, x: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> dict:
    """(impl, op) -> (call, check): ``call`` is what gets timed; ``check`` runs once on the
    fresh inputs and says whether this rank's result is right (``scale``: sum over ranks of
    |x_r|, what the rounding tolerance is relative to). For every point, the
    all-reduce message, the reduce-scatter input and the all-gather output are n elements."""
    import torch.distributed._symmetric_memory as symm_mem

    w, dev, rank = ctx.world_size, ctx.device, ctx.rank
    s = n // w
    group = dist.group.WORLD.group_name
    mine, mine_scale = ref[rank * s : (rank + 1) * s], scale[rank * s : (rank + 1) * s]
    gathered = torch.empty(n, dtype=dtype, device=dev)
    dist.all_gather_into_tensor(gathered, x[:s].contiguous())  # NCCL's answer for all-gather
    cases = {}

    t = x.clone()
    cases[("nccl", "all_reduce")] = (
        lambda: dist.all_reduce(t),
        lambda: (t.copy_(x), dist.all_reduce(t), _close(t, ref, w, scale))[-1],
    )
    rs_out = torch.empty(s, dtype=dtype, device=dev)
    cases[("nccl", "reduce_scatter")] = (
        lambda: dist.reduce_scatter_tensor(rs_out, x),
        lambda: (dist.reduce_scatter_tensor(rs_out, x), _close(rs_out, mine, w, mine_scale))[-1],
    )
    ag_in, ag_out = x[:s].contiguous(), torch.empty(n, dtype=dtype, device=dev)
    cases[("nccl", "all_gather")] = (
        lambda: dist.all_gather_into_tensor(ag_out, ag_in),
        lambda: (dist.all_gather_into_tensor(ag_out, ag_in), torch.equal(ag_out, gathered))[-1],
    )

    st = symm_mem.empty(n, dtype=dtype, device=dev)
    symm_mem.rendezvous(st, group)
    one = getattr(torch.ops.symm_mem, "one_shot_all_reduce", None)
    if one is not None:
        cases[("torch_one_shot", "all_reduce")] = (
            lambda: one(st, "sum", group),
            lambda: (st.copy_(x), _close(one(st, "sum", group), ref, w, scale))[-1],
        )
    two = getattr(torch.ops.symm_mem, "two_shot_all_reduce_", None)
    if two is not None:  # in place: the result replaces the input
        cases[("torch_two_shot", "all_reduce")] = (
            lambda: two(st, "sum", group),
            lambda: (st.copy_(x), two(st, "sum", group), _close(st, ref, w, scale))[-1],
        )

    buf = symm.empty(n, dtype, device=dev, workspace=True)
    out = torch.empty(n, dtype=dtype, device=dev)
    for alg in C.ALGORITHMS:
        cases[(f"labkit_{alg}", "all_reduce")] = (
            lambda alg=alg: C.all_reduce(buf, out, algorithm=alg),
            lambda alg=alg: (buf.tensor.copy_(x), _close(C.all_reduce(buf, out, algorithm=alg), ref, w, scale))[-1],
        )
    # in place, like NCCL's all_reduce and torch's two_shot_all_reduce_ above: the result replaces the input
    for alg in C.IN_PLACE_ALGORITHMS:
        cases[(f"labkit_{alg}_in_place", "all_reduce")] = (
            lambda alg=alg: C.all_reduce(buf, buf.tensor, algorithm=alg),
            lambda alg=alg: (buf.tensor.copy_(x), _close(C.all_reduce(buf, buf.tensor, algorithm=alg), ref, w, scale))[
                -1
            ],
        )
    # the same one-shot kernel, launched by replaying a one-call CUDA graph (no Python per call)
    replay = C.Graphed(C.all_reduce, buf, out, algorithm="one_shot")
    cases[("labkit_one_shot_graphed", "all_reduce")] = (
        replay,
        lambda: (buf.tensor.copy_(x), _close(replay(), ref, w, scale))[-1],
    )
    rs_lk = torch.empty(s, dtype=dtype, device=dev)
    cases[("labkit", "reduce_scatter")] = (
        lambda: C.reduce_scatter(buf, rs_lk),
        lambda: (buf.tensor.copy_(x), _close(C.reduce_scatter(buf, rs_lk), mine, w, mine_scale))[-1],
    )
    ag_buf = symm.empty(s, dtype, device=dev)
    ag_lk = torch.empty(n, dtype=dtype, device=dev)
    cases[("labkit", "all_gather")] = (
        lambda: C.all_gather(ag_buf, ag_lk),
        lambda: (ag_buf.tensor.copy_(x[:s]), torch.equal(C.all_gather(ag_buf, ag_lk), gathered))[-1],
    )
    return cases


def sweep(
    ctx, sizes=SIZES, dtype_name: str = "bfloat16", reps: int = 7, graphs: bool = True, progress: bool = True
) -> list[dict]:
    """One rank's part of the sweep (``run_ranks`` runs it on every rank); rank 0's records are
    the result. An implementation a torch build lacks is absent from the records."""
    from tqdm.auto import tqdm

    dtype = getattr(torch, dtype_name)
    w = ctx.world_size
    records = []
    for nbytes in tqdm(sizes, desc=f"sweep W={w}", disable=not progress or ctx.rank != 0):
        n, x, ref, scale = _message(ctx, nbytes, dtype, seed=1000 * ctx.rank + len(records))
        cases = _cases(ctx, n, dtype, x, ref, scale)
        for (impl, op), (call, check) in cases.items():
            rec = {"impl": impl, "op": op, "world_size": w, "bytes": n * dtype.itemsize, "dtype": dtype_name}
            try:
                rec["correct"] = _everywhere(bool(check()), ctx.device)
                rec["us"] = _time(call, _iters(nbytes), reps, graph=False)
                # a graph replay cannot itself be captured into another graph
                nested = impl.endswith("_graphed")
                rec["graph_us"] = _time(call, _iters(nbytes), reps, graph=True) if graphs and not nested else None
            except Exception as e:
                rec.setdefault("correct", False)
                rec.setdefault("us", None)
                rec.setdefault("graph_us", None)
                rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            _progress(
                ctx,
                {
                    "impl": impl,
                    "op": op,
                    "bytes": rec["bytes"],
                    "us": rec.get("us"),
                    "graph_us": rec.get("graph_us"),
                    "correct": rec.get("correct"),
                },
            )
            factor = BUS_FACTOR[op](w)
            for key, bw in (("us", "busbw_GBps"), ("graph_us", "graph_busbw_GBps")):
                rec[bw] = rec["bytes"] / rec[key] / 1e3 * factor if rec.get(key) else None
            records.append(rec)
        records += eager_series(
            ctx,
            symm.empty(n, dtype, device=ctx.device),
            torch.empty_like(x),
            x,
            lambda y, ref=ref, scale=scale: _close(y, ref, w, scale),
            torch_eager_ops(ctx, n, dtype, x, lambda y, ref=ref, scale=scale: _close(y, ref, w, scale)),
            iters=_iters(nbytes),
            reps=max(reps, 15),
            dtype_name=dtype_name,
        )
        _progress(ctx, {"phase": "eager", "bytes": n * dtype.itemsize})
        torch.cuda.synchronize()
        dist.barrier()
        _progress(ctx, {"bytes": n * dtype.itemsize, "records": len(records)})
    return records


def crossover_bytes(records: list[dict], world_size: int, key: str = "us") -> int | None:
    """The largest message size at which labkit's one-shot all-reduce is still at least as fast
    as its two-shot, above which two-shot wins at every measured size (None: one-shot always)."""

    def at(impl):
        return {
            r["bytes"]: r.get(key)
            for r in records
            if r.get("impl") == impl
            and r.get("op") == "all_reduce"
            and r.get("world_size") == world_size
            and r.get(key)
            and r.get("kind", "sweep") == "sweep"
        }

    one, two = at("labkit_one_shot"), at("labkit_two_shot")
    sizes = sorted(set(one) & set(two))
    for i in range(len(sizes)):
        if all(two[c] < one[c] for c in sizes[i:]):
            return sizes[i - 1] if i > 0 else 0
    return None
