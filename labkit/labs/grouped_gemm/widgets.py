"""Lab 04's panel: pick the number of experts, the skew and the tokens; the token counts and the
persistent schedule redraw, and on a GPU one button times the grouped GEMM against the host-sync
loop at those counts.

The drawing and the text come from plain functions (``schedule_figure``, ``schedule_text``,
``timing_text``); tests call them and change the controls."""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from labkit.workbench.widgets import FigureView, pre, run_button

#: SMs of an H100/H200 SXM: the persistent grid the schedule is drawn for when no GPU is here
HOPPER_SMS = 132
#: the output width the panel draws (tiles of it), small enough to see
DRAW_N = 768


def _programs() -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return HOPPER_SMS


def schedule_figure(experts: int, skew: str, tokens: int, programs: int | None = None):
    """Tokens per expert (left) and who computes which output tile (right), Hopper tiles."""
    from labkit.kernels.grouped_gemm import hopper_config
    from labkit.labs.grouped_gemm import distributions, schedule

    counts = distributions.token_counts(experts, tokens, skew)
    cfg = hopper_config(tokens, experts)
    programs = programs or _programs()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.4]})
    left.bar(range(experts), counts, color="tab:blue", width=0.9)
    left.set_xlabel("expert")
    left.set_ylabel("tokens")
    zeros = sum(1 for c in counts if c == 0)
    left.set_title(f"{skew}: {tokens} tokens over {experts} experts ({zeros} with none)", fontsize=9)
    schedule.plot_schedule(counts, DRAW_N, cfg.block_m, cfg.block_n, programs, ax=right)
    fig.tight_layout()
    return fig


def schedule_text(experts: int, skew: str, tokens: int, programs: int | None = None) -> str:
    from labkit.kernels.grouped_gemm import hopper_config
    from labkit.labs.grouped_gemm import distributions, schedule

    counts = distributions.token_counts(experts, tokens, skew)
    cfg = hopper_config(tokens, experts)
    programs = programs or _programs()
    s = schedule.summary(
        schedule.tile_schedule(counts, DRAW_N, cfg.block_m, cfg.block_n, programs), programs, cfg.block_m
    )
    return (
        f"tiles {cfg.block_m}x{cfg.block_n} (N = {DRAW_N}); {s['tiles']} tiles over {programs} programs: "
        f"busiest program {s['busiest_program']} tiles, mean {s['mean_per_program']:.1f}; "
        f"{s['idle_row_fraction']:.0%} of tile rows idle (partial last tiles). "
        f"The host-sync loop would wait for the counts, then launch {sum(1 for c in counts if c)} GEMMs."
    )


def timing_text(experts: int, skew: str, tokens: int, K: int = 1024, N: int = 1024) -> str:
    """GPU: labkit's grouped GEMM vs the host-sync loop at these counts (CUDA events, paired)."""
    import torch

    from labkit.kernels.grouped_gemm import flops, grouped_mm
    from labkit.labs.grouped_gemm import baselines, distributions
    from labkit.workbench import bench

    counts = distributions.token_counts(experts, tokens, skew)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, K, device="cuda", dtype=torch.bfloat16, generator=g)
    wt = torch.randn(experts, K, N, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.tensor(counts, device="cuda")
    cmp = bench.compare(
        {"labkit": lambda: grouped_mm(x, wt, c), "host_sync_loop": lambda: baselines.host_sync_loop(x, wt, c)},
        baseline="host_sync_loop",
        device="cuda",
        warmup=3,
        reps=15,
        inner=5,
    )
    lines = [f"[live, this GPU] {experts} experts, {skew}, {tokens} tokens, K = {K}, N = {N}, bf16"]
    for name, t in cmp.timings.items():
        lines.append(f"{name:>15}: {t.median_us:8.1f} us  ({flops(tokens, N, K) / t.median_us / 1e6:6.1f} TFLOP/s)")
    lines.append(f"labkit / loop, paired median: {cmp.ratio('labkit'):.2f}x the loop's time")
    return "\n".join(lines)


def schedule_explorer(live: bool):
    """Experts, skew and tokens change the counts and redraw the schedule; on a GPU, time it."""
    experts = w.IntSlider(value=8, min=2, max=128, description="experts")
    skew = w.ToggleButtons(options=["uniform", "skewed"], value="skewed", description="tokens")
    tokens = w.SelectionSlider(options=[256, 1024, 4096, 8192, 16384], value=4096, description="total")
    figure = FigureView()
    text = w.HTML()

    def redraw(_=None):
        figure.show(schedule_figure(experts.value, skew.value, tokens.value))
        text.value = pre(schedule_text(experts.value, skew.value, tokens.value))

    for control in (experts, skew, tokens):
        control.observe(redraw, names="value")
    redraw()
    timing = w.HTML()
    rows = [w.HBox([experts, skew, tokens]), text, figure]
    if live:
        rows.append(
            w.HBox(
                [
                    run_button(
                        "Time it on this GPU", timing, lambda: timing_text(experts.value, skew.value, tokens.value)
                    ),
                    timing,
                ]
            )
        )
    else:
        rows.append(
            w.HTML(pre("timing needs a CUDA GPU (recorded timings, where a GPU run has made them, are in section 4)"))
        )
    return w.VBox(rows)
