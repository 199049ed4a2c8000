"""Lab 02's pictures: symmetric memory, each algorithm's data movement, and the sweep plots
(latency log-log, busbw against size, the one-shot/two-shot crossover)."""
from __future__ import annotations

import textwrap

from labkit.workbench.plot import bytes_axis, format_bytes

STYLE = {"nccl": ("black", "-"), "torch_one_shot": ("tab:gray", "--"), "torch_two_shot": ("tab:gray", "-"),
         "labkit_one_shot": ("tab:blue", "-"), "labkit_two_shot": ("tab:orange", "-"),
         "labkit_tree": ("tab:green", "-"), "labkit": ("tab:blue", "-"),
         "labkit_one_shot_graphed": ("tab:cyan", ":"), "labkit_two_shot_in_place": ("tab:red", "-."),
         "labkit_two_shot_ce_in_place": ("tab:purple", "-.")}


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
        ax.text(x + 0.9, 0.4, f"data_ptrs[0..{world - 1}]\npad_ptrs[0..{world - 1}]", ha="center", va="center", fontsize=7)
    for r in range(1, world):  # rank 0's pointer table reaches every peer's buffer
        ax.annotate("", xy=(r * 2.2 + 0.9, 2.0), xytext=(0.9, 0.8),
                    arrowprops={"arrowstyle": "->", "color": "tab:blue", "alpha": 0.6})
    ax.set_xlim(-0.2, world * 2.2)
    ax.set_ylim(-0.2, 3.3)
    ax.axis("off")
    ax.set_title("symmetric memory: same-shaped buffers and pads on every rank; rank 0's pointer table shown", fontsize=9)


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
        _two_phases(ax, ys, world, ("tab:orange", "tab:green"),
                    ("shot 1: shard 0 from\neveryone", "shot 2: everyone copies\nshard 0"))
        text = "each rank reduces its 1/W shard, then all gather: 2(W-1)N/W per rank"
    elif algorithm == "two_shot_in_place":
        _two_phases(ax, ys, world, ("tab:orange", "tab:red"),
                    ("loads: shard 0 from\neveryone", "stores: the sum into\nevery buffer"))
        text = "in place: rank 0 reduces shard 0, then PUSHES it; two barriers, no copy out"
    elif algorithm == "two_shot_ce":
        _two_phases(ax, ys, world, ("tab:purple", "tab:red"),
                    ("copy engines: shard 0\ninto rank 0's workspace", "stores: the sum into\nevery buffer"),
                    first_dashed=True)
        text = "in place: cudaMemcpyAsync does shot one, a kernel reduces locally and pushes"
    elif algorithm == "tree":
        for r in range(world):
            parent = tree_links(r, world)[0]
            if parent >= 0:
                ax.annotate("", xy=(1, ys[parent]), xytext=(0.1, ys[r]),
                            arrowprops={"arrowstyle": "->", "color": "tab:green", "connectionstyle": "arc3,rad=0.2"})
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
        ax.annotate("", xy=(1, ys[0]), xytext=(0.1, ys[r]),
                    arrowprops={"arrowstyle": "->", "color": colors[0], **({"ls": "--"} if first_dashed else {})})
    for r in range(world):
        ax.annotate("", xy=(2, ys[r]), xytext=(1.1, ys[0]), arrowprops={"arrowstyle": "->", "color": colors[1]})
    for x, label in zip((1, 2), labels):
        ax.text(x, -0.8, label, fontsize=7, ha="center", va="top")


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


def plot_busbw(records: list[dict], ax, title: str, op: str = "all_reduce", key: str = "busbw_GBps",
               crossover: int | None = None) -> None:
    for impl, pts in sorted(_series(records, op, key).items()):
        color, ls = STYLE.get(impl, (None, "-"))
        ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", ms=3, ls=ls, color=color, label=impl)
    if crossover:
        ax.axvline(crossover, color="tab:red", ls=":", lw=1)
        ax.annotate("one-shot | two-shot", (crossover, ax.get_ylim()[1] * 0.9), fontsize=7, color="tab:red")
    ax.set_xscale("log", base=2)
    bytes_axis(ax, "x")
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
    ax.set_title(f"{title}\n{op}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def headline_markdown(records: list[dict]) -> str:
    """labkit's best against NCCL and PyTorch's symmetric-memory ops at three points of a sweep:
    the smallest size (latency), 1 MiB, and the largest (bus bandwidth), for all-reduce, then
    reduce-scatter and all-gather at the largest size. Each cell: back to back / graph replay."""
    sw = [r for r in records if r.get("kind", "sweep") == "sweep"]
    if not sw:
        return "(no sweep records)"
    w = sw[0]["world_size"]
    labkit_all_reduce = ["labkit_one_shot", "labkit_two_shot", "labkit_tree", "labkit_one_shot_graphed",
                         "labkit_two_shot_in_place", "labkit_two_shot_ce_in_place"]

    def best(impls, op, b, key):
        vals = [r.get(key) for r in sw if r["impl"] in impls and r["op"] == op and r["bytes"] == b and r.get(key)]
        return (min if key.endswith("us") else max)(vals) if vals else None

    def cell(impls, op, b, keys, fmt):
        a, g = (best(impls, op, b, k) for k in keys)
        return " / ".join("–" if v is None else fmt.format(v) for v in (a, g))

    sizes = sorted({r["bytes"] for r in sw})
    small, big = sizes[0], sizes[-1]
    points = [("all_reduce", small, ("us", "graph_us"), "{:.1f} µs"),
              ("all_reduce", 1 << 20, ("us", "graph_us"), "{:.1f} µs"),
              ("all_reduce", big, ("busbw_GBps", "graph_busbw_GBps"), "{:.0f} GB/s"),
              ("reduce_scatter", big, ("busbw_GBps", "graph_busbw_GBps"), "{:.0f} GB/s"),
              ("all_gather", big, ("busbw_GBps", "graph_busbw_GBps"), "{:.0f} GB/s")]
    rows = ["| op, size | labkit (best) | NCCL | torch symm_mem (best) |", "|---|---|---|---|"]
    for op, b, keys, fmt in points:
        if not any(r["op"] == op and r["bytes"] == b for r in sw):
            continue  # a size or op this sweep did not measure
        mine = labkit_all_reduce if op == "all_reduce" else ["labkit"]
        torch_impls = ["torch_one_shot", "torch_two_shot"] if op == "all_reduce" else []
        rows.append(f"| {op} {format_bytes(b)} | {cell(mine, op, b, keys, fmt)} | "
                    f"{cell(['nccl'], op, b, keys, fmt)} | {cell(torch_impls, op, b, keys, fmt)} |")
    return (f"W = {w}; each cell: back to back / CUDA-graph replay; latency at the small sizes, "
            f"bus bandwidth at the largest\n\n" + "\n".join(rows))


def chosen_vs_best_markdown(records: list[dict], world_size: int, in_place: bool = False) -> str:
    """At every size of a sweep: the all-reduce ``collectives.choose`` picks (in_place: the one
    ``all_reduce(buf, buf.tensor)`` runs on a buffer with a workspace), against the best of NCCL and
    PyTorch's symmetric-memory ops, in both timings."""
    from labkit.kernels.comm import collectives as C

    sw = [r for r in records if r.get("kind", "sweep") == "sweep" and r.get("op") == "all_reduce"
          and r.get("world_size") == world_size]
    if not sw:
        return f"(no all-reduce sweep records for W={world_size})"
    rows = ["| bytes | chosen | labkit µs (b2b / graph) | best other | other µs (b2b / graph) | chosen as fast? (b2b / graph) |",
            "|---|---|---|---|---|---|"]
    for b in sorted({r["bytes"] for r in sw}):
        at = {r["impl"]: r for r in sw if r["bytes"] == b}
        # (the sweep's buffer has a workspace)
        alg = f"{C.choose_in_place(b, world_size, True)}_in_place" if in_place else C.choose(b, world_size)
        mine = at.get(f"labkit_{alg}")
        others = [at[i] for i in ("nccl", "torch_one_shot", "torch_two_shot") if i in at]
        if not mine or not others:
            continue
        cells = []
        for key in ("us", "graph_us"):
            best = min((o for o in others if o.get(key)), key=lambda o: o[key], default=None)
            cells.append((best, mine.get(key)))
        b2b_best, g_best = cells[0][0], cells[1][0]
        verdict = " / ".join("yes" if (m and o and m <= o[k]) else "no"
                             for (o, m), k in zip(cells, ("us", "graph_us")))
        rows.append(f"| {b:,} | {alg} | {mine['us']:.1f} / {mine.get('graph_us') or float('nan'):.1f} | "
                    f"{b2b_best['impl']} / {g_best['impl'] if g_best else '-'} | "
                    f"{b2b_best['us']:.1f} / {g_best['graph_us'] if g_best else float('nan'):.1f} | {verdict} |")
    return "\n".join(rows)


def tune_markdown(rows: list[dict]) -> str:
    """``labkit.labs.collectives.bench.best_configs`` as a table: the fastest launch per op and size, and the
    default launch's time beside it."""
    if not rows:
        return "(no tune records)"
    out = ["| W | op | bytes | fastest: vectors x warps x programs | µs | default µs | default / fastest |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["best"]
        ratio = f"{r['default_us'] / b['us']:.2f}" if r.get("default_us") else "-"
        default = f"{r['default_us']:.1f}" if r.get("default_us") else "- (not recorded)"
        out.append(f"| {r['world_size']} | {r['impl']} {r['op']} | {r['bytes']:,} | "
                   f"{b['vectors']} x {b['num_warps']} x {b['programs']} | {b['us']:.1f} | {default} | {ratio} |")
    return "\n".join(out)


def plot_links(records: list[dict], ax, title: str, sweep: list[dict] | None = None) -> None:
    """The fastest correct copy per mode at the largest size (``labkit.labs.collectives.links.best_links``),
    both directions busy and one, with the all-reduce busbw of ``sweep`` (same machine) drawn
    across: the link's ceiling for each way of moving bytes, and where each algorithm sits."""
    from labkit.labs.collectives.links import best_links, DIRECTIONS, MODES

    rows = best_links(records)
    if not rows:
        ax.text(0.5, 0.5, "no link records", ha="center", transform=ax.transAxes)
        return
    big = max(r["bytes"] for r in rows)
    width = 0.38
    for i, direction in enumerate(DIRECTIONS):
        vals = [next((r["GBps"] for r in rows if r["impl"] == m and r["direction"] == direction and r["bytes"] == big), 0)
                for m in MODES]
        bars = ax.bar([k + (i - 0.5) * width for k in range(len(MODES))], vals, width,
                      label=f"{direction} direction{'s' if direction == 'both' else ''} busy")
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(MODES)), MODES)
    for impl, color in (("labkit_one_shot", "tab:blue"), ("labkit_two_shot_ce_in_place", "tab:purple"),
                        ("nccl", "black")):
        r = next((x for x in sweep or [] if x.get("impl") == impl and x.get("op") == "all_reduce"
                  and x.get("bytes") == big and x.get("graph_busbw_GBps")), None)
        if r:
            ax.axhline(r["graph_busbw_GBps"], color=color, ls=":", lw=1.2,
                       label=f"{impl} all-reduce, busbw {r['graph_busbw_GBps']:.0f} (graph)")
    ax.set_ylabel(f"GB/s per GPU, {big >> 20} MiB copies")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower center", framealpha=0.95)
    ax.grid(alpha=0.3, axis="y")
