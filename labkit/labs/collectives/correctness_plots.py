"""Lab 02's grids of checks: the correctness grid (every all-reduce form, reduce-scatter and
all-gather, per world size and dtype), the broken variants under load (wrong results of all
results), what each says in a line, and the PTX proof in a few lines (``ptx_lines``); ``heatmap``
draws the grids (``tune_plots`` draws the search with it too)."""

from __future__ import annotations

from labkit.workbench.plot import format_bytes


def heatmap(ax, values, texts, row_labels, col_labels, *, cmap, vmin, vmax, cbar_label):
    """A labelled grid: ``values`` rows of floats or None (None: drawn grey, "not run"), each
    cell annotated with its entry of ``texts``. Returns the image."""
    import numpy as np

    grid = np.ma.masked_invalid(np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float))
    import matplotlib

    cm = matplotlib.colormaps[cmap].with_extremes(bad="0.88")
    im = ax.imshow(grid, cmap=cm, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(col_labels)), col_labels, fontsize=7, rotation=20, ha="right")
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
    for i, row in enumerate(texts):
        for j, text in enumerate(row):
            if text:
                v = values[i][j]
                r, g, b, _ = cm(im.norm(v)) if v is not None else (0.88, 0.88, 0.88, 1)
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black",
                )  # legible on dark cells
    ax.figure.colorbar(im, ax=ax, fraction=0.04, pad=0.02).set_label(cbar_label, fontsize=7)
    return im


#: the columns of the correctness grid: every all-reduce form, then reduce-scatter and all-gather
def _check_columns(rows):
    forms = [
        f
        for f in ("one_shot", "two_shot", "tree", "two_shot_in_place", "two_shot_ce_in_place")
        if any(r["op"] == "all_reduce" and r["algorithm"] == f for r in rows)
    ]
    forms += sorted({r["algorithm"] for r in rows if r["op"] == "all_reduce"} - set(forms))
    cols = [("all_reduce", f) for f in forms]
    cols += [(op, "direct") for op in ("reduce_scatter", "all_gather") if any(r["op"] == op for r in rows)]
    if any(r["op"] == "all_gather" and r["algorithm"] == "naive" for r in rows):  # the naive read order
        cols.append(("all_gather", "naive"))
    return cols


def correctness_verdicts(rows: list[dict]) -> list[str]:
    """One line per world size for ``checks.check_algorithms`` rows (one per rank, op,
    algorithm and trial, as returned on every rank): how many checks were right on every rank with
    the pads back at zero, and which were not."""
    lines = []
    for w in sorted({r["world_size"] for r in rows}):
        mine = [r for r in rows if r["world_size"] == w]
        groups: dict = {}
        for r in mine:
            groups.setdefault((r["dtype"], r["op"], r["algorithm"], r.get("n")), []).append(r)
        bad = [k for k, rs in groups.items() if not all(r["correct"] and r["pads_zero"] for r in rs)]
        sizes = ", ".join(f"{d} {n:,}" for d, n in sorted({(r["dtype"], r.get("n")) for r in mine}))
        head = f"W={w} ({sizes} elements per rank): "
        if not bad:
            lines.append(
                head + f"all {len(groups)} op x algorithm x dtype checks correct on every rank, pads back at zero"
            )
        else:
            lines.append(
                head
                + f"{len(bad)} of {len(groups)} checks FAILED: "
                + "; ".join(f"{op} {alg} {d}" for d, op, alg, _ in sorted(bad))
            )
    return lines


def plot_correctness(rows: list[dict], ax, title: str = "") -> int:
    """``checks.check_algorithms`` rows as a grid: world size x dtype down, op and algorithm
    across, colour = fraction of ranks whose result matched the fp64 sum with their pad back at
    zero, text = ranks right / ranks. Grey: not run (reduce-scatter and all-gather need N divisible
    by W). Returns the number of cells drawn."""
    if not rows:
        ax.text(0.5, 0.5, "no correctness runs", ha="center", transform=ax.transAxes)
        ax.axis("off")
        return 0
    cols = _check_columns(rows)
    keys = sorted({(r["world_size"], r["dtype"]) for r in rows})
    values, texts = [], []
    for w, dtype in keys:
        vrow, trow = [], []
        for op, alg in cols:
            rs = [r for r in rows if (r["world_size"], r["dtype"], r["op"], r["algorithm"]) == (w, dtype, op, alg)]
            good = sum(bool(r["correct"] and r["pads_zero"]) for r in rs)
            vrow.append(good / len(rs) if rs else None)
            trow.append(f"{good}/{len(rs)}" if rs else "not run")
        values.append(vrow)
        texts.append(trow)
    heatmap(
        ax,
        values,
        texts,
        [f"W={w} {d}" for w, d in keys],
        [alg if op == "all_reduce" else op if alg == "direct" else f"{op} ({alg})" for op, alg in cols],
        cmap="RdYlGn",
        vmin=0,
        vmax=1,
        cbar_label="ranks correct, pads at zero (fraction)",
    )
    ax.set_title(title or "every algorithm against an fp64 sum: ranks right / ranks", fontsize=9)
    return sum(v is not None for row in values for v in row)


BROKEN_FORMS = ("one_shot", "two_shot", "two_shot_in_place", "two_shot_ce_in_place")


def plot_broken(records: list[dict], ax, title: str) -> int:
    """Broken-variant runs (``kind == "broken"`` records, as ``labkit bench collectives`` writes
    them and the notebook makes of its live runs) as a grid: variant and load down, algorithm
    across, colour = fraction of results wrong, text = wrong / results, or how the run ended when it
    did not finish. Returns the number of runs drawn."""
    recs = [r for r in records if r.get("kind") == "broken"]
    if not recs:
        ax.text(0.5, 0.5, "no broken-variant runs", ha="center", transform=ax.transAxes)
        ax.axis("off")
        return 0
    algs = [a for a in BROKEN_FORMS if any(r["impl"] == f"labkit_{a}" for r in recs)]
    algs += sorted({r["impl"].removeprefix("labkit_") for r in recs} - set(algs))
    variants = ("correct", "relaxed", "no_end_barrier")
    keys = sorted(
        {(r["load"], r["variant"]) for r in recs},
        key=lambda k: (k[0] != "late", k[0], variants.index(k[1]) if k[1] in variants else 9, k[1]),
    )
    values, texts = [], []
    for load, variant in keys:
        vrow, trow = [], []
        for a in algs:
            r = next((x for x in recs if (x["load"], x["variant"], x["impl"]) == (load, variant, f"labkit_{a}")), None)
            if r is None:
                vrow.append(None)
                trow.append("not run")
            elif r.get("wrong_results") is None:
                vrow.append(None)
                trow.append(str(r.get("outcome", "failed")).splitlines()[0][:18])
            else:
                vrow.append(r["wrong_results"] / r["ranks_x_trials"])
                trow.append(f"{r['wrong_results']}/{r['ranks_x_trials']}")
        values.append(vrow)
        texts.append(trow)
    sizes = sorted({(r["world_size"], r["bytes"]) for r in recs})
    heatmap(
        ax,
        values,
        texts,
        [f"{v}, {load}" for load, v in keys],
        algs,
        cmap="Reds",
        vmin=0,
        vmax=1,
        cbar_label="results wrong (fraction)",
    )
    ax.set_title(
        f"{title}\nwrong results / results; " + ", ".join(f"W={w} {format_bytes(b)}" for w, b in sizes), fontsize=9
    )
    return len(recs)


def broken_verdict(records: list[dict]) -> str:
    """One line for broken-variant runs (``kind == "broken"``): per variant and load, the wrong
    results over all its runs, and how many runs did not finish."""
    recs = [r for r in records if r.get("kind") == "broken"]
    parts = []
    for variant in dict.fromkeys(r["variant"] for r in recs):
        texts = []
        for load in dict.fromkeys(r["load"] for r in recs if r["variant"] == variant):
            mine = [r for r in recs if r["variant"] == variant and r["load"] == load]
            done = [r for r in mine if r.get("wrong_results") is not None]
            text = f"{sum(r['wrong_results'] for r in done)} of {sum(r['ranks_x_trials'] for r in done)} ({load})"
            if len(done) < len(mine):
                text += f", {len(mine) - len(done)} of {len(mine)} runs did not finish"
            texts.append(text)
        parts.append(f"{variant} wrong in " + ", ".join(texts))
    return "; ".join(parts) or "no broken-variant runs"


def ptx_lines(rows: list[dict]) -> list[str]:
    """``labkit.labs.collectives.ptx.summarize_all`` in a few lines: the distinct atomic
    instructions of the correct kernels (SEM 0) and of the relaxed variant (SEM 1), then one line per
    kernel: the memory orders of its atomics in each, and whether 16-byte vector loads and stores
    appear."""

    def orders(rs):
        found = {a for r in rs for a in r["atomics"]}
        return "/".join(o for o in ("release", "acquire", "relaxed") if any(f".{o}." in a for a in found)) or "none"

    lines = [
        f"{what}: " + ", ".join(sorted({a for r in rows if r["sem"] == sem for a in r["atomics"]}) or ["none"])
        for sem, what in ((0, "atomics, correct kernels"), (1, "atomics, 'relaxed' variant"))
    ]
    for alg in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == alg]
        vec = [
            what for what, key in (("loads", "vector_loads"), ("stores", "vector_stores")) if any(r[key] for r in mine)
        ]
        lines.append(
            f"{alg:>20}: correct {orders([r for r in mine if r['sem'] == 0])}, "
            f"relaxed variant {orders([r for r in mine if r['sem'] == 1])}; "
            f"16-byte vector {' and '.join(vec) or 'accesses: none'} "
            f"(W={', '.join(str(w) for w in sorted({r['world'] for r in mine}))})"
        )
    return lines
