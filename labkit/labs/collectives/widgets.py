"""Lab 02's panel: one all-reduce algorithm on any world size, beside its recorded timing.

Each panel's button calls a plain function that returns text (the ``*_report`` functions);
tests call the same functions and press the buttons."""

from __future__ import annotations

import ipywidgets as w

from labkit.workbench.widgets import run_button


def collective_report(algorithm: str, n: int, world_size: int, reference: list[dict], live_world: bool) -> str:
    """Lab 02: run one all-reduce algorithm on ``world_size`` ranks (GPUs, or emulated ranks on
    the CPU tier) on fresh inputs, and read the recorded latency of the nearest measured size."""
    import secrets

    from labkit.kernels.comm.ranks import run_ranks
    from labkit.labs.collectives import checks

    lines = []
    if live_world:
        res = run_ranks(
            checks.check_algorithms,
            world_size,
            n,
            "bfloat16",
            secrets.randbelow(2**20),
            1,
            [algorithm],
            timeout=300,
        )
        if res.ok:
            rows = [r for per in res.values for r in per]
            lines.append(
                f"{algorithm} on {world_size} ranks, {n:,} bf16 elements: "
                f"correct on {sum(r['correct'] for r in rows)} of {len(rows)} ranks, "
                f"pads back at zero on {sum(r['pads_zero'] for r in rows)} of {len(rows)}"
                + (
                    "; emulated ranks (CPU processes, kernels under the Triton interpreter)"
                    if res.backend == "gloo"
                    else ""
                )
            )
        else:
            lines.append(f"run failed:\n{res.summary()}")
    else:
        lines.append(f"{world_size} ranks is more than this machine runs here; nothing run")
    nbytes = 2 * n
    recs = [
        r
        for r in reference
        if r.get("impl") == f"labkit_{algorithm}"
        and r.get("op") == "all_reduce"
        and r.get("kind", "sweep") == "sweep"
        and r.get("us")
    ]
    if recs:
        near = min(recs, key=lambda r: (abs(r["world_size"] - world_size), abs(r["bytes"] - nbytes)))
        lines.append(
            f"RECORDED ({near['world_size']} GPUs, {near['bytes']:,} bytes): {near['us']:.1f} µs back to back, "
            f"{near.get('graph_us') or float('nan'):.1f} µs graph replay, busbw {near['busbw_GBps']:.0f} GB/s"
        )
    return "\n".join(lines)


def collective_explorer(reference: list[dict], max_world: int):
    """Pick an algorithm, a size and a world size; run it and see the recorded timing."""
    from labkit.labs.collectives import checks

    # the out-of-place algorithms, then the in-place forms (two_shot_in_place, two_shot_ce_in_place)
    algorithm = w.ToggleButtons(options=list(checks.ALL_REDUCE_FORMS), description="algorithm")
    size = w.SelectionSlider(options=[1 << k for k in range(8, 15)], value=1 << 12, description="elements")
    world = w.IntSlider(value=2, min=2, max=8, description="ranks")
    out = w.HTML()
    run = run_button(
        "Run",
        out,
        lambda: collective_report(algorithm.value, size.value, world.value, reference, world.value <= max_world),
    )
    return w.VBox([algorithm, w.HBox([size, world, run]), out])
