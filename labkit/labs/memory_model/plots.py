"""Lab 06's figures, drawn from records (``sweep`` and ``broken_barriers``), live or recorded.

* ``plot_histogram``: one row's outcome counts, the weak outcome highlighted, outcomes the model
  forbids hatched, the weak rate with its 95 % bound or "not observed in N" in the title;
* ``plot_observed_grid``: how often each test's weak outcome was seen, per semantics and scope,
  beside what the model says (hatched where it forbids it), as a coloured grid;
* ``plot_model_grid``: what the model and PTX say of each test's weak outcome, for every
  semantics and scope, as a coloured grid (any machine);
* ``plot_cost``: ns per instance by semantics and scope, from rows timed without their compile;
* ``plot_test``: a litmus test drawn as threads and their accesses;
* ``plot_barrier_hb``: the happens-before diagram of the correct barrier (lab 02's one-shot);
* ``plot_broken``: wrong results of the broken barriers against the delay.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Patch

from labkit.kernels.litmus import model
from labkit.kernels.litmus.catalogue import get_test

WEAK = "#d62728"
FORBIDDEN = "#7f7f7f"
PLAIN = "#1f77b4"


def label(r: dict) -> str:
    scope = f".{r['scope']}" if r.get("scope") else ""
    return f"{r['test']} {r['semantics']}{scope} {r['placement']} · stress {r.get('stress_name', '?')}"


def rate_text(r: dict) -> str:
    """The weak outcome's count as words: k of N with a 95 % interval, or not observed in N."""
    if r.get("skipped"):
        return f"not run: {r['skipped']}"
    n, k = r.get("classified", r["runs"]), r["weak_outcomes"]
    if n == 0:
        return "no instance classified"
    if k == 0:
        return f"weak not observed in {n:,} (rate < {r['upper']:.2g}, 95%)"
    return f"weak {k:,} of {n:,} = {r['rate']:.3g} (95% [{r['lower']:.2g}, {r['upper']:.2g}])"


def plot_histogram(r: dict, ax=None, title: str | None = None):
    """Bars of every outcome the row saw and every outcome the model allows (0 where unseen), on
    a log count axis; the weak outcome red, model-forbidden outcomes hatched."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.2))
    t = get_test(r["test"])
    weak = ",".join(map(str, t.weak))
    allowed = set(r.get("model_outcomes") or [])
    keys = sorted(set(r.get("counts") or {}) | allowed | {weak}, key=lambda k: tuple(int(v) for v in k.split(",")))
    counts = [(r.get("counts") or {}).get(k, 0) for k in keys]
    colors = [WEAK if k == weak else PLAIN for k in keys]
    bars = ax.bar(range(len(keys)), [max(c, 0) for c in counts], color=colors)
    for b, k, c in zip(bars, keys, counts):
        if k not in allowed:
            b.set_hatch("//")
            b.set_edgecolor(FORBIDDEN)
        if c == 0:
            ax.text(b.get_x() + b.get_width() / 2, 1, "0", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"({k})" for k in keys], rotation=45, ha="right", fontsize=7)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("instances (count, log)")
    ax.set_xlabel("outcome (" + ", ".join(t.observed) + ")")
    ax.set_title((title + "\n" if title else "") + label(r) + "\n" + rate_text(r), fontsize=8)
    ax.legend(
        handles=[
            Patch(color=WEAK, label="weak outcome"),
            Patch(facecolor="white", edgecolor=FORBIDDEN, hatch="//", label="forbidden by the model"),
        ],
        fontsize=6,
        loc="best",
    )
    return ax


def variant_columns() -> list[tuple[str, str | None]]:
    """The grids' columns: every (semantics, scope) of ``model.variants()``, in its order."""
    return list(dict.fromkeys((sem, sc) for sem, sc, _ in model.variants()))


def observed_grid(records, stress: str = "memory"):
    """(rows, cols, cells) of the observed weak rates, laid out as ``model_grid``: rows (test,
    placement) for the placements the records hold, columns (semantics, scope); each cell the
    record of that row under ``stress`` (else under the first stress it ran with), or None."""
    from labkit.labs.memory_model.sweep import STRESSES

    tests = [t for t in model.TESTS if any(r.get("test") == t for r in records)]
    placements = [p for p in model.PLACEMENTS if any(r.get("placement") == p for r in records)]
    cols = variant_columns()
    order = [stress] + [s for s in STRESSES if s != stress]
    found = {}
    for r in records:
        if r.get("skipped"):
            continue
        key = (r["test"], r["placement"], r["semantics"], r.get("scope"))
        rank = order.index(r.get("stress_name")) if r.get("stress_name") in order else len(order)
        if key not in found or rank < found[key][0]:
            found[key] = (rank, r)
    rows = [(t, p) for t in tests for p in placements]
    cells = [[found.get((t, p, sem, sc), (None, None))[1] for sem, sc in cols] for t, p in rows]
    return rows, cols, cells


def short_rate(rate: float) -> str:
    """0.0241 -> "2.4%", 7.06e-4 -> "7e-4": a cell's label."""
    if rate >= 0.01:
        return f"{rate * 100:.1f}%"
    mantissa, exponent = f"{rate:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def plot_observed_grid(records, ax=None, title: str = "observed", stress: str = "memory"):
    """How often each test's weak outcome was seen, by semantics and scope (columns) and test and
    placement (rows), coloured by log10 of the rate; grey "0": not observed (in the N of the
    row); hatched: the simplified model forbids it; red frame: seen although both the model and
    PTX forbid it (a bug in the hardware, the compiler or the kernels); blank: not run."""
    import math

    from matplotlib import cm, colors

    rows, cols, cells = observed_grid(records, stress)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.62 * len(cols), 0.9 + 0.32 * max(1, len(rows))))
    norm = colors.Normalize(vmin=-7, vmax=-1)
    cmap = plt.get_cmap("YlOrRd")
    stresses = set()
    for i, line in enumerate(cells):
        for j, r in enumerate(line):
            if r is None:
                ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor="white", edgecolor="0.85"))
                continue
            stresses.add(r.get("stress_name"))
            n = r.get("classified", r["runs"])
            rate = r["weak_outcomes"] / n if n else 0.0
            face = cmap(norm(math.log10(rate))) if rate > 0 else "#eeeeee"
            ax.add_patch(
                plt.Rectangle(
                    (j, i),
                    1,
                    1,
                    facecolor=face,
                    edgecolor="white",
                    hatch="///" if r["verdict"] == "forbidden" else None,
                )
            )
            if r.get("not_possible") or (rate > 0 and r["verdict"] == "forbidden" and r["ptx_verdict"] == "forbidden"):
                ax.add_patch(plt.Rectangle((j + 0.04, i + 0.04), 0.92, 0.92, fill=False, edgecolor=WEAK, lw=2))
            dark = rate > 0 and norm(math.log10(rate)) > 0.6
            ax.text(
                j + 0.5,
                i + 0.5,
                short_rate(rate) if rate > 0 else "0",
                ha="center",
                va="center",
                fontsize=6.5,
                color="white" if dark else "black",
            )
    ax.set_xlim(0, len(cols))
    ax.set_ylim(max(1, len(rows)), 0)
    ax.set_xticks(
        [j + 0.5 for j in range(len(cols))], [sem + (f"\n{sc}" if sc else "") for sem, sc in cols], fontsize=7
    )
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [f"{t}, {p}" for t, p in rows], fontsize=7)
    ax.tick_params(length=0)
    bar = plt.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, fraction=0.025, pad=0.01)
    bar.set_label("log10 weak rate", fontsize=7)
    bar.ax.tick_params(labelsize=7)
    shown = ", ".join(sorted(s for s in stresses if s)) or "-"
    ax.set_title(
        f"{title}\nweak outcome rate (stress {shown}; grey 0: not observed; hatched: the model "
        "forbids it; blank: not run)",
        fontsize=8,
    )
    return ax


def cost_rows(records, stress: str | None = "memory") -> list[dict]:
    """Rows whose ``seconds`` are the launches alone, under ``stress`` (None: any): rows with
    ``warmup_s`` (timed after an untimed first launch, which compiles or loads the kernel), and,
    of rows without it (reference/h100x2/memory_model_litmus.json), the one-GPU rows under "memory" stress
    (each ran right after its variant's "none" row in the same worker, whose first launch had
    compiled the same kernel); every other row without it has a compile in its seconds, so it is
    left out."""
    out = []
    for r in records:
        if r.get("skipped") or not r.get("runs") or (stress and r.get("stress_name") != stress):
            continue
        if "warmup_s" in r or (r.get("stress_name") == "memory" and r.get("placement") != "two_gpus"):
            out.append(r)
    return out


def cost_by_variant(records, stress: str | None = "memory") -> list[tuple[str, float, float, float, int]]:
    """(semantics.scope, median, min, max ns per instance, rows) over the tests and placements of
    ``cost_rows``, in the model's column order."""
    import statistics

    by: dict[str, list[float]] = {}
    for r in cost_rows(records, stress):
        by.setdefault(f"{r['semantics']}.{r['scope'] or '-'}", []).append(r["seconds"] / r["runs"] * 1e9)
    order = [f"{sem}.{sc or '-'}" for sem, sc in variant_columns()]
    return [(k, statistics.median(by[k]), min(by[k]), max(by[k]), len(by[k])) for k in order if k in by]


def plot_cost(records, ax=None, title: str = "cost", stress: str | None = "memory"):
    """What each semantics costs in the litmus kernel: ns per instance (the launches' seconds over
    the instances), the median over tests and placements as a bar, their range as a whisker."""
    rows = cost_by_variant(records, stress)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
    if not rows:
        ax.axis("off")
        ax.text(0.5, 0.5, f"{title}: no row timed without its compile", ha="center", va="center", fontsize=9)
        return ax
    ys = range(len(rows))
    med = [r[1] for r in rows]
    ax.barh(list(ys), med, color=PLAIN, alpha=0.8)
    ax.errorbar(
        med,
        list(ys),
        xerr=[[m - r[2] for m, r in zip(med, rows)], [r[3] - m for m, r in zip(med, rows)]],
        fmt="none",
        ecolor="0.2",
        capsize=2,
        lw=0.8,
    )
    ax.set_yticks(list(ys), [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(r[3] for r in rows) * 1.15)
    ax.set_xlabel(
        "ns per instance (launch seconds / instances): median over tests and placements, range as whisker", fontsize=8
    )
    shown = stress or ", ".join(sorted({str(r.get("stress_name")) for r in cost_rows(records, None)}))
    ax.set_title(f"{title}: stress {shown}, {sum(r[4] for r in rows)} rows", fontsize=9)
    return ax


def plot_test(test: str, ax=None):
    """Threads as columns, each access a box in program order; the weak outcome underneath."""
    t = get_test(test)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.8 * len(t.threads) + 0.5, 2.2))
    ax.axis("off")
    n = len(t.threads)
    for i, acc in enumerate(t.threads):
        x = (i + 0.5) / n
        ax.text(x, 0.9, f"T{i}", ha="center", fontsize=10, weight="bold")
        for j, a in enumerate(acc):
            y = 0.68 - 0.24 * j
            color = "#fde0c5" if a.kind == "st" else "#d5e8f7"
            ax.text(
                x,
                y,
                ("store " if a.kind == "st" else "load ") + str(a),
                ha="center",
                va="center",
                fontsize=9,
                bbox={"boxstyle": "round", "facecolor": color, "edgecolor": "0.4"},
            )
        if len(acc) == 2:
            ax.annotate("", (x, 0.5), (x, 0.6), arrowprops={"arrowstyle": "->", "color": "0.5"})
    weak = ", ".join(f"{o}={v}" for o, v in zip(t.observed, t.weak))
    ax.text(0.5, 0.08, f"weak outcome: {weak}", ha="center", fontsize=9, color=WEAK)
    ax.set_title(textwrap.fill(f"{t.name}: {t.question}", 18 * n + 10), fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    return ax


def plot_barrier_hb(ax=None):
    """Happens-before in the correct one-shot all-reduce, two ranks: program order on each rank,
    synchronises-with from each release (send) to the peer's acquire (wait) of the same slot, and
    the end barrier's edge that keeps rank 0's next input out of rank 1's reads."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.6))
    ax.axis("off")
    steps = [
        "write input (copy_)",
        "start: release-send to peer",
        "start: acquire-wait for peer",
        "read every buffer, sum",
        "end: release-send to peer",
        "end: acquire-wait for peer",
        "return; next input written",
    ]
    xs = (0.22, 0.78)
    ys = [0.9 - 0.115 * i for i in range(len(steps))]
    for r, x in enumerate(xs):
        ax.text(x, 0.98, f"rank {r}", ha="center", fontsize=10, weight="bold")
        for i, (s, y) in enumerate(zip(steps, ys)):
            ax.text(
                x,
                y,
                s,
                ha="center",
                va="center",
                fontsize=8,
                bbox={
                    "boxstyle": "round",
                    "facecolor": "#eeeeee" if "read" not in s else "#d5e8f7",
                    "edgecolor": "0.4",
                },
            )
            if i:
                ax.annotate("", (x, y + 0.035), (x, ys[i - 1] - 0.035), arrowprops={"arrowstyle": "->", "color": "0.5"})
    for a, b in ((0, 1), (1, 0)):
        for send, wait in ((1, 2), (4, 5)):
            ax.add_patch(
                FancyArrowPatch(
                    (xs[a] + (0.12 if a == 0 else -0.12), ys[send]),
                    (xs[b] + (-0.12 if b == 1 else 0.12), ys[wait]),
                    arrowstyle="->",
                    color="#2ca02c",
                    mutation_scale=10,
                    lw=1.2,
                )
            )
    ax.text(
        0.5,
        -0.06,
        "grey: program order.  green: synchronises-with (release -> acquire of one signal slot, "
        "sys scope).\nStart edges: every input is visible before any read. End edges: no rank writes its next "
        "input\nbefore every peer has finished reading (remove them: no_end_barrier; make them relaxed: relaxed; "
        "gpu scope: gpu_scope).",
        ha="center",
        fontsize=7,
    )
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.1, 1)
    ax.set_title("happens-before of the correct barrier (one-shot all-reduce, 2 ranks)", fontsize=9)
    return ax


def plot_broken(records, ax=None, title: str = ""):
    """Share of wrong results against the delay, one line per algorithm x variant; skipped rows
    listed in the title; delay 0 drawn at the left edge (a symlog axis)."""
    from labkit.labs.memory_model.broken_barriers import rates

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    table = rates(records)
    run = [e for e in table if e["trials"]]
    skipped = [e for e in table if not e["trials"]]
    series: dict = {}
    for e in run:
        series.setdefault((e["algorithm"], e["variant"]), []).append(e)
    # colour and marker say the algorithm, the line the variant: 16 lines, no two drawn alike
    styles = {"correct": "-", "relaxed": ":", "no_end_barrier": "--", "gpu_scope": "-."}
    algorithm_index = {alg: k for k, alg in enumerate(sorted({alg for alg, _ in series}))}
    markers = "osD^vP*X"
    for (alg, var), es in sorted(series.items()):
        es = sorted(es, key=lambda e: e["delay"])
        k = algorithm_index[alg]
        ax.plot(
            [e["delay"] for e in es],
            [e["wrong"] / e["trials"] for e in es],
            styles.get(var, "-"),
            color=f"C{k % 10}",
            marker=markers[k % len(markers)],
            label=f"{alg} {var}",
        )
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("delay on rank 1 (volatile-load round trips, symlog)")
    ax.set_ylabel("wrong results (share of trials)")
    ax.set_ylim(-0.05, 1.05)
    note = f"\n{len(skipped)} rows not run ({skipped[0]['skipped']})" if skipped else ""
    world = {e["world"] for e in table}
    ax.set_title(
        f"{title} broken barriers, world: {', '.join(sorted(map(str, world)))}{note}".strip(), fontsize=8, wrap=True
    )  # the reason whole, on a line of its own: a cut one hides why rows are missing
    if series:
        ax.legend(fontsize=6, ncol=2)
    return ax


#: the grid's colours: allowed by both, forbidden by both, forbidden here but allowed by PTX
GRID_COLOURS = {"allowed": "#fdd49e", "forbidden": "#c7e9c0", "ptx_allows": "#fc8d59"}


def model_grid(placements=("cross_cta", "two_gpus")) -> tuple[list[tuple], list[tuple], list[list[str]]]:
    """(rows (test, placement), columns (semantics, scope), cells): each cell "allowed",
    "forbidden" or "ptx_allows" (the simplified model forbids the weak outcome, PTX allows it)."""
    table = {(r["test"], r["semantics"], r["scope"], r["placement"]): r for r in model.table()}
    cols = variant_columns()
    rows = [(t, p) for t in model.TESTS for p in placements]
    cells = []
    for t, p in rows:
        line = []
        for sem, sc in cols:
            r = table[(t, sem, sc, p)]
            line.append("ptx_allows" if (r["model"], r["ptx"]) == ("forbidden", "allowed") else r["model"])
        cells.append(line)
    return rows, cols, cells


def plot_headline(r: dict, title: str = "your run (live)", stamp: dict | None = None):
    """The notebook's first figure: the test drawn beside the histogram of one run's outcomes, laid
    out above the caption so that neither the histogram's three-line title nor the caption is cut."""
    from labkit.workbench import plot

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.5]})
    plot_test(r["test"], axes[0])
    plot_histogram(r, axes[1], title)
    text = plot.caption(fig, yours=stamp, adjust=False)
    fig.tight_layout(rect=(0, (0.1 + 0.14 * len(text.splitlines())) / fig.get_figheight(), 1, 1))
    return fig


def plot_observed_grids(panels, stress: str, name: str, folder=None, *, stamp: dict | None = None):
    """Every panel's ``plot_observed_grid`` in one figure, two panels to a row (one row of four
    panels stacked would be some 2,400 pixels tall), captioned with the machine and versions of
    every source and saved as ``name``.png; returns the figure, or None without panels."""
    from labkit.workbench import plot

    if not panels:
        return None
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(9.0 * ncols, 4.9 * nrows), squeeze=False)
    for ax, panel in zip(grid.flat, panels):
        plot_observed_grid(panel.records, ax, textwrap.fill(panel.title, 60), stress=stress)
    for ax in list(grid.flat)[len(panels) :]:
        ax.set_axis_off()
    refs = {p.machine: p.result_set for p in panels if p.result_set is not None}
    text = plot.caption(fig, stamp if any(p.live for p in panels) else None, refs, adjust=False)
    fig.tight_layout(rect=(0, min(0.4, (0.1 + 0.14 * len(text.splitlines())) / fig.get_figheight()), 1, 1))
    plot.save(fig, name, folder)
    return fig


def plot_model_grid(ax=None, placements=("cross_cta", "two_gpus")):
    """The weak outcome of every test (rows, per placement) under every semantics and scope
    (columns): allowed, forbidden, or forbidden by the simplified model but allowed by PTX."""
    rows, cols, cells = model_grid(placements)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.62 * len(cols), 0.9 + 0.32 * len(rows)))
    for i, line in enumerate(cells):
        for j, cell in enumerate(line):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=GRID_COLOURS[cell], edgecolor="white"))
            ax.text(
                j + 0.5,
                i + 0.5,
                {"allowed": "A", "forbidden": "F", "ptx_allows": "F/A"}[cell],
                ha="center",
                va="center",
                fontsize=7,
            )
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks(
        [j + 0.5 for j in range(len(cols))], [sem + (f"\n{sc}" if sc else "") for sem, sc in cols], fontsize=7
    )
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [f"{t}, {p}" for t, p in rows], fontsize=7)
    ax.tick_params(length=0)
    ax.legend(
        handles=[
            Patch(facecolor=GRID_COLOURS["allowed"], label="A: weak outcome allowed"),
            Patch(facecolor=GRID_COLOURS["forbidden"], label="F: forbidden"),
            Patch(facecolor=GRID_COLOURS["ptx_allows"], label="F/A: this model forbids it, PTX allows it"),
        ],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    ax.set_title("the weak outcome, by semantics and scope (columns) and test and placement (rows)", fontsize=9)
    return ax


def model_table_text(test: str) -> str:
    """Per variant of one test: the model's and PTX's verdict on the weak outcome (any tier)."""
    lines = [f"{'semantics':<9} {'scope':<5} {'placement':<10} {'model':<9} {'PTX':<9} outcomes allowed"]
    for row in model.table([test]):
        lines.append(
            f"{row['semantics']:<9} {str(row['scope'] or '-'):<5} {row['placement']:<10} "
            f"{row['model']:<9} {row['ptx']:<9} {row['relaxed_outcomes']} (SC allows {row['sc_outcomes']})"
        )
    return "\n".join(lines)
