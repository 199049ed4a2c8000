"""``labkit bench memory_model_broken_barriers``: lab 02's broken collectives given a stress that makes their
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

Records: ``algorithm, variant, stress, delay, trials, wrong_results`` (+ world, n, seconds, pads_zero),
one per (form, variant, delay).

Spawns. Starting two rank processes (a fresh interpreter each, torch imported, CUDA set up) is,
by estimate, most of a row's cost, so one ``run_ranks`` call per (form, variant) runs every delay
of the profile in that same pair of processes (``delayed_sweep``, through ``measure_delays``): 16
spawns in either profile (64 rows in ``gpu``, 32 in ``cpu``), where one spawn a row took 64 in
``gpu``. A spawn that fails (a crash, a hang killed at its timeout) costs the rows of its own
(form, variant) only, each recorded as skipped with ``run_ranks``'s reason; the other spawns' rows
are kept. In a record, ``seconds`` is that delay's own trials (the slowest rank's; the first
trial includes compiling that delay's kernels), ``setup_s`` its buffer, inputs and first barrier,
``check_s`` the slowest rank's fp64 check and pad check (split as ``compare_s``, the comparisons, and ``pads_s``,
the pads between two host barriers, which waits for the slower rank's trials), and ``wall_s``
the wall time of its whole spawn divided evenly over the spawn's delays (process start included,
so not the delay's own cost; ``measure``, one delay, gives its spawn's whole wall time).

Budget. ``benchmark`` starts no new spawn once ``LABKIT_BARRIERS_BUDGET_S`` seconds (default
``BUDGET_S`` = 480) have passed since it began; the rows left are recorded with
``skipped="not started: the budget of N s ran out"``. A spawn's own timeout is cut so that it ends
by the budget plus ``GRACE_S`` (90 s) at the latest: 570 s after ``benchmark`` began, by default,
under the GPU machines' 10 minutes a command (the command's own start-up and the writing of the
results file come on top).

Resume. All 64 GPU rows take longer than one such command, so a later call given the earlier
file (``LABKIT_BARRIERS_RESUME=path/to/memory_model_broken_barriers.json``) keeps the rows of every (form,
variant) whose delays all ran there, each marked with the commit that measured it
(``resumed_from``), and spawns only for the others.
"""

from __future__ import annotations

import os
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
#: seconds after which ``benchmark`` starts no new spawn (environment ``LABKIT_BARRIERS_BUDGET_S``)
BUDGET_S = 480.0
#: seconds a spawn started within the budget may run past it before it is killed
GRACE_S = 90.0
#: the longest a spawn may run (``measure``'s and ``measure_delays``'s default timeout)
SPAWN_TIMEOUT_S = 600.0
BUDGET_ENV = "LABKIT_BARRIERS_BUDGET_S"
RESUME_ENV = "LABKIT_BARRIERS_RESUME"
PROFILES = {
    # 4 forms x 4 variants x 4 delays = 64 rows in 16 spawns of two ranks (one per form and
    # variant, every delay in it). A spawn's wall time is the sum of its rows' ``wall_s``, of which
    # the trials take ``seconds`` and the host checks ``check_s`` (reference/h200x2/ and
    # reference/h100x2/memory_model_broken_barriers.json): with the cores shared out among the ranks
    # (run_ranks) the 64 rows fit one call. The copy-engine form is not among them: by those
    # times it would fit too, but no GPU run has recorded it.
    "gpu": {
        "delays": (0, 100, 1000, 10000),
        "trials": 60,
        "n": 1 << 16,
        "dtype": "bfloat16",
        "forms": ("one_shot", "two_shot", "two_shot_in_place", "tree"),
        "variants": VARIANTS,
    },
    "cpu": {
        "delays": (0, 400),
        "trials": 4,
        "n": 4096,
        "dtype": "float32",
        "forms": ("one_shot", "two_shot", "two_shot_in_place", "tree"),
        "variants": VARIANTS,
    },
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


def delayed_trials(
    ctx,
    variant: str,
    form: str = "one_shot",
    trials: int = 8,
    n: int = 4096,
    dtype_name: str = "float32",
    delay: int = 0,
    seed: int = 0,
) -> dict:
    """``trials`` all-reduces back to back on new inputs (in place: each result copied out before
    the next input, as a caller would), rank ``SLOW_RANK`` delayed by ``delay`` inside the kernel.
    Returns how many results were wrong (against an fp64 sum of every rank's input)."""
    _check(variant, form, delay)
    began = time.perf_counter()
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
    # made before the clock starts: the first plan of a set of arguments on a buffer is agreed
    # across ranks (an exchange); the per-trial plans below reuse that agreement
    pl = delayed_plan(buf, outs[0], form, variant, delay)
    on_gpu = ctx.device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    start = time.perf_counter()
    setup_s = start - began  # the symmetric buffer, the inputs and the first barrier
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
    compare_s = time.perf_counter() - start - seconds  # the fp64 comparisons of every trial
    pads_zero = lab02.quiet_pads_zero(ctx, buf)
    check_s = time.perf_counter() - start - seconds  # that, and the pads between two barriers
    return {
        "variant": variant,
        "algorithm": form,
        "delay": delay,
        "trials": trials,
        "n": n,
        "dtype": dtype_name,
        "rank": ctx.rank,
        "wrong": len(wrong),
        "wrong_trials": wrong,
        "seconds": seconds,
        "pads_zero": pads_zero,
        "setup_s": setup_s,
        "check_s": check_s,
        "compare_s": compare_s,
        "pads_s": check_s - compare_s,
    }


def delayed_sweep(
    ctx, variant: str, form: str, delays, trials: int = 8, n: int = 4096, dtype_name: str = "float32", seed: int = 0
) -> list[dict]:
    """``delayed_trials`` for every delay of ``delays`` in turn, in this one pair of processes (each
    delay on a buffer of its own and the same inputs); returns the per-delay dicts, in order."""
    return [delayed_trials(ctx, variant, form, trials, n, dtype_name, delay, seed) for delay in delays]


def variants_sweep(
    ctx, variants, form: str, delays, trials: int = 8, n: int = 4096, dtype_name: str = "float32", seed: int = 0
) -> list[list[dict]]:
    """``delayed_sweep`` for every variant of ``variants`` in turn, in this one pair of processes;
    returns, per variant in order, its per-delay dicts."""
    return [delayed_sweep(ctx, v, form, delays, trials, n, dtype_name, seed) for v in variants]


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


def _check_delays(variant: str, form: str, delays) -> tuple[int, ...]:
    if isinstance(delays, (int, str)) or not hasattr(delays, "__iter__"):
        raise UsageError(f"delays: expected a sequence of ints >= 0 (volatile loads), got {delays!r}")
    delays = tuple(delays)
    if not delays:
        raise UsageError("delays: expected at least one delay, got none")
    for delay in delays:
        _check(variant, form, delay)
    return delays


def measure_delays(
    variant: str, form: str, delays, trials: int, n: int, dtype_name: str = "float32", timeout: float = SPAWN_TIMEOUT_S
) -> list[dict]:
    """Every delay of ``delays`` for one form and variant in ONE spawn of two ranks (2 GPUs, or the
    emulated world under the interpreter): one record per delay, in order. If the spawn fails, every
    one of its rows is recorded as skipped with the reason. ``wall_s``: the spawn's wall time
    divided evenly over its delays; ``seconds``: the delay's own trials, the slowest rank's."""
    delays = _check_delays(variant, form, delays)
    world = "emulated" if tier.interpreted() else "gpus"
    start = time.perf_counter()
    res = run_ranks(delayed_sweep, 2, variant, form, delays, trials, n, dtype_name, timeout=timeout)
    wall = time.perf_counter() - start
    if not res.ok:
        reason = f"run_ranks: {res.summary()}"[:300]
        return [row(form, variant, d, trials, world, skipped=reason) for d in delays]
    return _delay_rows(variant, form, delays, trials, n, dtype_name, world, res.unwrap(), wall / len(delays))


def measure_variants(
    variants, form: str, delays, trials: int, n: int, dtype_name: str = "float32", timeout: float = SPAWN_TIMEOUT_S
) -> list[dict]:
    """``measure_delays`` for every variant of ``variants``, all in ONE spawn of two ranks (one
    start of the ranks, not one per variant): the records of each variant in turn, as
    ``measure_delays`` gives them (``wall_s``: the spawn's wall time divided evenly over every
    row). If that spawn fails (a hang, a crash), says so and measures each variant in a spawn of
    its own, so the failure is pinned to its variant."""
    if isinstance(variants, str) or not variants:
        raise UsageError(f"variants: expected a non-empty list of variant names, got {variants!r}")
    variants = list(variants)
    for v in variants:
        _check_delays(v, form, delays)
    delays = tuple(delays)
    if len(variants) == 1:
        return measure_delays(variants[0], form, delays, trials, n, dtype_name, timeout=timeout)
    world = "emulated" if tier.interpreted() else "gpus"
    start = time.perf_counter()
    res = run_ranks(variants_sweep, 2, variants, form, delays, trials, n, dtype_name, timeout=timeout)
    wall = time.perf_counter() - start
    if not res.ok:
        print(
            f"the spawn running variants {variants} failed ({res.summary().splitlines()[0]}): "
            "measuring each variant in a spawn of its own"
        )
        return [r for v in variants for r in measure_delays(v, form, delays, trials, n, dtype_name, timeout=timeout)]
    per_rank = res.unwrap()  # per rank: per variant, one dict per delay
    each = wall / (len(variants) * len(delays))
    return [
        r
        for k, v in enumerate(variants)
        for r in _delay_rows(v, form, delays, trials, n, dtype_name, world, [rank[k] for rank in per_rank], each)
    ]


def _delay_rows(variant, form, delays, trials, n, dtype_name, world, per_rank, wall_each) -> list[dict]:
    """The records of one variant's delays from what its ranks returned (per rank, one dict per delay)."""
    out = []
    for i, delay in enumerate(delays):
        parts = [rank_rows[i] for rank_rows in per_rank]
        slowest = max(parts, key=lambda p: p["check_s"])
        wrong = len(set().union(*(p["wrong_trials"] for p in parts)))  # a trial is wrong if any rank's result is
        out.append(
            row(
                form,
                variant,
                delay,
                trials,
                world,
                wrong_results=wrong,
                wrong_per_rank=[p["wrong"] for p in parts],
                n=n,
                dtype=dtype_name,
                pads_zero=all(p["pads_zero"] for p in parts),
                seconds=round(max(p["seconds"] for p in parts), 4),
                setup_s=round(max(p["setup_s"] for p in parts), 3),
                # the slowest rank's check and how it splits (maxima taken apart could come from
                # different ranks and add up to more than any rank spent)
                check_s=round(slowest["check_s"], 3),
                compare_s=round(slowest["compare_s"], 3),
                pads_s=round(slowest["pads_s"], 3),
                wall_s=round(wall_each, 2),
            )
        )
    return out


def measure(
    variant: str,
    form: str,
    delay: int,
    trials: int,
    n: int,
    dtype_name: str = "float32",
    timeout: float = SPAWN_TIMEOUT_S,
) -> dict:
    """One row on two ranks (2 GPUs, or the emulated world under the interpreter): the record
    (a spawn of its own; ``wall_s`` is that spawn's wall time)."""
    _check(variant, form, delay)
    return measure_delays(variant, form, (delay,), trials, n, dtype_name, timeout=timeout)[0]


def row(form, variant, delay, trials, world, *, skipped=None, wrong_results=None, **extra) -> dict:
    return {
        "algorithm": form,
        "variant": variant,
        "stress": STRESS if delay else "none",
        "delay": delay,
        "slow_rank": SLOW_RANK,
        "trials": trials,
        "wrong_results": wrong_results,
        "world": world,
        "skipped": skipped,
        **extra,
    }


def budget_s() -> float:
    """``LABKIT_BARRIERS_BUDGET_S`` if set, else ``BUDGET_S``."""
    raw = os.environ.get(BUDGET_ENV)
    if raw is None or not raw.strip():
        return BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise UsageError(f"{BUDGET_ENV}: expected seconds >= 0, got {raw!r}")
    return value


def not_started(budget: float) -> str:
    return f"not started: the budget of {budget:g} s ran out"


def load_resume(path) -> dict:
    """The rows of an earlier results file that ran (not skipped), by (algorithm, variant, delay),
    each marked ``resumed_from`` with the commit that measured it (``results.resumable``). {} for
    no path or a missing file."""
    from labkit.workbench import results

    return {(r["algorithm"], r["variant"], r["delay"]): r for r in results.resumable(path)}


#: the clock of the budget (a test replaces it)
_clock = time.monotonic


def benchmark(
    profile: str, *, budget: float | None = None, progress: bool = True, resume: dict | None = None
) -> list[dict]:
    """Entry point of ``labkit bench memory_model_broken_barriers``: every form x variant x delay, one spawn per
    (form, variant) while the budget lasts (``budget`` seconds, default ``budget_s()``). ``resume``
    (default: ``load_resume`` of ``LABKIT_BARRIERS_RESUME``): rows already measured; a (form,
    variant) whose every delay is among them is kept, not run again."""
    started = _clock()
    p = PROFILES["gpu" if profile == "gpu" else "cpu"]
    pairs = [(f, v) for f in p["forms"] for v in p["variants"]]
    if profile == "gpu":
        gate = gates.requires(gpus=2, peer_access=True, compiled=True)
        if not gate.ok:
            return [row(f, v, d, p["trials"], "gpus", skipped=gate.reason) for f, v in pairs for d in p["delays"]]
    budget = budget_s() if budget is None else float(budget)
    resume = load_resume(os.environ.get(RESUME_ENV)) if resume is None else resume
    world = "emulated" if tier.interpreted() else "gpus"
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover

        def tqdm(x, **_):
            return x

    out: list[dict] = []
    for f, v in tqdm(pairs, desc="broken barriers (spawns)", disable=not progress):
        kept = [resume.get((f, v, d)) for d in p["delays"]]
        if all(kept):  # measured by an earlier call: no spawn
            out += kept
            continue
        elapsed = _clock() - started
        if elapsed > budget:
            out += [row(f, v, d, p["trials"], world, skipped=not_started(budget)) for d in p["delays"]]
            continue
        timeout = min(SPAWN_TIMEOUT_S, budget + GRACE_S - elapsed)  # ends by budget + GRACE_S at the latest
        out += measure_delays(v, f, p["delays"], p["trials"], p["n"], p["dtype"], timeout=timeout)
    return out


def rates(records) -> list[dict]:
    """Per (algorithm, variant, delay): wrong results of trials summed over records (skipped rows kept
    with ``trials`` 0)."""
    table: dict = {}
    for r in records:
        k = (r["algorithm"], r["variant"], r["delay"])
        e = table.setdefault(
            k,
            {
                "algorithm": k[0],
                "variant": k[1],
                "delay": k[2],
                "trials": 0,
                "wrong": 0,
                "world": r.get("world"),
                "skipped": r.get("skipped"),
            },
        )
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
                atomics = sorted(
                    {
                        ln.split()[1] if ln.startswith("@") else ln.split()[0]
                        for ln in (raw.strip() for raw in text.splitlines())
                        if "atom." in ln
                    }
                )
                out.append(
                    {
                        "algorithm": a,
                        "delay": d,
                        "sem": sem,
                        "sha1": hashlib.sha1(code_of(text).encode()).hexdigest(),
                        "volatile_loads": text.count("ld.volatile"),
                        "atomics": atomics,
                    }
                )
    return out
