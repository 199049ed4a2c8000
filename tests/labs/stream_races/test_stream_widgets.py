"""Lab 03's widgets and plots, driven directly (papermill renders widgets static): the alignment
panel on real pointers of this machine, the race panel on records, the plots on records of the
shape ``labkit bench stream_races`` writes."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from labkit.labs.stream_races import plots as stream_plots
from labkit.labs.stream_races import widgets


def _race_records():
    recs = []
    for allocator, corrupted in (("raw", 8), ("views", 8), ("views+record_stream", 0)):
        for sleep in (0.0, 5.0):
            for t in range(3):
                c = corrupted if sleep > 0 else 0
                recs.append(
                    {
                        "kind": "race",
                        "allocator": allocator,
                        "trial": t,
                        "sleep_ms": sleep,
                        "numel": 8,
                        "block_reused": allocator != "views+record_stream",
                        "corrupted_elems": c,
                        "corrupted_fraction": c / 8,
                        "offset_bytes": None,
                        "tflops": None,
                    }
                )
    return recs


def test_alignment_panel_reports_real_pointers():
    panel = widgets.alignment_explorer()
    (rows, cols, dtype), (groups, pad, button) = panel.children[0].children, panel.children[1].children
    out = panel.children[2]
    rows.value, cols.value, dtype.value, groups.value = 4095, 3, "bfloat16", 4
    button.click()
    assert "promises: 2-byte alignment" in out.value and "worst 2 bytes" in out.value
    pad.value = True
    button.click()
    assert "promises: 256-byte alignment" in out.value and "worst 256 bytes" in out.value


def test_race_panel_reads_the_reference_when_not_live():
    panel = widgets.race_explorer(_race_records(), live=False)
    allocator, (delay, _trials, button), out = panel.children[0], panel.children[1].children, panel.children[2]
    assert list(delay.options) == [0.0, 5.0]
    allocator.value, delay.value = "raw", 5.0
    button.click()
    assert "RECORDED reference" in out.value and "corrupted in 3 of 3 trials" in out.value
    allocator.value = "views+record_stream"
    button.click()
    assert "corrupted in 0 of 3 trials" in out.value
    assert "no recorded race" in widgets.race_report("raw", 99.0, 1, _race_records(), live=False)


def test_race_plot_and_table():
    recs = _race_records()
    fig, ax = plt.subplots()
    stream_plots.plot_race(recs, ax, "t")
    assert {line.get_label() for line in ax.get_lines()} == {"raw", "views", "views+record_stream"}
    assert "| raw | 5 | 3 of 3 | 3 of 3 | 100.0% |" in stream_plots.race_markdown(recs)
    plt.close(fig)


@pytest.mark.parametrize("with_times", [True, False])
def test_timeline_uses_the_allocator_trace_when_it_has_times(with_times):
    def ev(action, addr, t):
        return {"action": action, "addr": addr, "size": 64, "stream": 0, "t_us": t if with_times else None}

    tl = {
        "kind": "timeline",
        "allocator": "raw",
        "numel": 16,
        "owner_addr": 1024,
        "fresh_addr": 1024,
        "block_reused": True,
        "corrupted_elems": 16,
        "streams": {"main": 0, "side": 5},
        "marks_us": {
            "owner allocated (host)": 60.0,
            "owner freed (host)": 210.0,
            "fresh allocated (host)": 260.0,
            "synchronized (host)": 5300.0,
            "side write starts (GPU)": 5200.0,
            "side write ends (GPU)": 5210.0,
        },
        "events": [
            ev("alloc", 1024, 50.0),
            ev("free_requested", 1024, 200.0),
            ev("free_completed", 1024, 201.0),
            ev("alloc", 1024, 250.0),
        ],
    }
    sp = stream_plots.timeline_spans(tl)
    assert sp["from_allocator_trace"] is with_times
    assert sp["owner_alloc"] == (0.05 if with_times else 0.06)
    assert sp["fresh_alloc"] == (0.25 if with_times else 0.26)
    assert sp["write"] == (5.2, 5.21)
    fig, ax = plt.subplots()
    stream_plots.plot_timeline(tl, ax, "t")
    assert "SAME block" in [t.get_text() for t in ax.get_yticklabels()][1]
    plt.close(fig)


def test_gemm_and_sanitizer_tables():
    gemm = [
        {
            "kind": "gemm_alignment",
            "impl": "torch",
            "operands": "all",
            "offset_bytes": o,
            "tflops": tf,
            "time_vs_aligned": r,
            "max_rel_err": 1e-3,
            "m": 8,
            "n": 8,
            "k": 8,
            "dtype": "bfloat16",
        }
        for o, tf, r in ((0, 800.0, 1.0), (2, 130.0, 6.0))
    ]
    table = stream_plots.gemm_markdown(gemm)
    assert table.splitlines()[0] == "| impl | misaligned | aligned TFLOP/s | +0 B | +2 B | max rel. error |"
    assert "| torch | all | 800 | 1.00x | 6.00x | 1.0e-03 |" in table and len(table.splitlines()) == 3
    fig, ax = plt.subplots()
    stream_plots.plot_gemm_alignment(gemm, ax, "t")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["+0 B", "+2 B"]
    plt.close(fig)
    san = [
        {"kind": "sanitizer", "allocator": "raw", "reported": False, "corrupted_elems": 5, "report": None},
        {
            "kind": "sanitizer",
            "allocator": "missing wait_stream (control)",
            "reported": True,
            "corrupted_elems": None,
            "wrong_sum": None,
            "report": "detected 1 errors",
        },
    ]
    table = stream_plots.sanitizer_markdown(san)
    assert (
        "| raw | 1 | 0 | 1 |" in table and "| missing wait_stream (control) | 1 | 1 | 0 | detected 1 errors |" in table
    )


def _gemm_records(quartiles: bool):
    recs = []
    for impl in ("torch", "triton"):
        for o, tf, r in ((0, 800.0, 1.0), (2, 130.0, 6.0), (16, 700.0, 1.15)):
            rec = {
                "kind": "gemm_alignment",
                "impl": impl,
                "operands": "all",
                "offset_bytes": o,
                "tflops": tf,
                "time_vs_aligned": r,
                "max_rel_err": 1e-3,
                "m": 8,
                "n": 8,
                "k": 8,
                "dtype": "bfloat16",
            }
            if quartiles:
                rec.update(time_vs_aligned_p25=r * 0.95, time_vs_aligned_p75=r * 1.05)
            recs.append(rec)
    return recs


@pytest.mark.parametrize("quartiles", [False, True])
def test_gemm_plot_is_paired_ratios_against_aligned_with_a_line_at_one(quartiles):
    recs = _gemm_records(quartiles)
    series = stream_plots.gemm_ratio_series(recs)
    assert [row["ratio"] for row in series[("torch", "all")]] == [1.0, 6.0, 1.15]
    assert series[("torch", "all")][0]["tflops_aligned"] == 800.0
    fig, ax = plt.subplots()
    stream_plots.plot_gemm_alignment(recs, ax, "t")
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted(round(r["time_vs_aligned"], 6) for r in recs)  # the ratios, not TFLOP/s
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines())
    label = ax.get_ylabel()
    assert ("whiskers p25-p75" in label) == quartiles and ("quartiles not recorded" in label) == (not quartiles)
    assert any("800 TFLOP/s" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(fig)


def test_alloc_plot_marks_the_seed_story_numbers_as_such():
    recs = [
        {"kind": "alloc_time", "allocator": a, "groups": 64, "us": us, "us_p25": us * 0.9, "us_p75": us * 1.1}
        for a, us in (("views", 80.0), ("raw", 450.0))
    ]
    fig, ax = plt.subplots()
    stream_plots.plot_alloc_time(recs, ax, "t")
    seed_lines = [line for line in ax.get_lines() if stream_plots.SEED_LABEL in line.get_label()]
    assert sorted(line.get_xdata()[0] for line in seed_lines) == sorted(
        [stream_plots.SEED_VIEWS_US, stream_plots.SEED_BULK_ALLOCATE_US]
    )
    assert ax.get_xlim()[1] > max(r["us_p75"] for r in recs)  # the labels after the whiskers fit
    plt.close(fig)
    fig, ax = plt.subplots()
    stream_plots.plot_alloc_time(recs, ax, "t", seed=False)
    assert not [line for line in ax.get_lines() if stream_plots.SEED_LABEL in line.get_label()]
    plt.close(fig)
    # rows of one figure (a machine each) share the µs axis, wide enough for the slower machine
    # whichever row is drawn first
    slow = [{**r, "us": 2 * r["us"], "us_p25": 2 * r["us_p25"], "us_p75": 2 * r["us_p75"]} for r in recs]
    fig, (top, bottom) = plt.subplots(2, 1)
    stream_plots.plot_alloc_time(slow, top, "slow")
    stream_plots.plot_alloc_time(recs, bottom, "fast")
    assert top.get_shared_x_axes().joined(top, bottom)
    assert top.get_xlim() == bottom.get_xlim() and top.get_xlim()[1] > max(r["us_p75"] for r in slow)
    plt.close(fig)


def test_of_kind_keeps_panels_with_records_of_that_kind():
    from labkit.workbench.results import Panel

    panels = [
        Panel("your run (live)", [{"kind": "race", "allocator": "raw"}], None),
        Panel(
            "reference x (RECORDED, not this machine)",
            [{"kind": "alloc_time", "allocator": "raw"}, {"kind": "timeline", "allocator": "views"}],
            "x",
        ),
    ]
    assert [p.title for p in stream_plots.of_kind(panels, "race")] == ["your run (live)"]
    kept = stream_plots.of_kind(panels, "timeline", allocators=("views",))
    assert [p.machine for p in kept] == ["x"] and kept[0].records == [{"kind": "timeline", "allocator": "views"}]
    assert stream_plots.of_kind(panels, "timeline", allocators=("raw",)) == []
    assert len(panels[1].records) == 2  # the panels given are not changed


def test_a_race_record_without_a_count_is_refused_not_read_as_clean():
    """A null (or missing) corrupted_elems would count as a clean trial: the summary refuses it."""
    import pytest

    from labkit.labs.stream_races import plots
    from labkit.workbench import results

    good = {"kind": "race", "allocator": "raw", "sleep_ms": 5, "corrupted_elems": 3, "corrupted_fraction": 0.5}
    assert plots.race_summary([good])[0]["corrupted_trials"] == 1
    for bad in (None, float("nan"), "12", True):
        with pytest.raises(results.ResultsError, match="record 1 .*corrupted_elems"):
            plots.race_summary([good, dict(good, corrupted_elems=bad)])
