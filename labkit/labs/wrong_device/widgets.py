"""Lab 01's panels: one cell of the device-confusion matrix; the SC matmul at any setting.

Each panel's button calls a plain function that returns text (the ``*_report`` functions);
tests call the same functions and press the buttons."""

from __future__ import annotations

import ipywidgets as w

from labkit.workbench.widgets import run_button


def matrix_cell_report(
    pattern: str,
    peer_access: bool,
    guarded: bool,
    reference: list[dict],
    live: bool,
    nbytes: int = 64 << 20,
    timeout_s: float = 120.0,
) -> str:
    """One cell of the device-confusion matrix: run live in a child process (2 GPUs), else the
    recorded reference record, labelled as such."""
    from labkit.labs.wrong_device import experiments as wrong_device

    if live:
        rec = wrong_device.device_matrix(
            [pattern], nbytes=nbytes, timeout_s=timeout_s, guarded=(guarded,), peers=(peer_access,), progress=False
        )[0]
        source = "live, this machine"
    else:
        match = [
            r
            for r in reference
            if r.get("pattern") == pattern and r.get("peer_access") == peer_access and r.get("guarded") == guarded
        ]
        if not match:
            return f"no recorded reference for {pattern}, peer {peer_access}, guarded {guarded}"
        rec, source = match[0], "RECORDED reference (this machine has fewer than 2 GPUs)"
    gbps = (
        f"{rec['GBps']:.0f} GB/s ({'kernel, CUDA events' if rec.get('timing') == 'cuda_events' else 'host clock'})"
        if rec.get("GBps")
        else "did not run to the end"
    )
    return (
        f"[{source}]\n{pattern}, peer access {'on' if peer_access else 'off'} "
        f"(enabled: {rec.get('peer_enabled')}), {'guarded' if guarded else 'unguarded'}\n"
        f"outcome: {rec['outcome']}  |  {gbps}\n{rec['detail']}"
    )


def matrix_explorer(reference: list[dict], live: bool):
    """Pick a pattern, peer access and guard; run that cell (live) or read its reference."""
    from labkit.labs.wrong_device import experiments as wrong_device

    pattern = w.Dropdown(options=list(wrong_device.PATTERNS), description="pattern")
    peer = w.ToggleButtons(options=[("peer off", False), ("peer on", True)], description="peer access")
    guarded = w.ToggleButtons(options=[("unguarded", False), ("guarded", True)], description="launch")
    out = w.HTML()
    run = run_button(
        "Run cell" if live else "Show recorded cell",
        out,
        lambda: matrix_cell_report(pattern.value, peer.value, guarded.value, reference, live),
    )
    return w.VBox([w.HBox([pattern, run]), peer, guarded, out])


def sc_report(granularity: str, stoc_len: int, chunk_d: int, halve: bool, seed: int = 0) -> str:
    """sc_matmul at one setting on a small random product: exactness against the literal
    bitstreams, and the error against fp32 (the same numbers on the CPU and GPU tiers)."""
    import torch

    from labkit.kernels.sc import sc_counts, sc_matmul
    from labkit.workbench.tier import kernel_device

    g = torch.Generator().manual_seed(seed)
    three_d = granularity == "per_head"
    shape_a, shape_b = ((2, 4, 64), (2, 64, 8)) if three_d else ((4, 64), (64, 8))
    a = torch.randn(shape_a, generator=g).to(kernel_device())
    b = torch.randn(shape_b, generator=g).to(kernel_device())
    opts = dict(granularity=granularity, stoc_len=stoc_len, chunk_d=chunk_d, halve=halve)
    exact = torch.equal(sc_counts(a, b, **opts).cpu(), sc_counts(a, b, impl="reference", **opts).cpu())
    out, ref = sc_matmul(a, b, **opts), a @ b
    rel = ((out - ref).norm() / ref.norm()).item()
    return (
        f"{granularity}, stoc_len={stoc_len}, chunk_d={chunk_d}, halve={halve}: a {tuple(a.shape)} @ b "
        f"{tuple(b.shape)}\nkernel counts == literal bitstream counts: {exact}\n"
        f"relative error vs fp32 matmul: {rel:.4f}"
    )


def sc_explorer():
    """Pick granularity, stream length, chunking and halve; check exactness and see the error."""
    from labkit.kernels.sc.matmul import GRANULARITIES

    gran = w.Dropdown(options=list(GRANULARITIES), value="per_row", description="granularity")
    length = w.SelectionSlider(options=[16, 32, 64, 128, 256, 512, 1024], value=256, description="stoc_len")
    chunk = w.Dropdown(options=[0, 16, 32], value=0, description="chunk_d")
    halve = w.Checkbox(value=False, description="halve")
    out = w.HTML()
    run = run_button("Run", out, lambda: sc_report(gran.value, length.value, chunk.value, halve.value))
    return w.VBox([w.HBox([gran, length]), w.HBox([chunk, halve, run]), out])
