"""labkit.labs.fp8_dispatch: the benchmark (``labkit bench fp8_dispatch``), its plots and the panel.

CPU tier: ``benchmark("cpu")`` records carry the registry's required fields with sane values, the
GPU profile's matrix cells (which ones, which ones skipped on a machine without enough GPUs, with the
reason), the speed comparison's code at tiny shapes (interpreter, emulated GEMM), the input drifts
of ``run_case``, every figure drawn from those records (Agg), and the panel: changing a control
reruns and changes the verdict and the figure. GPU: the speed comparison at a small shape, and the
two-GPU matrix cells in their child processes."""

import json
import math
from pathlib import Path

import matplotlib

import labkit  # noqa: F401  (first: picks the tier before any kernel module is imported)

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from labkit.app import benchmarks
from labkit.labs.fp8_dispatch import bench, model, naive, plots, widgets
from labkit.workbench import gates, hardware, sandbox
from labkit.workbench.gates import HardwareUnavailable
from labkit.workbench.widgets import FigureView

#: under pytest-xdist (make test) every test of this file runs in one worker: the CPU benchmark of its module fixture
#: runs once, not once per worker
pytestmark = pytest.mark.xdist_group("fp8_bench_widgets")

SIZE = 1 / 512
#: where the small runs go: "cpu" under the interpreter, "one_gpu" on a GPU machine's compiled tier
HERE = model.local_placement()
HERE_DEVICE = model.PLACEMENTS[HERE][0]


@pytest.fixture(scope="module")
def cpu_records():
    return bench.benchmark("cpu", size=SIZE, steps=2, progress=False)


def test_registered_with_its_required_fields():
    generator, _, required = benchmarks.BENCHMARKS["fp8_dispatch"]
    assert generator == "labkit.labs.fp8_dispatch.bench.benchmark" and required() == bench.REQUIRED
    assert bench.REQUIRED == ("placement", "mode", "mechanism", "outcome", "rel_err_vs_bf16", "forward_ms")


def test_cpu_benchmark_records_carry_required_and_sane_values(cpu_records):
    json.dumps(cpu_records)
    assert all(set(bench.REQUIRED) <= set(r) for r in cpu_records)
    assert {r["kind"] for r in cpu_records} == {"matrix", "meta"}
    matrix = [r for r in cpu_records if r["kind"] == "matrix"]
    assert [r["mode"] for r in matrix] == list(model.MODES)
    for r in matrix:
        assert r["placement"] == HERE and r["outcome"] == "ok", r
        assert r["forward_ms"] is None if HERE == "cpu" else r["forward_ms"] > 0, r
        assert r["mechanism"] == naive.mechanism_label(r["mode"]) and r["sandbox"] is None
        assert "records" not in r and r["reported_at"] is None
        assert r["rel_err_vs_bf16"] == 0.0 if r["mode"] == "bf16" else 0 < r["rel_err_vs_bf16"] < 0.3
    meta = [r for r in cpu_records if r["kind"] == "meta"]
    fp8_modes = [m for m in model.MODES if m != "bf16"]
    # 2 steps x 7 layers x (input, weight) per FP8 mode; backward state left out
    assert len(meta) == len(fp8_modes) * 2 * 7 * 2
    assert {r["tensor"] for r in meta} == {"input", "weight"} and {r["step"] for r in meta} == {0, 1}
    assert all(r["device"] == r["weight_device"] == HERE_DEVICE and r["outcome"] is None for r in meta)
    inputs = [r for r in meta if r["tensor"] == "input"]
    assert all(r["amax"] > 0 for r in inputs)
    for r in inputs:  # the default recipe: "max" over the history, margin 0
        seen = max(
            q["amax"] for q in inputs if (q["mode"], q["module"]) == (r["mode"], r["module"]) and q["step"] <= r["step"]
        )
        assert math.isclose(r["scale"], 448.0 / seen, rel_tol=1e-6), r


def test_gpu_matrix_cells_skip_what_the_machine_cannot_run_with_the_reason():
    cells = bench.matrix_cells("gpu", 1)
    runnable = [c for c in cells if not c["skip"]]
    assert {(c["placement"], c["kind"]) for c in runnable} == {("one_gpu", "matrix")}
    assert [c["mode"] for c in runnable] == list(model.MODES)
    skipped = [c for c in cells if c["skip"]]
    assert skipped and all(c["skip"] == "needs 2 CUDA GPUs; this machine has 1" for c in skipped)
    blocking = [c for c in cells if c["kind"] == "launch_blocking"]
    assert [c["mode"] for c in blocking] == ["fp8_naive", *naive.MECHANISMS]
    assert all(c["env"] == {"CUDA_LAUNCH_BLOCKING": "1"} and c["placement"] == "two_gpus" for c in blocking)
    assert not any(c["skip"] for c in bench.matrix_cells("gpu", 2))
    row = bench._skipped(skipped[0], 1.0, 3)
    assert set(bench.REQUIRED) <= set(row) and row["outcome"].startswith("skipped: needs 2 CUDA GPUs")
    with pytest.raises(ValueError, match="profile: 'tpu' is not one of"):
        bench.matrix_cells("tpu", 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_profile_without_a_gpu_is_refused_in_one_line():
    with pytest.raises(HardwareUnavailable, match="needs 1 CUDA GPU; this machine has 0"):
        bench.benchmark("gpu", progress=False)
    (row,) = bench.speed_records("gpu")
    assert row["kind"] == "speed" and row["outcome"].startswith("skipped: needs 1 CUDA GPU")


def test_a_dead_child_becomes_a_record_with_the_sandbox_status(monkeypatch):
    died = sandbox.SandboxResult(
        status="illegal_memory_access",
        error_type=None,
        message="CUDA error: an illegal memory access was encountered",
        seconds=1.0,
        stderr="...\nCUDA error: an illegal memory access was encountered\n",
        returncode=-6,
        traceback='  File "/x/labkit/labs/fp8_dispatch/model.py", line 77, in forward\n'
        "    return self.down_proj(gate * up)\n",
    )
    monkeypatch.setattr(bench.sandbox, "run_isolated", lambda *a, **k: died)
    cell = {
        "kind": "launch_blocking",
        "placement": "two_gpus",
        "mode": "fp8_naive",
        "env": {"CUDA_LAUNCH_BLOCKING": "1"},
        "skip": None,
    }
    rec = bench.run_cell(cell, 1.0, 3, isolated=True)
    assert set(bench.REQUIRED) <= set(rec)
    assert rec["outcome"] == rec["sandbox"] == "illegal_memory_access" and rec["launch_blocking"]
    assert rec["reported_at"] == "labs/fp8_dispatch/model.py:77 (return self.down_proj(gate * up))"
    assert rec["mechanism"] == "all three" and "illegal memory access" in rec["stderr_tail"]
    assert bench._flatten(rec) == [rec]  # no meta from a cell that died


def test_reported_at_is_the_first_error_of_the_chain():
    rec = {
        "errors": [
            {"type": "RuntimeError", "message": "again", "at": "kernels/fp8/autocast.py:1 (exit)"},
            {"type": "RuntimeError", "message": "first", "at": "labs/fp8_dispatch/model.py:77 (gate * up)"},
        ]
    }
    assert bench.reported_at(rec) == "labs/fp8_dispatch/model.py:77 (gate * up)"
    assert bench.reported_at({"errors": []}) is None and bench.reported_at(traceback="") is None


def test_speed_comparison_code_runs_at_tiny_shapes():
    """Under the interpreter (emulated GEMM) the times say nothing about a GPU: only the records.
    On a GPU machine the same small comparison runs on cuda:0 (scaled_mm where FP8 runs)."""
    rows = bench.speed_records("cpu", shapes={"gate/up": (32, 48, 64)})
    assert [r["impl"] for r in rows] == list(bench.SPEED_IMPLS)
    on_cpu = HERE == "cpu"
    for r in rows:
        assert set(bench.REQUIRED) <= set(r) and r["kind"] == "speed" and r["ms"] > 0 and r["outcome"] == "ok"
        assert r["timing_method"] == ("cpu_clock" if on_cpu else "cuda_events")
        assert r["backend"] == "emulated" if on_cpu else r["backend"] in ("scaled_mm", "emulated")
    by = {r["impl"]: r for r in rows}
    assert by["bf16"]["ratio_vs_bf16"] == 1.0 and by["bf16"]["rel_err_vs_bf16"] == 0.0
    # E4M3 x E4M3 against bf16: a few percent of the largest output
    assert 0 < by["fp8_gemm"]["rel_err_vs_bf16"] == by["fp8_quantize_gemm"]["rel_err_vs_bf16"] < 0.1
    assert by["fp8_weight_cast"]["tflops"] is None and by["fp8_gemm"]["tflops"] > 0


def test_drift_scales_and_the_delayed_scale_they_show():
    assert model.drift_scales("constant", 4) is None
    assert model.drift_scales("spike", 8) == [1, 1, 1, 1, 16, 1, 1, 1]
    assert model.drift_scales("growing", 3) == [1, 2, 4]
    with pytest.raises(ValueError, match="drift: 'wave' is not one of"):
        model.drift_scales("wave", 3)
    with pytest.raises(ValueError, match="input_scales: expected None or at least 3"):
        model.run_case(HERE, size=SIZE, steps=3, input_scales=[1.0, 2.0])
    rec = model.run_case(HERE, size=SIZE, steps=4, input_scales=[1.0, 1.0, 16.0, 1.0])
    assert rec["outcome"] == "ok" and not rec["mismatches"]  # the checker follows the drift
    errs = rec["norm_rel_err_per_step"]
    assert errs[2] > 0.5 > model.WRONG_OUTPUT > errs[1]  # the spike is cast with the old scale: saturated
    q = [r for r in rec["records"] if r["module"] == "attn.q_proj" and r["tensor"] == "input"]
    assert q[2]["amax"] == 16 * q[1]["amax"] and q[3]["scale"] == q[2]["scale"] < q[1]["scale"]  # "max" keeps it


def test_plots_draw_from_benchmark_records(cpu_records):
    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    plots.plot_matrix(cpu_records, axes[0][0], "matrix")
    assert len(axes[0][0].patches) == len(model.MODES)
    plots.plot_meta_history(cpu_records, axes[0][1:], "naive", HERE, "fp8_naive")
    assert len(axes[0][1].lines) == 7 and axes[0][1].get_yscale() == "log"
    speed = bench.speed_records("cpu", shapes={"gate/up": (32, 48, 64), "down": (32, 64, 48)})
    plots.plot_speed(speed, axes[1][0], "speed")
    assert len(axes[1][0].patches) == 2 * len(bench.SPEED_IMPLS)
    plots.plot_speed(
        [{"kind": "speed", "outcome": "skipped: needs 1 CUDA GPU; this machine has 0"}], axes[1][1], "none"
    )
    assert "needs 1 CUDA GPU" in axes[1][1].texts[0].get_text()
    plots.plot_matrix([], axes[1][2], "empty")
    plt.close(fig)


def test_plots_show_a_crash_a_skip_and_state_off_its_weights_device():
    recs = [
        {
            "kind": "matrix",
            "placement": "two_gpus",
            "mode": "fp8_naive",
            "outcome": "illegal_memory_access",
            "rel_err_vs_bf16": None,
            "forward_ms": None,
        },
        {
            "kind": "matrix",
            "placement": "two_gpus",
            "mode": "global_reduction",
            "outcome": "exception: ValueError: Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)",
        },
        {
            "kind": "matrix",
            "placement": "other_gpu",
            "mode": "fp8_naive",
            "outcome": "skipped: needs 2 CUDA GPUs; this machine has 1",
        },
    ]
    meta = [
        {
            "kind": "meta",
            "placement": "two_gpus",
            "mode": "lazy_meta_on_current_device",
            "step": s,
            "module": m,
            "tensor": "input",
            "device": "cuda:0",
            "weight_device": w,
            "amax": 2.0,
            "scale": 224.0,
        }
        for s in range(3)
        for m, w in (("attn.q_proj", "cuda:0"), ("mlp.up_proj", "cuda:1"))
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    plots.plot_matrix(recs, axes[0])
    colours = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in axes[0].patches}
    assert len(colours) == 3
    assert (
        plots.outcome_class(recs[1]["outcome"]) == "exception" and plots.outcome_class(recs[2]["outcome"]) == "skipped"
    )
    plots.plot_meta_history(meta, axes[1:], "lazy", "two_gpus", "lazy_meta_on_current_device")
    labels = [t.get_text() for t in axes[2].get_legend().get_texts()]
    assert labels == ["state on cuda:0", "state on cuda:0, its weight on cuda:1"]
    plt.close(fig)


def test_datasheet_ceilings_are_listed_only_for_known_gpus():
    # half the datasheets' "with sparsity" figures (FP8 3,958 and BF16 1,979 TFLOPS)
    assert plots.datasheet_tflops("NVIDIA H200", "fp8") == pytest.approx(3958 / 2, abs=0.15)
    assert plots.datasheet_tflops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(1979 / 2, abs=0.15)
    assert plots.datasheet_tflops("NVIDIA H200 NVL", "fp8") is None and plots.datasheet_tflops(None, "bf16") is None


# --- the panel --------------------------------------------------------------------------------


def _controls(panel):
    (margin, history, steps), (algo, fmt), drift, (device_map, mode), text, figure = (
        panel.children[0].children,
        panel.children[1].children,
        panel.children[2],
        panel.children[3].children,
        panel.children[4],
        panel.children[5],
    )
    return dict(
        margin=margin,
        history=history,
        steps=steps,
        algo=algo,
        fmt=fmt,
        drift=drift,
        device_map=device_map,
        mode=mode,
        text=text,
        figure=figure,
    )


def test_changing_a_control_reruns_and_changes_the_verdict(monkeypatch):
    shown = []  # every figure the panel draws, in order
    real_show = FigureView.show
    monkeypatch.setattr(FigureView, "show", lambda view, fig: (shown.append(fig), real_show(view, fig))[1])
    maps = widgets.CPU_MAPS if HERE == "cpu" else widgets.ONE_GPU_MAPS
    c = _controls(widgets.recipe_explorer(maps, size=SIZE))
    assert len(shown) == 1 and "growing" in shown[0].axes[0].get_title()
    assert bytes(c["figure"].value)[:4] == b"\x89PNG" and c["figure"].figure is shown[0]
    assert list(c["device_map"].options) == list(maps)
    first = c["text"].value
    assert f"fp8_device_aware on {HERE}: wrong_output" in first  # a doubling input, no margin: saturated
    c["margin"].value = 1
    assert f"fp8_device_aware on {HERE}: ok" in c["text"].value and c["text"].value != first
    assert len(shown) == 2  # redrawn: the scales halve with one more bit of margin
    assert c["figure"].figure is shown[1]
    assert shown[1].axes[1].lines[0].get_ydata()[0] == shown[0].axes[1].lines[0].get_ydata()[0] / 2
    c["drift"].value = "spike"
    spike = c["text"].value
    c["algo"].value = "most_recent"
    assert c["text"].value != spike
    c["fmt"].value = "E4M3"
    assert "changes nothing here" in c["text"].value
    c["mode"].value = "bf16"
    assert "bf16 keeps no FP8 state" in c["text"].value
    assert len(shown) == 6 and "no FP8 state recorded" in shown[-1].axes[0].texts[0].get_text()


def test_case_report_text_and_figure():
    text, fig = widgets.case_report(HERE, "fp8_naive", drift="spike", steps=6, size=SIZE)
    recipe, result = text.split("\n", 1)
    assert recipe == "recipe: margin 0, amax history 16, amax algo max, format HYBRID; input spike over 6 steps"
    assert result.startswith(f"fp8_naive on {HERE}: ok") and "worst" in result and "at step 3" in result
    assert f"state on each layer's weight's device ({HERE_DEVICE})" in text
    amax_ax, scale_ax, err_ax = fig.axes[:3]
    assert len(amax_ax.lines) == 7 and len(err_ax.lines[0].get_xdata()) == 6
    plt.close(fig)


def test_verdict_of_a_dead_child_and_of_misplaced_state():
    dead = {
        "placement": "two_gpus",
        "mode": "fp8_naive",
        "outcome": "illegal_memory_access",
        "records": [],
        "errors": [],
        "sandbox_summary": "illegal_memory_access: CUDA error (3.0 s)",
        "norm_rel_err_per_step": [],
    }
    assert (
        widgets.verdict(dead)
        == "fp8_naive on two_gpus: illegal_memory_access (illegal_memory_access: CUDA error (3.0 s))"
    )
    misplaced = {
        "placement": "two_gpus",
        "mode": "fp8_naive",
        "outcome": "wrong_scale",
        "norm_rel_err_per_step": [0.1, 0.2],
        "mismatches": [{}],
        "errors": [],
        "records": [
            {"module": "attn.q_proj", "device": "cuda:0", "weight_device": "cuda:0"},
            {"module": "mlp.up_proj", "device": "cuda:0", "weight_device": "cuda:1"},
        ],
    }
    v = widgets.verdict(misplaced)
    assert "attn state on cuda:0; mlp state on cuda:0, its weights on cuda:1" in v and "1 amax/scale values differ" in v


def test_device_maps_follow_the_machine():
    maps = widgets.device_maps()
    n = gates.requires(gpus=2, compiled=True).ok and 2 or gates.requires(gpus=1, compiled=True).ok and 1 or 0
    assert maps == {0: widgets.CPU_MAPS, 1: widgets.ONE_GPU_MAPS, 2: widgets.TWO_GPU_MAPS}[n]
    assert set(widgets.TWO_GPU_MAPS.values()) == {"two_gpus", "one_gpu", "other_gpu"} <= set(model.PLACEMENTS)


# --- GPUs -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_speed_comparison_on_a_gpu():
    if not gates.requires(**bench.SPEED_GATE).ok:
        pytest.skip(gates.requires(**bench.SPEED_GATE).reason)
    rows = bench.speed_records("gpu", shapes={"gate/up": (1024, 1024, 2048)}, timing={"reps": 5})
    by = {r["impl"]: r for r in rows}
    assert by["fp8_gemm"]["backend"] == "scaled_mm" and by["fp8_gemm"]["timing_method"] == "cuda_events"
    assert 0 < by["fp8_quantize_gemm"]["rel_err_vs_bf16"] < 0.1
    print({k: (round(r["ms"], 4), round(r["ratio_vs_bf16"], 3)) for k, r in by.items()})


@pytest.mark.multigpu
def test_two_gpu_cells_run_contained_and_flatten():
    cells = [
        c
        for c in bench.matrix_cells("gpu", 2)
        if c["placement"] == "two_gpus" and c["mode"] in ("fp8_device_aware", "fp8_naive")
    ]
    for cell in cells:
        rec = bench.run_cell(cell, 1 / 64, 2, isolated=True)
        assert set(bench.REQUIRED) <= set(rec) and rec["sandbox"] in sandbox.STATUSES
        print(f"{cell['kind']} {cell['mode']}: {rec['outcome']} at {rec['reported_at']}")
        if cell["mode"] == "fp8_device_aware" and cell["kind"] == "matrix":
            assert rec["outcome"] == "ok"
            meta = bench.meta_records(rec)
            assert {r["device"] for r in meta if r["module"].startswith("mlp.")} == {"cuda:1"}


@pytest.mark.multigpu
def test_the_panel_runs_the_naive_mode_in_a_child_on_two_gpus():
    text, fig = widgets.case_report("two_gpus", "fp8_naive", drift="constant", steps=2)
    recipe_line, verdict = text.splitlines()[:2]  # the recipe that ran heads the verdict
    assert recipe_line.startswith("recipe: margin 0,")
    assert verdict.startswith("fp8_naive on two_gpus:")
    print(text)
    plt.close(fig)


def test_the_recorded_h200_figures_name_refusals_nan_and_the_hbm_ceiling():
    root = Path(__file__).resolve().parents[3] / "reference"
    two = json.loads((root / "h200x2" / "fp8_dispatch.json").read_text())["records"]
    fig, axes = plt.subplots(1, 4, figsize=(22, 5))
    plots.plot_matrix(two, axes[0])
    cells = [t.get_text() for t in axes[0].texts]
    assert any(t.startswith("exception: refused by\ntorch's device check") for t in cells)
    assert any("wrong_scale\noutput NaN" in t for t in cells)  # not "max rel err nan"
    one = json.loads((root / "h200x1" / "fp8_dispatch.json").read_text())["records"]
    plots.plot_speed(one, axes[1])
    cast = [r for r in plots.speed_rows(one) if r["impl"] == "fp8_weight_cast"][0]
    floor = 3 * cast["N"] * cast["K"] / (hardware.datasheet_hbm_tbps(cast["gpu"]) * 1e9)
    assert any(np.allclose(line.get_ydata(), floor) for line in axes[1].lines)  # drawn, in ms, below the bar
    assert floor < cast["ms"]
    plots.plot_meta_history(two, axes[2:], "", "two_gpus", "fp8_device_aware")
    fig.canvas.draw()
    for ax in axes[2:]:  # the line-end names do not cover one another
        boxes = [t.get_window_extent() for t in ax.texts]
        assert len(boxes) == 7
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    plt.close(fig)
