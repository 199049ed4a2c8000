"""Tables and plots for lab 03 (stream races and alignment), from records of ``labkit bench
streams`` or of a live run: the same functions draw the reader's run and the reference."""
from __future__ import annotations

import statistics
from collections import defaultdict

COLORS = {"raw": "tab:red", "views": "tab:orange", "views+record_stream": "tab:green"}


def race_summary(records: list[dict], kind: str = "race") -> list[dict]:
    """Per (allocator, sleep): trials, trials that corrupted, blocks reused, mean corrupted share."""
    groups = defaultdict(list)
    for r in records:
        if r.get("kind") == kind:
            groups[(r["allocator"], r.get("sleep_ms"))].append(r)
    rows = []
    for (allocator, sleep), rs in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        rows.append({"allocator": allocator, "sleep_ms": sleep, "trials": len(rs),
                     "corrupted_trials": sum(1 for r in rs if (r["corrupted_elems"] or 0) > 0),
                     "reused": sum(1 for r in rs if r.get("block_reused")),
                     "mean_corrupted_fraction": statistics.mean(r.get("corrupted_fraction") or 0.0 for r in rs),
                     "numel": rs[0].get("numel")})
    return rows


def race_markdown(records: list[dict], kind: str = "race") -> str:
    rows = race_summary(records, kind)
    if not rows:
        return f"(no {kind} records)"
    out = ["| allocator | side-stream delay (ms) | trials corrupted | block reused | mean share of elements corrupted |",
           "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['allocator']} | {r['sleep_ms']:g} | {r['corrupted_trials']} of {r['trials']} | "
                   f"{r['reused']} of {r['trials']} | {r['mean_corrupted_fraction']:.1%} |")
    return "\n".join(out)


def plot_race(records: list[dict], ax, title: str, kind: str = "race") -> None:
    """Share of the fresh tensor's elements overwritten by the side stream, against the delay."""
    rows = race_summary(records, kind)
    for j, allocator in enumerate(sorted({r["allocator"] for r in rows})):
        rs = [r for r in rows if r["allocator"] == allocator]
        xs = [max(r["sleep_ms"], 1e-3) for r in rs]  # 0 drawn at 1 µs on the log axis
        ax.plot(xs, [100 * r["mean_corrupted_fraction"] for r in rs], "o-", label=allocator,
                color=COLORS.get(allocator))
        for x, r in zip(xs, rs):
            ax.annotate(f"{r['corrupted_trials']}/{r['trials']}", (x, 100 * r["mean_corrupted_fraction"]),
                        textcoords="offset points", xytext=(0, 6 + 9 * j), ha="center", fontsize=7,
                        color=COLORS.get(allocator))
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
    return {"owner_alloc": first("alloc", tl["owner_addr"], marks["owner allocated (host)"]),
            "owner_free_requested": first("free_requested", tl["owner_addr"], marks["owner freed (host)"]),
            "owner_free_completed": first("free_completed", tl["owner_addr"], marks["owner freed (host)"]),
            "fresh_alloc": fresh_t, "end": marks["synchronized (host)"] / 1e3,
            "write": (marks["side write starts (GPU)"] / 1e3, marks["side write ends (GPU)"] / 1e3),
            "from_allocator_trace": timed}


def plot_timeline(tl: dict, ax, title: str) -> None:
    """One trial on one clock (ms since it began): how long the allocator kept the owner's block
    for it, which block the fresh tensor got and for how long, and when the side stream's write
    really ran on the GPU. A red fresh bar under the write is the race."""
    sp = timeline_spans(tl)
    same = tl["block_reused"]
    owner_end = max(sp["owner_free_completed"], sp["owner_free_requested"])
    ax.broken_barh([(sp["owner_alloc"], owner_end - sp["owner_alloc"])], (2.6, 0.8), color="tab:blue", alpha=0.7)
    ax.broken_barh([(sp["fresh_alloc"], sp["end"] - sp["fresh_alloc"])], (1.6, 0.8),
                   color="tab:red" if same else "tab:green", alpha=0.7)
    w0, w1 = sp["write"]
    ax.broken_barh([(w0, max(w1 - w0, 0.02))], (0.6, 0.8), color="tab:purple")
    ax.plot([sp["owner_free_requested"]], [3.0], "kx", markersize=9, label="owner freed (free_requested)")
    ax.annotate(f"write {w0:.2f}-{w1:.2f} ms", (w0, 1.45), fontsize=8, color="tab:purple", ha="right")
    ax.set_yticks([1, 2, 3], ["side stream writes\nthe owner's block (GPU)",
                              "fresh tensor's block:\n" + ("SAME block" if same else "another block"),
                              "owner's block held\nfor the owner (allocator)"], fontsize=8)
    ax.set_ylim(0.3, 3.7)
    ax.set_xlim(0, sp["end"] * 1.05)
    src = "the allocator's trace" if sp["from_allocator_trace"] else "host marks (no times in the trace)"
    ax.set_xlabel(f"ms since the trial began\n(blocks: {src}; write: CUDA events)", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    verdict = f"corrupted: {tl['corrupted_elems']:,} of {tl['numel']:,} elements"
    ax.set_title(f"{title}\n{verdict}", fontsize=9)
    ax.grid(alpha=0.3, axis="x")


def plot_alloc_time(records: list[dict], ax, title: str) -> None:
    rs = [r for r in records if r.get("kind") == "alloc_time"]
    names = [r["allocator"] for r in rs]
    us = [r["us"] for r in rs]
    err = [[r["us"] - r["us_p25"] for r in rs], [r["us_p75"] - r["us"] for r in rs]]
    ax.barh(range(len(rs)), us, xerr=err, color="tab:blue", alpha=0.7)
    ax.set_yticks(range(len(rs)), names, fontsize=8)
    for i, v in enumerate(us):
        ax.annotate(f"{v:.1f} µs", (v, i), textcoords="offset points", xytext=(4, -3), fontsize=8)
    groups = rs[0]["groups"] if rs else "?"
    ax.set_xlabel(f"host µs to hand out {groups} buffers (median, bars p25-p75)")
    ax.set_title(title, fontsize=9)


def plot_gemm_alignment(records: list[dict], ax, title: str) -> None:
    rs = [r for r in records if r.get("kind") == "gemm_alignment"]
    series = sorted({(r["impl"], r["operands"]) for r in rs})
    offsets = sorted({r["offset_bytes"] for r in rs})
    width = 0.8 / max(len(series), 1)
    for j, (impl, ops) in enumerate(series):
        ys = {r["offset_bytes"]: r["tflops"] for r in rs if r["impl"] == impl and r["operands"] == ops}
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(offsets))]
        ax.bar(xs, [ys.get(o, 0) for o in offsets], width, label=f"{impl}, misaligned: {ops}")
    ax.set_xticks(range(len(offsets)), [f"+{o} B" for o in offsets])
    ax.set_xlabel("operand pointer offset from a 256-byte boundary")
    ax.set_ylabel("TFLOP/s (median)")
    if rs:
        r = rs[0]
        title = f"{title}\n{r['dtype']} GEMM {r['m']}x{r['n']}x{r['k']}"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")


def gemm_markdown(records: list[dict]) -> str:
    rs = [r for r in records if r.get("kind") == "gemm_alignment"]
    if not rs:
        return "(no GEMM alignment records)"
    out = ["| impl | misaligned | offset | TFLOP/s | time vs aligned (paired median) | max rel. error |",
           "|---|---|---|---|---|---|"]
    for r in sorted(rs, key=lambda r: (r["impl"], r["operands"], r["offset_bytes"])):
        out.append(f"| {r['impl']} | {r['operands']} | +{r['offset_bytes']} B | {r['tflops']:.0f} | "
                   f"{r['time_vs_aligned']:.2f}x | {r['max_rel_err']:.1e} |")
    return "\n".join(out)


def sanitizer_markdown(records: list[dict]) -> str:
    rs = [r for r in records if r.get("kind") == "sanitizer"]
    if not rs:
        return "(no sanitizer records)"
    groups = defaultdict(list)
    for r in rs:
        groups[str(r["allocator"])].append(r)
    out = ["| case | trials | reported by the sanitizer | wrong result anyway | first report |", "|---|---|---|---|---|"]
    for name, g in groups.items():
        wrong = sum(1 for r in g if (r.get("corrupted_elems") or 0) > 0 or r.get("wrong_sum"))
        first = next((r["report"] for r in g if r.get("report")), "")
        out.append(f"| {name} | {len(g)} | {sum(1 for r in g if r.get('reported'))} | {wrong} | {first[:120]} |")
    return "\n".join(out)
