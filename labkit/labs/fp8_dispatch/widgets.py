"""Lab 05's panel: the recipe (margin, amax history length, amax algorithm, FP8 format), the input's
drift over the steps, the device map and the mode. Every change reruns a tiny ``run_case`` (in a
child process on GPUs for the story's naive mode, which may crash) and redraws the amax / scale
history and the error per step, with a one-line verdict.

The work is done by plain functions (``case_record``, ``verdict``, ``case_figure``,
``case_report``); tests call them and change the panel's controls."""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from labkit.labs.fp8_dispatch import model, plots
from labkit.workbench import gates, sandbox
from labkit.workbench.widgets import FigureView, pre

#: the modes the panel offers (each mechanism alone is in the notebook's matrix)
MODES = ("bf16", "fp8_device_aware", "fp8_naive")
#: device map label -> run_case placement, by what the machine has
CPU_MAPS = {"attn: cpu, mlp: cpu": "cpu"}
ONE_GPU_MAPS = {"attn: 0, mlp: 0": "one_gpu"}
TWO_GPU_MAPS = {
    "attn: 0, mlp: 1 (the story)": "two_gpus",
    "attn: 0, mlp: 0": "one_gpu",
    "attn: 1, mlp: 1 (current device 0)": "other_gpu",
}
#: the panel's model: this fraction of the story's dimensions (CPU: the interpreter's size)
TINY = {"cpu": 1 / 256, "gpu": 1 / 64}
TIMEOUT_S = 120.0


def device_maps() -> dict[str, str]:
    """The device maps this machine can run: two GPUs give the story's split and both blocks on
    either GPU; one GPU both on cuda:0; none the CPU."""
    if gates.requires(gpus=2, compiled=True).ok:
        return dict(TWO_GPU_MAPS)
    if gates.requires(gpus=1, compiled=True).ok:
        return dict(ONE_GPU_MAPS)
    return dict(CPU_MAPS)


def case_record(
    placement: str = "cpu",
    mode: str = "fp8_device_aware",
    margin: float = 0,
    amax_history_len: int = 16,
    amax_compute_algo: str = "max",
    fp8_format: str = "HYBRID",
    drift: str = "spike",
    steps: int = 8,
    size: float | None = None,
    timeout: float = TIMEOUT_S,
) -> dict:
    """One tiny run of the story's stack (``model.run_case``). On GPUs the naive mode runs in a child
    process: if it dies, the record says how (``outcome`` = the sandbox's status)."""
    recipe = {
        "margin": margin,
        "amax_history_len": amax_history_len,
        "amax_compute_algo": amax_compute_algo,
        "fp8_format": fp8_format,
    }
    size = size if size is not None else TINY["cpu" if placement == "cpu" else "gpu"]
    args = (placement, mode, size, steps)
    kwargs = {"recipe": recipe, "input_scales": model.drift_scales(drift, steps), "reps": 1}
    if placement == "cpu" or mode in ("bf16", "fp8_device_aware"):
        rec = model.run_case(*args, **kwargs)
    else:
        res = sandbox.run_isolated(model.run_case, *args, timeout=timeout, **kwargs)
        rec = (
            res.value
            if res.ok
            else {
                "placement": placement,
                "mode": mode,
                "outcome": res.status,
                "records": [],
                "errors": [],
                "sandbox_summary": res.summary(),
                "norm_rel_err_per_step": [],
                "rel_err_per_step": [],
            }
        )
    return dict(rec, drift=drift)


def _where(rec: dict) -> str:
    """Where each block's state lives against its weights: "state on each layer's weight's device
    (cpu)", or "attn state on cuda:0; mlp state on cuda:0, its weights on cuda:1"."""
    rows = rec.get("records") or []
    if rows and all(r["device"] == r["weight_device"] for r in rows):
        return f"state on each layer's weight's device ({', '.join(sorted({r['device'] for r in rows}))})"
    parts = []
    for block in ("attn", "mlp"):
        mine = [r for r in rows if r["module"].startswith(block + ".")]
        if not mine:
            continue
        state = sorted({r["device"] for r in mine})
        weight = sorted({r["weight_device"] for r in mine})
        parts.append(
            f"{block} state on {', '.join(state)}"
            + (f", its weights on {', '.join(weight)}" if state != weight else "")
        )
    return "; ".join(parts)


def verdict(rec: dict) -> str:
    """One line (two with a note): the outcome, the error against bf16 at the last and the worst
    step, where the state lives."""
    mode, placement, outcome = rec.get("mode"), rec.get("placement"), rec.get("outcome")
    head = f"{mode} on {placement}: {outcome}"
    if rec.get("sandbox_summary") and outcome not in ("ok", None) and not rec.get("records"):
        return f"{head} ({rec['sandbox_summary']})"
    errs = rec.get("norm_rel_err_per_step") or []
    if mode == "bf16":
        return (
            f"{head}; bf16 keeps no FP8 state: nothing to scale (it is the reference the FP8 modes are compared with)"
        )
    line = head
    if errs:
        worst = max(range(len(errs)), key=lambda i: errs[i])
        line += f"; error vs bf16 (norm-wise) at the last step {errs[-1]:.3f}, worst {errs[worst]:.3f} at step {worst}"
    if rec.get("mismatches"):
        line += f"; {len(rec['mismatches'])} amax/scale values differ from the independent model"
    where = _where(rec)
    if where:
        line += f"; {where}"
    if rec.get("errors"):
        first = rec["errors"][-1]
        line += f"; first error {first['type']} at {first.get('at')}"
    return line


FORMAT_NOTE = (
    "fp8_format: HYBRID and E4M3 differ only in the gradients' format (E5M2 or E4M3); this "
    "forward-only run casts no gradient, so the format changes nothing here."
)


def case_figure(rec: dict):
    """amax and scale of each layer's input over the steps (colour: the device its state lives on),
    and the norm-wise error against bf16 per step (``plots.plot_case``)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6), gridspec_kw={"width_ratios": [1, 1, 0.8]})
    plots.plot_case(rec, axes)
    fig.tight_layout()
    return fig


def case_report(
    placement: str = "cpu",
    mode: str = "fp8_device_aware",
    margin: float = 0,
    amax_history_len: int = 16,
    amax_compute_algo: str = "max",
    fp8_format: str = "HYBRID",
    drift: str = "spike",
    steps: int = 8,
    size: float | None = None,
) -> tuple[str, object]:
    """(verdict text, figure) of one tiny run: what the panel shows."""
    rec = case_record(placement, mode, margin, amax_history_len, amax_compute_algo, fp8_format, drift, steps, size)
    # what was run, first: two recipes can give the same numbers (a growing input makes the
    # history's max its most recent amax), and the reader should see that it did rerun
    text = (
        f"recipe: margin {margin}, amax history {amax_history_len}, amax algo {amax_compute_algo}, "
        f"format {fp8_format}; input {drift} over {steps} steps\n" + verdict(rec)
    )
    if fp8_format != "HYBRID" and mode != "bf16":
        text += "\n" + FORMAT_NOTE
    return text, case_figure(rec)


def recipe_explorer(maps: dict[str, str] | None = None, size: float | None = None):
    """The panel: recipe, input drift, device map and mode; each change reruns and redraws."""
    maps = maps or device_maps()
    margin = w.IntSlider(value=0, min=0, max=4, description="margin")
    history = w.SelectionSlider(options=[1, 2, 4, 8, 16], value=16, description="history len")
    algo = w.ToggleButtons(options=["max", "most_recent"], value="max", description="amax algo")
    fmt = w.ToggleButtons(options=["HYBRID", "E4M3"], value="HYBRID", description="format")
    drift = w.ToggleButtons(options=list(model.DRIFTS), value="growing", description="input")
    steps = w.IntSlider(value=8, min=2, max=12, description="steps")
    device_map = w.Dropdown(options=list(maps), value=next(iter(maps)), description="device map")
    mode = w.ToggleButtons(options=list(MODES), value="fp8_device_aware", description="mode")
    figure = FigureView()
    text = w.HTML()

    def redraw(change=None):
        if change is not None:  # a control moved: say so while the run takes (seconds; more in a child on GPUs)
            text.value = pre("running ...")
        report, fig = case_report(
            maps[device_map.value],
            mode.value,
            margin.value,
            history.value,
            algo.value,
            fmt.value,
            drift.value,
            steps.value,
            size,
        )
        figure.show(fig)
        text.value = pre(report)

    controls = (margin, history, algo, fmt, drift, steps, device_map, mode)
    for control in controls:
        control.observe(redraw, names="value")
    redraw()
    return w.VBox(
        [w.HBox([margin, history, steps]), w.HBox([algo, fmt]), drift, w.HBox([device_map, mode]), text, figure]
    )


__all__ = ["recipe_explorer", "case_report", "case_record", "case_figure", "verdict", "device_maps", "MODES"]
