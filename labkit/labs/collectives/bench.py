"""Sweeps of lab 02: NCCL, PyTorch's symmetric-memory ops and labkit's kernels, every size, in one
run per world size (``labkit bench collectives``).

Definitions (nccl-tests, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
algbw = bytes / time; busbw = algbw x 2 (W-1)/W for all-reduce, x (W-1)/W for reduce-scatter
and all-gather, where bytes is the all-reduce message, the reduce-scatter input or the
all-gather output. busbw is comparable with the link's bandwidth whatever W is.

Two latencies per point: ``us`` is the median over rounds of back-to-back calls (what a Python
caller sees, launch overhead included); ``graph_us`` replays the same calls captured in a CUDA
graph (what the GPU spends). Every implementation's result is checked against NCCL's on the
same inputs before it is timed; ``correct`` records the outcome.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import symm
from labkit.labs.collectives.messages import BUS_FACTOR
from labkit.labs.collectives.messages import agreed_everywhere as _everywhere
from labkit.labs.collectives.messages import close_to_ref as _close
from labkit.labs.collectives.messages import iters_for as _iters
from labkit.labs.collectives.messages import message as _message
from labkit.labs.collectives.rank_timing import median_us as _time
from labkit.workbench.errors import UsageError

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
REQUIRED = ("impl", "op", "world_size", "bytes", "dtype", "us", "busbw_GBps", "correct")


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


#: The ways to call labkit's all-reduce eagerly that the sweep times beside torch's eager
#: symm_mem ops (records of kind "eager", field ``path``).
EAGER_PATHS = {
    "eager_uncached": "no plan: checks, choices, guard and Triton's launch on every call",
    "plan_cached": "collectives.all_reduce(buf, out): the plan it keeps on the buffer",
    "plan": "plan() of a plan held by the caller (collectives.all_reduce_plan)",
}
#: The small messages (bytes per rank, inclusive) over which ``eager_verdicts`` summarises the
#: eager series: where a call's host time, not the links, decides.
EAGER_SMALL_BYTES = (4 << 10, 1 << 20)


def _torch_eager_ops(ctx, n: int, dtype, x: torch.Tensor, close) -> dict:
    """torch's eager symm_mem all-reduces for ``eager_series``: name -> (fields, call, check), on
    a symmetric tensor of their own; {} where this torch lacks them."""
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    st = symm_mem.empty(n, dtype=dtype, device=ctx.device)
    symm_mem.rendezvous(st, group)
    ops = {}
    one = getattr(torch.ops.symm_mem, "one_shot_all_reduce", None)
    if one is not None:
        ops["torch_one_shot"] = (
            {"impl": "torch_one_shot", "in_place": False, "algorithm": "one_shot"},
            lambda: one(st, "sum", group),
            lambda: (st.copy_(x), close(one(st, "sum", group)))[-1],
        )
    two = getattr(torch.ops.symm_mem, "two_shot_all_reduce_", None)
    if two is not None:  # in place
        ops["torch_two_shot"] = (
            {"impl": "torch_two_shot", "in_place": True, "algorithm": "two_shot"},
            lambda: two(st, "sum", group),
            lambda: (st.copy_(x), two(st, "sum", group), close(st))[-1],
        )
    return ops


def eager_series(
    ctx,
    buf,
    out: torch.Tensor,
    x: torch.Tensor,
    close,
    torch_ops: dict | None = None,
    *,
    iters: int,
    reps: int,
    warmup: int = 3,
    dtype_name: str = "bfloat16",
) -> list[dict]:
    """Records of kind "eager": labkit's all-reduce called eagerly on every path of ``EAGER_PATHS``,
    out of place (into ``out``) and in place (``out=buf.tensor``), algorithm "auto", beside
    ``torch_ops`` (``_torch_eager_ops``: name -> (fields, call, check)), all at one size.

    Each candidate is checked once on this rank's input ``x`` (``close(y)``: y is the sum over
    ranks; the outcome agreed by every rank), then all are timed in the same rounds, interleaved
    (``labkit.workbench.bench.compare``: CUDA events around ``iters`` back-to-back calls per sample
    on GPUs, the CPU clock on the emulated world), every sample starting with the device idle and
    the ranks lined up at a barrier, ``reps`` samples each: the median µs per call and its
    quartiles. Each labkit record has ``ratio_to_torch_best``: the median over rounds of its time
    over that round's time of torch's fastest op at this size (``baseline``), with quartiles. Call
    on every rank with the same arguments."""
    from labkit.kernels.comm import plan as P
    from labkit.labs.collectives import host_cost
    from labkit.workbench import bench as wb

    w, dev = ctx.world_size, buf.tensor.device
    nbytes = buf.tensor.numel() * buf.tensor.element_size()
    cands = dict(torch_ops or {})
    for in_place in (False, True):
        target = buf.tensor if in_place else out
        held = C.all_reduce_plan(buf, target)
        suffix = "_in_place" if in_place else ""
        key = ("all_reduce", P.out_key(target), "auto", None, "correct", None)  # all_reduce's own cache key
        calls = {
            "eager_uncached": lambda t=target: host_cost.eager_uncached(buf, t),
            "plan_cached": lambda t=target: C.all_reduce(buf, t),
            "plan": held,
        }
        for path, call in calls.items():
            fields = {
                "impl": "labkit_all_reduce",
                "path": path,
                "in_place": in_place,
                "algorithm": held.algorithm,
                "_plan": (lambda: "triton (no plan)")
                if path == "eager_uncached"
                else (lambda h=held: h.launch_path)
                if path == "plan"
                else (lambda k=key: buf._plans[k].launch_path if k in buf._plans else None),
            }
            cands[f"labkit_{path}{suffix}"] = (fields, call, lambda c=call: (buf.tensor.copy_(x), close(c()))[-1])
    base = {"kind": "eager", "op": "all_reduce", "world_size": w, "bytes": nbytes, "dtype": dtype_name}
    rows, timed = {}, {}
    for name, (fields, call, check) in cands.items():
        rec = {**base, "path": "torch_eager", **{k: v for k, v in fields.items() if not k.startswith("_")}}
        try:
            rec["correct"] = _everywhere(bool(check()), dev)
            timed[name] = call
        except Exception as e:
            rec.update(
                correct=False, us=None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            )
        rows[name] = rec

    def line_up():
        ctx.barrier()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    cmp = (
        wb.compare(
            timed,
            baseline=next(iter(timed)),
            device=dev if dev.type == "cuda" else None,
            warmup=warmup,
            reps=reps,
            inner=iters,
            method="cuda_events" if dev.type == "cuda" else "cpu_clock",
            line_up=line_up,
        )
        if timed
        else None
    )
    torch_timed = [nm for nm in timed if rows[nm]["impl"].startswith("torch_")]
    best = min(torch_timed, key=lambda nm: cmp.timings[nm].median_us) if torch_timed else None
    records = []
    for name, rec in rows.items():
        fields = cands[name][0]
        if name in timed:
            t = cmp.timings[name]
            rec.update(t.as_dict())
            rec["busbw_GBps"] = nbytes / t.median_us / 1e3 * BUS_FACTOR["all_reduce"](w)
        else:
            rec.setdefault("busbw_GBps", None)
        if "_plan" in fields:
            rec["launch_path"] = fields["_plan"]()
            rec["baseline"] = best
            if best is not None and name in timed:
                med, p25, p75 = cmp.ratio_to(name, best)
                rec.update(ratio_to_torch_best=med, ratio_p25=p25, ratio_p75=p75)
            else:
                rec.update(ratio_to_torch_best=None, ratio_p25=None, ratio_p75=None)
        records.append(rec)
    return records


def eager_verdicts(records: list[dict]) -> list[str]:
    """One line per world size, out of place and in place, and labkit path: the range of its paired
    ratios to torch's best eager op (its time over torch's, median over rounds) at the sizes of
    ``EAGER_SMALL_BYTES``, and at how many of them labkit is faster (ratio < 1). [] without eager
    records."""
    from labkit.workbench.plot import format_bytes

    lo, hi = EAGER_SMALL_BYTES
    eager = [r for r in records if r.get("kind") == "eager" and r.get("impl") == "labkit_all_reduce"]
    lines = []
    for w in sorted({r["world_size"] for r in eager}):
        for in_place in (False, True):
            for path in EAGER_PATHS:
                pts = sorted(
                    (r["bytes"], r.get("ratio_to_torch_best"))
                    for r in eager
                    if r["world_size"] == w
                    and r["in_place"] == in_place
                    and r["path"] == path
                    and lo <= r["bytes"] <= hi
                )
                if not pts:
                    continue
                where = "in place" if in_place else "out of place"
                if any(v is None for _, v in pts):
                    lines.append(
                        f"W={w}, {path}, {where}: no torch eager op timed beside it at "
                        f"{sum(v is None for _, v in pts)} of {len(pts)} sizes: no ratio"
                    )
                    continue
                faster = sum(v < 1 for _, v in pts)
                lines.append(
                    f"W={w}, {path}, {where}: x{min(v for _, v in pts):.2f}..x{max(v for _, v in pts):.2f} "
                    f"of torch's best eager op (paired medians) at {format_bytes(pts[0][0])}.."
                    f"{format_bytes(pts[-1][0])}; faster than torch's best at {faster} of {len(pts)} sizes"
                )
    return lines


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
            _torch_eager_ops(ctx, n, dtype, x, lambda y, ref=ref, scale=scale: _close(y, ref, w, scale)),
            iters=_iters(nbytes),
            reps=max(reps, 15),
            dtype_name=dtype_name,
        )
        _progress(ctx, {"phase": "eager", "bytes": n * dtype.itemsize})
        torch.cuda.synchronize()
        dist.barrier()
        _progress(ctx, {"bytes": n * dtype.itemsize, "records": len(records)})
    return records


def _progress(ctx, line: dict) -> None:
    """Rank 0 appends one JSON line per finished size to $LABKIT_PROGRESS_FILE, if set: a sweep
    cut short by a time limit still shows how far it got (the ranks' stdout is not streamed)."""
    import json
    import os
    import time

    path = os.environ.get("LABKIT_PROGRESS_FILE")
    if path and ctx.rank == 0:
        with open(path, "a") as f:
            f.write(json.dumps({"time": time.time(), "world_size": ctx.world_size, **line}) + "\n")


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


#: The grid of launch configurations ``tune`` measures: vectors per thread x warps x programs.
TUNE_SIZES = [64 << 10, 1 << 20, 16 << 20, 256 << 20]
#: "programs" in units of the GPU's SM count: a quarter, a half, one and two per SM.
TUNE_GRID = {"vectors": (1, 2, 4), "num_warps": (4, 8, 16), "programs_per_sm": (0.25, 0.5, 1, 2)}


def tune(
    ctx, sizes=TUNE_SIZES, grid=None, dtype_name: str = "bfloat16", reps: int = 5, progress: bool = True
) -> list[dict]:
    """One rank's part of the launch-configuration search: every config of ``grid`` for
    labkit's one-shot and two-shot all-reduce (out of place and in place), reduce-scatter and all-gather at ``sizes``,
    timed by CUDA-graph replay (the kernel's own time, no Python), each checked first. Every
    rank runs the same configs in the same order: a collective's grid must match across ranks
    (which is also why per-rank ``triton.autotune`` cannot be used on these kernels: each rank
    would time and pick on its own, and ranks that picked different grids would wait forever
    for programs that do not exist)."""
    import itertools

    from tqdm.auto import tqdm

    grid = grid or TUNE_GRID
    dtype = getattr(torch, dtype_name)
    w, dev = ctx.world_size, ctx.device
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    configs = [
        C.LaunchConfig(vectors=v, num_warps=nw, programs=max(1, round(p * sms)))
        for v, nw, p in itertools.product(grid["vectors"], grid["num_warps"], grid["programs_per_sm"])
    ]
    most = max(c.programs for c in configs)
    records = []
    bar = tqdm(total=len(sizes) * len(configs), desc=f"tune W={w}", disable=not progress or ctx.rank != 0)
    for nbytes in sizes:
        n, x, ref, scale = _message(ctx, nbytes, dtype, seed=7 + ctx.rank)
        s = n // w
        gathered = torch.empty(n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(gathered, x[:s].contiguous())
        buf = symm.empty(n, dtype, device=dev, max_blocks=most, workspace=True)
        ag_buf = symm.empty(s, dtype, device=dev, max_blocks=most)
        out, rs_out, ag_out = (torch.empty(k, dtype=dtype, device=dev) for k in (n, s, n))
        mine = slice(ctx.rank * s, (ctx.rank + 1) * s)
        for cfg in configs:
            ops = {
                "one_shot": (
                    lambda cfg=cfg, buf=buf, out=out: C.all_reduce(buf, out, algorithm="one_shot", config=cfg),
                    lambda y, ref=ref, scale=scale: _close(y, ref, w, scale),
                ),
                "two_shot": (
                    lambda cfg=cfg, buf=buf, out=out: C.all_reduce(buf, out, algorithm="two_shot", config=cfg),
                    lambda y, ref=ref, scale=scale: _close(y, ref, w, scale),
                ),
                "two_shot_in_place": (
                    lambda cfg=cfg, buf=buf: C.all_reduce(buf, buf.tensor, algorithm="two_shot", config=cfg),
                    lambda y, ref=ref, scale=scale: _close(y, ref, w, scale),
                ),
                "two_shot_ce_in_place": (
                    lambda cfg=cfg, buf=buf: C.all_reduce(buf, buf.tensor, algorithm="two_shot_ce", config=cfg),
                    lambda y, ref=ref, scale=scale: _close(y, ref, w, scale),
                ),
                "reduce_scatter": (
                    lambda cfg=cfg, buf=buf, rs_out=rs_out: C.reduce_scatter(buf, rs_out, config=cfg),
                    lambda y, ref=ref, scale=scale, mine=mine: _close(y, ref[mine], w, scale[mine]),
                ),
                "all_gather": (
                    lambda cfg=cfg, ag_buf=ag_buf, ag_out=ag_out: C.all_gather(ag_buf, ag_out, config=cfg),
                    lambda y, gathered=gathered: torch.equal(y, gathered),
                ),
            }
            for name, (call, check) in ops.items():
                op = "all_reduce" if "_shot" in name else name
                rec = {
                    "kind": "tune",
                    "impl": f"labkit_{name}" if op == "all_reduce" else "labkit",
                    "op": op,
                    "world_size": w,
                    "bytes": n * dtype.itemsize,
                    "dtype": dtype_name,
                    "timing": "graph_us",
                    "vectors": cfg.vectors,
                    "num_warps": cfg.num_warps,
                    "programs": cfg.programs,
                    "multiprocessors": sms,
                    "default": cfg == C.default_config(n * dtype.itemsize, w, dev, TUNE_KERNELS[name]),
                }
                buf.tensor.copy_(x)
                ag_buf.tensor.copy_(x[:s])
                rec["correct"] = _everywhere(bool(check(call())), dev)
                rec["us"] = _time(call, _iters(nbytes), reps, graph=True)
                rec["busbw_GBps"] = rec["bytes"] / rec["us"] / 1e3 * BUS_FACTOR[op](w)
                records.append(rec)
            bar.update()
        _progress(ctx, {"phase": "tune", "bytes": n * dtype.itemsize, "records": len(records)})
        del buf, ag_buf, ops, call, check  # the lambdas hold the buffers too
        torch.cuda.synchronize()
        dist.barrier()
    bar.close()
    return records


#: ``tune``'s names -> the kernel names of ``collectives.LAUNCH_TABLE``
TUNE_KERNELS = {
    "one_shot": "one_shot",
    "two_shot": "two_shot",
    "two_shot_in_place": "two_shot_in_place",
    "two_shot_ce_in_place": "two_shot_ce",
    "reduce_scatter": "reduce_scatter",
    "all_gather": "all_gather",
}


def launch_table_from(records: list[dict], margin: float = C.TABLE_MARGIN) -> dict:
    """``collectives.LAUNCH_TABLE`` as the ``tune`` records give it: for each kernel, world size
    and searched size, the fastest correct launch with one program per SM, where it took less
    than (1 - margin) x the time of ``collectives.rule_config``'s launch (one program per SM too)
    in the same search. A size without the rule's launch recorded has no entry."""
    groups: dict = {}
    for r in records:
        if r.get("kind") != "tune" or not r.get("correct") or not r.get("us"):
            continue
        if r["programs"] != r["multiprocessors"]:
            continue
        name = r["impl"].removeprefix("labkit_") if r["impl"] != "labkit" else r["op"]
        key = (TUNE_KERNELS[name], r["world_size"], r["bytes"])
        groups.setdefault(key, {})[(r["vectors"], r["num_warps"])] = r["us"]
    table = {}
    for (kernel, w, nbytes), times in sorted(groups.items()):
        rule = C.rule_config(nbytes, w)
        best = min(times, key=times.get)
        if rule in times and times[best] < (1 - margin) * times[rule]:
            table[(kernel, w, nbytes)] = best
    return table


def best_configs(records: list[dict]) -> list[dict]:
    """For each (impl, op, world size, bytes) of ``tune`` records: the fastest correct config,
    beside the time of ``default_config``'s choice (the evidence for the rule, or against it)."""
    groups: dict = {}
    for r in records:
        if r.get("kind") == "tune" and r.get("correct") and r.get("us"):
            groups.setdefault((r["impl"], r["op"], r["world_size"], r["bytes"]), []).append(r)
    rows = []
    for key, rs in sorted(groups.items()):
        best = min(rs, key=lambda r: r["us"])
        default = [r for r in rs if r.get("default")]
        rows.append(
            {
                "impl": key[0],
                "op": key[1],
                "world_size": key[2],
                "bytes": key[3],
                "best": {k: best[k] for k in ("vectors", "num_warps", "programs", "us", "busbw_GBps")},
                "default_us": default[0]["us"] if default else None,
            }
        )
    return rows


def tune_benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench collectives_tune``: ``tune`` on 2 ranks and, where the
    machine has more GPUs, on all of them."""
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.workbench import gates

    gates.requires(gpus=2, peer_access=True, compiled=True).check()
    n = torch.cuda.device_count()
    records = []
    for w in sorted({2, n}):
        records += run_ranks(tune, w, timeout=900).unwrap()[0]
        _progress_main({"phase": f"tune W={w} done"})
    return records


def _failure_detail(res) -> str:
    """The one-line summary per rank plus the tail of what failed ranks wrote to stderr."""
    tails = [f"rank {r.rank} stderr: ...{r.stderr.strip()[-300:]}" for r in res.failed if r.stderr.strip()]
    return "\n".join([res.summary()] + tails[:2])


#: (variant, algorithm, load, trials, elements) of the broken-variant runs: every variant with a
#: late rank at 256K elements; the correct kernel and the one without end barrier again with a
#: GEMM overlapping the collective on one rank, at 8M elements (long enough reads to be overtaken).
BROKEN_RUNS = [
    (v, a, "late", 60, 1 << 18)
    for v in ("correct", "relaxed", "no_end_barrier")
    for a in ("one_shot", "two_shot", "two_shot_in_place", "two_shot_ce_in_place")
] + [(v, a, "gemm", 12, 1 << 23) for v in ("correct", "no_end_barrier") for a in ("one_shot", "two_shot")]


def _broken_records(w: int, runs=BROKEN_RUNS, timeout: float = 60.0) -> list[dict]:
    """Each run in its own world with its own timeout, so that one that hangs is recorded as
    such and the others still run. If the correct kernel itself does not finish, the rest are
    not started (a hang that is not the variant's) and say so."""
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.labs.collectives import experiments

    rows = []
    blocked = None
    for variant, alg, load, trials, n in runs:
        row = {
            "kind": "broken",
            "impl": f"labkit_{alg}",
            "op": "all_reduce",
            "variant": variant,
            "load": load,
            "world_size": w,
            "bytes": n * 2,
            "dtype": "bfloat16",
            "us": None,
            "busbw_GBps": None,
            "trials": trials,
            "ranks_x_trials": trials * w,
            "wrong_results": None,
            "correct": False,
        }
        if blocked:
            rows.append(dict(row, outcome=f"not run: {blocked}"))
            continue
        res = run_ranks(experiments.broken_trials, w, variant, alg, trials, n, load=load, timeout=timeout)
        if res.ok:
            wrong = sum(r["wrong"] for r in res.values)
            row.update(
                wrong_results=wrong,
                correct=wrong == 0,
                outcome=f"{wrong} wrong of {trials * w}",
                seconds=max(r["seconds"] for r in res.values),
            )
        else:
            row["outcome"] = _failure_detail(res)
            if variant == "correct" and not rows:
                blocked = "the correct kernel did not finish the first of these experiments"
        rows.append(row)
        _progress_main(
            {"phase": "broken", "variant": variant, "algorithm": alg, "load": load, "outcome": row["outcome"]}
        )
    return rows


def _crash_record(w: int) -> dict:
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.labs.collectives import experiments

    res = run_ranks(experiments.unguarded_leaf, w, timeout=120)
    return {
        "kind": "crash",
        "impl": "labkit_tree",
        "op": "all_reduce",
        "variant": "unguarded_leaf",
        "world_size": w,
        "bytes": 4096 * 4,
        "dtype": "float32",
        "us": None,
        "busbw_GBps": None,
        "correct": bool(res.ok and all(res.values)),
        "statuses": [r.status for r in res.results],
        "outcome": res.summary(),
    }


def host_cost_records(
    w: int, cases=None, reps: int | None = None, launch_reps: int | None = None, timeout: float = 300
) -> list[dict]:
    """Records of kind "host_cost": the breakdowns of ``cases`` (default
    ``labkit.labs.collectives.host_cost.BENCH_CASES``) on ``w`` ranks, every rank's records (one eager
    call, stage by stage, per path), with the fields every record of this benchmark carries
    (``REQUIRED``)."""
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.labs.collectives import host_cost

    per_rank = run_ranks(
        host_cost.measure_cases, w, cases or host_cost.BENCH_CASES, "bfloat16", reps, launch_reps, timeout=timeout
    ).unwrap()
    return [
        dict(r, kind="host_cost", impl="labkit_all_reduce", busbw_GBps=None, correct=None)
        for rs in per_rank
        for r in rs
    ]


def _world_records(fn, w: int, kind: str, impl: str, op: str, timeout: float, rank0_only: bool) -> list[dict]:
    """``fn`` on ``w`` ranks in a world of its own (a failure or hang there costs its records, not
    the sweep's): rank 0's records (``rank0_only``) or every rank's, or one record of ``kind``
    saying how the run ended."""
    from labkit.kernels.comm.ranks import run_ranks

    res = run_ranks(fn, w, timeout=timeout)
    if res.ok:
        return list(res.values[0]) if rank0_only else [r for rs in res.values for r in rs]
    return [
        {
            "kind": kind,
            "impl": impl,
            "op": op,
            "world_size": w,
            "bytes": None,
            "dtype": "bfloat16",
            "us": None,
            "busbw_GBps": None,
            "correct": False,
            "outcome": _failure_detail(res),
        }
    ]


def order_and_profile_records(w: int) -> list[dict]:
    """The all-gather order comparison (``gather_order.compare_orders``, rank 0's timings, as the
    sweep's) and the profile of one ``two_shot_ce`` call (``ce_profile.profile_two_shot_ce``, every
    rank's activities), each in its own world. Estimated cost on 2 GPUs, not measured: about 20 s
    for the comparison (rank start-up, a fresh process compiling both orders at two launch configs,
    256 MiB inputs, 15 rounds x 2 orders x 3 sizes of graph replays) and about 15 s for the profile
    (rank start-up, warm-up calls, two profiles: the first starts CUPTI), so under a minute on the
    sweep's 274 s."""
    from labkit.labs.collectives import ce_profile, gather_order

    records = _world_records(
        gather_order.compare_orders, w, gather_order.KIND, "labkit", "all_gather", timeout=300, rank0_only=True
    )
    _progress_main({"phase": "all-gather orders done"})
    records += _world_records(
        ce_profile.profile_two_shot_ce,
        w,
        ce_profile.KIND,
        "labkit_two_shot_ce_in_place",
        "all_reduce",
        timeout=180,
        rank0_only=True,
    )
    _progress_main({"phase": "two_shot_ce profile done"})
    return records


def _progress_main(line: dict) -> None:
    import types

    _progress(types.SimpleNamespace(rank=0, world_size=None), line)


#: The parts of ``labkit bench collectives``, in the order they run, each a function of the
#: world size returning its records (every one tagged ``part``). ``PARTS_ENV`` (comma-separated)
#: runs only some of them; ``RESUME_ENV`` names an earlier file whose records of the parts not run
#: now are kept (marked ``resumed_from``), so a machine whose 10-minute calls cannot hold the
#: whole benchmark records it over several calls, each starting from the file the last one wrote.
PARTS_ENV = "LABKIT_COLLECTIVES_PARTS"
RESUME_ENV = "LABKIT_COLLECTIVES_RESUME"


def _sweep_part(w: int) -> list[dict]:
    from labkit.kernels.comm.ranks import run_ranks

    return [dict(r, kind=r.get("kind", "sweep")) for r in run_ranks(sweep, w, timeout=900).unwrap()[0]]


def _push_part(w: int) -> list[dict]:
    """The push and flag-in-data one-shots beside the pull one, ``all_reduce`` and torch's ops
    (kind "push"), then each public call's host µs at 4 KiB of bf16, interleaved in one process
    (kind "host_call": ``host_cost.call_costs``, every rank's records)."""
    from labkit.labs.collectives import host_cost, push_bench

    calls = _world_records(host_cost.call_costs, w, "host_call", "labkit_fid", "all_reduce", 300, rank0_only=False)
    return push_bench.push_records(w) + [dict(r, kind="host_call", busbw_GBps=None) for r in calls]


def _into_part(w: int) -> list[dict]:
    from labkit.labs.collectives import into_bench  # out of place into a symmetric output, at bandwidth sizes

    return _world_records(
        into_bench.into_series, w, into_bench.KIND, "labkit_into", "all_reduce", timeout=300, rank0_only=True
    )


PARTS = {
    "sweep": _sweep_part,
    "host_cost": host_cost_records,
    "orders": order_and_profile_records,
    "push": _push_part,
    "into": _into_part,
    "broken": _broken_records,
    "crash": lambda w: [_crash_record(w)],
}


def _mark_resumed(record: dict, commit: str | None) -> dict:
    """A kept record, its ``resumed_from`` dropped where it names the commit writing the file: a
    record without it was measured at the file's own ``env.git_commit``."""
    if record.get("resumed_from") == commit:
        return {k: v for k, v in record.items() if k != "resumed_from"}
    return record


def parts_to_run(value: str | None) -> list[str]:
    """The parts named in ``value`` (comma-separated; None or empty: all), in ``PARTS`` order."""
    if not value:
        return list(PARTS)
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        raise UsageError(f"{PARTS_ENV}: unknown part(s) {unknown}; the parts are {', '.join(PARTS)}")
    return [n for n in PARTS if n in names]


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench collectives``: the sweep on every GPU of this machine (one
    world), the host-cost breakdown, the all-gather orders and the ``two_shot_ce`` profile, the push
    one-shot, the out-of-place series into a symmetric output, then the broken variants under load
    and the unguarded-leaf crash (``PARTS``; ``PARTS_ENV`` and ``RESUME_ENV`` split it over calls).
    The crossover records are computed from the sweep records the file holds."""
    import datetime
    import os
    import time

    import torch

    from labkit.workbench import env, gates, results

    run_now = parts_to_run(os.environ.get(PARTS_ENV))
    gates.requires(gpus=2, peer_access=True, compiled=True).check()
    w = torch.cuda.device_count()
    kept = [r for r in results.resumable(os.environ.get(RESUME_ENV)) if r.get("kind") != "crossover"]
    kept = [
        _mark_resumed(r, env.git_commit()) for r in kept if r.get("part") not in run_now and r.get("world_size") == w
    ]
    records = []
    for name in PARTS:
        if name in run_now:
            # when each part ran, and for how long: what else shared the machine then can be read
            # off the time (a part kept from an earlier file keeps its own)
            started = time.time()
            part = PARTS[name](w)
            when = {
                "part_started": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds"),
                "part_s": round(time.time() - started, 1),
            }
            records += [dict(r, part=name, **when) for r in part]
            _progress_main({"phase": f"{name} done"})
        else:
            records += [r for r in kept if r.get("part") == name]
    for key in ("us", "graph_us"):
        records.append(
            {
                "kind": "crossover",
                "impl": "labkit",
                "op": "all_reduce",
                "world_size": w,
                "bytes": crossover_bytes(records, w, key),
                "dtype": "bfloat16",
                "timing": key,
                "us": None,
                "busbw_GBps": None,
                "correct": None,
            }
        )
    return records
