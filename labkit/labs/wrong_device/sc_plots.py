"""Pictures for the SC lab: two streams and their XNOR, the error of the count table, and the
kernel's speed beside a bf16 matmul (the reader's run beside the reference machines)."""
from __future__ import annotations

import numpy as np
import torch

from labkit.kernels.sc import encoding


def plot_streams(ax, q_a: int, q_b: int, sc_prec: int = 4, stoc_len: int = 64, a_seq: str = "bitrev",
                 b_seq: str = "counter_alt", halve: bool = False, k_parity: int = 0) -> dict:
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
    shown = {"v_a": q_a / Q, "v_b": q_b / Q, "exact": q_a * q_b / Q ** 2, "count": C,
             "decoded": (2 * C - stoc_len) / stoc_len}
    ax.set_title(f"v_a = {shown['v_a']:+.3f}, v_b = {shown['v_b']:+.3f}: exact product {shown['exact']:+.4f}, "
                 f"SC (2C - L)/L = {shown['decoded']:+.4f}", fontsize=9)
    return shown


def plot_table_error(ax, sc_prec: int = 8, stoc_len: int = 256, a_seq: str = "bitrev",
                     b_seq: str = "counter_alt", halve: bool = False, phase: int = 0):
    """Heat map of (SC product - exact product) over every (q_a, q_b) pair: what the table knows."""
    T = encoding.count_table(sc_prec, stoc_len, a_seq, b_seq, halve)[phase].double()
    Q = encoding.qmax(sc_prec)
    levels = torch.arange(-Q, Q + 1, dtype=torch.float64) / Q
    err = T / stoc_len - levels[:, None] * levels[None, :]
    lim = float(err.abs().max())
    im = ax.imshow(err.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, origin="lower",
                   extent=(-1, 1, -1, 1))
    ax.set_xlabel("v_b = q_b / Q")
    ax.set_ylabel("v_a = q_a / Q")
    ax.set_title(f"SC product error, {a_seq} x {b_seq} (phase {phase}), L = {stoc_len}\n"
                 f"mean {float(err.mean()):+.2e}, max |err| {lim:.3f}", fontsize=9)
    return im


def plot_speed(ax, sources: dict[str, list[dict]], method: str = "cuda_graph") -> None:
    """Bars of sc_matmul time / bf16 matmul time per (layer, M), one group of bars per source
    (``{"your run": records, "reference h200x2": records}``), log scale."""
    keys = sorted({(r["layer"], r["M"]) for recs in sources.values() for r in recs if r["impl"] == "sc_matmul"})
    width = 0.8 / max(1, len(sources))
    for i, (label, recs) in enumerate(sources.items()):
        ratios = []
        for layer, M in keys:
            match = [r for r in recs if r["impl"] == "sc_matmul" and (r["layer"], r["M"]) == (layer, M)
                     and r.get("method", method) == method]
            ratios.append(match[0]["ratio_vs_bf16"] if match else np.nan)
        xs = np.arange(len(keys)) + i * width
        ax.bar(xs, ratios, width, label=label)
        for x, v in zip(xs, ratios):
            if np.isfinite(v):
                ax.text(x, v, f"{v:.3g}x", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(keys)) + width * (len(sources) - 1) / 2, [f"{l}\nM={m}" for l, m in keys])
    ax.set_ylabel(f"sc_matmul time / bf16 matmul time ({method})")
    ax.axhline(1, color="0.5", lw=0.8)
    ax.legend(fontsize=8)
