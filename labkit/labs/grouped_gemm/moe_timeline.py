"""Where the GPU waits: one MoE training step under ``torch.profiler``, reduced to a small record.

A host sync shows on a timeline as a hole in the GPU's row: the host stops in ``.tolist()``
until the router's kernels finish, and the GPU has nothing queued until the host, released,
launches the expert loop. ``timeline`` profiles one ``moe.forward_backward`` (or one replay of
its captured graph) after warm-up; ``reduce_trace`` turns the profiler's chrome trace into a
record a results file can hold (kind="timeline"):

* ``kernels``: GPU activity (kernels, copies, memsets) as [start_us, dur_us, short name,
  busy_us], µs from the step's start (the host entering the step); busy_us < dur_us for an
  interval merged from several (below);
* ``syncs``: the host calls that wait for the GPU (stream/device/event synchronize, a blocking
  device-to-host copy, ``aten::item`` / ``aten::_local_scalar_dense``), same form;
* ``gpu_idle_us``: the step's span minus the union of the GPU intervals, computed on the full
  trace before anything is merged; the span runs from the host entering the step to the later
  of the host leaving it and the last GPU activity.

At most ``max_intervals`` intervals are kept per row: neighbours separated by the smallest gaps
are merged first, so the large gaps (the idle time the figure is about) survive. A profiler that
returns no GPU events (no CUPTI, or the CPU tier) gives a record that says so, not an error.
"""

from __future__ import annotations

import re

import torch

from labkit.labs.grouped_gemm import moe, moe_graph
from labkit.workbench import trace
from labkit.workbench.errors import UsageError

#: name of the ``record_function`` range that marks the profiled step
STEP = "moe_step"
GPU_CATEGORIES = trace.GPU_CATEGORIES
#: host calls that block until the GPU catches up (a cudaMemcpyAsync counts only when device to host)
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::tolist",
)


def short_name(name: str, width: int = 40) -> str:
    """A kernel's name without return type, namespaces, template and parameter lists."""
    name = re.sub(r"^void\s+", "", name).replace("(anonymous namespace)", "anon")
    while True:  # drop <...> from the innermost out
        stripped = re.sub(r"<[^<>]*>", "", name)
        if stripped == name:
            break
        name = stripped
    name = name.split("(", 1)[0].split("::")[-1].strip() or name
    return name if len(name) <= width else name[: width - 1] + "…"


def union_us(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of (start, end) intervals clipped to [lo, hi]."""
    total, reach = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def merge_smallest_gaps(intervals: list[list], max_intervals: int) -> list[list]:
    """[[start, end, name], ...] sorted by start -> at most ``max_intervals`` of
    [start, end, name, busy]: the neighbours with the smallest gaps between them are merged.

    A merged interval is named after its first member with the count of the others
    ("gemm (+12)"), and ``busy`` keeps how much of it its members really cover: a stretch of many
    short kernels with gaps between them (a launch-bound loop) must not be drawn as solid work."""
    if len(intervals) > max_intervals:
        gaps = sorted(b[0] - a[1] for a, b in zip(intervals, intervals[1:]))
        threshold = gaps[len(intervals) - max_intervals - 1]  # merging every gap <= this is enough
    else:
        threshold = float("-inf")  # nothing to merge
    merged, members = [], []
    for start, stop, name in intervals:
        if merged and start - merged[-1][1] <= threshold:
            last = merged[-1]
            last[3] += max(0.0, stop - max(start, last[1]))  # the part not already covered
            last[1] = max(last[1], stop)
            members[-1] += 1
        else:
            merged.append([start, stop, name, stop - start])
            members.append(1)
    for iv, n in zip(merged, members):
        if n > 1:
            iv[2] = f"{iv[2]} (+{n - 1})"
    return merged


def _cat(event: dict) -> str:
    return str(event.get("cat", "")).lower()


def _step_bounds(complete: list[dict]) -> tuple[float, float]:
    """(start, end) of the host's ``STEP`` range; without one, of every complete event."""
    steps = [e for e in complete if e.get("name") == STEP and _cat(e) == "user_annotation"]
    if steps:
        return steps[0]["ts"], steps[0]["ts"] + steps[0].get("dur", 0)
    if complete:
        return min(e["ts"] for e in complete), max(e["ts"] + e.get("dur", 0) for e in complete)
    return 0.0, 0.0


def _host_waits(complete: list[dict], t0: float, host_end: float) -> list[list]:
    """[start, end, name] of the calls in the step that block the host until the GPU catches up."""
    d2h = {
        e.get("args", {}).get("correlation")
        for e in complete
        if _cat(e) == "gpu_memcpy" and "dtoh" in e.get("name", "").lower()
    }

    def waits(e):
        if e.get("name") in SYNC_CALLS:
            return True
        return e.get("name") == "cudaMemcpyAsync" and e.get("args", {}).get("correlation") in d2h

    return sorted(
        (
            [e["ts"], e["ts"] + e.get("dur", 0), e["name"]]
            for e in complete
            if t0 <= e["ts"] <= host_end and _cat(e) != "user_annotation" and waits(e)
        ),
        key=lambda iv: iv[0],
    )


def reduce_trace(events: list[dict], *, max_intervals: int = 300) -> dict:
    """The timeline fields of a chrome trace's ``traceEvents`` (see the module docstring)."""
    if isinstance(max_intervals, bool) or not isinstance(max_intervals, int) or max_intervals < 1:
        raise UsageError(f"max_intervals: expected a positive int, got {max_intervals!r}")
    complete = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    t0, host_end = _step_bounds(complete)
    gpu = sorted(
        (
            [e["ts"], e["ts"] + e.get("dur", 0), short_name(e.get("name", "?"))]
            for e in complete
            if _cat(e) in GPU_CATEGORIES and e["ts"] >= t0
        ),
        key=lambda iv: iv[0],
    )
    syncs = _host_waits(complete, t0, host_end)
    end = max([host_end] + [iv[1] for iv in gpu])
    busy = union_us([(a, b) for a, b, _ in gpu], t0, end)  # on the full trace, before merging

    def rows(intervals):
        return [
            [round(a - t0, 2), round(b - a, 2), n, round(busy, 2)]
            for a, b, n, busy in merge_smallest_gaps(intervals, max_intervals)
        ]

    record = {
        "device_events": bool(gpu),
        "span_us": round(end - t0, 2),
        "host_us": round(host_end - t0, 2),
        "gpu_events": len(gpu),
        "gpu_busy_us": None,
        "gpu_idle_us": None,
        "gpu_idle_share": None,
        "sync_calls": len(syncs),
        "sync_us": round(union_us([(a, b) for a, b, _ in syncs], t0, end), 2),
        "kernels": rows(gpu),
        "syncs": rows(syncs),
        "merged": len(gpu) > max_intervals or len(syncs) > max_intervals,
        "note": "the profiler returned no GPU events (no CUDA activity recorded)",
    }
    if gpu:
        record.update(
            gpu_busy_us=round(busy, 2),
            gpu_idle_us=round(end - t0 - busy, 2),
            gpu_idle_share=(end - t0 - busy) / (end - t0) if end > t0 else 0.0,
            note=None,
        )
    return record


def profile_events(fn, *, cuda: bool) -> list[dict]:
    """Run ``fn()`` once inside a ``STEP`` range under torch.profiler (CPU, and CUDA if ``cuda``);
    the chrome trace's events. The synchronize after the range lets the GPU's work finish
    inside the profile without counting as a host sync of the step."""
    return trace.profile_events(fn, cuda=cuda, label=STEP)


def timeline(
    layer: moe.MoELayer,
    x: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    graph: bool = False,
    warmup: int = 2,
    max_intervals: int = 300,
) -> dict:
    """One profiled training step of ``layer`` (``reduce_trace``'s fields plus kind, impl, method).

    graph=True profiles one replay of the step captured by ``moe_graph.CapturedStep`` (needs
    sync="device" and CUDA). ``warmup`` steps run first, outside the profile, so compilation and
    first-launch costs stay out of it. On the CPU tier the trace has no GPU events and the record
    says so."""
    if not isinstance(layer, moe.MoELayer):
        raise TypeError(f"layer: expected an MoELayer, got {type(layer).__name__}")
    moe_graph.check_step_inputs(layer, x, grad_out)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise UsageError(f"warmup: expected an int >= 0, got {warmup!r}")
    cuda = x.device.type == "cuda"
    if graph:
        moe_graph.cuda_device_of(layer, sync="device")
        fn = moe_graph.CapturedStep(layer, x, grad_out).replay
    else:

        def fn():
            moe.forward_backward(layer, x, grad_out)

    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(x.device)
    record = reduce_trace(profile_events(fn, cuda=cuda), max_intervals=max_intervals)
    return {
        "kind": "timeline",
        "impl": "device" if layer.sync == "device" else "host_sync",
        "method": "graph" if graph else "eager",
        "tokens": x.shape[0],
        "experts": layer.num_experts,
        **record,
    }


__all__ = [
    "GPU_CATEGORIES",
    "STEP",
    "SYNC_CALLS",
    "merge_smallest_gaps",
    "profile_events",
    "reduce_trace",
    "short_name",
    "timeline",
    "union_us",
]
