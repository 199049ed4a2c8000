"""Profiler evidence for ``two_shot_ce``: what the GPU ran for one in-place all-reduce whose first
shot is ``Tensor.copy_`` into the peers' workspaces.

The claim to check: the copies are copies (CUPTI memcpy activities, done by the copy engines),
not kernels on the SMs, and they sit between a one-program barrier kernel and the reduce kernel.
``profile_two_shot_ce`` records one call under ``torch.profiler`` on every rank (GPUs only) and
reduces the exported Chrome trace with ``summarize_trace`` to a few flat records: each GPU
activity's category, kind (e.g. "Memcpy DtoD" or "Memcpy PtoP", the copy kind CUPTI reports),
name, stream, start and duration, and bytes for copies. ``summary_markdown`` shows them as a
short table.
"""

from __future__ import annotations

import torch

from labkit.labs.collectives.messages import close_to_ref
from labkit.workbench import trace as wtrace
from labkit.workbench.trace import trace_events

KIND = "ce_profile"
#: the all-reduce message profiled: where the in-place ``auto`` takes ``two_shot_ce`` on 2 GPUs
MESSAGE_BYTES = 256 << 20
#: Chrome-trace categories of GPU activities (kineto's names; "Kernel" in older kineto) -> activity
GPU_CATEGORIES = dict(zip(wtrace.GPU_CATEGORIES, ("kernel", "memcpy", "memset")))
#: most table rows ``summary_markdown`` shows
MAX_ROWS = 15


def summarize_trace(trace) -> list[dict]:
    """The GPU activities of a Chrome trace (``trace``: the exported dict, or its ``traceEvents``),
    in order of start: dicts of ``activity`` ("kernel", "memcpy", "memset"), ``activity_kind``
    ("kernel", or the copy kind from the name: "Memcpy DtoD (Device -> Device)" -> "Memcpy DtoD"),
    ``name`` (at most 120 characters), ``copy_kernel`` (a kernel whose full name says copy),
    ``stream``, ``device``, ``start_us`` (from the first activity), ``us`` (duration) and
    ``copy_bytes`` (copies and sets; None for kernels)."""
    acts = []
    for e in trace_events(trace):
        activity = GPU_CATEGORIES.get(str(e.get("cat", "")).lower())
        if activity is None or e.get("ph") != "X":
            continue
        name = str(e.get("name", ""))
        args = e.get("args") or {}
        acts.append(
            {
                "activity": activity,
                "activity_kind": "kernel" if activity == "kernel" else name.split(" (")[0],
                "name": name[:120],
                "stream": args.get("stream"),
                "device": args.get("device"),
                # a copy done by the SMs: torch's copy kernels carry "copy" in their (long) names
                "copy_kernel": activity == "kernel" and "copy" in name.lower(),
                "ts": float(e.get("ts", 0.0)),
                "us": float(e.get("dur", 0.0)),
                "copy_bytes": None if activity == "kernel" else args.get("bytes"),
            }
        )
    acts.sort(key=lambda a: a["ts"])
    t0 = acts[0]["ts"] if acts else 0.0
    return [{**{k: v for k, v in a.items() if k != "ts"}, "start_us": a["ts"] - t0} for a in acts]


def host_calls(trace) -> str:
    """The host-side CUDA API calls of a Chrome trace that copy, set or launch, counted:
    "cuLaunchKernelEx x2, cudaMemcpyAsync x1" ("" when the trace has none)."""
    counts: dict = {}
    for e in trace_events(trace):
        wanted = any(w in str(e.get("name", "")).lower() for w in ("memcpy", "memset", "launch"))
        if str(e.get("cat", "")).lower() in wtrace.HOST_CATEGORIES and wanted:
            counts[e.get("name", "?")] = counts.get(e.get("name", "?"), 0) + 1
    return ", ".join(f"{name} x{k}" for name, k in sorted(counts.items()))


def _host_barrier():
    """A barrier on the host only (a gloo group beside NCCL): the profiled window then holds no
    NCCL kernel, and every rank has its profiler running before any launches."""
    import torch.distributed as dist

    group = dist.new_group(backend="gloo")
    return lambda: dist.barrier(group=group)


def profile_two_shot_ce(ctx, nbytes: int = MESSAGE_BYTES, dtype_name: str = "bfloat16", seed: int = 0) -> list[dict]:
    """Records of kind ``KIND``: one in-place ``two_shot_ce`` all-reduce of ``nbytes`` per rank,
    profiled on every rank (after warm-up calls and a first, discarded profile that starts CUPTI),
    every rank's GPU activities (one record each, in order, with its ``rank``); the result checked
    against the fp32 sum of every rank's input. Off GPUs: one record saying why it was skipped.
    Call on every rank; each returns all ranks' records."""
    import torch.distributed as dist

    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm

    if not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"nbytes: expected a positive int, got {nbytes!r}")
    dtype = getattr(torch, dtype_name)
    w, dev = ctx.world_size, ctx.device
    n = max(w, nbytes // dtype.itemsize)
    base = {
        "kind": KIND,
        "impl": "labkit_two_shot_ce_in_place",
        "op": "all_reduce",
        "world_size": w,
        "bytes": n * dtype.itemsize,
        "dtype": dtype_name,
        "busbw_GBps": None,
    }
    if dev.type != "cuda":
        return [dict(base, us=None, correct=None, skipped="needs GPUs: the copy engines and CUPTI's trace of them")]
    g = torch.Generator(device=dev)
    shards = [torch.randn(n, generator=g.manual_seed(seed * 1009 + r), device=dev) for r in range(w)]
    x = shards[ctx.rank].to(dtype)
    ref, scale = sum(shards), sum(s.abs() for s in shards)
    del shards
    buf = symm.empty(n, dtype, device=dev, workspace=True)
    for _ in range(2):  # compile, make the plan, warm the copy path: none of it in the trace
        buf.tensor.copy_(x)
        C.all_reduce(buf, buf.tensor, algorithm="two_shot_ce")
    line_up = _host_barrier()
    error, rows, calls = None, [], ""
    try:
        for _ in range(2):  # the first profile only starts CUPTI (its first traces can be slow): the second is kept
            buf.tensor.copy_(x)
            torch.cuda.synchronize(dev)
            trace = wtrace.profile_events(
                lambda: (line_up(), C.all_reduce(buf, buf.tensor, algorithm="two_shot_ce")), cuda=True, device=dev
            )
        rows, calls = summarize_trace(trace), host_calls(trace)
    except Exception as e:
        torch.cuda.synchronize(dev)
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    # the profiled call's result (unknown if the profile failed before or during the call)
    right = close_to_ref(buf.tensor, ref, w, scale) if error is None else None
    del ref, scale
    mine = [dict(base, rank=ctx.rank, index=i, correct=right, host_calls=calls, **row) for i, row in enumerate(rows)]
    if not mine:
        mine = [
            dict(
                base,
                rank=ctx.rank,
                us=None,
                correct=right,
                host_calls=calls,
                error=error or "the trace holds no GPU activity (CUPTI not tracing here?)",
            )
        ]
    everyone = [None] * w
    dist.all_gather_object(everyone, mine)
    flags = [r["correct"] for rs in everyone for r in rs]
    agreed = None if None in flags else all(flags)
    return [dict(r, correct=agreed) for rs in everyone for r in rs]


def profile_records(records: list[dict]) -> list[dict]:
    """The records of kind ``KIND`` that hold an activity; [] in files made before the profile."""
    return [r for r in records if r.get("kind") == KIND and r.get("activity")]


def verdict(records: list[dict]) -> str:
    """One line: per rank, how many kernels and copies one call ran, the copies' kinds, and whether
    any copy ran as a kernel (a kernel whose name says copy)."""
    recs = profile_records(records)
    if not recs:
        why = next((r.get("skipped") or r.get("error") for r in records if r.get("kind") == KIND), None)
        return f"no profile of two_shot_ce here{': ' + why if why else ' (recorded before it)'}"
    ranks = sorted({r["rank"] for r in recs})
    per = []
    for rank in ranks:
        rs = [r for r in recs if r["rank"] == rank]
        kernels = [r for r in rs if r["activity"] == "kernel"]
        copies = [r for r in rs if r["activity"] == "memcpy"]
        per.append((len(kernels), len(copies), tuple(sorted({r["activity_kind"] for r in copies}))))
    same = len(set(per)) == 1
    k, c, kinds = per[0]
    copy_kernels = [r["name"] for r in recs if r.get("copy_kernel")]
    counted = f"{k} kernel{'' if k == 1 else 's'} and {c} cop{'y' if c == 1 else 'ies'}"
    head = ("every rank" if same else f"rank {ranks[0]}") + f": {counted} ({', '.join(kinds) or 'no copy'})"
    tail = (
        "; no kernel named like a copy"
        if not copy_kernels
        else f"; kernels named like a copy: {sorted(set(copy_kernels))}"
    )
    return f"{recs[0]['world_size']} ranks, {recs[0]['bytes'] >> 20} MiB in place, one call: {head}{tail}" + (
        ""
        if same
        else "; the ranks differ: " + "; ".join(f"rank {r}: {p[0]} kernels, {p[1]} copies" for r, p in zip(ranks, per))
    )


def summary_markdown(records: list[dict], rank: int = 0, max_rows: int = MAX_ROWS) -> str:
    """``rank``'s activities of one call as a Markdown table of at most ``max_rows`` rows, in order
    of start; "" without any."""
    rs = [r for r in profile_records(records) if r["rank"] == rank]
    if not rs:
        return ""
    lines = [
        "| # | activity | kind | name | stream | start (µs) | duration (µs) | bytes | GB/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rs[:max_rows]:
        nb = r.get("copy_bytes")
        rate = f"{nb / r['us'] / 1e3:.0f}" if nb and r["us"] else ""
        name = r["name"] if len(r["name"]) <= 48 else r["name"][:45] + "..."
        lines.append(
            f"| {r['index']} | {r['activity']} | {r['activity_kind']} | `{name}` | {r.get('stream')} | "
            f"{r['start_us']:.1f} | {r['us']:.1f} | {nb if nb is not None else ''} | {rate} |"
        )
    if len(rs) > max_rows:
        lines.append(f"| | ... {len(rs) - max_rows} more | | | | | | | |")
    return "\n".join(lines)


__all__ = [
    "GPU_CATEGORIES",
    "KIND",
    "MESSAGE_BYTES",
    "host_calls",
    "profile_records",
    "profile_two_shot_ce",
    "summarize_trace",
    "summary_markdown",
    "verdict",
]
