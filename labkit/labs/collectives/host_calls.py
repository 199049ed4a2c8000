"""The host µs of one call of each public all-reduce, side by side (``HOST_CALLS``): the push and
flag-in-data one-shots, ``all_reduce`` with flag-in-data and with its own choice, and torch's
in-place op, at one small size, in one process, interleaved (``call_costs``, a rank function;
part "push" of ``labkit bench collectives`` records it as kind "host_call"), with where on the host
the process ran (``where_it_ran``) and a line per size (``call_costs_summary``). Where the time of
one call goes, stage by stage, is ``host_cost``.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import symm
from labkit.labs.collectives.rank_timing import line_up as _line_up
from labkit.workbench import tier

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
    from labkit.labs.collectives import checks

    interp = tier.interpreted()
    rounds = rounds or (3 if interp else 15)
    calls = calls or (2 if interp else 200)
    dtype = getattr(torch, dtype_name)
    dev = ctx.device
    cands, absent = _host_call_candidates(ctx, n, dtype)
    mine, everyone = checks.rank_inputs(ctx, n, dtype, seed)
    correct = {}
    for name, (call, source) in cands.items():
        source.copy_(mine)
        y = call()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        correct[name] = checks.close_to_sum(y, everyone, dtype, ctx.world_size)
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
