"""Tables and plots for lab 03 (stream races and alignment), from records of ``labkit bench
streams`` or of a live run: the same functions draw the reader's run and the reference."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict

from labkit.workbench import hardware, results

COLORS = {"raw": "tab:red", "views": "tab:orange", "views+record_stream": "tab:green"}


def of_kind(panels: list, kind: str, allocators=None) -> list:
    """The panels (``labkit.workbench.results.panels``) keeping only their records of ``kind`` (and
    of the given allocators); panels left with no record are dropped."""
    out = []
    for p in panels:
        recs = [
            r for r in p.records if r.get("kind") == kind and (allocators is None or r.get("allocator") in allocators)
        ]
        if recs:
            out.append(dataclasses.replace(p, records=recs))
    return out


def race_summary(records: list[dict], kind: str = "race") -> list[dict]:
    """Per (allocator, sleep): trials, trials that corrupted, blocks reused, mean corrupted share.
    A trial whose ``corrupted_elems`` is missing or null is refused (a ResultsError naming the
    record): counted, it would read as a clean trial."""
    groups = defaultdict(list)
    for i, r in enumerate(records):
        if r.get("kind") == kind:
            if not isinstance(r.get("corrupted_elems"), int) or isinstance(r.get("corrupted_elems"), bool):
                raise results.ResultsError(
                    f"race_summary: record {i} ({kind}, {r.get('allocator')}) holds corrupted_elems="
                    f"{r.get('corrupted_elems')!r}: expected a count"
                )
            groups[(r["allocator"], r.get("sleep_ms"))].append(r)
    rows = []
    for (allocator, sleep), rs in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        rows.append(
            {
                "allocator": allocator,
                "sleep_ms": sleep,
                "trials": len(rs),
                "corrupted_trials": sum(1 for r in rs if r["corrupted_elems"] > 0),
                "reused": sum(1 for r in rs if r.get("block_reused")),
                "mean_corrupted_fraction": statistics.mean(r.get("corrupted_fraction") or 0.0 for r in rs),
                "numel": rs[0].get("numel"),
            }
        )
    return rows


def race_markdown(records: list[dict], kind: str = "race") -> str:
    rows = race_summary(records, kind)
    if not rows:
        return f"(no {kind} records)"
    out = [
        "| allocator | side-stream delay (ms) | trials corrupted | block reused | mean share of elements corrupted |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['allocator']} | {r['sleep_ms']:g} | {r['corrupted_trials']} of {r['trials']} | "
            f"{r['reused']} of {r['trials']} | {r['mean_corrupted_fraction']:.1%} |"
        )
    return "\n".join(out)


def plot_race(records: list[dict], ax, title: str, kind: str = "race") -> None:
    """Share of the fresh tensor's elements overwritten by the side stream, against the delay."""
    rows = race_summary(records, kind)
    for j, allocator in enumerate(sorted({r["allocator"] for r in rows})):
        rs = [r for r in rows if r["allocator"] == allocator]
        xs = [max(r["sleep_ms"], 1e-3) for r in rs]  # 0 drawn at 1 µs on the log axis
        ax.plot(
            xs, [100 * r["mean_corrupted_fraction"] for r in rs], "o-", label=allocator, color=COLORS.get(allocator)
        )
        for x, r in zip(xs, rs):
            ax.annotate(
                f"{r['corrupted_trials']}/{r['trials']}",
                (x, 100 * r["mean_corrupted_fraction"]),
                textcoords="offset points",
                xytext=(0, 6 + 9 * j),
                ha="center",
                fontsize=7,
                color=COLORS.get(allocator),
            )
    ax.set_xscale("log")
    ax.set_xlabel("side stream busy before its write (ms; 0 drawn at 0.001)")
    ax.set_ylabel("fresh tensor corrupted (% of elements)")
    ax.set_ylim(-5, 125)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _plausible_times(events: list[dict]) -> bool:
    ts = [e["t_us"] for e in events if e.get("t_us") is not None]
    return bool(ts) and len(ts) == len(events) and all(-1e6 < t < 1e7 for t in ts)


def timeline_spans(tl: dict) -> dict:
    """Times (ms since the trial began) of what the timeline draws, from the allocator's own trace
    where it carries host times, else from labkit's host marks."""
    marks, events = tl["marks_us"], tl["events"]
    timed = _plausible_times(events)

    def first(action, addr, default):
        for e in events:
            if e["action"] == action and e["addr"] == addr and timed:
                return e["t_us"] / 1e3
        return default / 1e3

    fresh_allocs = [e for e in events if e["action"] == "alloc" and e["addr"] == tl["fresh_addr"]]
    fresh_t = fresh_allocs[-1]["t_us"] / 1e3 if (timed and fresh_allocs) else marks["fresh allocated (host)"] / 1e3
    return {
        "owner_alloc": first("alloc", tl["owner_addr"], marks["owner allocated (host)"]),
        "owner_free_requested": first("free_requested", tl["owner_addr"], marks["owner freed (host)"]),
        "owner_free_completed": first("free_completed", tl["owner_addr"], marks["owner freed (host)"]),
        "fresh_alloc": fresh_t,
        "end": marks["synchronized (host)"] / 1e3,
        "write": (marks["side write starts (GPU)"] / 1e3, marks["side write ends (GPU)"] / 1e3),
        "from_allocator_trace": timed,
    }


def plot_timeline(tl: dict, ax, title: str) -> None:
    """One trial on one clock (ms since it began): how long the allocator kept the owner's block
    for it, which block the fresh tensor got and for how long, and when the side stream's write
    really ran on the GPU. A red fresh bar under the write is the race."""
    sp = timeline_spans(tl)
    same = tl["block_reused"]
    owner_end = max(sp["owner_free_completed"], sp["owner_free_requested"])
    ax.broken_barh([(sp["owner_alloc"], owner_end - sp["owner_alloc"])], (2.6, 0.8), color="tab:blue", alpha=0.7)
    ax.broken_barh(
        [(sp["fresh_alloc"], sp["end"] - sp["fresh_alloc"])],
        (1.6, 0.8),
        color="tab:red" if same else "tab:green",
        alpha=0.7,
    )
    w0, w1 = sp["write"]
    ax.broken_barh([(w0, max(w1 - w0, 0.02))], (0.6, 0.8), color="tab:purple")
    ax.plot([sp["owner_free_requested"]], [3.0], "kx", markersize=9, label="owner freed (free_requested)")
    ax.annotate(
        f"write {w0:.2f}-{w1:.2f} ms ", (w0, 1.45), fontsize=8, color="tab:purple", ha="right", va="top"
    )  # below the fresh bar, left of the write
    ax.set_yticks(
        [1, 2, 3],
        [
            "side stream writes\nthe owner's block (GPU)",
            "fresh tensor's block:\n" + ("SAME block" if same else "another block"),
            "owner's block held\nfor the owner (allocator)",
        ],
        fontsize=8,
    )
    ax.set_ylim(0.3, 3.7)
    ax.set_xlim(0, sp["end"] * 1.05)
    src = "the allocator's trace" if sp["from_allocator_trace"] else "host marks (no times in the trace)"
    ax.set_xlabel(f"ms since the trial began\n(blocks: {src}; write: CUDA events)", fontsize=8)
    ax.legend(fontsize=7, loc="lower left")  # the empty corner: bars start at the left, the write is late
    verdict = f"corrupted: {tl['corrupted_elems']:,} of {tl['numel']:,} elements"
    ax.set_title(f"{title}\n{verdict}", fontsize=9)
    ax.grid(alpha=0.3, axis="x")


#: The seed story's own allocation times, quoted (the one typed number in this lab: a citation of a
#: public report, measured on its GPU, not on yours). From the seed file
#: te-grouped-wgrad-tensor-views-pr.txt (TransformerEngine PR #3049): "A simple benchmark on a GB200
#: node finds that allocating 64 tensor views takes 50 us while tex.bulk_allocate takes 58 us."
SEED_VIEWS_US = 50.0
SEED_BULK_ALLOCATE_US = 58.0
SEED_GROUPS = 64
SEED_LABEL = "seed story (TE PR, its GPU)"
_ALLOC_TIME_GID = "labkit.alloc_time"  # marks the axes plot_alloc_time drew, to share x with


def plot_alloc_time(records: list[dict], ax, title: str, seed: bool = True) -> None:
    """Host time to hand out the buffers, one bar per way (median, whiskers p25-p75); with
    ``seed``, the seed story's two numbers as lines (its GPU and its C++ code, not this run)."""
    rs = [r for r in records if r.get("kind") == "alloc_time"]
    # the rows of one figure (a machine each, plot.beside) share the µs axis: two machines' bars
    # compare by length only on one scale
    peers = [a for a in ax.figure.axes if a is not ax and a.get_gid() == _ALLOC_TIME_GID]
    ax.set_gid(_ALLOC_TIME_GID)
    if peers:
        ax.sharex(peers[0])
    names = [r["allocator"] for r in rs]
    us = [r["us"] for r in rs]
    err = [[r["us"] - r["us_p25"] for r in rs], [r["us_p75"] - r["us"] for r in rs]]
    ax.barh(range(len(rs)), us, xerr=err, color="tab:blue", alpha=0.7)
    ax.set_yticks(range(len(rs)), names, fontsize=8)
    for i, r in enumerate(rs):  # the label starts after the whisker, never on it
        ax.annotate(
            f"{r['us']:.1f} µs", (max(r["us_p75"], r["us"]), i), textcoords="offset points", xytext=(5, -3), fontsize=8
        )
    right = max([r["us_p75"] for r in rs] + ([SEED_BULK_ALLOCATE_US] if seed else []), default=1.0)
    # room for the labels, and never narrower than the rows already drawn on the shared axis
    ax.set_xlim(0, max(right * 1.18, ax.get_xlim()[1] if peers else 0.0))
    if seed:
        for x, what, style in (
            (SEED_VIEWS_US, f"{SEED_GROUPS} views", "--"),
            (SEED_BULK_ALLOCATE_US, "tex.bulk_allocate", ":"),
        ):
            ax.axvline(x, color="tab:purple", ls=style, lw=1.2, label=f"{SEED_LABEL}: {what}, {x:g} µs")
        ax.legend(fontsize=7, loc="lower right")
    groups = rs[0]["groups"] if rs else "?"
    ax.set_xlabel(f"host µs to hand out {groups} buffers (median, bars p25-p75)")
    ax.set_title(title, fontsize=9)


def gemm_ratio_series(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Per (impl, operands misaligned): one row per offset with the time relative to +0 bytes in
    the same rounds. ``ratio`` is the median of the per-round paired ratios (``time_vs_aligned``);
    ``p25``/``p75`` its quartiles where the records carry them (None otherwise); ``tflops_aligned``
    the median TFLOP/s at +0 of that series."""
    rs = [r for r in records if r.get("kind") == "gemm_alignment"]
    out = {}
    for key in sorted({(r["impl"], r["operands"]) for r in rs}):
        series = sorted((r for r in rs if (r["impl"], r["operands"]) == key), key=lambda r: r["offset_bytes"])
        base = next((r for r in series if r["offset_bytes"] == 0), None)
        out[key] = [
            {
                "offset_bytes": r["offset_bytes"],
                "ratio": r["time_vs_aligned"],
                "p25": r.get("time_vs_aligned_p25"),
                "p75": r.get("time_vs_aligned_p75"),
                "tflops_aligned": base["tflops"] if base else None,
            }
            for r in series
        ]
    return out


def gpu_name(panel) -> str | None:
    """The GPU a panel's records ran on: the reference file's first GPU, or this machine's for a live run."""
    if panel.result_set is not None:
        gpus = panel.result_set.env.get("gpus") or []
        return gpus[0]["name"] if gpus else None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def plot_gemm_alignment(records: list[dict], ax, title: str, gpu: str | None = None) -> None:
    """Each offset's GEMM time over the +0-byte time of the same rounds (paired), per
    implementation and misaligned operands; a line at 1.0 (as fast as aligned). Whiskers are the
    quartiles of the paired ratios where the records hold them; the y label says when they do not.
    A ratio axis has no room for a ceiling: where ``gpu`` is listed in
    ``labkit.workbench.hardware.DATASHEET_DENSE_TFLOPS``, the legend gives each series' +0 B rate as
    a share of that datasheet peak (the lab standard's ceiling policy)."""
    series = gemm_ratio_series(records)
    dtype = next((r["dtype"] for r in records if r.get("kind") == "gemm_alignment"), None)
    peak = hardware.datasheet_dense_tflops(gpu, "bf16") if dtype == "bfloat16" else None
    offsets = sorted({row["offset_bytes"] for rows in series.values() for row in rows})
    width = 0.8 / max(len(series), 1)
    have_quartiles = all(row["p25"] is not None and row["p75"] is not None for rows in series.values() for row in rows)
    for j, ((impl, ops), rows) in enumerate(series.items()):
        at = {row["offset_bytes"]: row for row in rows}
        xs = [i + (j - (len(series) - 1) / 2) * width for i, o in enumerate(offsets) if o in at]
        ys = [at[o]["ratio"] for o in offsets if o in at]
        yerr = None
        if have_quartiles:
            yerr = [
                [at[o]["ratio"] - at[o]["p25"] for o in offsets if o in at],
                [at[o]["p75"] - at[o]["ratio"] for o in offsets if o in at],
            ]
        base = rows[0]["tflops_aligned"]
        share = f", {base / peak:.0%} of the datasheet peak" if base and peak else ""
        label = f"{impl}, misaligned: {ops}" + (f" (+0 B: {base:.0f} TFLOP/s{share})" if base else "")
        ax.bar(xs, ys, width, yerr=yerr, capsize=2, label=label)
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6)
    ax.axhline(1.0, color="0.2", lw=1, ls="--", label="1.0: as fast as +0 B")
    if peak:  # an invisible handle: the legend names the ceiling the shares are of
        ax.plot([], [], " ", label=f"datasheet bf16 dense peak, {gpu.replace('NVIDIA ', '')}: {peak:g} TFLOP/s")
    ax.set_xticks(range(len(offsets)), [f"+{o} B" for o in offsets])
    ax.set_xlabel("operand pointer offset from a 256-byte boundary")
    ax.set_ylabel(
        "time / time at +0 B, same round\n(median of paired ratios;\n"
        + ("whiskers p25-p75)" if have_quartiles else "quartiles not recorded)"),
        fontsize=8,
    )
    rs = [r for r in records if r.get("kind") == "gemm_alignment"]
    if rs:
        r = rs[0]
        title = f"{title}\n{r['dtype']} GEMM {r['m']}x{r['n']}x{r['k']}"
    ax.set_title(title, fontsize=9)
    top = max([row["p75"] or row["ratio"] for rows in series.values() for row in rows], default=1.0)
    ax.set_ylim(0, top * 1.12)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")


def gemm_markdown(records: list[dict]) -> str:
    """One row per implementation and misaligned operands (4 rows, not one per offset): the time
    at each offset against the aligned one (paired medians), the aligned TFLOP/s, and the largest
    relative error over the offsets."""
    rs = [r for r in records if r.get("kind") == "gemm_alignment"]
    if not rs:
        return "(no GEMM alignment records)"
    offsets = sorted({r["offset_bytes"] for r in rs})
    out = [
        "| impl | misaligned | aligned TFLOP/s | " + " | ".join(f"+{o} B" for o in offsets) + " | max rel. error |",
        "|---|---|---|" + "---|" * len(offsets) + "---|",
    ]
    groups = defaultdict(dict)
    for r in rs:
        groups[(r["impl"], r["operands"])][r["offset_bytes"]] = r
    for (impl, operands), by_offset in sorted(groups.items()):
        aligned = by_offset.get(0)
        cells = [f"{by_offset[o]['time_vs_aligned']:.2f}x" if o in by_offset else "-" for o in offsets]
        worst = max(r["max_rel_err"] for r in by_offset.values())
        out.append(
            f"| {impl} | {operands} | {aligned['tflops']:.0f} | " if aligned else f"| {impl} | {operands} | - | "
        )
        out[-1] += " | ".join(cells) + f" | {worst:.1e} |"
    return "\n".join(out)


def sanitizer_markdown(records: list[dict]) -> str:
    rs = [r for r in records if r.get("kind") == "sanitizer"]
    if not rs:
        return "(no sanitizer records)"
    groups = defaultdict(list)
    for r in rs:
        groups[str(r["allocator"])].append(r)
    out = [
        "| case | trials | reported by the sanitizer | wrong result anyway | first report |",
        "|---|---|---|---|---|",
    ]
    for name, g in groups.items():
        wrong = sum(1 for r in g if (r.get("corrupted_elems") or 0) > 0 or r.get("wrong_sum"))
        first = next((r["report"] for r in g if r.get("report")), "")
        out.append(f"| {name} | {len(g)} | {sum(1 for r in g if r.get('reported'))} | {wrong} | {first[:120]} |")
    return "\n".join(out)
