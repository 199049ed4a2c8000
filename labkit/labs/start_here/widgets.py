"""Lab 00's panels: run a failing experiment in a child process; time the Triton copy.

Each panel's button calls a plain function that returns text (the ``*_report`` functions);
tests call the same functions and press the buttons."""

from __future__ import annotations

import ipywidgets as w

from labkit.labs.start_here import copy_bandwidth, experiments
from labkit.workbench import sandbox
from labkit.workbench.widgets import run_button


def crash_report(experiment: str, timeout_s: float) -> str:
    """Run one of experiments.CRASH_EXPERIMENTS in a child process; say how it ended."""
    if experiment not in experiments.CRASH_EXPERIMENTS:
        raise ValueError(f"experiment: {experiment!r} is not one of {list(experiments.CRASH_EXPERIMENTS)}")
    res = sandbox.run_isolated(experiments.CRASH_EXPERIMENTS[experiment], timeout=timeout_s)
    lines = [f"{experiment}: {res.summary()}"]
    if res.stderr.strip():
        lines += ["last lines the child wrote to stderr:"] + res.stderr.strip().splitlines()[-6:]
    return "\n".join(lines)


def copy_report(nbytes: int, reps: int) -> str:
    """Check and time torch.copy_ against the Triton copy at one size; one line each."""
    recs = copy_bandwidth.copy_sweep([nbytes], reps=reps, progress=False)
    return "\n".join(
        f"{r['impl']:<12} {r['us']:10.1f} us  (IQR {r['us_p25']:.1f}-{r['us_p75']:.1f})"
        f"  {r['GBps']:8.1f} GB/s  x{r['ratio_vs_torch']:.2f} vs torch  [{r['method']}]"
        for r in recs
    )


def crash_explorer(timeout_s: float = 60.0):
    """Pick an experiment, run it in a child process, see how its failure is classified."""
    pick = w.Dropdown(options=list(experiments.CRASH_EXPERIMENTS), description="experiment")
    timeout = w.FloatSlider(
        value=min(timeout_s, 10.0), min=1, max=max(timeout_s, 10.0), step=1, description="timeout s"
    )
    out = w.HTML()
    run = run_button("Run in a child process", out, lambda: crash_report(pick.value, timeout.value))
    return w.VBox([w.HBox([pick, timeout, run]), out])


def copy_explorer(default_log2_bytes: int = 16, max_log2_bytes: int = 30):
    """Pick a size and sample count, time torch.copy_ against the Triton copy, see the ratio."""
    size = w.IntSlider(value=default_log2_bytes, min=12, max=max_log2_bytes, description="log2 bytes")
    reps = w.IntSlider(value=5, min=1, max=100, description="samples")
    out = w.HTML()
    run = run_button(
        "Measure", out, lambda: copy_report(1 << size.value, reps.value), icon="clock-o", busy="measuring ..."
    )
    return w.VBox([w.HBox([size, reps, run]), out])
