"""``labkit bench broken_barriers``: lab 02's broken collectives given a stress that makes their
race happen.

The stress is a delay inside one rank's kernel, between the barrier and the peer reads that the
end barrier protects (``labkit.kernels.comm.signals.slow_down``: ``DELAY`` volatile loads on rank
``SLOW_RANK``, a constexpr that compiles to nothing at 0). Without the end barrier the fast rank
returns, its caller writes the next input into its symmetric buffer, and the slow rank, still
before its reads, sums the NEW input: a wrong result every time the delay outlasts the fast
rank's return and copy. Where the delay sits per kernel: one-shot and the in-place two-shots after
the start barrier; out-of-place two-shot after the middle barrier (before shot two's reads);
the tree after a child's "result ready" wait (before it copies from its parent).

Variants (``labkit.kernels.comm.collectives.VARIANTS``): ``correct``, ``relaxed`` (barrier
atomics relaxed), ``no_end_barrier``, and ``gpu_scope`` (release/acquire at gpu scope: the
ordering is promised within one GPU, too narrow for a peer GPU).

Profiles: ``gpu`` (2 GPUs with peer access; else one record per row saying skipped and why): the
kernels compiled, the delay in volatile-load round trips. ``cpu``: the emulated world (two
processes over shared memory, interpreted kernels, the host's x86-TSO memory model: every scope
behaves alike there), labelled ``world="emulated"``; the same in-kernel delay, where one load
costs an interpreter step (tens of microseconds), not a GPU round trip.

Records: ``algorithm, variant, stress, delay, trials, wrong_results`` (+ world, n, seconds, pads_zero).
"""
from __future__ import annotations

import time

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import plan as P
from labkit.kernels.comm import symm
from labkit.kernels.comm.ranks import run_ranks
from labkit.labs.collectives import experiments as lab02
from labkit.workbench import gates, tier
from labkit.workbench.errors import UsageError

REQUIRED = ("algorithm", "variant", "stress", "delay", "trials", "wrong_results", "world", "skipped")
VARIANTS = ("correct", "relaxed", "no_end_barrier", "gpu_scope")
#: the all-reduce forms measured (lab 02's ``ALL_REDUCE_FORMS``)
FORMS = lab02.ALL_REDUCE_FORMS
SLOW_RANK = 1
STRESS = "delay: DELAY volatile loads on rank 1 between the barrier and its peer reads (signals.slow_down)"
PROFILES = {
    # 4 forms x 4 variants x 4 delays = 64 rows, each two spawned ranks: about 5-10 s a row by
    # estimate (not measured), 6-11 minutes in all; the copy-engine forms are left out to fit
    "gpu": {"delays": (0, 100, 1000, 10000), "trials": 60, "n": 1 << 16, "dtype": "bfloat16",
            "forms": ("one_shot", "two_shot", "two_shot_in_place", "tree"), "variants": VARIANTS},
    "cpu": {"delays": (0, 400), "trials": 4, "n": 4096, "dtype": "float32",
            "forms": ("one_shot", "two_shot", "two_shot_in_place", "tree"), "variants": VARIANTS},
}


def _check(variant: str, form: str, delay: int) -> None:
    if variant not in VARIANTS:
        raise UsageError(f"variant: {variant!r} is not one of {list(VARIANTS)}")
    if form not in FORMS:
        raise UsageError(f"algorithm: {form!r} is not one of {list(FORMS)}")
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise UsageError(f"delay: expected an int >= 0 (volatile loads), got {delay!r}")


def delayed_plan(buf, out, form: str, variant: str, delay: int, slow_rank: int = SLOW_RANK) -> P.CollectivePlan:
    """Lab 02's all-reduce plan for ``form`` with ``DELAY``/``SLOW_RANK`` added to every kernel
    that takes them (the plan's own checks and choices; nothing of lab 02's public API changed)."""
    _check(variant, form, delay)
    target = buf.tensor if form.endswith("_in_place") else out
    pl = C.make_all_reduce_plan(buf, target, form.removesuffix("_in_place"), None, variant, None, keep=True, fast=False)
    if delay:
        for step in pl.steps:
            if isinstance(step, P.KernelLaunch) and "DELAY" in step.kernel.arg_names:
                step.kwargs = dict(step.kwargs, DELAY=delay, SLOW_RANK=slow_rank)
    return pl


def delayed_trials(ctx, variant: str, form: str = "one_shot", trials: int = 8, n: int = 4096,
                   dtype_name: str = "float32", delay: int = 0, seed: int = 0) -> dict:
    """``trials`` all-reduces back to back on new inputs (in place: each result copied out before
    the next input, as a caller would), rank ``SLOW_RANK`` delayed by ``delay`` inside the kernel.
    Returns how many results were wrong (against an fp64 sum of every rank's input)."""
    _check(variant, form, delay)
    dtype = getattr(torch, dtype_name)
    w = ctx.world_size
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir, workspace=form.endswith("ce_in_place"))
    inputs, everyone = [], []
    for t in range(trials):
        x, xs = lab02.rank_inputs(ctx, n, dtype, seed * 100_000 + t)
        inputs.append(x)
        everyone.append(xs)
    outs = [torch.empty(n, dtype=dtype, device=ctx.device) for _ in range(trials)]
    in_place = form.endswith("_in_place")
    pl = delayed_plan(buf, outs[0], form, variant, delay) if in_place else None
    on_gpu = ctx.device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    start = time.perf_counter()
    for t in range(trials):
        buf.tensor.copy_(inputs[t])  # the next input overwrites the buffer, in stream order
        if in_place:
            y = pl.launch()
            outs[t].copy_(y)
        else:
            delayed_plan(buf, outs[t], form, variant, delay).launch(outs[t])
    if on_gpu:
        torch.cuda.synchronize(ctx.device)
    seconds = time.perf_counter() - start
    wrong = [t for t in range(trials) if not lab02.close_to_sum(outs[t], everyone[t], dtype, w)]
    pads_zero = lab02.quiet_pads_zero(ctx, buf)
    return {"variant": variant, "algorithm": form, "delay": delay, "trials": trials, "n": n, "dtype": dtype_name,
            "rank": ctx.rank, "wrong": len(wrong), "wrong_trials": wrong, "seconds": seconds, "pads_zero": pads_zero}


def zero_delay_matches(ctx, n: int = 4096, seed: int = 3) -> tuple[bool, bool]:
    """On every rank: lab 02's all-reduce and the delayed plan at delay 0 on the same input.
    Returns (bit-identical results, correct against the fp64 sum)."""
    buf = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    x, xs = lab02.rank_inputs(ctx, n, torch.float32, seed)
    buf.tensor.copy_(x)
    a = C.all_reduce(buf, algorithm="one_shot").clone()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    buf.tensor.copy_(x)
    out = torch.empty_like(x)
    b = delayed_plan(buf, out, "one_shot", "correct", 0).launch(out)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    return bool(torch.equal(a, b)), lab02.close_to_sum(b, xs, torch.float32, ctx.world_size)


def measure(variant: str, form: str, delay: int, trials: int, n: int, dtype_name: str = "float32",
            timeout: float = 600.0) -> dict:
    """One row on two ranks (2 GPUs, or the emulated world under the interpreter): the record."""
    _check(variant, form, delay)
    world = "emulated" if tier.interpreted() else "gpus"
    start = time.perf_counter()
    res = run_ranks(delayed_trials, 2, variant, form, trials, n, dtype_name, delay, timeout=timeout)
    if not res.ok:
        return row(form, variant, delay, trials, world, skipped=f"run_ranks: {res.summary()}"[:300])
    parts = res.unwrap()
    wrong = len(set().union(*(p["wrong_trials"] for p in parts)))  # a trial is wrong if any rank's result is
    return row(form, variant, delay, trials, world, wrong_results=wrong,
               wrong_per_rank=[p["wrong"] for p in parts], n=n, dtype=dtype_name,
               pads_zero=all(p["pads_zero"] for p in parts), seconds=round(max(p["seconds"] for p in parts), 4),
               wall_s=round(time.perf_counter() - start, 2))


def row(form, variant, delay, trials, world, *, skipped=None, wrong_results=None, **extra) -> dict:
    return {"algorithm": form, "variant": variant, "stress": STRESS if delay else "none", "delay": delay,
            "slow_rank": SLOW_RANK, "trials": trials, "wrong_results": wrong_results, "world": world,
            "skipped": skipped, **extra}


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench broken_barriers``: every form x variant x delay."""
    p = PROFILES["gpu" if profile == "gpu" else "cpu"]
    grid = [(f, v, d) for f in p["forms"] for v in p["variants"] for d in p["delays"]]
    if profile == "gpu":
        gate = gates.requires(gpus=2, peer_access=True, compiled=True)
        if not gate.ok:
            return [row(f, v, d, p["trials"], "gpus", skipped=gate.reason) for f, v, d in grid]
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **_):
            return x
    return [measure(v, f, d, p["trials"], p["n"], p["dtype"]) for f, v, d in tqdm(grid, desc="broken barriers")]


def rates(records) -> list[dict]:
    """Per (algorithm, variant, delay): wrong results of trials summed over records (skipped rows kept
    with ``trials`` 0)."""
    table: dict = {}
    for r in records:
        k = (r["algorithm"], r["variant"], r["delay"])
        e = table.setdefault(k, {"algorithm": k[0], "variant": k[1], "delay": k[2], "trials": 0, "wrong": 0,
                                 "world": r.get("world"), "skipped": r.get("skipped")})
        if not r.get("skipped") and r.get("wrong_results") is not None:
            e["trials"] += r["trials"]
            e["wrong"] += r["wrong_results"]
            e["skipped"] = None
    return list(table.values())


def code_of(ptx: str) -> str:
    """The PTX's code alone: no debug sections, no ``.loc`` line records, no comments (they move
    whenever a source line does)."""
    ptx = ptx.split("\t.section\t.debug", 1)[0]
    lines = (ln.split("//", 1)[0].rstrip() for ln in ptx.splitlines())
    return "\n".join(ln for ln in lines if ln.strip() and not ln.strip().startswith((".loc", ".file")))


def delay_ptx(algorithms=None, delays=(0, 64), sems=(0, 2)) -> list[dict]:
    """Compiled for sm_90 without a GPU (call in a process with TRITON_INTERPRET=0, e.g.
    ``sandbox.run_isolated(..., env={"TRITON_INTERPRET": "0"})``): per kernel, delay and barrier
    semantics, a hash of the PTX, its volatile loads and its barrier atomics. DELAY=0 must have no
    volatile load (the delay compiled away); SEM 2 (gpu_scope) atomics at .gpu scope."""
    import hashlib

    from labkit.labs.collectives import ptx as lab02_ptx

    out = []
    for a in algorithms or lab02_ptx.SIGNATURES:
        for d in delays:
            for sem in sems:
                text = lab02_ptx.compile_collective(a, world=2, sem=sem, delay=d).asm["ptx"]
                atomics = sorted({ln.split()[1] if ln.startswith("@") else ln.split()[0]
                                  for ln in (raw.strip() for raw in text.splitlines()) if "atom." in ln})
                out.append({"algorithm": a, "delay": d, "sem": sem, "sha1": hashlib.sha1(code_of(text).encode()).hexdigest(),
                            "volatile_loads": text.count("ld.volatile"), "atomics": atomics})
    return out
