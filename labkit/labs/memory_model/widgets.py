"""Lab 06's panels: a litmus test rerun for any test, semantics, scope, placement and stress, and
lab 02's broken barriers under a delay.

The text and the drawing come from plain functions (``litmus_report``, ``litmus_figure``,
``broken_report``); tests call the same functions and press the same buttons."""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from labkit.kernels.litmus import TESTS, model
from labkit.workbench import tier
from labkit.workbench.widgets import FigureView, pre, run_button

#: instances per rerun: small enough to redraw in about a second
LIVE_INSTANCES = {"gpu": 100_000, "interpreter": 256}


def variant_of(semantics: str, scope: str) -> tuple[str, str | None]:
    """The panel's choices as a variant: unscoped semantics ignore the scope; scoped ones given
    "none" take "gpu"."""
    if semantics not in model.SCOPED:
        return semantics, None
    return semantics, (scope if scope in model.SCOPES else "gpu")


def runnable(semantics: str, placement: str, gpus: int) -> str | None:
    """Why this variant cannot run here (None: it can)."""
    if semantics in model.SCOPED and tier.interpreted():
        return "inline PTX needs a compiled GPU; the model's outcome set is shown instead"
    if placement == "two_gpus" and not tier.interpreted() and gpus < 2:
        return "two_gpus needs 2 GPUs with peer access"
    return None


def litmus_record(
    test: str, semantics: str, scope: str, placement: str, stress: str, recorded=(), gpus: int = 0
) -> tuple[dict | None, str]:
    """A record for the choice: run now where possible, else the recorded row (if any); and where
    it came from."""
    from labkit.labs.memory_model import sweep

    sem, sc = variant_of(semantics, scope)
    row = {"test": test, "semantics": sem, "scope": sc, "placement": placement, "stress_name": stress}
    why = runnable(sem, placement, gpus)
    if why is None:
        n = LIVE_INSTANCES["interpreter" if tier.interpreted() else "gpu"]
        if placement == "two_gpus" and tier.interpreted():
            n = 64
        stress_obj = sweep.STRESSES[stress] if not tier.interpreted() else sweep.Stress()
        rec = sweep.run_row(row, n, stress=stress_obj)
        where = "live, this machine" + (
            " (interpreter: SC outcomes only; stress not applied)" if tier.interpreted() else ""
        )
        if rec.get("note"):
            where += f"; {rec['note']}"
        return rec, where
    for r in recorded:
        if sweep.key_of(r) == sweep.key_of(row) and not r.get("skipped"):
            return r, f"RECORDED ({r.get('device') or 'reference'}), not this machine; {why}"
    return sweep.record(row, skipped=why), f"not run: {why}"


def litmus_report(rec: dict, where: str) -> str:
    from labkit.labs.memory_model import plots

    lines = [
        f"[{where}]",
        plots.label(rec),
        plots.rate_text(rec),
        f"model: weak outcome {rec['verdict']}; PTX: {rec['ptx_verdict']}"
        + (f" ({rec['ptx_note']})" if rec.get("ptx_note") else ""),
        "outcomes the model allows: " + " ".join(f"({o})" for o in rec["model_outcomes"]),
    ]
    if rec.get("counts"):
        lines.append("observed: " + ", ".join(f"({k}): {v:,}" for k, v in rec["counts"].items()))
    return "\n".join(lines)


def litmus_figure(rec: dict):
    from labkit.labs.memory_model import plots

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.5]})
    plots.plot_test(rec["test"], left)
    plots.plot_histogram(rec, right)
    fig.subplots_adjust(top=0.74, bottom=0.3, left=0.03, right=0.98, wspace=0.2)
    return fig


def litmus_explorer(recorded=(), gpus: int = 0):
    """Change test, semantics, scope, placement or stress: the test reruns (where this machine
    can run it) or the recorded row is shown, and the histogram is redrawn."""
    from labkit.labs.memory_model import sweep

    test = w.Dropdown(options=list(TESTS), value="MP", description="test")
    semantics = w.ToggleButtons(options=list(model.SEMANTICS), value="plain", description="semantics")
    scope = w.ToggleButtons(options=["none"] + list(model.SCOPES), value="none", description="scope")
    placement = w.ToggleButtons(options=list(model.PLACEMENTS), value="cross_cta", description="placement")
    stress = w.ToggleButtons(options=list(sweep.STRESSES), value="none", description="stress")
    text, figure = w.HTML(), FigureView()

    def redraw(_=None):
        rec, where = litmus_record(
            test.value, semantics.value, scope.value, placement.value, stress.value, recorded, gpus
        )
        text.value = pre(litmus_report(rec, where))
        figure.show(litmus_figure(rec))

    for control in (test, semantics, scope, placement, stress):
        control.observe(redraw, names="value")
    redraw()
    return w.VBox([test, semantics, scope, placement, stress, text, figure])


def broken_report(algorithm: str, variant: str, delay: int, trials: int, recorded=(), live: bool = True) -> str:
    """One broken-barrier row: run on two ranks (2 GPUs, or the emulated world), or recorded."""
    from labkit.labs.memory_model import broken_barriers as bb

    if live:
        r = bb.measure(
            variant,
            algorithm,
            delay,
            trials,
            4096 if tier.interpreted() else 1 << 16,
            "float32" if tier.interpreted() else "bfloat16",
        )
        where = "live, emulated world (processes, interpreted kernels)" if r["world"] == "emulated" else "live, 2 GPUs"
    else:
        rows = [
            r
            for r in recorded
            if (r["algorithm"], r["variant"], r["delay"]) == (algorithm, variant, delay) and not r.get("skipped")
        ]
        if not rows:
            return f"no recorded row for {algorithm} {variant} at delay {delay}, and this machine cannot run it"
        r, where = rows[0], "RECORDED, not this machine"
    if r.get("skipped"):
        return f"[{where}] {algorithm} {variant} delay {delay}: not run: {r['skipped']}"
    return (
        f"[{where}] {algorithm}, variant {variant}, delay {delay} on rank {r.get('slow_rank', 1)}:\n"
        f"wrong results in {r['wrong_results']} of {r['trials']} trials; signal pads back at zero: {r.get('pads_zero')}"
    )


def broken_explorer(recorded=(), live: bool = True):
    """Pick an algorithm, a variant and a delay; run the trials (2 GPUs or the emulated world)."""
    from labkit.labs.memory_model import broken_barriers as bb

    variant = w.ToggleButtons(options=list(bb.VARIANTS), value="no_end_barrier", description="variant")
    algorithm = w.Dropdown(
        options=["one_shot", "two_shot", "two_shot_in_place", "tree"], value="one_shot", description="algorithm"
    )
    delays = [0, 400, 4000] if tier.interpreted() else [0, 100, 1000, 10000]
    delay = w.SelectionSlider(options=delays, value=delays[1], description="delay")
    trials = w.IntSlider(value=3 if tier.interpreted() else 20, min=1, max=60, description="trials")
    out = w.HTML()
    button = run_button(
        "Run the trials" if live else "Show recorded",
        out,
        lambda: broken_report(algorithm.value, variant.value, delay.value, trials.value, recorded, live),
    )
    return w.VBox([variant, w.HBox([algorithm, delay, trials, button]), out])
