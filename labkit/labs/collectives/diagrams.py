"""Lab 02's diagrams: symmetric memory (each rank's buffer, signal pad and the peers' mappings) and
each algorithm's data movement (who reads or writes whose shard, phase by phase)."""

from __future__ import annotations

import textwrap


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
