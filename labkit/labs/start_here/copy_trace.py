"""What a 1 GiB ``torch.copy_`` runs on the GPU, eagerly and as a CUDA-graph replay, read from
``torch.profiler`` (CUDA activities).

Why: the copy benchmark (``copy_bandwidth``) measured the captured ``torch.copy_`` slower than the
eager one at 1 GiB. An eager same-device contiguous ``copy_`` is a ``cudaMemcpyAsync``; captured,
it becomes a memcpy node of the graph. The profiler's device activities say which work each path
really ran (a ``Memcpy DtoD`` or a kernel) and for how long; the runtime calls say how it was
issued (``cudaMemcpyAsync`` or ``cudaGraphLaunch``).

* ``summarize_trace(events)``: pure, reduces a Chrome-trace event list (what
  ``prof.export_chrome_trace`` writes) to one row per (activity, name): count and microseconds.
* ``compare_paths(eager, graph)``: pure, the verdict the two summaries support, and whether
  they settle the cause.
* ``trace_copy(nbytes)``: one eager copy and one replay of the captured copy, each profiled
  alone (GPU only); ``records(profile)`` runs it in a child process for ``labkit bench start_here``.
"""

from __future__ import annotations

from collections import defaultdict

from labkit.workbench import trace

KIND = "copy_trace"
PATHS = ("eager copy_", "graph replay")
#: What the GPU ran (the evidence), and what the host called to issue it.
DEVICE_ACTIVITIES = trace.GPU_CATEGORIES
HOST_CALLS = trace.HOST_CATEGORIES
TRACE_BYTES = 1 << 30  # the size at which the benchmark's graph replay was slower
#: A graph's device work counts as slower only past this share: run-to-run spread of a 1 GiB copy
#: in the benchmark's records is well under it (p25-p75 within 0.3 %).
SLOWER_BY = 0.10


def summarize_trace(events, kinds=DEVICE_ACTIVITIES + HOST_CALLS) -> list[dict]:
    """One row per (activity, name) among complete events ("ph": "X") whose category is in
    ``kinds``: {"activity", "name", "count", "us" (summed duration), "us_max"}, in the order of
    ``kinds``, then by time. Events of other categories (CPU ops, flow arrows, metadata) are left out."""
    if isinstance(events, (str, bytes, dict)) or not hasattr(events, "__iter__"):
        raise ValueError(f"events: expected a list of trace events (dicts), got {type(events).__name__}")
    kinds = tuple(kinds) if not isinstance(kinds, str) else (kinds,)
    if not kinds or not all(isinstance(k, str) for k in kinds):
        raise ValueError(f"kinds: expected one or more category names, got {kinds!r}")
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ValueError(f"events: item {i} is a {type(e).__name__}, not a trace event dict")
        if e.get("ph") != "X" or e.get("cat") not in kinds:
            continue
        dur = e.get("dur")
        if not isinstance(dur, (int, float)) or dur < 0:
            raise ValueError(f"events: item {i} ({e.get('name')!r}) has no duration ('dur': {dur!r})")
        groups[(e["cat"], str(e.get("name")))].append(float(dur))
    rows = [
        {"activity": cat, "name": name, "count": len(ds), "us": sum(ds), "us_max": max(ds)}
        for (cat, name), ds in groups.items()
    ]
    return sorted(rows, key=lambda r: (kinds.index(r["activity"]), -r["us"], r["name"]))


def device_work(rows: list[dict]) -> list[dict]:
    """The rows of a summary that ran on the GPU (kernels, memcpys, memsets)."""
    return [r for r in rows if r.get("activity") in DEVICE_ACTIVITIES]


def _names(rows: list[dict]) -> str:
    return ", ".join(f"{r['count']} x {r['activity']} '{r['name']}'" for r in rows)


def compare_paths(eager: list[dict], graph: list[dict], slower_by: float = SLOWER_BY) -> dict:
    """What two summaries (eager copy, graph replay) show: {"settled", "verdict"}.

    Settled means the device work itself differs: a different activity or name (a kernel where
    eager ran a memcpy, say), or the same one taking more than ``1 + slower_by`` times as long.
    The same work in about the same time refutes the memcpy-node hypothesis, which settles nothing
    about the cause; a path without device activity in its trace settles nothing either."""
    if slower_by < 0:
        raise ValueError(f"slower_by: expected >= 0, got {slower_by}")
    e, g = device_work(eager), device_work(graph)
    for label, rows in (("eager copy_", e), ("graph replay", g)):
        if not rows:
            return {"settled": False, "verdict": f"the {label} trace holds no GPU activity: not settled"}
    e_us, g_us = sum(r["us"] for r in e), sum(r["us"] for r in g)
    kinds = lambda rows: sorted({(r["activity"], r["name"]) for r in rows})  # noqa: E731
    if kinds(e) != kinds(g):
        return {
            "settled": True,
            "verdict": (
                f"the GPU ran different work: eager {_names(e)} ({e_us:,.0f} us); graph replay "
                f"{_names(g)} ({g_us:,.0f} us)"
            ),
        }
    if g_us > (1 + slower_by) * e_us:
        return {
            "settled": True,
            "verdict": (
                f"the same work ({_names(g)}) took {g_us:,.0f} us in the graph against {e_us:,.0f} us "
                f"eager: the memcpy node itself runs slower (how the driver runs it is not in the trace)"
            ),
        }
    return {
        "settled": False,
        "verdict": (
            f"the same work ({_names(g)}) in about the same time ({g_us:,.0f} us in the graph, "
            f"{e_us:,.0f} us eager): not the memcpy node; the cause is not settled"
        ),
    }


def profiled_events(fn, device=None) -> list[dict]:
    """Chrome-trace events of one call of ``fn`` under ``torch.profiler`` (CPU activities, plus CUDA
    ones and a synchronize before the profiler stops when ``device`` is a CUDA device)."""
    import torch

    cuda = device is not None and torch.device(device).type == "cuda"
    return trace.profile_events(fn, cuda=cuda, device=device)


def trace_copy(nbytes: int = TRACE_BYTES, device=None) -> list[dict]:
    """One eager ``out.copy_(x)`` and one replay of the same copy captured as the benchmark
    captures it (``bench._capture``), each profiled alone after a warm-up, on a CUDA device.
    One flat record per (path, activity, name) of ``summarize_trace``."""
    import torch

    from labkit.workbench import bench, tier

    if not (isinstance(nbytes, int) and nbytes >= 4 and nbytes % 4 == 0):
        raise ValueError(f"nbytes: {nbytes!r} is not a positive multiple of 4 bytes (float32)")
    device = torch.device(device) if device is not None else tier.kernel_device()
    if device.type != "cuda":
        raise ValueError(f"device: the trace needs a CUDA device, got {device}")
    x = torch.randn(nbytes // 4, device=device)
    out = torch.empty_like(x)
    eager = lambda: out.copy_(x)  # noqa: E731
    graph = bench._capture(eager, 1, device)  # the very capture the cuda_graph timings replay
    for _ in range(3):  # warm-up outside the profiler: first launches, clocks
        eager()
        graph.replay()
    torch.cuda.synchronize(device)
    traced = {"eager copy_": profiled_events(eager, device), "graph replay": profiled_events(graph.replay, device)}
    correct = bool(torch.equal(out, x))
    return [_record(nbytes, path, row, correct) for path in PATHS for row in summarize_trace(traced[path])]


def _record(nbytes: int, path: str | None, row: dict | None, correct, **extra) -> dict:
    """A flat record carrying the workbench benchmark's required fields (None where a field is
    a timing statistic the trace does not have)."""
    row = row or {}
    return {
        "kind": KIND,
        "impl": "torch.copy_",
        "bytes": nbytes,
        "path": path,
        "activity": row.get("activity"),
        "name": row.get("name"),
        "count": row.get("count"),
        "us": row.get("us"),
        "us_max": row.get("us_max"),
        "us_p25": None,
        "us_p75": None,
        "GBps": None,
        "ratio_vs_torch": None,
        "correct": correct,
        "method": "torch.profiler",
        "skipped": None,
        "error": None,
        **extra,
    }


def records(profile: str, timeout: float = 300.0) -> list[dict]:
    """The trace for ``labkit bench start_here``: on a GPU, ``trace_copy`` in a child process (a
    profiler failure must not lose the sweep's records; it comes back as one record with its
    ``error``); without one, one record with the ``skipped`` reason."""
    from labkit.workbench import gates, sandbox

    gate = gates.requires(gpus=1, compiled=True)
    if not gate.ok or profile != "gpu":
        reason = gate.reason if not gate.ok else f"profile {profile!r}: the trace runs at 1 GiB on the gpu profile"
        return [_record(TRACE_BYTES, None, None, None, skipped=reason)]
    res = sandbox.run_isolated(trace_copy, TRACE_BYTES, timeout=timeout)
    if res.ok:
        return res.value
    return [_record(TRACE_BYTES, None, None, None, error=res.summary())]


def summaries(recs: list[dict]) -> dict:
    """Back from flat records to {path: summary rows}, plus "skipped"/"error" when a record says so."""
    out: dict = {}
    for r in recs:
        if r.get("kind") != KIND:
            continue
        if r.get("skipped") or r.get("error"):
            out["skipped" if r.get("skipped") else "error"] = r.get("skipped") or r.get("error")
            continue
        out.setdefault(r["path"], []).append({k: r[k] for k in ("activity", "name", "count", "us", "us_max")})
    return out


def report(recs: list[dict], label: str) -> str:
    """Lines for the notebook: the rows of each path, then the verdict; or why there are none."""
    s = summaries(recs)
    if not any(p in s for p in PATHS):
        why = s.get("skipped") or s.get("error")
        return f"{label}: no profiler trace of the 1 GiB copy" + (f" ({why})" if why else "")
    nbytes = next(r["bytes"] for r in recs if r.get("kind") == KIND and r.get("path"))
    lines = [f"{label}: torch.profiler, one {nbytes / 2**30:g} GiB torch.copy_ per path"]
    for path in PATHS:
        lines.append(f"  {path}:")
        for row in s.get(path, []):
            lines.append(f"    {row['activity']:<13} {row['name'][:48]:<48} x{row['count']:<3} {row['us']:10,.1f} us")
    v = compare_paths(s.get("eager copy_", []), s.get("graph replay", []))
    lines.append(("  SETTLED: " if v["settled"] else "  NOT SETTLED: ") + v["verdict"])
    return "\n".join(lines)
