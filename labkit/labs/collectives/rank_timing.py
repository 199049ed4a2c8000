"""Timing one collective call on every rank at once: rounds of back-to-back calls (or one CUDA
graph replay of them) between CUDA events, the ranks lined up by a barrier before each round.
Lab 02's sweep (``sweep_bench``), the link probe (``links``) and the host-cost breakdown
(``host_cost``) all time this way; ``line_up`` starts the host-timed loops of ``host_cost`` and
``host_calls`` together. Call it inside ``run_ranks`` on GPUs (torch.distributed initialised)."""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist


def median_us(fn, iters: int, reps: int, graph: bool) -> float:
    """Median µs per call: ``reps`` rounds of ``iters`` back-to-back calls (or one graph replay
    of them), ranks lined up by a barrier before every round."""
    return statistics.median(samples_us(fn, iters, reps, graph))


def capture(fn, iters: int) -> torch.cuda.CUDAGraph:
    """One CUDA graph of ``iters`` back-to-back calls of ``fn``, captured on a side stream after
    one warm-up call there (the warm-up runs; the captured calls run at each replay)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up on the capture stream
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(iters):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


def samples_us(fn, iters: int, reps: int, graph: bool = False, active: bool = True) -> list[float]:
    """µs per call of each of ``reps`` rounds (``median_us``). A rank that is not ``active`` runs
    nothing and only joins the barriers, so the active ranks time their calls together while it
    stays idle (``labkit.labs.collectives.links``: one direction of the links busy); it returns []."""
    if not active:
        for _ in range(reps):
            dist.barrier()
        return []
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = capture(fn, iters) if graph else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        if g is not None:
            g.replay()
        else:
            for _ in range(iters):
                fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / iters)
    return samples


def line_up(device: torch.device) -> None:
    """Every rank starts the next timed loop of launches together, its GPU idle (a barrier where
    torch.distributed runs; a lone process only waits for its GPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


__all__ = ["capture", "line_up", "median_us", "samples_us"]
