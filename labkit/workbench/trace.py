"""torch.profiler traces as plain event lists: what the labs that read a trace share (lab 00's
copy, lab 02's copy-engine all-reduce, lab 04's MoE step).

``profile_events(fn, ...)`` runs ``fn`` once under the profiler and returns the Chrome trace's
events (what ``prof.export_chrome_trace`` writes); ``trace_events(trace)`` accepts such a trace
as the exported dict or its event list. Each lab reduces the events its own way.
"""

from __future__ import annotations

import json
import os
import tempfile

#: Chrome-trace categories of what the GPU ran (kineto's names)
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
#: Chrome-trace categories of the host's CUDA API calls (what the process asked the driver for)
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")


def profile_events(fn, *, cuda: bool, label: str | None = None, device=None) -> list[dict]:
    """Run ``fn()`` once under torch.profiler (CPU activities, and CUDA ones if ``cuda``), inside a
    ``record_function(label)`` range when ``label`` is given; the trace's events. With ``cuda``, a
    synchronize (of ``device``, default the current one) after ``fn`` lets its GPU work finish
    inside the profile, outside the labelled range."""
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with record_function(label) if label else contextlib.nullcontext():
            fn()
        if cuda:
            torch.cuda.synchronize(device)
    fd, path = tempfile.mkstemp(suffix=".json", prefix="labkit-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)


def trace_events(trace) -> list[dict]:
    """The events of a Chrome trace given as the exported dict or as its list of event dicts."""
    if isinstance(trace, dict):
        if "traceEvents" not in trace:
            raise ValueError("trace: a Chrome-trace dict needs a 'traceEvents' list")
        trace = trace["traceEvents"]
    if not isinstance(trace, (list, tuple)) or not all(isinstance(e, dict) for e in trace):
        raise ValueError(
            "trace: expected a Chrome-trace dict (torch.profiler's export_chrome_trace) or its "
            f"list of event dicts, got {type(trace).__name__}"
        )
    return list(trace)
