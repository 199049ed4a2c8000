"""Lab 02's figures of the launch search (``tune_bench``): the fastest config per op and size beside
the default's (``plot_tune``), and the one-shot/two-shot crossover of the tuned kernels
(``plot_tuned_crossover``)."""

from __future__ import annotations

from labkit.labs.collectives.correctness_plots import heatmap
from labkit.labs.collectives.sweep_plots import STYLE
from labkit.workbench.plot import bytes_axis, format_bytes


def plot_tune(rows: list[dict], ax, title: str) -> int:
    """``labkit.labs.collectives.tune_bench.best_configs`` as a grid: op (and world size) down, message
    size across, colour = the best launch's bus bandwidth, text = that launch (vectors x warps x
    programs) and, where the default launch was recorded, its time over the best one's. Returns the
    number of cells drawn."""
    if not rows:
        ax.text(0.5, 0.5, "no tune records", ha="center", transform=ax.transAxes)
        ax.axis("off")
        return 0
    keys = sorted({(r["world_size"], r["impl"], r["op"]) for r in rows})
    sizes = sorted({r["bytes"] for r in rows})
    values, texts = [], []
    for w, impl, op in keys:
        vrow, trow = [], []
        for b in sizes:
            r = next((x for x in rows if (x["world_size"], x["impl"], x["op"], x["bytes"]) == (w, impl, op, b)), None)
            if r is None:
                vrow.append(None)
                trow.append("")
                continue
            best = r["best"]
            vrow.append(best["busbw_GBps"])
            text = f"{best['vectors']}x{best['num_warps']}x{best['programs']}\n{best['us']:.1f} µs"
            if r.get("default_us"):
                text += f"\ndefault x{r['default_us'] / best['us']:.2f}"
            trow.append(text)
        values.append(vrow)
        texts.append(trow)
    flat = [v for row in values for v in row if v is not None]
    heatmap(
        ax,
        values,
        texts,
        [f"W={w} {impl.removeprefix('labkit_') if op == 'all_reduce' else op}" for w, impl, op in keys],
        [format_bytes(b) for b in sizes],
        cmap="viridis",
        vmin=0,
        vmax=max(flat),
        cbar_label="best launch's busbw (GB/s)",
    )
    ax.set_xlabel("message size per rank")
    ax.set_title(
        f"{title}\nfastest launch (vectors x warps x programs), its CUDA-graph µs"
        + ("; default launch's time / fastest" if any(r.get("default_us") for r in rows) else ""),
        fontsize=9,
    )
    return len(flat)


def plot_tuned_crossover(rows: list[dict], ax, title: str) -> dict:
    """The best (tuned) CUDA-graph µs of labkit's one-shot and two-shot all-reduce against message
    size, one pair of lines per world size (``tune_bench.best_configs`` rows). Returns {world size:
    ``sweep_bench.crossover_bytes`` of the tuned times} (None: one-shot at least as fast everywhere)."""
    from labkit.labs.collectives.sweep_bench import crossover_bytes

    ar = [r for r in rows if r["op"] == "all_reduce" and r["impl"] in ("labkit_one_shot", "labkit_two_shot")]
    if not ar:
        ax.text(0.5, 0.5, "no tuned one-shot / two-shot records", ha="center", transform=ax.transAxes)
        ax.axis("off")
        return {}
    crossings = {}
    worlds = sorted({r["world_size"] for r in ar})
    for i, w in enumerate(worlds):
        for impl in ("labkit_one_shot", "labkit_two_shot"):
            pts = sorted((r["bytes"], r["best"]["us"]) for r in ar if r["world_size"] == w and r["impl"] == impl)
            if pts:
                color, _ = STYLE[impl]
                ax.plot(
                    [b for b, _ in pts],
                    [u for _, u in pts],
                    marker="os^v"[i % 4],
                    ms=4,
                    color=color,
                    ls=("-", "--", ":", "-.")[i % 4],
                    label=f"{impl.removeprefix('labkit_')}, W={w}",
                )
        flat = [
            {"impl": r["impl"], "op": "all_reduce", "world_size": w, "bytes": r["bytes"], "us": r["best"]["us"]}
            for r in ar
            if r["world_size"] == w
        ]
        crossings[w] = crossover_bytes(flat, w)
        if crossings[w]:
            ax.axvline(
                crossings[w],
                color="0.4",
                ls=":",
                lw=1,
                label=f"W={w}: two-shot faster above {format_bytes(crossings[w])}",
            )
    ax.set_yscale("log")
    bytes_axis(ax, "x")
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("µs per call, best launch (CUDA-graph replay)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return crossings
