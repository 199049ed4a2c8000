"""Lab 03's panels: the stream race for any allocator and delay; the alignment of packed views.

Each panel's button calls a plain function that returns text (the ``*_report`` functions);
tests call the same functions and press the buttons."""

from __future__ import annotations

import ipywidgets as w

from labkit.workbench.widgets import run_button


def race_report(
    allocator: str, sleep_ms: float, trials: int, reference: list[dict], live: bool, numel: int = 1 << 22
) -> str:
    """Lab 03: the stream race for one allocator and delay, run live (1 GPU) or read from the
    recorded reference, labelled as such."""
    from labkit.labs.stream_races import plots as stream_plots
    from labkit.labs.stream_races import race as stream_race

    if live:
        recs = [stream_race.race_trial(allocator, numel=numel, sleep_ms=sleep_ms, trial=t) for t in range(trials)]
        source = "live, this machine"
    else:
        recs = [
            r
            for r in reference
            if r.get("kind") == "race" and r.get("allocator") == allocator and r.get("sleep_ms") == sleep_ms
        ]
        source = "RECORDED reference (this machine has no GPU)"
        if not recs:
            return f"no recorded race for {allocator} at {sleep_ms} ms"
    row = stream_plots.race_summary(recs)[0]
    return (
        f"[{source}]\nallocator {allocator}, side stream busy {sleep_ms:g} ms before writing\n"
        f"block handed out again while the side stream still had work: {row['reused']} of {row['trials']} trials\n"
        f"fresh tensor corrupted in {row['corrupted_trials']} of {row['trials']} trials "
        f"(mean {row['mean_corrupted_fraction']:.1%} of {row['numel']:,} elements)"
    )


def race_explorer(reference: list[dict], live: bool):
    """Pick an allocation style and a delay; run the race (GPU) or read its reference."""
    from labkit.labs.stream_races import race as stream_race

    allocator = w.ToggleButtons(options=list(stream_race.ALLOCATORS), description="allocator")
    delays = sorted({r["sleep_ms"] for r in reference if r.get("kind") == "race"}) or [0.0, 0.05, 0.5, 5.0, 25.0]
    delay = w.SelectionSlider(options=delays, value=delays[-1], description="delay (ms)")
    trials = w.IntSlider(value=5, min=1, max=20, description="trials", disabled=not live)
    out = w.HTML()
    run = run_button(
        "Run the race" if live else "Show recorded race",
        out,
        lambda: race_report(allocator.value, delay.value, trials.value, reference, live),
    )
    return w.VBox([allocator, w.HBox([delay, trials, run]), out])


def alignment_text(rows: int, cols: int, dtype_name: str, groups: int, pad: bool) -> str:
    """Lab 03: packed views of ``groups`` (rows x cols) buffers, as the fix allocates them: the
    alignment shape arithmetic promises, and what the pointers really are (any tier)."""
    import torch

    from labkit.kernels import alloc
    from labkit.workbench.tier import kernel_device

    dtype = getattr(torch, dtype_name)
    per = alloc.padded_numel((rows, cols), dtype) if pad else rows * cols
    bulk = alloc.allocate_views([(per,)] * groups, dtype, kernel_device())
    report = alloc.alignment_report([t[: rows * cols] for t in bulk.tensors])
    worst = min(r["aligned_to"] for r in report)
    lines = [
        f"{groups} views of ({rows}, {cols}) {dtype_name}, {'padded to 256 B' if pad else 'packed'}: "
        f"{rows * cols * dtype.itemsize:,} bytes each, {per * dtype.itemsize:,} reserved",
        f"shape arithmetic promises: {alloc.view_alignment((per,), dtype)}-byte alignment; "
        f"pointers measured: worst {worst} bytes",
        "view  ptr%16  ptr%128  ptr%256",
    ]
    lines += [f"{i:>4}  {r['mod_16']:>6}  {r['mod_128']:>7}  {r['mod_256']:>7}" for i, r in enumerate(report[:8])]
    if groups > 8:
        lines.append(f"... {groups - 8} more")
    return "\n".join(lines)


def alignment_explorer():
    """Change a weight shape and padding; see which views lose 16/128/256-byte alignment."""
    rows = w.BoundedIntText(value=4095, min=1, max=1 << 16, description="rows")
    cols = w.BoundedIntText(value=3, min=1, max=1 << 16, description="cols")
    dtype = w.Dropdown(options=["bfloat16", "float16", "float32"], value="bfloat16", description="dtype")
    groups = w.IntSlider(value=8, min=2, max=64, description="groups")
    pad = w.Checkbox(value=False, description="pad to 256 B")
    out = w.HTML()
    run = run_button(
        "Allocate",
        out,
        lambda: alignment_text(rows.value, cols.value, dtype.value, groups.value, pad.value),
        icon="play",
        busy=None,
    )
    return w.VBox([w.HBox([rows, cols, dtype]), w.HBox([groups, pad, run]), out])
