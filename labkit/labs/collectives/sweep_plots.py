"""Lab 02's sweep figures and what they say in words: latency and bus bandwidth against message size
per implementation (``STYLE``), the eager series of labkit's call paths beside torch's eager ops,
the headline table, labkit's chosen all-reduce against the best of NCCL and PyTorch, and the
measured links with the ceiling they put on a collective (``link_ceiling``)."""

from __future__ import annotations

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


#: the eager series (records of kind "eager", ``eager_bench.eager_series``): (impl, path) -> label, colour, style
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
    ``eager_bench.eager_verdicts`` summarises (``eager_bench.EAGER_SMALL_BYTES``) are lightly shaded. Returns
    the number of series drawn; without eager records, says so on the axes."""
    from labkit.labs.collectives.eager_bench import EAGER_SMALL_BYTES

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
