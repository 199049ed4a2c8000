"""Lab 02's pictures, by figure family, and their public names gathered here (what the notebook
imports as ``plots``):

* ``diagrams``: symmetric memory and each algorithm's data movement;
* ``sweep_plots``: the sweep (latency log-log, busbw against size, the eager series, the headline
  table, labkit's choice against the best peer) and the measured links with their ceiling;
* ``correctness_plots``: the correctness grid, the broken variants under load, the PTX proof lines;
* ``tune_plots``: the launch search and the one-shot/two-shot crossover of the tuned kernels.
"""

from __future__ import annotations

from labkit.labs.collectives.correctness_plots import (
    BROKEN_FORMS,
    broken_verdict,
    correctness_verdicts,
    heatmap,
    plot_broken,
    plot_correctness,
    ptx_lines,
)
from labkit.labs.collectives.diagrams import plot_data_movement, plot_symmetric_memory
from labkit.labs.collectives.sweep_plots import (
    CEILING_MODES,
    EAGER_STYLE,
    STYLE,
    chosen_vs_best,
    chosen_vs_best_verdict,
    draw_ceiling,
    eager_records,
    headline_markdown,
    link_ceiling,
    plot_busbw,
    plot_chosen_vs_best,
    plot_eager,
    plot_latency,
    plot_links,
)
from labkit.labs.collectives.tune_plots import plot_tune, plot_tuned_crossover

__all__ = [
    "BROKEN_FORMS",
    "CEILING_MODES",
    "EAGER_STYLE",
    "STYLE",
    "broken_verdict",
    "chosen_vs_best",
    "chosen_vs_best_verdict",
    "correctness_verdicts",
    "draw_ceiling",
    "eager_records",
    "headline_markdown",
    "heatmap",
    "link_ceiling",
    "plot_broken",
    "plot_busbw",
    "plot_chosen_vs_best",
    "plot_correctness",
    "plot_data_movement",
    "plot_eager",
    "plot_latency",
    "plot_links",
    "plot_symmetric_memory",
    "plot_tune",
    "plot_tuned_crossover",
    "ptx_lines",
]
