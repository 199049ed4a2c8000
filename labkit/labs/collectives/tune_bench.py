"""The launch-configuration search of lab 02 (``labkit bench collectives_tune``): every launch of a
grid for labkit's all-reduce kernels, reduce-scatter and all-gather, timed by CUDA-graph replay at a
few sizes, each checked first (``tune``); what the records say: the table of launches that beat the
rule (``launch_table_from``, ``collectives.LAUNCH_TABLE``) and the fastest config beside the
default's (``best_configs``).
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
from labkit.labs.collectives.messages import progress as _progress
from labkit.labs.collectives.messages import progress_main as _progress_main
from labkit.labs.collectives.rank_timing import median_us as _time

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
