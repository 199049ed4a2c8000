"""``labkit bench wrong_device``: lab 01's reference benchmark, every experiment of the lab in
one run (its own module, so that the experiments it gathers need not import each other)."""

from __future__ import annotations

from labkit.labs.wrong_device import crash_search, demos, experiments
from labkit.labs.wrong_device.experiments import REQUIRED

__all__ = ["REQUIRED", "benchmark"]


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench wrong_device`` (needs 2 GPUs).

    Time, an ESTIMATE (not measured as a whole): the matrix about 1 min (16 children of about
    4 s each in the first recorded file); the guard's cost under 1 s; the CUDA_LAUNCH_BLOCKING
    demonstration ~10-20 s (2 children); the sharded decode ~1 min (2 children, each importing
    accelerate and compiling the SC kernels, unless Triton's disk cache has them); the
    regression test ~1 min (2 children); the crash search ~1 min (6 children, a 0.1 s sleep
    each). So about 4-5 minutes in all, inside the GPU machines' 10 minutes per command, unless
    children hang: each has its own timeout (the matrix's 120 s, the others' 60-180 s)."""
    from labkit.workbench import gates

    gates.requires(gpus=2, compiled=True).check()
    return (
        experiments.device_matrix()
        + experiments.guard_overhead()
        + demos.launch_blocking_records()
        + demos.sharded_decode_records()
        + demos.regression_records()
        + crash_search.crash_search()
    )
