"""The checks and measurements lab 04's comparison (``bench``) and sweep (``tune``) share:
the float32 reference on a few experts and the relative error against it, paired per-round
ratios, the host cost of a call, one call captured in a CUDA graph, and an error in one line.
Nothing here knows the lab's shapes or record fields (those are ``bench``'s)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import torch

from labkit.workbench import bench


def _checked_experts(counts: list[int]) -> list[int]:
    """A few experts to check against float32: the largest, the smallest non-empty, the first
    and the last non-empty (duplicates dropped)."""
    busy = [e for e, c in enumerate(counts) if c]
    picks = [max(busy, key=lambda e: counts[e]), min(busy, key=lambda e: counts[e]), busy[0], busy[-1]]
    return sorted(set(picks))


def _reference(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> dict[int, tuple[int, torch.Tensor]]:
    """expert -> (first row, float32 product) for the checked experts."""
    starts = list(itertools.accumulate([0] + counts[:-1]))
    return {
        e: (starts[e], x[starts[e] : starts[e] + counts[e]].float() @ w[e].float()) for e in _checked_experts(counts)
    }


def _rel_err(out: torch.Tensor, ref: dict[int, tuple[int, torch.Tensor]]) -> float:
    worst, scale = 0.0, 0.0
    for _, (r0, r) in ref.items():
        got = out[r0 : r0 + r.shape[0]].float()
        worst = max(worst, float((got - r).abs().max()))
        scale = max(scale, float(r.abs().max()))
    return worst / scale if scale else worst


def _paired(cmp: bench.Comparison, name: str, base: str) -> tuple[float, float, float]:
    """Median and quartiles of the per-round ratios time(name) / time(base) of one comparison."""
    r = sorted(a / b for a, b in zip(cmp.timings[name].samples_us, cmp.timings[base].samples_us))
    q = lambda p: r[round(p * (len(r) - 1))]  # noqa: E731  (bench.Comparison.ratio_iqr's rule)
    return statistics.median(r), q(0.25), q(0.75)


def _host_us(fn: Callable[[], object], calls: int, rounds: int, cuda: bool) -> float:
    """Median over ``rounds`` of the host time of ``calls`` calls without a sync, per call (µs):
    a call's launch cost, or all of its time where it waits for the GPU (the loop's tolist)."""
    samples = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(samples)


def _capture_one(fn: Callable[[], object]):
    """One call of fn captured in a CUDA graph on the current device, after a warm-up call on a
    side stream (compilation, lazy allocations); returns (graph, what the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def _capture_error(fn: Callable[[], object], device: torch.device) -> str | None:
    """Capture one call of fn in a CUDA graph (after a warm-up on a side stream); None if that
    works, else the error in one line. For implementations expected to capture: the one that
    cannot (the loop) is tried in a child process instead (``capture_check``)."""
    try:
        with torch.cuda.device(device):
            graph, _ = _capture_one(fn)
            del graph
        return None
    except Exception as e:
        return _one_line(e)


def _one_line(e: BaseException) -> str:
    """The error in one line, its first cause first: a failed capture raises again when the
    capture ends ("operation failed due to a previous error during capture"), which would
    otherwise hide the call that broke it."""

    def line(x: BaseException) -> str:
        text = str(x).strip().splitlines()
        return f"{type(x).__name__}: {text[0][:300] if text else ''}"

    root, seen = e, {id(e)}
    while root.__context__ is not None and id(root.__context__) not in seen:
        root = root.__context__
        seen.add(id(root))
    return line(root) if root is e else f"{line(root)} (then {line(e)})"
