"""ipywidgets panels that let a reader change an experiment without editing code.

Each panel's button calls a plain function that returns text (``crash_report``,
``copy_report``), shown in the panel; tests call the same functions and press the buttons."""
from __future__ import annotations

import html

import ipywidgets as w

from labkit import experiments, sandbox, workbench


def crash_report(experiment: str, timeout_s: float) -> str:
    """Run one of experiments.CRASH_EXPERIMENTS in a child process; say how it ended."""
    if experiment not in experiments.CRASH_EXPERIMENTS:
        raise ValueError(f"experiment: {experiment!r} is not one of {list(experiments.CRASH_EXPERIMENTS)}")
    res = sandbox.run_isolated(experiments.CRASH_EXPERIMENTS[experiment], timeout=timeout_s)
    lines = [f"{experiment}: {res.summary()}"]
    if res.stderr.strip():
        lines += ["last lines the child wrote to stderr:"] + res.stderr.strip().splitlines()[-6:]
    return "\n".join(lines)


def copy_report(nbytes: int, reps: int) -> str:
    """Check and time torch.copy_ against the Triton copy at one size; one line each."""
    recs = workbench.copy_sweep([nbytes], reps=reps, progress=False)
    return "\n".join(f"{r['impl']:<12} {r['us']:10.1f} us  (IQR {r['us_p25']:.1f}-{r['us_p75']:.1f})"
                     f"  {r['GBps']:8.1f} GB/s  x{r['ratio_vs_torch']:.2f} vs torch  [{r['method']}]"
                     for r in recs)


def _pre(text: str) -> str:
    return f"<pre style='font-size:12px'>{html.escape(text)}</pre>"


def crash_explorer(timeout_s: float = 60.0):
    """Pick an experiment, run it in a child process, see how its failure is classified."""
    pick = w.Dropdown(options=list(experiments.CRASH_EXPERIMENTS), description="experiment")
    timeout = w.FloatSlider(value=min(timeout_s, 10.0), min=1, max=max(timeout_s, 10.0), step=1,
                            description="timeout s")
    run = w.Button(description="Run in a child process", icon="play")
    out = w.HTML()

    def on_run(_=None):
        out.value = _pre("running ...")
        out.value = _pre(crash_report(pick.value, timeout.value))

    run.on_click(on_run)
    return w.VBox([w.HBox([pick, timeout, run]), out])


def copy_explorer(default_log2_bytes: int = 16, max_log2_bytes: int = 30):
    """Pick a size and sample count, time torch.copy_ against the Triton copy, see the ratio."""
    size = w.IntSlider(value=default_log2_bytes, min=12, max=max_log2_bytes, description="log2 bytes")
    reps = w.IntSlider(value=5, min=1, max=100, description="samples")
    run = w.Button(description="Measure", icon="clock-o")
    out = w.HTML()

    def on_run(_=None):
        out.value = _pre("measuring ...")
        out.value = _pre(copy_report(1 << size.value, reps.value))

    run.on_click(on_run)
    return w.VBox([w.HBox([size, reps, run]), out])


def matrix_cell_report(pattern: str, peer_access: bool, guarded: bool, reference: list[dict],
                       live: bool, nbytes: int = 64 << 20, timeout_s: float = 120.0) -> str:
    """One cell of the device-confusion matrix: run live in a child process (2 GPUs), else the
    recorded reference record, labelled as such."""
    from labkit import wrong_device

    if live:
        rec = wrong_device.device_matrix([pattern], nbytes=nbytes, timeout_s=timeout_s, guarded=(guarded,),
                                         peers=(peer_access,), progress=False)[0]
        source = "live, this machine"
    else:
        match = [r for r in reference if r.get("pattern") == pattern and r.get("peer_access") == peer_access
                 and r.get("guarded") == guarded]
        if not match:
            return f"no recorded reference for {pattern}, peer {peer_access}, guarded {guarded}"
        rec, source = match[0], "RECORDED reference (this machine has fewer than 2 GPUs)"
    gbps = f"{rec['GBps']:.0f} GB/s" if rec.get("GBps") else "did not run to the end"
    return (f"[{source}]\n{pattern}, peer access {'on' if peer_access else 'off'} "
            f"(enabled: {rec.get('peer_enabled')}), {'guarded' if guarded else 'unguarded'}\n"
            f"outcome: {rec['outcome']}  |  {gbps}\n{rec['detail']}")


def matrix_explorer(reference: list[dict], live: bool):
    """Pick a pattern, peer access and guard; run that cell (live) or read its reference."""
    from labkit import wrong_device

    pattern = w.Dropdown(options=list(wrong_device.PATTERNS), description="pattern")
    peer = w.ToggleButtons(options=[("peer off", False), ("peer on", True)], description="peer access")
    guarded = w.ToggleButtons(options=[("unguarded", False), ("guarded", True)], description="launch")
    run = w.Button(description="Run cell" if live else "Show recorded cell", icon="play")
    out = w.HTML()

    def on_run(_=None):
        out.value = _pre("running ...")
        out.value = _pre(matrix_cell_report(pattern.value, peer.value, guarded.value, reference, live))

    run.on_click(on_run)
    return w.VBox([w.HBox([pattern, run]), peer, guarded, out])


def sc_report(granularity: str, stoc_len: int, chunk_d: int, halve: bool, seed: int = 0) -> str:
    """sc_matmul at one setting on a small random product: exactness against the literal
    bitstreams, and the error against fp32 (the same numbers on the CPU and GPU tiers)."""
    import torch

    from labkit.sc import sc_counts, sc_matmul
    from labkit.tier import kernel_device

    g = torch.Generator().manual_seed(seed)
    three_d = granularity == "per_head"
    shape_a, shape_b = ((2, 4, 64), (2, 64, 8)) if three_d else ((4, 64), (64, 8))
    a = torch.randn(shape_a, generator=g).to(kernel_device())
    b = torch.randn(shape_b, generator=g).to(kernel_device())
    opts = dict(granularity=granularity, stoc_len=stoc_len, chunk_d=chunk_d, halve=halve)
    exact = torch.equal(sc_counts(a, b, **opts).cpu(), sc_counts(a, b, impl="reference", **opts).cpu())
    out, ref = sc_matmul(a, b, **opts), a @ b
    rel = ((out - ref).norm() / ref.norm()).item()
    return (f"{granularity}, stoc_len={stoc_len}, chunk_d={chunk_d}, halve={halve}: a {tuple(a.shape)} @ b "
            f"{tuple(b.shape)}\nkernel counts == literal bitstream counts: {exact}\n"
            f"relative error vs fp32 matmul: {rel:.4f}")


def sc_explorer():
    """Pick granularity, stream length, chunking and halve; check exactness and see the error."""
    from labkit.sc.matmul import GRANULARITIES

    gran = w.Dropdown(options=list(GRANULARITIES), value="per_row", description="granularity")
    length = w.SelectionSlider(options=[16, 32, 64, 128, 256, 512, 1024], value=256, description="stoc_len")
    chunk = w.Dropdown(options=[0, 16, 32], value=0, description="chunk_d")
    halve = w.Checkbox(value=False, description="halve")
    run = w.Button(description="Run", icon="play")
    out = w.HTML()

    def on_run(_=None):
        out.value = _pre("running ...")
        out.value = _pre(sc_report(gran.value, length.value, chunk.value, halve.value))

    run.on_click(on_run)
    return w.VBox([w.HBox([gran, length]), w.HBox([chunk, halve, run]), out])
