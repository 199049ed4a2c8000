"""The wrong-current-device lab: the add-one launcher, outcome classification, and on 2 GPUs the
matrix's guarded cells, which must all be correct whatever the unguarded ones do."""

import pytest
import torch

import labkit
from labkit.labs.wrong_device import experiments as wd
from labkit.workbench.sandbox import SandboxResult

DEV = labkit.workbench.tier.kernel_device()


@pytest.mark.parametrize("n", [1, 4097, 300_001])
def test_add_one_is_exact(n):
    x = torch.randn(n, device=DEV)
    assert torch.equal(wd.add_one(x), x + 1)
    assert torch.equal(wd.add_one(x, guarded=False), x + 1)  # same device: the bug cannot show


def test_add_one_refuses_bad_input():
    with pytest.raises(TypeError, match="x: dtype float16 is not supported"):
        wd.add_one(torch.randn(4, device=DEV).half())
    with pytest.raises(ValueError, match=r"out: shape \(3,\) differs"):
        wd.add_one(torch.randn(4, device=DEV), torch.empty(3, device=DEV))
    with pytest.raises(ValueError, match="x on .*, out on meta"):
        wd.add_one(torch.randn(4, device=DEV), torch.empty(4, device="meta"))


@pytest.mark.parametrize(
    "res,outcome",
    [
        (SandboxResult("ok", value={"correct": True, "out_device": "cuda:1", "GBps": 1.0}), "correct"),
        (SandboxResult("ok", value={"correct": False, "out_device": "cuda:1", "GBps": 1.0}), "wrong result"),
        (SandboxResult("ok", value={"correct": True, "out_device": "cuda:0", "GBps": 1.0}), "wrong device"),
        (
            SandboxResult(
                "exception",
                error_type="builtins.ValueError",
                message="Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)",
            ),
            "exception",
        ),
        (
            SandboxResult(
                "illegal_memory_access", error_type="torch.AcceleratorError", message="illegal memory access"
            ),
            "illegal memory access",
        ),
        (SandboxResult("timeout", seconds=120), "hang"),
    ],
)
def test_classify_cell(res, outcome):
    got, detail = wd.classify_cell(res)
    assert got == outcome and detail


def test_peer_line_round_trip():
    assert wd._parse_peer_line(f"noise\n{wd._PEER_LINE}True\nmore") is True
    assert wd._parse_peer_line(f"{wd._PEER_LINE}False") is False
    assert wd._parse_peer_line(f"{wd._PEER_LINE}None") is None and wd._parse_peer_line("") is None


def test_run_cell_checks_its_arguments():
    with pytest.raises(ValueError, match="pattern: 'nope'"):
        wd.run_cell("nope", False, True)


@pytest.mark.multigpu
def test_guarded_cells_are_correct_for_every_pattern():
    records = wd.device_matrix(nbytes=16 << 20, guarded=(True,))  # the unguarded half: labkit bench
    assert len(records) == 2 * len(wd.PATTERNS)
    for r in records:
        assert r["outcome"] == "correct", r


def test_guard_overhead_is_measured():
    recs = wd.guard_overhead(reps=2000)
    assert [r["detail"].split(",")[0] for r in recs] == ["no guard", "on_device_of"]
    assert all(r["us_per_launch"] > 0 for r in recs)


@pytest.mark.gpu
def test_launch_blocking_moves_the_reported_line_to_the_launch():
    before, blocking = wd.launch_blocking_demo()
    assert before["status"] == blocking["status"] == "illegal_memory_access", (before, blocking)
    # Without blocking: a later, innocent line of the same function (the next CUDA call).
    assert before["reported_at"].startswith("fault_then_later_work: "), before
    assert "_store_at_kernel" not in before["reported_at"], before
    assert "_store_at_kernel[(1,)]" in blocking["reported_at"], blocking  # the launch itself


def test_reported_at_names_the_innermost_labkit_line():
    tb = (
        'Traceback (most recent call last):\n  File "/x/labkit/sandbox.py", line 9, in main\n    fn()\n'
        '  File "/x/labkit/kernels/fault.py", line 60, in fault_then_later_work\n'
        '    total = innocent.sum().item()\n  File "/torch/x.py", line 1, in f\n    g()\n'
    )
    assert wd._reported_at(tb) == "fault_then_later_work: total = innocent.sum().item()"
    assert "no labkit frame" in wd._reported_at(None)


def test_plot_matrix_draws_one_cell_per_record():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [
        {
            "pattern": p,
            "peer_access": peer,
            "guarded": g,
            "outcome": "correct" if g else "exception",
            "GBps": 100.0 if g else None,
            "peer_enabled": peer,
        }
        for p in wd.PATTERNS
        for peer in (False, True)
        for g in (False, True)
    ]
    fig, ax = plt.subplots()
    wd.plot_matrix(recs, ax, "test")
    assert len(ax.patches) == len(recs)
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("correct\n100 GB/s") == len(recs) // 2
    plt.close(fig)


def test_matrix_cell_report_labels_recorded_cells():
    from labkit.labs.wrong_device import widgets

    ref = [
        {
            "pattern": "triton_launch",
            "peer_access": True,
            "guarded": False,
            "outcome": "wrong result",
            "GBps": 500.0,
            "detail": "d",
            "peer_enabled": True,
        }
    ]
    text = widgets.matrix_cell_report("triton_launch", True, False, ref, live=False)
    assert "RECORDED" in text and "wrong result" in text and "500 GB/s" in text
    assert "no recorded reference" in widgets.matrix_cell_report("triton_launch", False, False, ref, live=False)
    with pytest.raises(ValueError, match="patterns: 'nope'"):
        wd.device_matrix(["nope"])


def test_sc_speed_plot_draws_the_hbm_floor_only_from_a_measured_bandwidth():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.labs.start_here.copy_bandwidth import hbm_reached
    from labkit.labs.wrong_device import sc_plots

    workbench = [
        {"impl": "torch.copy_", "method": "cuda_events", "bytes": 1 << 20, "GBps": 400.0},
        {"impl": "torch.copy_", "method": "cuda_graph", "bytes": 1 << 30, "GBps": 2700.0},
        {"impl": "torch.copy_", "method": "cuda_events", "bytes": 1 << 30, "GBps": 4000.0},
        {"impl": "triton copy", "method": "cuda_events", "bytes": 1 << 31, "GBps": 9000.0},
    ]
    assert hbm_reached(workbench) == (4000.0, 1 << 30)  # the largest eager torch copy, not the fastest
    assert hbm_reached([]) is None
    assert sc_plots.hbm_floor_us(1000, 2000, 4000.0) == pytest.approx(
        1000 * 2000 / 4000e9 * 1e6
    )  # bytes / (bytes per s) in µs
    recs = [
        {
            "layer": "down",
            "M": 1,
            "K": 1000,
            "N": 2000,
            "impl": impl,
            "us": us,
            "ratio_vs_bf16": us / 10.0,
            "method": "cuda_graph",
        }
        for impl, us in (("bf16 matmul", 10.0), ("sc_matmul", 70.0))
    ]
    fig, ax = plt.subplots()
    sc_plots.plot_speed(ax, {"with": recs, "without": recs}, bandwidths={"with": (4000.0, "a test")})
    floors = [c for c in ax.collections if "HBM floor" in str(c.get_label())]
    assert len(floors) == 1
    (seg,) = floors[0].get_segments()
    assert seg[0][1] == pytest.approx(sc_plots.hbm_floor_us(1000, 2000, 4000.0) / 10.0)
    plt.close(fig)


def test_table_error_figure_shares_one_scale_and_its_titles_do_not_overlap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.labs.wrong_device import sc_plots

    fig = sc_plots.table_error_figure(sc_prec=4, stoc_len=32)
    fig.canvas.draw()
    axes = [ax for ax in fig.axes if ax.get_images()]
    assert len(axes) == 3 and len({ax.get_images()[0].get_clim() for ax in axes}) == 1
    renderer = fig.canvas.get_renderer()
    boxes = [ax.title.get_window_extent(renderer) for ax in axes]
    for left, right in zip(boxes, boxes[1:]):
        assert left.x1 <= right.x0, "neighbouring titles overlap"
    ylabels = [ax.yaxis.label.get_window_extent(renderer) for ax in axes if ax.get_ylabel()]
    assert len(ylabels) == 1  # only the first panel names the shared y axis
    plt.close(fig)
