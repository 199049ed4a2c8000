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


def race_report(allocator: str, sleep_ms: float, trials: int, reference: list[dict], live: bool,
                numel: int = 1 << 22) -> str:
    """Lab 03: the stream race for one allocator and delay, run live (1 GPU) or read from the
    recorded reference, labelled as such."""
    from labkit import stream_plots, stream_race

    if live:
        recs = [stream_race.race_trial(allocator, numel=numel, sleep_ms=sleep_ms, trial=t) for t in range(trials)]
        source = "live, this machine"
    else:
        recs = [r for r in reference if r.get("kind") == "race" and r.get("allocator") == allocator
                and r.get("sleep_ms") == sleep_ms]
        source = "RECORDED reference (this machine has no GPU)"
        if not recs:
            return f"no recorded race for {allocator} at {sleep_ms} ms"
    row = stream_plots.race_summary(recs)[0]
    return (f"[{source}]\nallocator {allocator}, side stream busy {sleep_ms:g} ms before writing\n"
            f"block handed out again while the side stream still had work: {row['reused']} of {row['trials']} trials\n"
            f"fresh tensor corrupted in {row['corrupted_trials']} of {row['trials']} trials "
            f"(mean {row['mean_corrupted_fraction']:.1%} of {row['numel']:,} elements)")


def race_explorer(reference: list[dict], live: bool):
    """Pick an allocation style and a delay; run the race (GPU) or read its reference."""
    from labkit import stream_race

    allocator = w.ToggleButtons(options=list(stream_race.ALLOCATORS), description="allocator")
    delays = sorted({r["sleep_ms"] for r in reference if r.get("kind") == "race"}) or [0.0, 0.05, 0.5, 5.0, 25.0]
    delay = w.SelectionSlider(options=delays, value=delays[-1], description="delay (ms)")
    trials = w.IntSlider(value=5, min=1, max=20, description="trials", disabled=not live)
    run = w.Button(description="Run the race" if live else "Show recorded race", icon="play")
    out = w.HTML()

    def on_run(_=None):
        out.value = _pre("running ...")
        out.value = _pre(race_report(allocator.value, delay.value, trials.value, reference, live))

    run.on_click(on_run)
    return w.VBox([allocator, w.HBox([delay, trials, run]), out])


def alignment_text(rows: int, cols: int, dtype_name: str, groups: int, pad: bool) -> str:
    """Lab 03: packed views of ``groups`` (rows x cols) buffers, as the fix allocates them: the
    alignment shape arithmetic promises, and what the pointers really are (any tier)."""
    import torch

    from labkit import alloc
    from labkit.tier import kernel_device

    dtype = getattr(torch, dtype_name)
    per = alloc.padded_numel((rows, cols), dtype) if pad else rows * cols
    bulk = alloc.allocate_views([(per,)] * groups, dtype, kernel_device())
    report = alloc.alignment_report([t[: rows * cols] for t in bulk.tensors])
    worst = min(r["aligned_to"] for r in report)
    lines = [f"{groups} views of ({rows}, {cols}) {dtype_name}, {'padded to 256 B' if pad else 'packed'}: "
             f"{rows * cols * dtype.itemsize:,} bytes each, {per * dtype.itemsize:,} reserved",
             f"shape arithmetic promises: {alloc.view_alignment((per,), dtype)}-byte alignment; "
             f"pointers measured: worst {worst} bytes",
             "view  ptr%16  ptr%128  ptr%256"]
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
    run = w.Button(description="Allocate", icon="play")
    out = w.HTML()

    def on_run(_=None):
        out.value = _pre(alignment_text(rows.value, cols.value, dtype.value, groups.value, pad.value))

    run.on_click(on_run)
    return w.VBox([w.HBox([rows, cols, dtype]), w.HBox([groups, pad, run]), out])


def collective_report(algorithm: str, n: int, world_size: int, reference: list[dict], live_world: bool) -> str:
    """Lab 02: run one all-reduce algorithm on ``world_size`` ranks (GPUs, or emulated ranks on
    the CPU tier) on fresh inputs, and read the recorded latency of the nearest measured size."""
    import secrets

    from labkit.dist import experiments
    from labkit.dist.ranks import run_ranks

    lines = []
    if live_world:
        res = run_ranks(experiments.check_algorithms, world_size, n, "bfloat16", secrets.randbelow(2**20), 1,
                        [algorithm], timeout=300)
        if res.ok:
            rows = [r for per in res.values for r in per]
            lines.append(f"{algorithm} on {world_size} ranks, {n:,} bf16 elements: "
                         f"correct on {sum(r['correct'] for r in rows)} of {len(rows)} ranks, "
                         f"pads back at zero on {sum(r['pads_zero'] for r in rows)} of {len(rows)}")
        else:
            lines.append(f"run failed:\n{res.summary()}")
    else:
        lines.append(f"{world_size} ranks is more than this machine runs here; nothing run")
    nbytes = 2 * n
    recs = [r for r in reference if r.get("impl") == f"labkit_{algorithm}" and r.get("op") == "all_reduce"
            and r.get("kind", "sweep") == "sweep" and r.get("us")]
    if recs:
        near = min(recs, key=lambda r: (abs(r["world_size"] - world_size), abs(r["bytes"] - nbytes)))
        lines.append(f"RECORDED ({near['world_size']} GPUs, {near['bytes']:,} bytes): {near['us']:.1f} µs back to back, "
                     f"{near.get('graph_us') or float('nan'):.1f} µs graph replay, busbw {near['busbw_GBps']:.0f} GB/s")
    return "\n".join(lines)


def collective_explorer(reference: list[dict], max_world: int):
    """Pick an algorithm, a size and a world size; run it and see the recorded timing."""
    from labkit.dist import experiments

    # the out-of-place algorithms, then the in-place forms (two_shot_in_place, two_shot_ce_in_place)
    algorithm = w.ToggleButtons(options=list(experiments.ALL_REDUCE_FORMS), description="algorithm")
    size = w.SelectionSlider(options=[1 << k for k in range(8, 15)], value=1 << 12, description="elements")
    world = w.IntSlider(value=2, min=2, max=8, description="ranks")
    run = w.Button(description="Run", icon="play")
    out = w.HTML()

    def on_run(_=None):
        out.value = _pre("running ...")
        out.value = _pre(collective_report(algorithm.value, size.value, world.value, reference,
                                           world.value <= max_world))

    run.on_click(on_run)
    return w.VBox([algorithm, w.HBox([size, world, run]), out])
