"""The grouped GEMM's persistent schedule, replayed in Python so it can be drawn.

``tile_schedule`` walks the experts exactly as ``labkit.kernels.grouped_gemm_kernels._grouped_mm_kernel``
does (each of P programs takes global tiles p, p + P, ...; expert e's tiles are numbered after
expert e-1's; within an expert, tile-rows in groups of GROUP_M), and returns who computes what.
Tests check that it covers every output element exactly once, deals tiles round-robin, and uses
the kernel's tile sizes (``labkit.kernels.grouped_gemm.forward_config``).
"""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle


@dataclasses.dataclass(frozen=True)
class Tile:
    program: int  # which persistent program computes it
    turn: int  # its position in that program's sequence (0 = first)
    expert: int
    tile_m: int  # tile-row within the expert
    tile_n: int  # tile-column
    row0: int  # first row of x / out it covers
    rows: int  # rows it covers (the expert's last tile may be partial)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tile_schedule(counts: list[int], N: int, block_m: int, block_n: int, programs: int, group_m: int = 8) -> list[Tile]:
    """Every output tile of a grouped GEMM over ``counts`` rows per expert, with its program."""
    for name, v in (("N", N), ("block_m", block_m), ("block_n", block_n), ("programs", programs), ("group_m", group_m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise ValueError(f"counts: expected non-negative ints, got {counts!r}")
    tiles_n = _cdiv(N, block_n)
    out, first, row0 = [], 0, 0
    for e, m in enumerate(counts):
        tiles_m = _cdiv(m, block_m)
        for local in range(tiles_m * tiles_n):
            per_group = group_m * tiles_n
            group_first = (local // per_group) * group_m
            group_rows = min(tiles_m - group_first, group_m)
            tile_m = group_first + (local % per_group) % group_rows
            tile_n = (local % per_group) // group_rows
            g = first + local
            start = row0 + tile_m * block_m
            out.append(Tile(g % programs, g // programs, e, tile_m, tile_n, start, min(block_m, row0 + m - start)))
        first += tiles_m * tiles_n
        row0 += m
    return out


def summary(tiles: list[Tile], programs: int, block_m: int) -> dict:
    """Load balance: tiles per program (busiest, mean) and the rows a partial tile leaves idle."""
    per = [0] * programs
    for t in tiles:
        per[t.program] += 1
    return {
        "tiles": len(tiles),
        "programs": programs,
        "busiest_program": max(per, default=0),
        "mean_per_program": len(tiles) / programs,
        "idle_row_fraction": sum(block_m - t.rows for t in tiles) / max(1, len(tiles) * block_m),
    }


def plot_schedule(
    counts: list[int],
    N: int,
    block_m: int,
    block_n: int,
    programs: int,
    ax=None,
    title: str | None = None,
    group_m: int = 8,
):
    """The output [M, N] as tiles, coloured by the program that computes them; expert borders
    drawn; the numbers in each tile are the program's turn (0 = its first tile)."""
    tiles = tile_schedule(counts, N, block_m, block_n, programs, group_m)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
    cmap = plt.get_cmap("tab20")
    M = sum(counts)
    for t in tiles:
        x0, w = t.tile_n * block_n, min(block_n, N - t.tile_n * block_n)
        ax.add_patch(Rectangle((x0, t.row0), w, t.rows, facecolor=cmap(t.program % 20), edgecolor="white", lw=0.5))
        if len(tiles) <= 120:
            ax.text(x0 + w / 2, t.row0 + t.rows / 2, str(t.turn), ha="center", va="center", fontsize=6)
    row = 0
    for e, m in enumerate(counts):
        ax.axhline(row, color="black", lw=0.8)
        ax.text(N * 1.01, row + m / 2, f"e{e}: {m}" if m else f"e{e}: 0", va="center", fontsize=6)
        row += m
    ax.set_xlim(0, N)
    ax.set_ylim(M, 0)
    ax.set_xlabel("output column (N)")
    ax.set_ylabel("output row (tokens, grouped by expert)")
    busiest = max((sum(1 for t in tiles if t.program == p) for p in range(programs)), default=0)
    ax.set_title(
        title or f"{len(tiles)} tiles over {programs} programs (colour = program; busiest does {busiest})", fontsize=9
    )
    return ax


__all__ = ["Tile", "plot_schedule", "summary", "tile_schedule"]
