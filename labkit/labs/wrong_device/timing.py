"""Kernel time of the device-confusion matrix's cells, from CUDA events on the launch's own stream.

Why not the host clock: a launch returns before its kernel runs, so ``time.perf_counter`` around
Python calls measures launch overhead, the guard, allocations and synchronisation as much as the
kernel (the first recorded matrix had a guarded cell slower than an unguarded one over NVLink).

Why events are recorded at the launch itself: the stream a Triton kernel runs on is the current
stream of the *current* device at the moment of the launch, and that is what differs between the
cells (``expected_launch_device``): unguarded launches run on cuda:0's stream although the data
lives on cuda:1, guarded ones on cuda:1's, the stream pattern on a fresh side stream, and a graph
replays on the stream current at replay. Events recorded around the Python call on one fixed
device's stream would bracket nothing in some cells. So, while a ``KernelTimer`` is active, the
launch sites (``experiments._raw_launch`` and the graph replay) call ``around_launch``, which
takes ``torch.cuda.current_stream()`` there and then, i.e. the launch's own stream.

Why a sleep before each start event: events time what their stream executes between them. With
the stream idle, the start event would fire at once and the span would include the host's launch
path; behind a short ``torch.cuda._sleep`` the host has enqueued the kernel before the start event
runs, so the span is the kernel (plus the event overhead, about a microsecond).
"""

from __future__ import annotations

import contextlib
import statistics

import torch

#: cycles slept on the launch stream before each timed launch: about 0.5 ms at the H200's
#: ~2 GHz clock, far longer than the host needs to enqueue one Triton launch or graph replay
SLEEP_CYCLES = 1_000_000
#: the matrix's four ways of launching on the wrong device (``experiments.PATTERNS`` is this)
PATTERNS = ("triton_launch", "scratch_current_device", "stream_current_device", "graph_wrong_device")
TIMING = "cuda_events"  # the value of a record's "timing" field; files without it used the host clock

#: the timer the launch sites report to (None: not timing, launches untouched)
ACTIVE: KernelTimer | None = None


def expected_launch_device(pattern: str, guarded: bool, data_device: int = 1, current_device: int = 0) -> int:
    """The device whose stream runs a matrix cell's kernel (the data on ``data_device``, while
    ``current_device`` is current): the guard makes the data's device current for the launch;
    without it every pattern launches on the current device (Triton's launch, ``device="cuda"``
    scratch, ``torch.cuda.Stream()``, and the graph, captured and replayed under it)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern: {pattern!r} is not one of {PATTERNS}")
    if not isinstance(guarded, bool):
        raise TypeError(f"guarded: expected a bool, got {guarded!r}")
    return data_device if guarded else current_device


class KernelTimer:
    """Collects (device index, start event, end event) for every launch made while active."""

    def __init__(self, sleep_cycles: int = SLEEP_CYCLES):
        if not (isinstance(sleep_cycles, int) and sleep_cycles >= 0):
            raise ValueError(f"sleep_cycles: expected a non-negative int, got {sleep_cycles!r}")
        self.sleep_cycles = sleep_cycles
        self.spans: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def around_launch(self):
        stream = torch.cuda.current_stream()  # the launch's own stream: current device, current stream
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(self.sleep_cycles)  # on the current stream: the launch's
        start.record(stream)
        yield
        end.record(stream)
        self.spans.append((stream.device.index, start, end))

    def elapsed(self) -> list[tuple[int, float]]:
        """(device, milliseconds) per launch; call after synchronising the devices."""
        return [(dev, start.elapsed_time(end)) for dev, start, end in self.spans]


@contextlib.contextmanager
def timing(timer: KernelTimer):
    """Make ``timer`` the one the launch sites report to, for the duration of the block."""
    global ACTIVE
    if ACTIVE is not None:
        raise RuntimeError("a KernelTimer is already active: timed blocks do not nest")
    ACTIVE = timer
    try:
        yield timer
    finally:
        ACTIVE = None


def around_launch():
    """What a launch site wraps its launch in: the active timer's span, or nothing."""
    return ACTIVE.around_launch() if ACTIVE is not None else contextlib.nullcontext()


def kernel_timing(spans: list[tuple[int, float]], nbytes: int) -> dict:
    """The record fields of a cell's timed launches: ``us`` the median kernel time, ``GBps`` one
    read and one write of ``nbytes`` in that time, ``launch_device`` the device whose stream ran
    them ("cuda:N", or "mixed: ..." if they were not all on one), ``timed_launches``, ``timing``."""
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes: expected a positive int, got {nbytes!r}")
    if not spans:
        raise ValueError("spans: no timed launch (did the launch site run under the timer?)")
    for dev, ms in spans:
        if not (isinstance(dev, int) and dev >= 0 and ms >= 0):
            raise ValueError(f"spans: expected (device index, milliseconds >= 0), got {(dev, ms)!r}")
    devices = sorted({dev for dev, _ in spans})
    seconds = statistics.median(ms for _, ms in spans) / 1e3
    where = f"cuda:{devices[0]}" if len(devices) == 1 else "mixed: " + ", ".join(f"cuda:{d}" for d in devices)
    return {
        "us": seconds * 1e6,
        "GBps": 2 * nbytes / seconds / 1e9 if seconds > 0 else None,
        "launch_device": where,
        "timed_launches": len(spans),
        "timing": TIMING,
    }


def timing_note(records: list[dict], short: bool = False) -> str:
    """One line on what the GB/s of a set of matrix records measure (old files lack ``timing``);
    short: a few words, for a plot title."""
    timed = {r.get("timing") for r in records if r.get("GBps")}
    if short:
        return (
            ""
            if not timed
            else "GB/s: kernel time (CUDA events)"
            if timed == {TIMING}
            else "GB/s: host clock (older file)"
            if timed == {None}
            else "GB/s: mixed timings"
        )
    if not timed:
        return "no cell ran to the end, so no GB/s"
    if timed == {TIMING}:
        return (
            "GB/s: kernel time, CUDA events on the stream the kernel ran on (median of the timed "
            "launches), one read and one write of the tensor"
        )
    if timed == {None}:
        return (
            "GB/s: host-clock timings (an older file, made before cells were timed with CUDA events): "
            "launch and synchronisation overheads included; they rank cells of that run, nothing more"
        )
    return "GB/s: a mix of host-clock and CUDA-event timings; compare only cells with the same timing"
