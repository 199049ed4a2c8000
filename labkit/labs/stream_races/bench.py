"""``labkit bench stream_races``: lab 03's reference benchmark, every experiment of the lab in one
run (its own module, so that the experiments it gathers need not import each other)."""

from __future__ import annotations

from labkit.labs.stream_races import alignment_cost, reuse_probe
from labkit.labs.stream_races.race import (
    ALLOCATORS,
    PROFILES,
    REQUIRED,
    _blank,
    race_sweep,
    sanitizer_run,
    timeline_trial,
    wgrad_trial,
)

__all__ = ["REQUIRED", "benchmark"]


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench stream_races`` (one GPU): the race sweep, the wgrad pattern, the
    sanitizer, one allocator timeline per allocator, the allocator-reuse probe (kind
    "reuse_probe"), allocation time and GEMM alignment."""
    from labkit.workbench import gates

    gates.requires(gpus=1, compiled=True).check()
    p = PROFILES["quick" if profile == "quick" else "gpu"]
    records = race_sweep(p["sleeps_ms"], p["trials"], p["numel"])
    records += [
        wgrad_trial(a, sleep_ms=s, trial=t) for a in ALLOCATORS for s in (0.0, 5.0) for t in range(p["wgrad_trials"])
    ]
    records += sanitizer_run(p["sanitizer_trials"], numel=p["numel"])
    records += [timeline_trial(a, numel=p["numel"]) for a in ALLOCATORS]
    records += reuse_probe.probe_records(p["probe_trials"])
    records += alignment_cost.allocation_timing_isolated()
    m, n, k = p["gemm"]
    records += alignment_cost.gemm_alignment(m, n, k)
    return [_blank(r) for r in records]
