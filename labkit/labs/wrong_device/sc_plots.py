"""Pictures for the SC lab: two streams and their XNOR, the error of the count table, and the
kernel's speed beside a bf16 matmul (the reader's run beside the reference machines)."""

from __future__ import annotations

import numpy as np
import torch

from labkit.kernels.sc import encoding


def plot_streams(
    ax,
    q_a: int,
    q_b: int,
    sc_prec: int = 4,
    stoc_len: int = 64,
    a_seq: str = "bitrev",
    b_seq: str = "counter_alt",
    halve: bool = False,
    k_parity: int = 0,
) -> dict:
    """Draw a's stream, b's stream and their XNOR as rows of bits; return the numbers shown."""
    Q = encoding.qmax(sc_prec)
    for name, q in (("q_a", q_a), ("q_b", q_b)):
        if not -Q <= q <= Q:
            raise ValueError(f"{name}: expected a value in [-{Q}, {Q}] for sc_prec={sc_prec}, got {q}")
    sa = encoding.bitstreams(torch.tensor(q_a), sc_prec, stoc_len, a_seq, halve, k_parity)
    sb = encoding.bitstreams(torch.tensor(q_b), sc_prec, stoc_len, b_seq, halve, k_parity)
    xnor = sa == sb
    C = int(xnor.sum())
    rows = np.stack([sa.numpy(), sb.numpy(), xnor.numpy()]).astype(float)
    ax.imshow(rows, cmap="Greys", aspect="auto", interpolation="nearest", vmin=0, vmax=1)
    ax.set_yticks([0, 1, 2], [f"a ({a_seq})", f"b ({b_seq})", "XNOR"])
    ax.set_xlabel(f"bit t (L = {stoc_len})")
    shown = {
        "v_a": q_a / Q,
        "v_b": q_b / Q,
        "exact": q_a * q_b / Q**2,
        "count": C,
        "decoded": (2 * C - stoc_len) / stoc_len,
    }
    ax.set_title(
        f"v_a = {shown['v_a']:+.3f}, v_b = {shown['v_b']:+.3f}: exact product {shown['exact']:+.4f}, "
        f"SC (2C - L)/L = {shown['decoded']:+.4f}",
        fontsize=9,
    )
    return shown


def plot_table_error(
    ax,
    sc_prec: int = 8,
    stoc_len: int = 256,
    a_seq: str = "bitrev",
    b_seq: str = "counter_alt",
    halve: bool = False,
    phase: int = 0,
):
    """Heat map of (SC product - exact product) over every (q_a, q_b) pair: what the table knows."""
    T = encoding.count_table(sc_prec, stoc_len, a_seq, b_seq, halve)[phase].double()
    Q = encoding.qmax(sc_prec)
    levels = torch.arange(-Q, Q + 1, dtype=torch.float64) / Q
    err = T / stoc_len - levels[:, None] * levels[None, :]
    lim = float(err.abs().max())
    im = ax.imshow(err.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, origin="lower", extent=(-1, 1, -1, 1))
    ax.set_xlabel("v_b = q_b / Q")
    ax.set_ylabel("v_a = q_a / Q")
    ax.set_title(
        f"SC product error, {a_seq} x {b_seq} (phase {phase}), L = {stoc_len}\n"
        f"mean {float(err.mean()):+.2e}, max |err| {lim:.3f}",
        fontsize=9,
    )
    return im


def table_error_figure(cases=(("counter", 0), ("counter_alt", 0), ("counter_alt", 1)), **options):
    """One heat map of ``plot_table_error`` per (b_seq, phase) in a row, sharing one colour bar;
    constrained layout keeps titles, axis labels and the colour bar apart. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.6 * len(cases) + 1.2, 4.6), layout="constrained", squeeze=False)
    ims = [plot_table_error(ax, b_seq=b_seq, phase=phase, **options) for ax, (b_seq, phase) in zip(axes[0], cases)]
    lim = max(abs(v) for im in ims for v in im.get_clim())
    for im in ims:  # one scale for every panel, so that one colour bar reads them all
        im.set_clim(-lim, lim)
    for ax in axes[0][1:]:
        ax.set_ylabel("")
    fig.colorbar(ims[-1], ax=list(axes[0]), shrink=0.85, label="SC product - exact product")
    return fig


def hbm_floor_us(K: int, N: int, GBps: float) -> float:
    """Lower bound on the SC kernel's time for one [K, N] weight: its int8 bytes (K * N) read once
    at ``GBps`` (activations, scales and output left out, so the true floor is a little higher)."""
    return K * N / (GBps * 1e3)


def plot_speed(
    ax,
    sources: dict[str, list[dict]],
    method: str = "cuda_graph",
    bandwidths: dict[str, tuple[float, str]] | None = None,
) -> None:
    """Bars of sc_matmul time / bf16 matmul time per (layer, M), one group of bars per source
    (``{"your run": records, "reference h200x2": records}``), log scale.

    bandwidths: {source label: (GB/s, where it was measured)}: for those sources a black tick over
    each bar marks the SC kernel's HBM floor (``hbm_floor_us``) over the same source's bf16 time,
    the ratio the kernel would reach if it only streamed its weight at that bandwidth."""
    keys = sorted({(r["layer"], r["M"]) for recs in sources.values() for r in recs if r["impl"] == "sc_matmul"})
    width = 0.8 / max(1, len(sources))
    floor_labelled, tallest = False, 1.0
    for i, (label, recs) in enumerate(sources.items()):
        ratios, floors = [], []
        for layer, M in keys:
            match = [
                r
                for r in recs
                if r["impl"] == "sc_matmul" and (r["layer"], r["M"]) == (layer, M) and r.get("method", method) == method
            ]
            bf16 = [
                r
                for r in recs
                if r["impl"] == "bf16 matmul"
                and (r["layer"], r["M"]) == (layer, M)
                and r.get("method", method) == method
            ]
            ratios.append(match[0]["ratio_vs_bf16"] if match else np.nan)
            bw = (bandwidths or {}).get(label)
            floors.append(
                hbm_floor_us(match[0]["K"], match[0]["N"], bw[0]) / bf16[0]["us"] if (bw and match and bf16) else np.nan
            )
        xs = np.arange(len(keys)) + i * width
        tallest = max([tallest] + [v for v in ratios if np.isfinite(v)])
        ax.bar(xs, ratios, width, label=label)
        for x, v in zip(xs, ratios):
            if np.isfinite(v):
                ax.text(x, v, f"{v:.3g}x", ha="center", va="bottom", fontsize=7)
        for x, f in zip(xs, floors):
            if np.isfinite(f):
                bw_text = f"{bandwidths[label][0]:.0f} GB/s, {bandwidths[label][1]}"
                ax.hlines(
                    f,
                    x - width * 0.45,
                    x + width * 0.45,
                    colors="k",
                    lw=2,
                    label=None if floor_labelled else f"SC HBM floor: int8 weight bytes / {bw_text}, over bf16 time",
                )
                floor_labelled = True
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(keys)) + width * (len(sources) - 1) / 2, [f"{layer}\nM={m}" for layer, m in keys])
    ax.set_ylabel(f"sc_matmul time / bf16 matmul time ({method})")
    ax.axhline(1, color="0.5", lw=0.8)
    ax.set_ylim(top=tallest * 30)  # headroom on the log axis: the legend sits above the bars
    ax.legend(fontsize=7, loc="upper left")


def plot_decode(model_panels, stamp: dict | None = None):
    """ms per token of batch-1 greedy decode per configuration, one bar series per source (your
    run, each recorded machine), whiskers p25-p75 where recorded; laid out above the caption so
    that the two-line axis label and the configurations' tick labels are not cut."""
    import matplotlib.pyplot as plt

    from labkit.workbench import plot

    fig, ax = plt.subplots(figsize=(9, 4.6))
    width = 0.8 / len(model_panels)
    configs = [r["config"] for r in model_panels[0].records]
    for i, p in enumerate(model_panels):
        row = {r["config"]: r for r in p.records}
        ms = [row[c]["ms_per_token"] if c in row else float("nan") for c in configs]
        # whiskers: the quartiles of the timed tokens, where the run recorded them
        low = [ms[j] - row[c].get("ms_per_token_p25", ms[j]) if c in row else 0 for j, c in enumerate(configs)]
        high = [row[c].get("ms_per_token_p75", ms[j]) - ms[j] if c in row else 0 for j, c in enumerate(configs)]
        ax.bar([j + i * width for j in range(len(configs))], ms, width, yerr=[low, high], capsize=3, label=p.title)
    ax.set_xticks(
        [j + width * (len(model_panels) - 1) / 2 for j in range(len(configs))],
        [c.replace(", ", ",\n") for c in configs],
        fontsize=7,
    )
    ax.set_ylabel("ms per token\n(batch 1 greedy decode; median, whiskers p25-p75)", fontsize=9)
    ax.set_title("Llama-3.1-8B-shaped layers on 2 GPUs: bf16 vs SC linears", fontsize=10)
    ax.legend(fontsize=8)
    text = plot.caption(fig, stamp, {p.machine: p.result_set for p in model_panels if not p.live}, adjust=False)
    fig.tight_layout(rect=(0, (0.1 + 0.14 * len(text.splitlines())) / fig.get_figheight(), 1, 1))
    return fig
