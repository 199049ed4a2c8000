"""Figures of lab 05's records (``labkit.labs.fp8_dispatch.bench``, ``model.run_case``).

* ``plot_matrix``: the story's matrix, one row per mode, one column per placement, each cell
  coloured by its outcome and labelled with its error against bf16 and its forward time.
* ``plot_meta_history``: amax (measured each step) and scale (after each step's update) per
  module over the steps of one run, on a log scale, coloured and marked by the device the state
  lives on: where the story's state goes is the point of the figure.
* ``plot_speed``: the MLP GEMMs' median times, bf16 against the FP8 GEMM alone and the input's
  quantise + GEMM, the weight cast beside them; each FP8 bar carries its paired ratio to bf16.
  Where the GPU is listed, a dotted mark at each GEMM bar gives the shortest time its datasheet's
  dense tensor-core peak allows, and at the weight cast the shortest its HBM bandwidth allows
  (ceilings, never measurements).

matplotlib only; each function draws into axes the caller made (``labkit.workbench.plot.beside``).
"""

from __future__ import annotations

import textwrap

from labkit.labs.fp8_dispatch import findings
from labkit.labs.fp8_dispatch.model import MODES, PLACEMENTS
from labkit.workbench import hardware

#: outcome -> cell colour: green correct; amber / orange silent; red / purple loud; grey not run
OUTCOME_COLOURS = {
    "ok": "#4caf50",
    "wrong_output": "#ff9800",
    "wrong_scale": "#ffc107",
    "exception": "#e53935",
    "illegal_memory_access": "#8e24aa",
    "cuda_error": "#6a1b9a",
    "timeout": "#424242",
    "signal": "#616161",
    "exit": "#757575",
    "skipped": "#d0d0d0",
}
PLACEMENT_ORDER = tuple(PLACEMENTS)
#: how the matrix labels its rows: each mechanism with its letter in the notebook's section 3
MODE_LABELS = {
    "fp8_naive": "fp8_naive\n(a + b + c)",
    "lazy_meta_on_current_device": "(a) lazy meta on\ncurrent device",
    "global_reduction": "(b) global\nreduction",
    "unguarded_launch": "(c) unguarded\nlaunch",
}
DEVICE_STYLE = {"cpu": ("tab:gray", "o"), "cuda:0": ("tab:blue", "s"), "cuda:1": ("tab:red", "^")}
SPEED_COLOURS = {
    "bf16": "tab:gray",
    "fp8_gemm": "tab:blue",
    "fp8_quantize_gemm": "tab:green",
    "fp8_weight_cast": "tab:orange",
}
SPEED_LABELS = {
    "bf16": "bf16 GEMM",
    "fp8_gemm": "FP8 GEMM alone",
    "fp8_quantize_gemm": "input quantise + FP8 GEMM",
    "fp8_weight_cast": "weight cast (once per optimizer step)",
}


def datasheet_tflops(gpu_name: str | None, dtype: str) -> float | None:
    """The datasheet dense tensor-core TFLOP/s of a GPU ("bf16" or "fp8"), or None if not listed."""
    return hardware.datasheet_dense_tflops(gpu_name, dtype)  # labkit.workbench.hardware.DATASHEET_DENSE_TFLOPS


def outcome_class(outcome: str | None) -> str:
    """The colour class of an outcome: "exception: ..." -> "exception", "skipped: ..." -> "skipped"."""
    if not outcome:
        return "skipped"
    head = outcome.split(":", 1)[0]
    return head if head in OUTCOME_COLOURS else "exception"


def _empty(ax, title: str, text: str) -> None:
    ax.text(0.5, 0.5, textwrap.fill(text, 40), ha="center", va="center", fontsize=8, transform=ax.transAxes)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def _cell_text(r: dict) -> str:
    """A matrix cell's words: the outcome (for a refused run, what refused it, not the message
    cut mid-sentence), its error against bf16 and its forward time."""
    outcome = r.get("outcome") or "?"
    if outcome_class(outcome) == "skipped":
        return "not run here:\n" + textwrap.fill(outcome.split(": ", 1)[-1], 24)
    who = findings.refused_by(outcome)
    if who:  # "torch's device check in the FP8 GEMM, which ..." -> its first clause
        lines = ["exception: refused by", *textwrap.wrap(who.split(",")[0], 30)]
    else:
        lines = textwrap.wrap(findings._short(outcome), 30)
        if len(lines) > 3:
            lines = lines[:3]
            lines[-1] += " ..."
    err = r.get("rel_err_vs_bf16")
    if findings._is_nan(err):
        lines.append("output NaN")
    elif err is not None:
        lines.append(f"max rel err {err:.3f}")
    if r.get("forward_ms") is not None:
        lines.append(f"{r['forward_ms']:.2f} ms / forward")
    return "\n".join(lines)


def plot_matrix(records: list[dict], ax, title: str = "", kind: str = "matrix") -> None:
    """Rows: modes; columns: placements; colour: outcome; text: outcome, max relative error against
    the bf16 run of the same placement (last step), median forward ms (GPU only)."""
    from matplotlib.patches import Patch, Rectangle

    cells = [r for r in records if r.get("kind", "matrix") == kind and r.get("mode") in MODES]
    if not cells:
        return _empty(ax, title, "no matrix records here")
    cols = [p for p in PLACEMENT_ORDER if any(r["placement"] == p for r in cells)]
    rows = [m for m in MODES if any(r["mode"] == m for r in cells)]
    seen = set()
    for r in cells:
        i, j = rows.index(r["mode"]), cols.index(r["placement"])
        cls = outcome_class(r.get("outcome"))
        seen.add(cls)
        ax.add_patch(Rectangle((j, i), 1, 1, facecolor=OUTCOME_COLOURS[cls], edgecolor="white", lw=2))
        ax.text(
            j + 0.5,
            i + 0.5,
            _cell_text(r),
            ha="center",
            va="center",
            fontsize=7,
            color="black" if cls in ("ok", "wrong_output", "wrong_scale", "skipped") else "white",
        )
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks(
        [j + 0.5 for j in range(len(cols))],
        [f"{p}\n(attn {PLACEMENTS[p][0]}, mlp {PLACEMENTS[p][1]})" for p in cols],
        fontsize=7,
    )
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [MODE_LABELS.get(m, m) for m in rows], fontsize=7)
    ax.tick_params(length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.legend(
        handles=[Patch(color=OUTCOME_COLOURS[c], label=c) for c in OUTCOME_COLOURS if c in seen],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="outcome",
        title_fontsize=7,
    )
    ax.set_title(title, fontsize=9)


def meta_of(
    records: list[dict], placement: str | None = None, mode: str | None = None, tensor: str = "input"
) -> list[dict]:
    """The forward state's per-step records of one run: kind "meta" records (a benchmark's), or a
    ``run_case`` record's ``records`` list, filtered by placement, mode and tensor."""
    out = []
    for r in records:
        if r.get("kind") == "meta":
            rows = [r]
        elif "records" in r and r.get("mode") is not None:
            rows = [
                dict(m, placement=r.get("placement"), mode=r.get("mode"))
                for m in r["records"]
                if m.get("direction") == "forward"
            ]
        else:
            rows = [r] if "step" in r and "amax" in r else []
        out += [
            m
            for m in rows
            if (placement is None or m.get("placement") == placement)
            and (mode is None or m.get("mode") == mode)
            and m.get("tensor") == tensor
        ]
    return out


def plot_meta_history(
    records: list[dict],
    axes,
    title: str = "",
    placement: str | None = None,
    mode: str | None = None,
    tensor: str = "input",
) -> None:
    """Two axes: amax (left) and scale (right) over the steps, one line per module, colour and
    marker by the device its state lives on (its weight's device in brackets where they differ).
    Zero amaxes (a tensor not measured in a step) are left out of the log axis."""
    ax_amax, ax_scale = axes
    rows = meta_of(records, placement, mode, tensor)
    if not rows:
        for ax, what in ((ax_amax, "amax"), (ax_scale, "scale")):
            _empty(
                ax,
                f"{title}: {what}" if title else what,
                "no FP8 state recorded here (bf16, or the run failed before its first update)",
            )
        return
    modules = sorted({r["module"] for r in rows}, key=lambda m: (not m.startswith("attn"), m))
    devices_seen = {}
    ends = {ax_amax: [], ax_scale: []}  # (x, y, name, colour) of each line's last point
    for module in modules:
        pts = sorted(
            (r["step"], r["amax"], r["scale"], r["device"], r.get("weight_device"))
            for r in rows
            if r["module"] == module
        )
        device, weight_device = pts[-1][3], pts[-1][4]
        colour, marker = DEVICE_STYLE.get(device, ("tab:purple", "D"))
        apart = bool(weight_device) and weight_device != device  # the story's misplacement: hollow, dashed
        label = f"state on {device}" + (f", its weight on {weight_device}" if apart else "")
        style = dict(
            color=colour,
            marker=marker,
            ms=5 if apart else 4,
            lw=1,
            alpha=0.85,
            ls="--" if apart else "-",
            markerfacecolor="white" if apart else colour,
        )
        devices_seen[label] = style
        for ax, k in ((ax_amax, 1), (ax_scale, 2)):
            xs = [p[0] for p in pts if p[k] > 0]
            ys = [p[k] for p in pts if p[k] > 0]
            if not xs:
                continue
            ax.plot(xs, ys, **style)
            ends[ax].append((xs[-1], ys[-1], module.split(".")[-1], colour))
    steps = sorted({r["step"] for r in rows})
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], label=label, **style) for label, style in devices_seen.items()]
    for ax, what, unit in (
        (ax_amax, "amax", f"max |{tensor}|, measured in the step"),
        (ax_scale, "scale", "scale after the step's update\n(fp8_max / amax / 2^margin)"),
    ):
        ax.set_yscale("log")
        ax.set_xticks(steps)
        ax.set_xlim(min(steps) - 0.3, max(steps) + 0.9)
        ax.set_xlabel("step")
        ax.set_ylabel(unit, fontsize=8)
        ax.set_title(
            f"{title}: {what} of each layer's {tensor}" if title else f"{what} of each layer's {tensor}", fontsize=9
        )
        ax.grid(alpha=0.3, which="both")
    for ax, points in ends.items():  # after the axes are final: the spreading is in points on screen
        _label_line_ends(ax, points)
    ax_scale.legend(handles=handles, fontsize=7, loc="best")


def _label_line_ends(ax, points: list[tuple], gap_pt: float = 8.0) -> None:
    """Name each line at its last point. Names at the same step closer than ``gap_pt`` points on
    the axes as drawn are spread apart, each crowd centred on its points, so none hides another."""
    to_pt = 72.0 / ax.figure.dpi
    by_step: dict = {}
    for x, y, name, colour in points:
        by_step.setdefault(x, []).append((ax.transData.transform((x, y))[1] * to_pt, x, y, name, colour))
    for column in by_step.values():
        column.sort()
        # Blocks of names spaced gap_pt apart, each centred on the mean of its points; a block that
        # would overlap the one below merges with it (so every name stays as near its line as it can).
        blocks = []  # [sum of the points' heights, count]
        for c in column:
            blocks.append([c[0], 1])
            while len(blocks) > 1:
                (s0, n0), (s1, n1) = blocks[-2], blocks[-1]
                top_below = s0 / n0 + gap_pt * (n0 - 1) / 2
                bottom = s1 / n1 - gap_pt * (n1 - 1) / 2
                if bottom - top_below >= gap_pt:
                    break
                blocks[-2:] = [[s0 + s1, n0 + n1]]
        at = [total / n + gap_pt * (k - (n - 1) / 2) for total, n in blocks for k in range(n)]
        low, high = ax.bbox.y0 * to_pt + gap_pt / 2, ax.bbox.y1 * to_pt - gap_pt / 2
        shift = max(0.0, low - at[0]) - max(0.0, at[-1] - high)  # keep the names inside the axes
        at = [a + shift for a in at]
        for (y_pt, x, y, name, colour), want in zip(column, at):
            ax.annotate(
                name, (x, y), textcoords="offset points", xytext=(4, want - y_pt), fontsize=6, color=colour, va="center"
            )


def plot_case(rec: dict, axes, title: str | None = None) -> None:
    """One ``run_case`` record on three axes: amax and scale of each layer's input over the steps
    (``plot_meta_history``) and the norm-wise error against bf16 per step, with the line above
    which ``run_case`` calls the output wrong."""
    from labkit.labs.fp8_dispatch.model import WRONG_OUTPUT

    scales = rec.get("input_scales")
    if title is None:
        drift = rec.get("drift") or ("constant" if not scales else "x " + "/".join(f"{f:g}" for f in scales))
        title = f"{rec.get('mode')}, {rec.get('placement')}, input {drift}"
    plot_meta_history([rec], axes[:2], title)
    errs = rec.get("norm_rel_err_per_step") or []
    ax = axes[2]
    if errs and rec.get("mode") != "bf16":
        ax.plot(range(len(errs)), errs, marker="o", color="tab:purple")
        ax.axhline(WRONG_OUTPUT, color="0.3", ls="--", lw=1, label=f"'wrong_output' above {WRONG_OUTPUT}")
        ax.set_xticks(range(len(errs)))
        ax.set_ylim(0, max(errs + [WRONG_OUTPUT]) * 1.15)
        ax.legend(fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel("||out - bf16|| / ||bf16||", fontsize=8)
    ax.set_title("error against bf16, per step", fontsize=9)
    ax.grid(alpha=0.3)


def speed_rows(records: list[dict]) -> list[dict]:
    """Timed speed records (kind "speed" with a time), in shape order then SPEED_LABELS order."""
    rows = [r for r in records if r.get("kind") == "speed" and r.get("ms")]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    order = list(SPEED_LABELS)
    return sorted(rows, key=lambda r: (shapes.index(r["shape"]), order.index(r["impl"]) if r["impl"] in order else 99))


def plot_speed(records: list[dict], ax, title: str = "") -> None:
    """Median ms per MLP GEMM shape (whiskers: quartiles): bf16, FP8 GEMM alone, quantise + FP8
    GEMM, and the weight cast; FP8 bars annotated with the paired ratio bf16 time / their time
    (> 1: faster than bf16). Dotted marks: the datasheet's shortest possible GEMM time, where listed."""
    rows = speed_rows(records)
    if not rows:
        skipped = [r.get("outcome") for r in records if r.get("kind") == "speed" and r.get("outcome")]
        return _empty(ax, title, "no FP8 vs bf16 timing here" + (f"\n({skipped[0]})" if skipped else ""))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    impls = [i for i in SPEED_LABELS if any(r["impl"] == i for r in rows)]
    width = 0.8 / len(impls)
    gpus = {r.get("gpu") for r in rows}
    gpu = next(iter(gpus)) if len(gpus) == 1 else None
    ceiling_drawn = hbm_drawn = False
    for j, impl in enumerate(impls):
        sel = [(shapes.index(r["shape"]), r) for r in rows if r["impl"] == impl]
        xs = [i + (j - (len(impls) - 1) / 2) * width for i, _ in sel]
        ys = [r["ms"] for _, r in sel]
        yerr = [
            [r["ms"] - r.get("ms_p25", r["ms"]) for _, r in sel],
            [r.get("ms_p75", r["ms"]) - r["ms"] for _, r in sel],
        ]
        ax.bar(xs, ys, width, yerr=yerr, capsize=2, color=SPEED_COLOURS[impl], label=SPEED_LABELS[impl])
        for x, (_, r) in zip(xs, sel):
            ratio = r.get("ratio_vs_bf16")
            speedup = impl in ("fp8_gemm", "fp8_quantize_gemm") and ratio
            text = f"{r['ms']:.2f} ms" + (f"\n{1 / ratio:.2f}x" if speedup else "")
            ax.annotate(text, (x, r["ms"]), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6)
            hbm = hardware.datasheet_hbm_tbps(gpu) if impl == "fp8_weight_cast" and gpu else None
            if hbm:  # the cast reads the bf16 weight (2 B) and writes its FP8 copy (1 B): memory-bound
                floor_ms = 3 * r["N"] * r["K"] / (hbm * 1e9)
                ax.plot(
                    [x - width / 2, x + width / 2],
                    [floor_ms] * 2,
                    color="tab:brown",
                    ls=":",
                    lw=1.5,
                    label=None
                    if hbm_drawn
                    else f"shortest cast at the datasheet's HBM bandwidth\n(3 bytes per weight element, {hbm:g} TB/s)",
                )
                hbm_drawn = True
            dtype = {"bf16": "bf16", "fp8_gemm": "fp8", "fp8_quantize_gemm": "fp8"}.get(impl)
            peak = datasheet_tflops(gpu, dtype) if dtype else None
            if peak:
                floor_ms = 2 * r["M"] * r["N"] * r["K"] / (peak * 1e9)
                ax.plot(
                    [x - width / 2, x + width / 2],
                    [floor_ms] * 2,
                    color="black",
                    ls=":",
                    lw=1.5,
                    label=None
                    if ceiling_drawn
                    else f"shortest time at the datasheet's dense peak\n"
                    f"({gpu.replace('NVIDIA ', '')}: bf16 {datasheet_tflops(gpu, 'bf16'):g}, "
                    f"FP8 {datasheet_tflops(gpu, 'fp8'):g} TFLOP/s)",
                )
                ceiling_drawn = True
    first = {r["shape"]: r for r in reversed(rows)}
    ax.set_xticks(
        range(len(shapes)),
        [f"{s}\nx {first[s]['M']}×{first[s]['K']} @ W.T, W {first[s]['N']}×{first[s]['K']}" for s in shapes],
        fontsize=7,
    )
    ax.set_ylabel(
        "median ms per call (whiskers p25-p75)\nFP8 GEMM bars: bf16 time / their time,\nmedian of the paired rounds",
        fontsize=8,
    )
    ax.set_ylim(0, max(r.get("ms_p75", r["ms"]) for r in rows) * 1.25)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")


__all__ = [
    "plot_matrix",
    "plot_meta_history",
    "plot_case",
    "plot_speed",
    "meta_of",
    "speed_rows",
    "outcome_class",
    "datasheet_tflops",
    "OUTCOME_COLOURS",
]
