"""Plot helpers (byte axes, captions naming machine and versions) and the notebook widgets."""

import dataclasses

import matplotlib
import matplotlib.pyplot as plt

matplotlib.use("Agg")

import pytest

from labkit.labs.start_here import widgets
from labkit.workbench import env, plot, results


@pytest.mark.parametrize(
    "n,text",
    [
        (1, "1 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (3 << 20, "3 MiB"),
        (1 << 30, "1 GiB"),
        (256 << 30, "256 GiB"),
        (1 << 42, "4 TiB"),
    ],
)
def test_format_bytes(n, text):
    assert plot.format_bytes(n) == text


def test_bytes_axis_labels_ticks_in_binary_units():
    fig, (ax,) = plot.new_figure()
    ax.plot([4096, 1 << 20, 1 << 28], [1, 2, 3])
    plot.bytes_axis(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "1 MiB" in labels and "4 KiB" in labels


def test_caption_names_machine_versions_and_references(tmp_path):
    fig, (ax,) = plot.new_figure()
    st = env.stamp()
    ref_path = results.write_results(tmp_path / "h200x2" / "lab.json", "lab", [{"v": 1}], generator="t")
    rs = results.load_results(ref_path)
    rs.env.update(machine="h200x2", gpus=[{"name": "NVIDIA H200"}] * 2, interpreter=False)
    text = plot.caption(fig, yours=st, refs={"h200x2": rs})
    assert f"your run: {st['machine']}" in text and f"torch {st['versions']['torch']}" in text
    assert "reference h200x2: h200x2 (2x NVIDIA H200)" in text
    path = plot.save(fig, "demo", tmp_path)
    assert path.exists() and path.stat().st_size > 1000


def test_save_replaces_a_symbolic_link_at_its_name_never_writes_through_it(tmp_path):
    """A link planted at ``<name>.png`` in a persistent output folder (N86): the PNG takes its
    place, its target is untouched, and no temporary file is left."""
    import os

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / "planted.png").symlink_to(victim)
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    path = plot.save(fig, "planted", out)
    assert path == out / "planted.png" and not path.is_symlink()
    assert path.read_bytes().startswith(b"\x89PNG") and victim.read_text() == "mine"
    assert sorted(os.listdir(out)) == ["planted.png"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~results._umask())
    plt.close(fig)


def test_save_shows_the_figure_once_and_closes_it(tmp_path, monkeypatch):
    """In a kernel, with a non-interactive backend (MPLBACKEND=Agg inherited) or the inline one,
    save displays the PNG it wrote and closes the figure: matplotlib-inline, which draws every
    figure still open at the end of the cell, draws it no second time."""
    import types

    import IPython
    import IPython.display

    from labkit.app.runner.execute import KERNEL_MPLBACKEND

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    fig, (ax,) = plot.new_figure()
    ax.plot([1, 2], [3, 4])
    plot.save(fig, "outside", tmp_path)
    assert shown == [], "outside a kernel (scripts, tests) nothing is displayed"
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=object()))
    assert fig.number in plt.get_fignums(), "outside a kernel the figure stays open"
    monkeypatch.setattr(matplotlib, "get_backend", lambda: "agg")
    path = plot.save(fig, "agg", tmp_path)
    assert len(shown) == 1 and shown[0].data == path.read_bytes(), "the PNG written, displayed"
    assert fig.number not in plt.get_fignums(), "closed: nothing draws it again"
    fig, (ax,) = plot.new_figure()
    ax.plot([1, 2], [3, 4])
    monkeypatch.setattr(matplotlib, "get_backend", lambda: KERNEL_MPLBACKEND)
    path = plot.save(fig, "inline", tmp_path)
    assert len(shown) == 2 and shown[1].data == path.read_bytes(), "under the inline backend too"
    assert fig.number not in plt.get_fignums(), "closed: matplotlib-inline does not draw it at the cell's end"
    monkeypatch.setattr(matplotlib, "get_backend", lambda: "module://ipympl.backend_nbagg")
    fig, (ax,) = plot.new_figure()
    plot.save(fig, "interactive", tmp_path)
    assert len(shown) == 2 and fig.number in plt.get_fignums(), "an interactive backend shows it itself"


def test_crash_explorer_runs_the_chosen_experiment():
    panel = widgets.crash_explorer(timeout_s=30)
    (pick, _timeout, button), out = panel.children[0].children, panel.children[1]
    pick.value = "Python exception"
    button.click()
    assert "Python exception: exception: builtins.ValueError" in out.value
    with pytest.raises(ValueError, match="experiment"):
        widgets.crash_report("no such experiment", 5)


def test_copy_explorer_measures_one_size():
    panel = widgets.copy_explorer(default_log2_bytes=12, max_log2_bytes=16)
    (_size, reps, button), out = panel.children[0].children, panel.children[1]
    reps.value = 2
    button.click()
    assert "torch.copy_" in out.value and "triton copy" in out.value and "GB/s" in out.value


def test_graph_vs_events_pairs_methods_per_size():
    from labkit.labs.start_here.copy_bandwidth import graph_vs_events

    recs = [
        {"impl": "a", "bytes": 8, "method": "cuda_events", "us": 10.0},
        {"impl": "a", "bytes": 8, "method": "cuda_graph", "us": 2.0},
        {"impl": "a", "bytes": 16, "method": "cuda_events", "us": 4.0},  # no graph twin: left out
        {"impl": "b", "bytes": 8, "method": "cuda_graph", "us": 6.0},
        {"impl": "b", "bytes": 8, "method": "cuda_events", "us": 3.0},
    ]
    assert graph_vs_events(recs) == [
        {"impl": "a", "bytes": 8, "events_us": 10.0, "graph_us": 2.0, "graph_over_events": 0.2},
        {"impl": "b", "bytes": 8, "events_us": 3.0, "graph_us": 6.0, "graph_over_events": 2.0},
    ]
    assert graph_vs_events([{"impl": "a", "bytes": 8, "method": "cpu_clock", "us": 1.0}]) == []


def test_copy_bandwidth_plot_has_your_run_and_references(tmp_path):
    from labkit.labs.start_here import copy_bandwidth

    def rec(impl, method, nbytes, gbps):
        return {"impl": impl, "method": method, "bytes": nbytes, "GBps": gbps}

    mine = [rec(i, "cpu_clock", b, 1.0) for i in copy_bandwidth.IMPLS for b in (4096, 16384)]
    ref_recs = [
        rec(i, m, b, 1e3) for i in copy_bandwidth.IMPLS for m in ("cuda_events", "cuda_graph") for b in (4096, 16384)
    ]
    path = results.write_results(tmp_path / "h200x2" / "start_here.json", "workbench", ref_recs, generator="t")
    # the reference names its GPU whatever machine writes this file (on a GPU node the stamp would
    # name that node's GPU, on the CPU tier none): the ceiling drawn is the named GPU's datasheet HBM
    ref = results.load_results(path)
    refs = {"h200x2": dataclasses.replace(ref, env={**ref.env, "gpus": [{"name": "NVIDIA H200"}]})}
    fig = copy_bandwidth.plot_copy_bandwidth(mine, env.stamp(), refs)
    eager, graph = fig.axes[:2]
    peak = "HBM peak, H200 datasheet: 4.8 TB/s"
    assert [line.get_label() for line in eager.lines] == [
        "your run: torch.copy_",
        "your run: triton copy",
        "reference h200x2: torch.copy_",
        "reference h200x2: triton copy",
        peak,
    ]
    # the CPU clock run has no graph replays; the reference has
    assert [line.get_label() for line in graph.lines] == [
        "reference h200x2: torch.copy_",
        "reference h200x2: triton copy",
        peak,
    ]
    assert "reference h200x2" in fig.texts[-1].get_text()
    # one legend for both panels, beside them: it hides no point (it once sat on the 1 GiB ones)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [line.get_label() for line in eager.lines]
    fig.canvas.draw()
    assert not any(legend.get_window_extent().overlaps(ax.get_window_extent()) for ax in (eager, graph))
    fig_empty = copy_bandwidth.plot_copy_bandwidth(mine, env.stamp(), {})
    assert not fig_empty.axes[1].lines and "no graph timings" in fig_empty.axes[1].texts[0].get_text()


def test_panels_put_the_readers_run_first_and_label_every_reference(tmp_path):
    for machine in ("h200x2", "h100x1"):
        results.write_results(tmp_path / machine / "lab.json", "lab", [{"x": 1, "y": 2.0}], generator="t")
    live = [{"x": 1, "y": 3.0}]
    got = results.panels("lab", live, reference_dir=tmp_path)
    assert [(p.title, p.machine, p.live) for p in got] == [
        ("your run (live)", None, True),
        ("reference h100x1 (RECORDED, not this machine)", "h100x1", False),
        ("reference h200x2 (RECORDED, not this machine)", "h200x2", False),
    ]
    assert got[0].records == live and got[2].records == [{"x": 1, "y": 2.0}]
    only = results.panels("lab", None, machines=["h200x2"], reference_dir=tmp_path)
    assert [p.machine for p in only] == ["h200x2"]
    assert results.panels("other", None, reference_dir=tmp_path) == []


def test_beside_draws_a_row_per_panel_and_captions_every_source(tmp_path):
    results.write_results(tmp_path / "ref" / "h200x2" / "lab.json", "lab", [{"x": 1, "y": 2.0}], generator="t")
    got = results.panels("lab", [{"x": 1, "y": 3.0}], reference_dir=tmp_path / "ref")
    drawn = []

    def draw(axes, panel):
        drawn.append(panel.title)
        for ax in axes:
            ax.plot([r["x"] for r in panel.records], [r["y"] for r in panel.records], label=panel.title)

    fig = plot.beside(got, draw, "lab_fig", tmp_path, stamp=env.stamp(), ncols=2)
    assert drawn == [p.title for p in got]
    assert len(fig.axes) == 4 and (tmp_path / "lab_fig.png").exists()
    text = fig.texts[-1].get_text()
    assert text.startswith("your run: ") and "reference h200x2" in text
    # four rows under a suptitle: it stays inside the figure and above every row's title (at
    # matplotlib's default height a tall figure dropped it onto the first row's)
    tall = plot.beside(got * 2, draw, "tall", tmp_path, ncols=2, width=3.2, suptitle="a suptitle " * 12)
    renderer = tall.canvas.get_renderer()
    sup = tall._suptitle.get_window_extent(renderer)  # its Text: matplotlib has no public getter
    assert tall.bbox.x0 <= sup.x0 and sup.x1 <= tall.bbox.x1 and sup.y1 <= tall.bbox.y1
    assert all(ax.get_tightbbox(renderer).y1 < sup.y0 for ax in tall.axes)
    assert plot.beside([], draw, "none", tmp_path) is None


def test_copy_plot_draws_the_datasheet_ceiling_and_the_headline_reads_the_reference(tmp_path):
    from labkit.labs.start_here import copy_bandwidth
    from labkit.workbench.results import ResultSet

    env_h200 = {
        "gpus": [{"name": "NVIDIA H200"}],
        "machine": "h200x1",
        "created": "2026-11-23",
        "versions": {"torch": "2.11.0", "triton": "3.6.0"},
        "interpreter": False,
    }
    recs = [
        {"impl": i, "method": "cuda_graph", "bytes": 1 << 30, "GBps": g}
        for i, g in (("triton copy", 4000.0), ("torch.copy_", 2800.0))
    ]
    refs = {"h200x1": ResultSet("workbench", "t", env_h200, recs, tmp_path / "w.json")}
    fig = copy_bandwidth.plot_copy_bandwidth([], env.stamp(), refs)
    ceilings = [line for line in fig.axes[1].lines if "datasheet" in line.get_label()]
    assert len(ceilings) == 1 and ceilings[0].get_ydata()[0] == 4800.0
    text = copy_bandwidth.headline(refs)
    assert text == (
        "RECORDED h200x1: labkit's Triton copy moves 4,000 GB/s at 1024 MiB under graph replay "
        "(torch.copy_: 2,800), 83% of the H200 datasheet HBM peak"
    )
    eager = [
        {"impl": i, "method": "cuda_events", "bytes": 1 << 30, "GBps": g}
        for i, g in (("triton copy", 3990.0), ("torch.copy_", 4200.0))
    ]
    refs["h200x1"] = ResultSet("workbench", "t", env_h200, recs + eager, tmp_path / "w.json")
    assert copy_bandwidth.headline(refs).endswith("; launched eagerly 3,990 GB/s (torch.copy_: 4,200)")
    unknown = {"x": ResultSet("workbench", "t", {"gpus": [{"name": "NVIDIA B200"}]}, recs, tmp_path / "x.json")}
    assert "datasheet" not in copy_bandwidth.headline(unknown)
    assert copy_bandwidth.headline({}) is None
