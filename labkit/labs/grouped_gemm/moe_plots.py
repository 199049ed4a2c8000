"""Figures of lab 04's MoE layer, from records of ``moe_bench.moe_records`` (a live run or a
reference file): the same functions draw both. matplotlib only; each draws on the ``ax`` given."""

from __future__ import annotations

from matplotlib.colors import to_rgba

#: one colour per way of running a step
COLORS = {("host_sync", "eager"): "tab:red", ("device", "eager"): "tab:blue", ("device", "graph"): "tab:green"}
LABELS = {
    ("host_sync", "eager"): "host sync, eager",
    ("device", "eager"): "device counts, eager",
    ("device", "graph"): "device counts, CUDA graph",
}


def _gaps(intervals: list, span: float) -> list[tuple[float, float]]:
    """(start, width) of the stretches of [0, span] that no interval covers."""
    gaps, reach = [], 0.0
    for start, dur, *_ in sorted(intervals, key=lambda iv: iv[0]):
        if start > reach:
            gaps.append((reach, start - reach))
        reach = max(reach, start + dur)
    if span > reach:
        gaps.append((reach, span - reach))
    return gaps


def _busy_share(interval: list) -> float:
    """[start, dur, name, busy]: busy / dur (1 for an interval of one kernel, or without busy)."""
    if len(interval) < 4 or not interval[1]:
        return 1.0
    return max(0.0, min(1.0, interval[3] / interval[1]))


def plot_timeline(record: dict, ax, title: str) -> None:
    """One step (a kind="timeline" record) as two rows against µs since the step began: the GPU's
    kernels and the host's waits for the GPU; the GPU's idle stretches shaded grey, intervals merged
    from many short kernels drawn paler the more idle they hold, and the idle total, measured on
    the full trace, written on the plot."""
    if record.get("kind") != "timeline":
        raise ValueError(f"record: expected a kind='timeline' record, got kind={record.get('kind')!r}")
    span = record.get("span_us") or 0.0
    ax.set_title(title, fontsize=9)
    ax.set_yticks([5, 17])
    ax.set_yticklabels(["host waits\nfor the GPU", "GPU kernels"], fontsize=8)
    ax.set_ylim(0, 22)
    ax.set_xlabel("µs since the step began")
    if not record.get("device_events"):
        ax.text(
            0.5,
            0.5,
            record.get("note") or "no GPU events in this trace",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
        )
        ax.set_xlim(0, max(span, 1.0))
        return
    kernels = record.get("kernels") or []
    for start, width in _gaps(kernels, span):
        ax.axvspan(start, start + width, color="0.85", zorder=0, lw=0)
    # a merged interval is drawn as pale as it is idle: opacity = the share its kernels cover
    shades = [to_rgba("tab:blue", 0.15 + 0.85 * _busy_share(iv)) for iv in kernels]
    ax.broken_barh([(iv[0], max(iv[1], span * 1e-4)) for iv in kernels], (13, 8), facecolors=shades)
    syncs = record.get("syncs") or []
    if syncs:
        ax.broken_barh([(iv[0], max(iv[1], span * 1e-4)) for iv in syncs], (1, 8), color="tab:red")
    idle, share = record.get("gpu_idle_us"), record.get("gpu_idle_share")
    text = f"GPU idle {idle:,.0f} µs of {span:,.0f} µs ({share:.0%})" if idle is not None else ""
    if record.get("sync_calls"):
        n = record["sync_calls"]
        text += f"; host waits {record.get('sync_us', 0):,.0f} µs in {n} call{'s' if n > 1 else ''}"
    ax.text(
        0.99,
        0.97,
        text,
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8,
        bbox={"facecolor": "white", "alpha": 0.8, "lw": 0},
    )
    ax.set_xlim(0, span)
    ax.grid(axis="x", alpha=0.3)


def _find(rows: list[dict], way: tuple[str, str], skew: float) -> dict | None:
    return next((r for r in rows if (r["impl"], r["method"]) == way and (r.get("skew") or 0.0) == skew), None)


def plot_layer_times(records: list[dict], ax, title: str) -> None:
    """Bars of one step's GPU time (ms_fwd_bwd, median; error bars from the quartiles) per way of
    running it, grouped by skew; above each group, how many times faster the graph replay is
    than the host-sync loop (the paired per-round ratio where the records carry it)."""
    rows = [r for r in records if r.get("kind") == "moe_layer"]
    if not rows:
        ax.text(0.5, 0.5, "no moe_layer records", transform=ax.transAxes, ha="center", va="center")
        ax.set_title(title, fontsize=9)
        return
    skews = sorted({r.get("skew") or 0.0 for r in rows})
    ways = [w for w in COLORS if any((r["impl"], r["method"]) == w for r in rows)]
    width = 0.8 / len(ways)
    for j, way in enumerate(ways):
        xs, ms, lo, hi = [], [], [], []
        for i, skew in enumerate(skews):
            r = _find(rows, way, skew)
            if r is None:
                continue
            xs.append(i + (j - (len(ways) - 1) / 2) * width)
            ms.append(r["ms_fwd_bwd"])
            lo.append(max(0.0, r["ms_fwd_bwd"] - r["us_p25"] / 1e3) if r.get("us_p25") is not None else 0.0)
            hi.append(max(0.0, r["us_p75"] / 1e3 - r["ms_fwd_bwd"]) if r.get("us_p75") is not None else 0.0)
        ax.bar(xs, ms, width * 0.95, yerr=[lo, hi], capsize=3, color=COLORS[way], label=LABELS[way])
    top = max(r["ms_fwd_bwd"] for r in rows)
    for i, skew in enumerate(skews):
        host, graph = _find(rows, ("host_sync", "eager"), skew), _find(rows, ("device", "graph"), skew)
        if host and graph:
            paired = graph.get("ratio_vs_host_sync")  # median of per-round ratios: less noisy
            factor = 1 / paired if paired else host["ms_fwd_bwd"] / graph["ms_fwd_bwd"]
            ax.annotate(f"graph {factor:.1f}x faster\nthan host sync", (i, top * 1.06), ha="center", fontsize=8)
    r0 = rows[0]
    ax.set_xticks(range(len(skews)))
    ax.set_xticklabels([f"skew {s:g}" + (" (router only)" if s == 0 else "") for s in skews], fontsize=8)
    ax.set_ylabel("forward + backward (ms, median; bars: quartiles)")
    ax.set_ylim(0, top * 1.55)  # room for the factors, and for the legend above them
    ax.set_title(
        f"{title}\nT={r0.get('tokens')} tokens, E={r0.get('experts')}, top-{r0.get('top_k')}, "
        f"H={r0.get('K')}, F={r0.get('N')}",
        fontsize=9,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=len(ways), frameon=False)


__all__ = ["COLORS", "LABELS", "plot_layer_times", "plot_timeline"]
