"""Lab 02's pictures: symmetric memory, each algorithm's data movement, and the sweep plots
(latency log-log, busbw against size, the one-shot/two-shot crossover)."""

from __future__ import annotations

import textwrap

from labkit.workbench.plot import bytes_axis, format_bytes

STYLE = {
    "nccl": ("black", "-"),
    "torch_one_shot": ("tab:gray", "--"),
    "torch_two_shot": ("tab:gray", "-"),
    "labkit_one_shot": ("tab:blue", "-"),
    "labkit_two_shot": ("tab:orange", "-"),
    "labkit_tree": ("tab:green", "-"),
    "labkit": ("tab:blue", "-"),
    "labkit_one_shot_graphed": ("tab:cyan", ":"),
    "labkit_two_shot_in_place": ("tab:red", "-."),
    "labkit_two_shot_ce_in_place": ("tab:purple", "-."),
}


def plot_symmetric_memory(ax, world: int = 4) -> None:
    """W ranks, each with a data buffer and a signal pad at the same place in its heap; every
    rank holds a table of W pointers to them (PyTorch maps the peers' memory over NVLink)."""
    for r in range(world):
        x = r * 2.2
        ax.add_patch(_box(x, 2.0, 1.8, 1.0, "tab:blue"))
        ax.text(x + 0.9, 2.5, f"rank {r}\ndata buffer", ha="center", va="center", fontsize=8)
        ax.add_patch(_box(x, 1.2, 1.8, 0.6, "tab:orange"))
        ax.text(x + 0.9, 1.5, "signal pad", ha="center", va="center", fontsize=8)
        ax.add_patch(_box(x, 0.0, 1.8, 0.8, "tab:gray"))
        ax.text(
            x + 0.9, 0.4, f"data_ptrs[0..{world - 1}]\npad_ptrs[0..{world - 1}]", ha="center", va="center", fontsize=7
        )
    for r in range(1, world):  # rank 0's pointer table reaches every peer's buffer
        ax.annotate(
            "",
            xy=(r * 2.2 + 0.9, 2.0),
            xytext=(0.9, 0.8),
            arrowprops={"arrowstyle": "->", "color": "tab:blue", "alpha": 0.6},
        )
    ax.set_xlim(-0.2, world * 2.2)
    ax.set_ylim(-0.2, 3.3)
    ax.axis("off")
    ax.set_title(
        "symmetric memory: same-shaped buffers and pads on every rank; rank 0's pointer table shown", fontsize=9
    )


def _box(x, y, w, h, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, facecolor=color, alpha=0.25, edgecolor=color)


def plot_data_movement(ax, algorithm: str, world: int = 4) -> None:
    """Who reads what from whom, for one rank's point of view (rank 0) or the whole tree."""
    from labkit.kernels.comm.tree import tree_links

    ys = {r: world - 1 - r for r in range(world)}
    for r in range(world):
        ax.text(0, ys[r], f"rank {r}", ha="right", va="center", fontsize=8)
    if algorithm == "one_shot":
        for r in range(world):
            ax.annotate("", xy=(1, ys[0]), xytext=(0.1, ys[r]), arrowprops={"arrowstyle": "->", "color": "tab:blue"})
        text = "rank 0 reads ALL of every buffer: (W-1)N over the links, one step"
    elif algorithm == "two_shot":
        _two_phases(
            ax,
            ys,
            world,
            ("tab:orange", "tab:green"),
            ("shot 1: shard 0 from\neveryone", "shot 2: everyone copies\nshard 0"),
        )
        text = "each rank reduces its 1/W shard, then all gather: 2(W-1)N/W per rank"
    elif algorithm == "two_shot_in_place":
        _two_phases(
            ax,
            ys,
            world,
            ("tab:orange", "tab:red"),
            ("loads: shard 0 from\neveryone", "stores: the sum into\nevery buffer"),
        )
        text = "in place: rank 0 reduces shard 0, then PUSHES it; two barriers, no copy out"
    elif algorithm == "two_shot_ce":
        _two_phases(
            ax,
            ys,
            world,
            ("tab:purple", "tab:red"),
            ("copy engines: shard 0\ninto rank 0's workspace", "stores: the sum into\nevery buffer"),
            first_dashed=True,
        )
        text = "in place: cudaMemcpyAsync does shot one, a kernel reduces locally and pushes"
    elif algorithm == "tree":
        for r in range(world):
            parent = tree_links(r, world).a_parent
            if parent >= 0:
                ax.annotate(
                    "",
                    xy=(1, ys[parent]),
                    xytext=(0.1, ys[r]),
                    arrowprops={"arrowstyle": "->", "color": "tab:green", "connectionstyle": "arc3,rad=0.2"},
                )
        text = "tree A shown (tree B mirrors it): partial sums go up, the result comes down"
    elif algorithm == "reduce_scatter":
        for r in range(world):
            ax.annotate("", xy=(1, ys[0]), xytext=(0.1, ys[r]), arrowprops={"arrowstyle": "->", "color": "tab:purple"})
        text = "rank 0 reads shard 0 of every buffer and sums: (W-1)N/W"
    else:
        for r in range(world):
            ax.annotate("", xy=(1, ys[0]), xytext=(0.1, ys[r]), arrowprops={"arrowstyle": "->", "color": "tab:red"})
        text = "rank 0 copies every rank's shard: (W-1)N/W"
    ax.set_xlim(-0.8, 2.4)
    ax.set_ylim(-1.6, world)
    ax.axis("off")
    ax.set_title(textwrap.fill(f"{algorithm}: {text}", 60), fontsize=8)


def _two_phases(ax, ys, world, colors, labels, first_dashed=False):
    """Arrows of a two-phase algorithm from rank 0's point of view: into rank 0 (phase one, from
    every rank; the copy engines' phase dashed, and without rank 0's own shard), then out of
    rank 0 to every rank (phase two), each phase labelled underneath."""
    for r in range(1 if first_dashed else 0, world):
        ax.annotate(
            "",
            xy=(1, ys[0]),
            xytext=(0.1, ys[r]),
            arrowprops={"arrowstyle": "->", "color": colors[0], **({"ls": "--"} if first_dashed else {})},
        )
    for r in range(world):
        ax.annotate("", xy=(2, ys[r]), xytext=(1.1, ys[0]), arrowprops={"arrowstyle": "->", "color": colors[1]})
    # phase one's label ends where its arrows meet, phase two's starts there: they never overlap
    ax.text(0.95, -0.8, labels[0], fontsize=7, ha="right", va="top")
    ax.text(1.15, -0.8, labels[1], fontsize=7, ha="left", va="top")


def _series(records, op, key):
    out = {}
    for r in records:
        if r.get("kind", "sweep") == "sweep" and r.get("op") == op and r.get(key):
            out.setdefault(r["impl"], []).append((r["bytes"], r[key]))
    return {k: sorted(v) for k, v in out.items()}


def plot_latency(records: list[dict], ax, title: str, op: str = "all_reduce", key: str = "us") -> None:
    for impl, pts in sorted(_series(records, op, key).items()):
        color, ls = STYLE.get(impl, (None, "-"))
        ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", ms=3, ls=ls, color=color, label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    bytes_axis(ax, "x")
    ax.set_ylabel("µs per call (median)" + (", CUDA-graph replay" if key == "graph_us" else ", back to back"))
    ax.set_title(f"{title}\n{op}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


#: the eager series (records of kind "eager", ``bench.eager_series``): (impl, path) -> label, colour, style
EAGER_STYLE = {
    ("labkit_all_reduce", "eager_uncached"): (
        "labkit, no plan (every call checks, chooses, Triton launch)",
        "tab:red",
        ":",
    ),
    ("labkit_all_reduce", "plan_cached"): ("labkit all_reduce(...), its cached plan", "tab:blue", "-"),
    ("labkit_all_reduce", "plan"): ("labkit plan() (held by the caller)", "tab:cyan", "--"),
    ("torch_one_shot", "torch_eager"): ("torch one_shot_all_reduce (out of place)", "0.45", "--"),
    ("torch_two_shot", "torch_eager"): ("torch two_shot_all_reduce_ (in place)", "black", "-"),
}


def eager_records(records: list[dict]) -> list[dict]:
    """The timed records of the sweep's eager series (kind "eager"); [] in files made before it."""
    return [r for r in records if r.get("kind") == "eager" and r.get("us")]


def plot_eager(records: list[dict], ax, title: str, in_place: bool = False) -> int:
    """µs per call against message size: labkit's all-reduce called eagerly on each path (no plan,
    the cached plan of ``all_reduce``, a held ``plan()``), out of place or in place, beside both of
    torch's eager symm_mem ops; each point the median, its bar the quartiles (records of kind
    "eager": every candidate timed in the same interleaved rounds). The small messages that
    ``bench.eager_verdicts`` summarises (``bench.EAGER_SMALL_BYTES``) are lightly shaded. Returns
    the number of series drawn; without eager records, says so on the axes."""
    from labkit.labs.collectives.bench import EAGER_SMALL_BYTES

    recs = eager_records(records)
    worlds = sorted({r["world_size"] for r in recs})
    if not recs:
        ax.text(
            0.5,
            0.5,
            "no eager-series records here\n(files recorded before the eager series existed lack them)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=8,
        )
        ax.axis("off")
        return 0
    drawn = 0
    for (impl, path), (label, color, ls) in EAGER_STYLE.items():
        pts = sorted(
            (r["bytes"], r["us"], r.get("us_p25", r["us"]), r.get("us_p75", r["us"]))
            for r in recs
            if r["impl"] == impl
            and r.get("path") == path
            and (impl != "labkit_all_reduce" or bool(r.get("in_place")) == in_place)
        )
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.errorbar(
            xs,
            ys,
            yerr=[[y - p[2] for y, p in zip(ys, pts)], [p[3] - y for y, p in zip(ys, pts)]],
            marker="o",
            ms=3,
            ls=ls,
            color=color,
            capsize=2,
            lw=1.3,
            label=label,
        )
        drawn += 1
    lo, hi = EAGER_SMALL_BYTES
    ax.axvspan(lo / 1.2, hi * 1.2, color="0.5", alpha=0.07, lw=0, label="small messages")
    if not any(r["impl"].startswith("torch_") for r in recs):
        ax.text(
            0.99,
            0.01,
            "no torch eager op in these records",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
            color="0.35",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    bytes_axis(ax, "x")
    ax.set_xlabel("message size per rank")
    from matplotlib.ticker import FuncFormatter

    for axis in (ax.yaxis,):  # plain numbers on the log axis (4, 10, 40 rather than 4x10^0 ...)
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "245" else ""))
    ax.set_ylabel("µs per call, called from Python (median, quartiles)")
    ax.set_title(
        f"{title}, W={'/'.join(map(str, worlds))}\nall_reduce, labkit {'in place' if in_place else 'out of place'}"
        f"; small messages shaded ({format_bytes(lo)}..{format_bytes(hi)})",
        fontsize=9,
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return drawn


def plot_busbw(
    records: list[dict],
    ax,
    title: str,
    op: str = "all_reduce",
    key: str = "busbw_GBps",
    crossover: int | None = None,
    ceiling: dict | None = None,
    no_ceiling: str | None = None,
) -> None:
    """Bus bandwidth against message size per implementation; ``ceiling`` (``link_ceiling``): the
    measured link ceiling drawn across, or without one the note ``no_ceiling`` on the axes."""
    for impl, pts in sorted(_series(records, op, key).items()):
        color, ls = STYLE.get(impl, (None, "-"))
        ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", ms=3, ls=ls, color=color, label=impl)
    if crossover:
        ax.axvline(crossover, color="tab:red", ls=":", lw=1)
        ax.annotate("one-shot | two-shot", (crossover, ax.get_ylim()[1] * 0.9), fontsize=7, color="tab:red")
    if ceiling or no_ceiling:
        draw_ceiling(ax, ceiling, no_ceiling or "")
    ax.set_xscale("log", base=2)
    bytes_axis(ax, "x")
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
    ax.set_title(f"{title}\n{op}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left")  # the small sizes, where busbw is near zero


def headline_markdown(records: list[dict]) -> str:
    """labkit's best against NCCL and PyTorch's symmetric-memory ops at three points of a sweep:
    the smallest size (latency), 1 MiB, and the largest (bus bandwidth), for all-reduce, then
    reduce-scatter and all-gather at the largest size. Each cell: back to back / graph replay."""
    sw = [r for r in records if r.get("kind", "sweep") == "sweep"]
    if not sw:
        return "(no sweep records)"
    w = sw[0]["world_size"]
    labkit_all_reduce = [
        "labkit_one_shot",
        "labkit_two_shot",
        "labkit_tree",
        "labkit_one_shot_graphed",
        "labkit_two_shot_in_place",
        "labkit_two_shot_ce_in_place",
    ]

    def best(impls, op, b, key):
        vals = [r.get(key) for r in sw if r["impl"] in impls and r["op"] == op and r["bytes"] == b and r.get(key)]
        return (min if key.endswith("us") else max)(vals) if vals else None

    def cell(impls, op, b, keys, fmt):
        a, g = (best(impls, op, b, k) for k in keys)
        return " / ".join("–" if v is None else fmt.format(v) for v in (a, g))

    sizes = sorted({r["bytes"] for r in sw})
    small, big = sizes[0], sizes[-1]
    points = [
        ("all_reduce", small, ("us", "graph_us"), "{:.1f} µs"),
        ("all_reduce", 1 << 20, ("us", "graph_us"), "{:.1f} µs"),
        ("all_reduce", big, ("busbw_GBps", "graph_busbw_GBps"), "{:.0f} GB/s"),
        ("reduce_scatter", big, ("busbw_GBps", "graph_busbw_GBps"), "{:.0f} GB/s"),
        ("all_gather", big, ("busbw_GBps", "graph_busbw_GBps"), "{:.0f} GB/s"),
    ]
    rows = ["| op, size | labkit (best) | NCCL | torch symm_mem (best) |", "|---|---|---|---|"]
    for op, b, keys, fmt in points:
        if not any(r["op"] == op and r["bytes"] == b for r in sw):
            continue  # a size or op this sweep did not measure
        mine = labkit_all_reduce if op == "all_reduce" else ["labkit"]
        torch_impls = ["torch_one_shot", "torch_two_shot"] if op == "all_reduce" else []
        rows.append(
            f"| {op} {format_bytes(b)} | {cell(mine, op, b, keys, fmt)} | "
            f"{cell(['nccl'], op, b, keys, fmt)} | {cell(torch_impls, op, b, keys, fmt)} |"
        )
    return (
        f"W = {w}; each cell: back to back / CUDA-graph replay; latency at the small sizes, "
        f"bus bandwidth at the largest\n\n" + "\n".join(rows)
    )


def chosen_vs_best(records: list[dict], world_size: int, in_place: bool = False) -> list[dict]:
    """At every size of a sweep: the all-reduce ``collectives.choose`` picks (in_place: the one
    ``all_reduce(buf, buf.tensor)`` runs on a buffer with a workspace), against the best of NCCL and
    PyTorch's symmetric-memory ops, in both timings. One dict per size: bytes, algorithm, mine (its
    record), and for "us" and "graph_us" the fastest other record (None where none was timed)."""
    from labkit.kernels.comm import collectives as C

    sw = [
        r
        for r in records
        if r.get("kind", "sweep") == "sweep" and r.get("op") == "all_reduce" and r.get("world_size") == world_size
    ]
    out = []
    for b in sorted({r["bytes"] for r in sw}):
        at = {r["impl"]: r for r in sw if r["bytes"] == b}
        # (the sweep's buffer has a workspace)
        alg = f"{C.choose_in_place(b, world_size, True)}_in_place" if in_place else C.choose(b, world_size)
        mine = at.get(f"labkit_{alg}")
        others = [at[i] for i in ("nccl", "torch_one_shot", "torch_two_shot") if i in at]
        if not mine or not others:
            continue
        best = {
            key: min((o for o in others if o.get(key)), key=lambda o: o[key], default=None)
            for key in ("us", "graph_us")
        }
        out.append({"bytes": b, "algorithm": alg, "mine": mine, "best": best})
    return out


def chosen_vs_best_verdict(records: list[dict], world_size: int, in_place: bool = False) -> str:
    """One line: at how many sizes of the sweep the chosen all-reduce was as fast as the best of
    NCCL and PyTorch's ops, in each timing, and its ratio at the largest size."""
    rows = chosen_vs_best(records, world_size, in_place)
    if not rows:
        return f"no all-reduce sweep records for W={world_size}"
    parts = []
    for key, label in (("us", "back to back"), ("graph_us", "graph replay")):
        pairs = [
            (r["mine"][key], r["best"][key][key], r["bytes"]) for r in rows if r["mine"].get(key) and r["best"][key]
        ]
        if pairs:
            parts.append(
                f"{label} {sum(m <= o for m, o, _ in pairs)} of {len(pairs)} sizes "
                f"(x{pairs[-1][0] / pairs[-1][1]:.2f} at {format_bytes(pairs[-1][2])})"
            )
    return (
        f"W={world_size}, {'in place' if in_place else 'out of place'}: chosen as fast as the best other at "
        + "; ".join(parts)
    )


def plot_chosen_vs_best(records: list[dict], ax, title: str, world_size: int, in_place: bool = False) -> int:
    """``chosen_vs_best`` drawn: labkit's chosen all-reduce time over the best of NCCL and PyTorch's
    symmetric-memory ops at each size (log2 bytes axis), back to back and under CUDA-graph replay,
    with a line at 1.0 (below it labkit is faster). The chosen algorithm is written at each point
    where it changes. Returns the number of sizes drawn."""
    rows = chosen_vs_best(records, world_size, in_place)
    if not rows:
        ax.text(0.5, 0.5, f"no all-reduce sweep records for W={world_size}", ha="center", transform=ax.transAxes)
        ax.axis("off")
        return 0
    for key, label, style in (("us", "back to back", "o-"), ("graph_us", "CUDA-graph replay", "s--")):
        pts = [
            (r["bytes"], r["mine"][key] / r["best"][key][key]) for r in rows if r["mine"].get(key) and r["best"][key]
        ]
        if pts:
            ax.plot([b for b, _ in pts], [v for _, v in pts], style, ms=4, label=label)
    ax.axhline(1.0, color="black", lw=1, ls=":", label="as fast as the best other (1.0)")
    previous = None
    for r in rows:  # the chosen algorithm where it changes
        if r["algorithm"] != previous:
            ax.annotate(
                r["algorithm"],
                (r["bytes"], 1.0),
                xytext=(2, 6),
                textcoords="offset points",
                fontsize=7,
                rotation=30,
                color="0.3",
            )
            previous = r["algorithm"]
    bytes_axis(ax, "x")
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("chosen labkit µs / best of NCCL, torch symm_mem µs")
    ax.set_title(
        f"{title}, W={world_size}\n{'in place (choose_in_place)' if in_place else 'out of place (choose)'}", fontsize=9
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return len(rows)


def plot_links(
    records: list[dict], ax, title: str, sweep: list[dict] | None = None, ceiling: dict | None = None
) -> None:
    """The fastest correct copy per mode at the largest size (``labkit.labs.collectives.links.best_links``),
    both directions busy and one, with the all-reduce busbw of ``sweep`` (same machine) drawn
    across: the link's ceiling for each way of moving bytes, and where each algorithm sits.
    ``ceiling`` (``link_ceiling`` of the same records): the best of them drawn as a line."""
    from labkit.labs.collectives.links import DIRECTIONS, MODES, best_links

    rows = best_links(records)
    if not rows:
        ax.text(0.5, 0.5, "no link records", ha="center", transform=ax.transAxes)
        return
    big = max(r["bytes"] for r in rows)
    width = 0.38
    for i, direction in enumerate(DIRECTIONS):
        vals = [
            next((r["GBps"] for r in rows if r["impl"] == m and r["direction"] == direction and r["bytes"] == big), 0)
            for m in MODES
        ]
        bars = ax.bar(
            [k + (i - 0.5) * width for k in range(len(MODES))],
            vals,
            width,
            label=f"{direction} direction{'s' if direction == 'both' else ''} busy",
        )
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(MODES)), MODES)
    for impl, color in (
        ("labkit_one_shot", "tab:blue"),
        ("labkit_two_shot_ce_in_place", "tab:purple"),
        ("nccl", "black"),
    ):
        r = next(
            (
                x
                for x in sweep or []
                if x.get("impl") == impl
                and x.get("op") == "all_reduce"
                and x.get("bytes") == big
                and x.get("graph_busbw_GBps")
            ),
            None,
        )
        if r:
            ax.axhline(
                r["graph_busbw_GBps"],
                color=color,
                ls=":",
                lw=1.2,
                label=f"{impl} all-reduce, busbw {r['graph_busbw_GBps']:.0f} (graph)",
            )
    if ceiling:
        draw_ceiling(ax, ceiling, "")
    ax.set_ylabel(f"GB/s per GPU, {big >> 20} MiB copies")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower center", framealpha=0.95)
    ax.grid(alpha=0.3, axis="y")


def _heatmap(ax, values, texts, row_labels, col_labels, *, cmap, vmin, vmax, cbar_label):
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
    _heatmap(
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
    _heatmap(
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


def plot_tune(rows: list[dict], ax, title: str) -> int:
    """``labkit.labs.collectives.bench.best_configs`` as a grid: op (and world size) down, message
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
    _heatmap(
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


#: the link modes that bound a collective that pushes or copies (stores, copy engines)
CEILING_MODES = ("sm_write", "memcpy_read", "memcpy_write")


def link_ceiling(link_records: list[dict] | None, source: str) -> dict | None:
    """The measured link ceiling: the fastest of SM stores and ``cudaMemcpyAsync`` (``CEILING_MODES``)
    at the largest size with both directions of every link busy, as in a collective
    (``labkit.labs.collectives.links.best_links``). ``source`` names where the records come from
    ("reference h200x2", "your run"). None without link records."""
    from labkit.labs.collectives.links import best_links

    rows = [r for r in best_links(link_records or []) if r["impl"] in CEILING_MODES]
    if not rows:
        return None
    big = max(r["bytes"] for r in rows)
    at = [r for r in rows if r["bytes"] == big and r["direction"] == "both"] or [r for r in rows if r["bytes"] == big]
    top = max(at, key=lambda r: r["GBps"])
    return {
        "GBps": top["GBps"],
        "mode": top["impl"],
        "direction": top["direction"],
        "bytes": big,
        "world_size": top["world_size"],
        "source": source,
        "label": f"link ceiling, measured: {top['GBps']:.0f} GB/s ({top['impl']}, {format_bytes(big)}, "
        f"{top['direction']} direction{'s' if top['direction'] == 'both' else ''} busy), {source}",
    }


def draw_ceiling(ax, ceiling: dict | None, missing: str) -> None:
    """A horizontal line at ``link_ceiling``'s GB/s, labelled with where it came from; without one,
    a note on the axes (``missing``) and no line."""
    if ceiling:
        ax.axhline(ceiling["GBps"], color="tab:red", lw=1.4, ls="--", alpha=0.8, label=ceiling["label"])
    else:
        ax.text(0.99, 0.01, missing, transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="0.35")


def plot_tuned_crossover(rows: list[dict], ax, title: str) -> dict:
    """The best (tuned) CUDA-graph µs of labkit's one-shot and two-shot all-reduce against message
    size, one pair of lines per world size (``bench.best_configs`` rows). Returns {world size:
    ``bench.crossover_bytes`` of the tuned times} (None: one-shot at least as fast everywhere)."""
    from labkit.labs.collectives.bench import crossover_bytes

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
