"""Lab 04's panel: changing a control re-runs the schedule and redraws (the text and the figure)."""

import matplotlib

import labkit  # noqa: F401

matplotlib.use("Agg")

import pytest

from labkit.labs.grouped_gemm import distributions, widgets


def test_changing_experts_or_skew_redraws_the_panel():
    panel = widgets.schedule_explorer(live=False)
    (experts, skew, _tokens), text, figure = panel.children[0].children, panel.children[1], panel.children[2]
    before, drawn = text.value, figure.value
    experts.value = 64
    after_experts = text.value
    skew.value = "uniform"
    assert before != after_experts != text.value
    assert bytes(drawn)[:4] == b"\x89PNG" and bytes(figure.value) != bytes(drawn)
    assert len(figure.figure.axes[0].patches) == 64  # one bar per expert
    assert "64" not in before and "timing needs a CUDA GPU" in panel.children[3].value


def test_figure_shows_every_experts_count_and_the_schedule():
    fig = widgets.schedule_figure(16, "skewed", 4096, programs=132)
    counts_ax, schedule_ax = fig.axes
    heights = [p.get_height() for p in counts_ax.patches]
    assert heights == distributions.token_counts(16, 4096, "skewed")
    assert len(schedule_ax.patches) > 0


def test_schedule_text_counts_the_launches_the_loop_would_make():
    text = widgets.schedule_text(8, "skewed", 1024, programs=132)
    live = sum(1 for c in distributions.token_counts(8, 1024, "skewed") if c)
    assert f"then launch {live} GEMMs" in text


@pytest.mark.gpu
def test_timing_runs_live_on_a_gpu():
    assert "TFLOP/s" in widgets.timing_text(8, "skewed", 1024, K=256, N=256)
