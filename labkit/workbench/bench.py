"""Timing that can be trusted: warm-up, device-side timers, many samples, medians and spread,
and comparisons measured in one run.

* ``time_fn(fn)``: one function. On CUDA it records a pair of CUDA events around ``inner``
  back-to-back calls per sample (``method="cuda_events"``), or captures those calls in a CUDA
  graph and times its replays (``method="cuda_graph"``: launch gaps mostly gone). On the CPU
  (interpreter tier) it reads ``time.perf_counter`` (``method="cpu_clock"``).
* ``compare({"baseline": f, "new": g}, baseline="baseline")``: every candidate is sampled in
  the same rounds, interleaved (f g f g ...), so clock and thermal drift hit all of them alike.
  The ratio is reported as the median of the per-round paired ratios, with its quartiles.

A sample is the time of ``inner`` calls divided by ``inner``. Report medians; the spread is the
interquartile range. Benchmarks are not tests: correctness is checked separately, before timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable

import torch

METHODS = ("auto", "cuda_events", "cuda_graph", "cpu_clock")


@dataclasses.dataclass
class Timing:
    method: str
    samples_us: list[float]
    inner: int

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    def quantile_us(self, q: float) -> float:
        s = sorted(self.samples_us)
        return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]

    @property
    def p25_us(self) -> float:
        return self.quantile_us(0.25)

    @property
    def p75_us(self) -> float:
        return self.quantile_us(0.75)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    def as_dict(self) -> dict:
        return {
            "us": self.median_us,
            "us_p25": self.p25_us,
            "us_p75": self.p75_us,
            "us_min": self.min_us,
            "samples": len(self.samples_us),
            "inner": self.inner,
            "method": self.method,
        }


@dataclasses.dataclass
class Comparison:
    baseline: str
    timings: dict[str, Timing]
    #: per candidate, the per-round ratios time(candidate) / time(baseline)
    paired_ratios: dict[str, list[float]]

    def ratio(self, name: str) -> float:
        """Median of the paired per-round ratios time(name) / time(baseline); < 1 is faster."""
        return statistics.median(self.paired_ratios[name])

    def ratio_iqr(self, name: str) -> tuple[float, float]:
        r = sorted(self.paired_ratios[name])
        q = lambda p: r[round(p * (len(r) - 1))]  # noqa: E731
        return q(0.25), q(0.75)

    def ratio_to(self, name: str, other: str) -> tuple[float, float, float]:
        """(median, p25, p75) of the per-round ratios time(name) / time(other): the ratio to a
        candidate other than the baseline (e.g. the fastest of a group, chosen after timing)."""
        r = sorted(a / b for a, b in zip(self.timings[name].samples_us, self.timings[other].samples_us))
        q = lambda p: r[round(p * (len(r) - 1))]  # noqa: E731
        return statistics.median(r), q(0.25), q(0.75)


def _resolve_method(method: str, device: torch.device | None) -> str:
    if method not in METHODS:
        raise ValueError(f"method: {method!r} is not one of {METHODS}")
    is_cuda = device is not None and torch.device(device).type == "cuda"
    if method == "auto":
        return "cuda_events" if is_cuda else "cpu_clock"
    if method in ("cuda_events", "cuda_graph") and not is_cuda:
        raise ValueError(f"method={method!r} needs device to be a CUDA device, got {device}")
    return method


class _Sampler:
    """Takes one sample of one function with the chosen method."""

    def __init__(self, fn: Callable[[], object], method: str, device, inner: int):
        self.fn, self.method, self.inner, self.device = fn, method, inner, device
        self.graph = None
        self.pending: list[tuple] = []  # CUDA events, resolved after one synchronize
        self.samples: list[float] = []
        if method == "cuda_graph":
            self.graph = _capture(fn, inner, device)

    def sample(self) -> None:
        if self.method == "cpu_clock":
            t0 = time.perf_counter()
            for _ in range(self.inner):
                self.fn()
            self.samples.append((time.perf_counter() - t0) * 1e6 / self.inner)
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if self.graph is not None:
            self.graph.replay()
        else:
            for _ in range(self.inner):
                self.fn()
        end.record()
        self.pending.append((start, end))

    def finish(self) -> Timing:
        if self.pending:
            torch.cuda.synchronize(self.device)
            self.samples += [s.elapsed_time(e) * 1e3 / self.inner for s, e in self.pending]
            self.pending = []
        return Timing(self.method, self.samples, self.inner)


def _capture(fn: Callable[[], object], inner: int, device) -> torch.cuda.CUDAGraph:
    """Capture ``inner`` calls of fn in a CUDA graph (warmed up on a side stream first)."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn()
        torch.cuda.synchronize()
        return graph


def _check_counts(warmup: int, reps: int, inner: int) -> None:
    if warmup < 0:
        raise ValueError(f"warmup: expected >= 0, got {warmup}")
    if reps < 1:
        raise ValueError(f"reps: expected >= 1, got {reps}")
    if inner < 1:
        raise ValueError(f"inner: expected >= 1, got {inner}")


def time_fn(
    fn: Callable[[], object], *, device=None, warmup: int = 5, reps: int = 30, inner: int = 1, method: str = "auto"
) -> Timing:
    """Median-ready samples of ``fn()``; ``device`` is the CUDA device it runs on, or None/CPU."""
    return compare(
        {"fn": fn}, baseline="fn", device=device, warmup=warmup, reps=reps, inner=inner, method=method
    ).timings["fn"]


def compare(
    candidates: dict[str, Callable[[], object]],
    *,
    baseline: str,
    device=None,
    warmup: int = 5,
    reps: int = 30,
    inner: int = 1,
    method: str = "auto",
    line_up: Callable[[], object] | None = None,
) -> Comparison:
    """Time every candidate in the same interleaved rounds; ratios are paired per round.

    line_up: called before every sample (e.g. synchronize the device and wait at a barrier of all
    ranks, so that each sample of a collective starts with the GPUs idle and the ranks together)."""
    if baseline not in candidates:
        raise ValueError(f"baseline: {baseline!r} is not one of the candidates {list(candidates)}")
    _check_counts(warmup, reps, inner)
    method = _resolve_method(method, device)
    ctx = torch.cuda.device(device) if method != "cpu_clock" else contextlib.nullcontext()
    with ctx:
        for fn in candidates.values():  # warm-up: compilation, autotuning, caches, clocks
            for _ in range(warmup):
                fn()
        if method != "cpu_clock":
            torch.cuda.synchronize()
        samplers = {name: _Sampler(fn, method, device, inner) for name, fn in candidates.items()}
        names = list(candidates)
        for r in range(reps):
            # rotate the order each round so no candidate always runs first
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if line_up is not None:
                    line_up()
                samplers[name].sample()
        timings = {name: s.finish() for name, s in samplers.items()}
    base = timings[baseline].samples_us
    paired = {name: [a / b for a, b in zip(t.samples_us, base)] for name, t in timings.items()}
    return Comparison(baseline, timings, paired)


def gbps(nbytes: float, us: float) -> float:
    """Bytes per microsecond to GB/s (1 GB = 1e9 bytes)."""
    return nbytes / us / 1e3


@functools.cache
def sleep_cycles_per_ms(device_index: int) -> float:
    """``torch.cuda._sleep`` spins for a number of GPU clock cycles; measure how many make 1 ms.

    Labs use the sleep to hold a stream busy for a set time (a race window, a late rank).
    Measured once per device and process: call it before the window opens, since it synchronizes."""
    with torch.cuda.device(device_index):
        cycles = 20_000_000
        torch.cuda._sleep(1000)  # load the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = math.inf
        for _ in range(3):
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end))
        return cycles / best
