"""Figures of the grouped-GEMM benchmark (``labkit.labs.grouped_gemm.bench`` records).

* ``plot_tflops_panels``: TFLOP/s, one panel per shape, bars per implementation for each
  product (forward, dgrad, wgrad) and split, under the datasheet's bf16 dense tensor-core peak
  where the GPU is listed (a ceiling labelled as a datasheet figure), labkit's ratio to torch
  from the record above its bar.
* ``plot_ratio``: labkit's time over torch's (or the loop's) in the same rounds, per shape and
  split, eager and graph side by side, with the line at 1.0.
* ``plot_cpu_cost``: host microseconds per call of each implementation (log scale).

torch is timed with w in two layouts (and in backward through autograd too); these plots show
its faster call per comparison (``torch_layout_best``), the baseline the ratios use.
"""

from __future__ import annotations

from labkit.workbench import hardware

IMPL_COLORS = {"labkit": "tab:blue", "torch_grouped_mm": "tab:orange", "host_sync_loop": "tab:red"}
METHOD_ORDER = ("graph", "eager", "cpu_clock")
#: forward records are kind "gemm", backward ones "gemm_backward" (field ``op``: dgrad, wgrad)
GEMM_KINDS = ("gemm", "gemm_backward")
OPS_ORDER = ("forward", "dgrad", "wgrad")


def datasheet_bf16_tflops(gpu_name: str | None) -> float | None:
    """The datasheet bf16 dense tensor-core peak of a GPU by its reported name, or None
    (``labkit.workbench.hardware.DATASHEET_DENSE_TFLOPS``: a ceiling to draw, never a measurement)."""
    return hardware.datasheet_dense_tflops(gpu_name, "bf16")


def _shown(records: list[dict], kinds: tuple[str, ...] = ("gemm",)) -> list[dict]:
    """Timed records of ``kinds`` (the forward's "gemm" unless told), torch only in its faster
    call of each comparison."""
    return [
        r
        for r in records
        if r.get("kind") in kinds
        and r.get("ms")
        and (r.get("impl") != "torch_grouped_mm" or r.get("torch_layout_best") in (True, None))
    ]


def _shape(r: dict) -> tuple:
    return (r["experts"], r["tokens"], r["K"], r["N"])


def _group_ticks(ax, groups: list[tuple]) -> None:
    """x ticks of (shape, split) groups: short labels, the shapes spelled out in the axis label."""
    ax.set_xticks(range(len(groups)), [f"E={s[0]}\n{skew}" for s, skew in groups], fontsize=7)
    shapes = sorted({s for s, _ in groups})
    ax.set_xlabel(
        "experts and split; tokens M × K × N: " + ", ".join(f"E={E} {M}×{K}×{N}" for E, M, K, N in shapes), fontsize=7
    )


def _empty(ax, title: str, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8, transform=ax.transAxes, wrap=True)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def shapes_of(records: list[dict]) -> list[tuple]:
    """The (experts, tokens, K, N) shapes of timed grouped-GEMM records, fewest experts first:
    one panel each in ``plot_tflops_panels``."""
    return sorted({_shape(r) for r in _shown(records, kinds=GEMM_KINDS)})


def _op(r: dict) -> str:
    return r.get("op") or "forward"


def plot_tflops_panels(records: list[dict], axes, method: str | None = None, title: str = "") -> None:
    """TFLOP/s (2·M·N·K over the median time), one panel per shape (``shapes_of``; ``axes``: as
    many): bars per implementation (torch in its faster call of each comparison) for each product
    (forward, dgrad, wgrad) and split, under the GPU's datasheet bf16 dense peak where it is
    listed (``hardware.DATASHEET_DENSE_TFLOPS``: the ceiling, a datasheet figure). Above labkit's
    bar: its ``ratio_vs_torch`` from the same record (time over torch's; below 1 is faster).
    ``method``: "graph", "eager" or "cpu_clock" (default: the first the records hold)."""
    rs = _shown(records, kinds=GEMM_KINDS)
    if method is None:
        method = next((m for m in METHOD_ORDER if any(r["method"] == m for r in rs)), None)
    rs = [r for r in rs if r["method"] == method]
    shapes = sorted({_shape(r) for r in rs})
    axes = list(axes)
    if not rs:
        return _empty(axes[0], title, f"no timed grouped-GEMM records for method {method!r}")
    gpus = {r.get("gpu") for r in rs}
    peak = datasheet_bf16_tflops(next(iter(gpus))) if len(gpus) == 1 else None
    impls = [i for i in IMPL_COLORS if any(r["impl"] == i for r in rs)]
    for ax, shape in zip(axes, shapes):
        mine = [r for r in rs if _shape(r) == shape]
        groups = sorted({(_op(r), r["skew"]) for r in mine}, key=lambda g: (OPS_ORDER.index(g[0]), g[1] != "uniform"))
        width = 0.8 / len(impls)
        for j, impl in enumerate(impls):
            at = {(_op(r), r["skew"]): r for r in mine if r["impl"] == impl}
            xs = [i + (j - (len(impls) - 1) / 2) * width for i, g in enumerate(groups) if g in at]
            sel = [at[g] for g in groups if g in at]
            ax.bar(xs, [r["tflops"] for r in sel], width, color=IMPL_COLORS[impl], label=impl)
            if impl == "labkit":
                for x, r in zip(xs, sel):
                    if r.get("ratio_vs_torch") is not None:
                        ax.annotate(
                            f"×{r['ratio_vs_torch']:.2f}",
                            (x, r["tflops"]),
                            textcoords="offset points",
                            xytext=(0, 2),
                            ha="center",
                            fontsize=6,
                        )
        if peak:
            ax.axhline(peak, color="0.3", ls=":", lw=1.2, label=f"datasheet bf16 dense peak: {peak:g} TFLOP/s")
            ax.set_ylim(0, peak * 1.1)
        else:
            ax.set_ylim(bottom=0)
        ax.set_xticks(range(len(groups)), [f"{op}\n{skew}" for op, skew in groups], fontsize=7)
        E, M, K, N = shape
        ax.set_title(f"E={E}: {M} tokens, K={K}, N={N}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    for ax in axes[len(shapes) :]:
        ax.axis("off")
    axes[0].set_ylabel(f"TFLOP/s (2·M·N·K / median time)\nmethod: {method}", fontsize=8)
    # one legend, below the first panel; "×r" above labkit's bars is its time over torch's
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(
        handles + [matplotlib_text_handle()],
        labels + ["×r: labkit time / torch's (paired median)"],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(0.0, -0.18),
        ncol=len(labels) + 1,
        frameon=False,
    )


def matplotlib_text_handle():
    """An empty legend handle (a line of no width) for a legend entry that is only words."""
    from matplotlib.lines import Line2D

    return Line2D([], [], lw=0)


def ratio_rows(records: list[dict], against: str = "torch", op: str = "forward") -> list[dict]:
    """labkit's paired ratio per (shape, split, method) of one product (``op``: forward, dgrad
    or wgrad): {"shape", "skew", "method", "ratio", "p25", "p75"} from ``ratio_vs_torch`` or
    ``ratio_vs_loop``."""
    if against not in ("torch", "loop"):
        raise ValueError(f"against: {against!r} is not 'torch' or 'loop'")
    if op not in OPS_ORDER:
        raise ValueError(f"op: {op!r} is not one of {OPS_ORDER}")
    key = f"ratio_vs_{against}"
    return [
        {
            "shape": _shape(r),
            "skew": r["skew"],
            "method": r["method"],
            "ratio": r[key],
            "p25": r.get(f"{key}_p25"),
            "p75": r.get(f"{key}_p75"),
        }
        for r in _shown(records, kinds=GEMM_KINDS)
        if r["impl"] == "labkit" and _op(r) == op and r.get(key) is not None
    ]


def plot_ratio(records: list[dict], ax, title: str, against: str = "torch", op: str = "forward") -> None:
    """labkit's time over torch's grouped GEMM (``against="torch"``) or over the host-sync loop
    (``"loop"``, forward only), paired per round, for one product (``op``): median bars, quartile
    whiskers, per shape and split, one bar per method; the line at 1.0 is "as fast as" the other."""
    rows = ratio_rows(records, against, op)
    other = "torch's grouped GEMM" if against == "torch" else "the host-sync loop"
    if not rows:
        return _empty(
            ax,
            title,
            f"no paired timing of labkit against {other} in these records"
            + (" (torch's device-side path needs sm_90)" if against == "torch" else ""),
        )
    groups = sorted({(row["shape"], row["skew"]) for row in rows}, key=lambda g: (g[0], g[1] != "uniform"))
    methods = [m for m in METHOD_ORDER[::-1] if any(row["method"] == m for row in rows)]
    width = 0.8 / len(methods)
    colors = {"eager": "tab:green", "graph": "tab:purple", "cpu_clock": "tab:gray"}
    for j, m in enumerate(methods):
        at = {(row["shape"], row["skew"]): row for row in rows if row["method"] == m}
        xs = [i + (j - (len(methods) - 1) / 2) * width for i, g in enumerate(groups) if g in at]
        sel = [at[g] for g in groups if g in at]
        ys = [row["ratio"] for row in sel]
        have_q = all(row["p25"] is not None and row["p75"] is not None for row in sel)
        yerr = (
            [[row["ratio"] - row["p25"] for row in sel], [row["p75"] - row["ratio"] for row in sel]] if have_q else None
        )
        ax.bar(xs, ys, width, yerr=yerr, capsize=2, color=colors.get(m), label=m)
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6)
    ax.axhline(
        1.0,
        color="0.2",
        lw=1,
        ls="--",
        label="1.0: as fast as torch" if against == "torch" else "1.0: as fast as the loop",
    )
    _group_ticks(ax, groups)
    ax.set_ylabel(f"labkit time / {other} time\n(same round; median of paired ratios,\nwhiskers p25-p75)", fontsize=8)
    ax.set_title(title, fontsize=9)
    top = max([row["p75"] or row["ratio"] for row in rows] + [1.0])
    if against == "loop":
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, top * 1.15)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")


def plot_cpu_cost(records: list[dict], ax, title: str) -> None:
    """Host µs per call (``cpu_us``: ``inner`` calls without a sync, divided by ``inner``) per
    implementation, grouped by shape and split; log scale. For labkit and torch this is the
    launch cost; for the loop it includes waiting for the GPU at ``tolist()``."""
    rs = [r for r in _shown(records) if r.get("cpu_us")]
    if not rs:
        return _empty(ax, title, "no host-cost measurements in these records")
    groups = sorted({(_shape(r), r["skew"]) for r in rs}, key=lambda g: (g[0], g[1] != "uniform"))
    impls = [i for i in IMPL_COLORS if any(r["impl"] == i for r in rs)]
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        at = {(_shape(r), r["skew"]): r for r in rs if r["impl"] == impl}
        xs = [i + (j - (len(impls) - 1) / 2) * width for i, g in enumerate(groups) if g in at]
        ys = [at[g]["cpu_us"] for g in groups if g in at]
        ax.bar(xs, ys, width, color=IMPL_COLORS[impl], label=impl)
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6)
    ax.set_yscale("log")
    _group_ticks(ax, groups)
    ax.set_ylabel("host µs per call (no sync; median)", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")


__all__ = [
    "datasheet_bf16_tflops",
    "plot_cpu_cost",
    "plot_ratio",
    "plot_tflops_panels",
    "ratio_rows",
    "shapes_of",
]
