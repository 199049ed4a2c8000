"""The start-here lab's measurement: the Triton copy kernel against ``torch.Tensor.copy_``.

A copy reads and writes every byte once, so its speed is memory bandwidth: GB/s here counts
bytes read plus bytes written (2 x size). Small sizes fit in L2 (its size is in ``labkit doctor``,
read from the device's ``L2_cache_size``) and measure the cache and launch overhead rather than HBM.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from labkit.kernels import copy
from labkit.workbench import bench, tier

#: Sizes in bytes for each profile: small under the interpreter, up to 1 GiB on a GPU.
SIZES = {
    "cpu": [1 << 14, 1 << 16, 1 << 18, 1 << 20],
    "gpu": [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30],
}
REQUIRED = ("impl", "bytes", "us", "us_p25", "us_p75", "GBps", "ratio_vs_torch", "correct", "method")
IMPLS = ("torch.copy_", "triton copy")


def copy_sweep(sizes_bytes: list[int], reps: int = 30, warmup: int = 5, progress: bool = True) -> list[dict]:
    """Check then time both copies at each size (float32); one record per (impl, method, size)."""
    if not sizes_bytes:
        raise ValueError("sizes_bytes: expected at least one size")
    for s in sizes_bytes:
        if not (isinstance(s, int) and s >= 4 and s % 4 == 0):
            raise ValueError(f"sizes_bytes: {s!r} is not a positive multiple of 4 bytes (float32)")
    dev = tier.kernel_device()
    cuda = dev.type == "cuda"
    records = []
    for nbytes in tqdm(sizes_bytes, desc="copy sweep", unit="size", disable=not progress):
        x = torch.randn(nbytes // 4, device=dev)
        ref_out, out = torch.empty_like(x), torch.full_like(x, float("nan"))  # poisoned
        copy(x, out)
        correct = bool(torch.equal(out, x))
        # Enough back-to-back calls per sample that a sample lasts well past launch overhead.
        inner = max(1, min(100, (1 << 26) // nbytes)) if cuda else 1
        candidates = {
            "torch.copy_": lambda ref_out=ref_out, x=x: ref_out.copy_(x),
            "triton copy": lambda x=x, out=out: copy(x, out),
        }
        # On a GPU, time twice: CUDA events around launches from Python (what a caller pays per
        # call, launch overhead included) and CUDA-graph replays (close to the kernels alone).
        for method in ("cuda_events", "cuda_graph") if cuda else ("cpu_clock",):
            cmp = bench.compare(
                candidates,
                baseline="torch.copy_",
                device=dev if cuda else None,
                warmup=warmup,
                reps=reps,
                inner=inner,
                method=method,
            )
            for impl in IMPLS:
                t = cmp.timings[impl]
                records.append(
                    {
                        "impl": impl,
                        "bytes": nbytes,
                        **t.as_dict(),
                        "GBps": bench.gbps(2 * nbytes, t.median_us),
                        "ratio_vs_torch": cmp.ratio(impl),
                        "correct": correct if impl == "triton copy" else True,
                    }
                )
        del x, ref_out, out, candidates  # the lambdas hold the tensors too
    return records


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench start_here``: the sweep, then the profiler's view of one 1 GiB
    copy eager and under graph replay (``copy_trace``: kind "copy_trace", a ``skipped`` reason
    without a GPU). The sweep's records carry no "kind", as before."""
    from labkit.labs.start_here import copy_trace

    reps = 50 if profile == "gpu" else 5
    return copy_sweep(SIZES[profile], reps=reps) + copy_trace.records(profile)


def hbm_reached(records: list[dict]) -> tuple[float, int] | None:
    """(GB/s, bytes) of the largest eager ``torch.copy_`` in this benchmark's records (GB/s counts
    the read and the write): the HBM bandwidth that machine really reached, which other labs use
    as a measured floor for memory-bound work. None when there is no such record."""
    copies = [
        r for r in records if r.get("impl") == "torch.copy_" and r.get("method") == "cuda_events" and r.get("GBps")
    ]
    if not copies:
        return None
    top = max(copies, key=lambda r: r["bytes"])
    return top["GBps"], top["bytes"]


def graph_vs_events(records: list[dict]) -> list[dict]:
    """Per (impl, size): median time under CUDA-graph replay over median time with events.

    Below 1: the graph removed launch overhead. Above 1: the captured work itself ran slower
    than the eager launches, i.e. capture changed *how* the work runs, not just how it is launched.
    """
    by = {(r["impl"], r["bytes"], r["method"]): r for r in records}
    out = []
    for (impl, nbytes, method), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if method != "cuda_events" or (impl, nbytes, "cuda_graph") not in by:
            continue
        g = by[(impl, nbytes, "cuda_graph")]
        out.append(
            {
                "impl": impl,
                "bytes": nbytes,
                "events_us": r["us"],
                "graph_us": g["us"],
                "graph_over_events": g["us"] / r["us"],
            }
        )
    return out


_PANELS = (("launched from Python", ("cuda_events", "cpu_clock")), ("CUDA-graph replay", ("cuda_graph",)))
_STYLE = {"torch.copy_": ("o", "--"), "triton copy": ("s", "-")}


def _datasheet_peak(env: dict) -> tuple[str, float] | None:
    """(GPU name, datasheet HBM TB/s) of the machine a results file was made on, if listed."""
    from labkit.workbench.hardware import datasheet_hbm_tbps

    gpus = env.get("gpus") or []
    name = gpus[0]["name"] if gpus else None
    peak = datasheet_hbm_tbps(name) if name else None
    return (name.replace("NVIDIA ", ""), peak) if peak else None


def headline(refs: dict) -> str | None:
    """One line for the notebook's first screen: the Triton copy at the largest recorded size
    under graph replay, against torch.copy_ and the HBM datasheet peak, then the same size
    launched eagerly (CUDA events), per reference machine."""
    lines = []
    for machine, rs in sorted(refs.items()):
        graph = [r for r in rs.records if r.get("method") == "cuda_graph" and r.get("GBps")]
        if not graph:
            continue
        top = max(r["bytes"] for r in graph)
        at = {r["impl"]: r["GBps"] for r in graph if r["bytes"] == top}
        if "triton copy" not in at:
            continue
        peak = _datasheet_peak(rs.env)
        share = f", {at['triton copy'] / (peak[1] * 1e3):.0%} of the {peak[0]} datasheet HBM peak" if peak else ""
        vs = f" (torch.copy_: {at['torch.copy_']:,.0f})" if "torch.copy_" in at else ""
        eager = {
            r["impl"]: r["GBps"]
            for r in rs.records
            if r.get("method") == "cuda_events" and r.get("GBps") and r["bytes"] == top
        }
        launched = (
            f"; launched eagerly {eager['triton copy']:,.0f} GB/s"
            + (f" (torch.copy_: {eager['torch.copy_']:,.0f})" if "torch.copy_" in eager else "")
            if "triton copy" in eager
            else ""
        )
        lines.append(
            f"RECORDED {machine}: labkit's Triton copy moves {at['triton copy']:,.0f} GB/s at "
            f"{top >> 20} MiB under graph replay{vs}{share}{launched}"
        )
    return "\n".join(lines) or None


def plot_copy_bandwidth(records: list[dict], yours: dict, refs: dict):
    """Two panels (eager launches | graph replays): GB/s against size, your run beside references.

    records: your copy_sweep records; yours: their environment stamp; refs: {machine: ResultSet}.
    Colour tells the source (your run, each reference machine), marker and line the implementation.
    """
    from labkit.workbench import plot

    fig, axes = plot.new_figure(ncols=2, width=5.6, height=4.4)
    sources = [("your run", records, "black")] + [
        (f"reference {m}", rs.records, c)
        for (m, rs), c in zip(sorted(refs.items()), ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red"))
    ]
    peaks = [_datasheet_peak(rs.env) for _, rs in sorted(refs.items())]
    for ax, (title, methods) in zip(axes, _PANELS):
        for label, recs, color in sources:
            for impl, (marker, style) in _STYLE.items():
                pts = sorted((r["bytes"], r["GBps"]) for r in recs if r["impl"] == impl and r["method"] in methods)
                if pts:
                    ax.plot(
                        *zip(*pts),
                        marker=marker,
                        linestyle=style,
                        color=color,
                        alpha=1 if label == "your run" else 0.7,
                        label=f"{label}: {impl}",
                    )
        for (_, _, color), peak in zip(sources[1:], peaks):
            if peak:  # the ceiling: a copy cannot beat HBM (GB/s counts read + written bytes)
                ax.axhline(
                    peak[1] * 1e3,
                    color=color,
                    linestyle=":",
                    linewidth=1,
                    label=f"HBM peak, {peak[0]} datasheet: {peak[1]:g} TB/s",
                )
        plot.bytes_axis(ax, "x")
        ax.set_yscale("log")
        ax.set_xlabel("tensor size")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if not ax.lines:
            ax.text(
                0.5, 0.5, "no graph timings\n(CPU tier, no reference)", ha="center", va="center", transform=ax.transAxes
            )
    axes[0].set_ylabel("GB/s (bytes read + written)")
    title = fig.suptitle("Copy bandwidth: Triton kernel vs torch.copy_ (median of samples)")
    plot.caption(fig, yours=yours, refs=refs)
    handles = {line.get_label(): line for ax in axes for line in ax.lines}
    if handles:
        # one legend for both panels (the same sources), right of the axes: inside either panel it
        # hid the points at the largest sizes, where the graph-replay lines dip
        legend = fig.legend(handles.values(), handles.keys(), fontsize=6.5, loc="upper left")
        w0, (left, right) = fig.get_figwidth(), (fig.subplotpars.left, fig.subplotpars.right)
        wide = right * w0 + 0.1 + legend.get_window_extent().width / fig.dpi + 0.15
        fig.set_figwidth(wide)  # the axes keep their inches; the legend gets its own beside them
        fig.subplots_adjust(left=left * w0 / wide, right=right * w0 / wide)
        legend.set_bbox_to_anchor((fig.subplotpars.right + 0.1 / wide, fig.subplotpars.top))
        title.set_x((fig.subplotpars.left + fig.subplotpars.right) / 2)  # centred over the panels still
    return fig
