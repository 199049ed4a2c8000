"""Lab 02's experiments that break, on every rank (``run_ranks``).

* ``broken_trials``: the deliberately broken variants under load. Many collectives are queued
  back to back, each on new inputs, with one rank made late before some of them (a GPU sleep, or
  a host sleep in the emulated world), so a rank that skips a barrier can run ahead into the next
  call while a peer still reads. Counts results that differ from the reference; "0 wrong in N
  trials" is reported as exactly that. ``broken_matrix`` runs several in one world, and
  ``live_broken`` (the notebook's process) drives it, falling back to one world per run on failure.
* ``unguarded_leaf``: the tree variant that reads pointer-table entry -1; expected to crash, so
  the notebook runs it through ``run_ranks`` with a timeout, which reports how each rank ended.
* ``lonely_barrier`` and ``hang_demo``: only rank 0 enters a barrier and spins; ``hang_demo`` (the
  notebook's process) runs it with a short timeout and checks that rank 0 really was in the barrier.
"""

from __future__ import annotations

import contextlib
import time

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import symm
from labkit.labs.collectives.checks import agree_first, all_reduce_form, close_to_sum, quiet_pads_zero, rank_inputs

#: how one rank is disturbed before every third call of ``broken_trials``
LOADS = {
    "late": "the rank starts late (a GPU sleep of late_us on its stream; a host sleep when emulated)",
    "gemm": "a bf16 GEMM (8192^3) on a side stream of the rank, launched with the collective, as "
    "compute overlaps communication in training (meant to slow that rank's reads; on 2xH200 it "
    "did not make the end-barrier race show, probably because the GEMM's CTAs fill the SMs and "
    "the collective's programs start after them instead of sharing SMs: not verified)",
    "held": "the rank's first read of a peer's buffer waits until every peer has returned and written "
    "its next input, or HOLD_S seconds (labkit.check.held_reader: a reader held between its "
    "barrier and its reads, forced instead of waited for; the emulated world only)",
}
#: the longest a held reader waits (load "held"): what a call its peers cannot return from costs
HOLD_S = 0.5


def _gemm_load(device: torch.device):
    """Operands for the "gemm" load, and the side stream it runs on."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    return a, a.clone(), torch.empty_like(a), torch.cuda.Stream(device)


def broken_trials(
    ctx,
    variant: str,
    algorithm: str = "one_shot",
    trials: int = 50,
    n: int = 1 << 16,
    dtype_name: str = "bfloat16",
    late_us: float = 200.0,
    seed: int = 0,
    load: str = "late",
) -> dict:
    """``trials`` all-reduces queued back to back with ``variant``, each on new inputs; before
    every third one a rank chosen in turn is disturbed by ``load`` (``LOADS``). ``algorithm``:
    one of ``ALL_REDUCE_FORMS`` (in place, each result is copied out before the next input is
    written, as a caller would). Returns how many results were wrong.

    Load "held" (the emulated world): the disturbed rank's call runs under
    ``held_reader.hold_peer_reads``; each peer, once it has written the input of the next call,
    says so, which is what lets the held rank read on (after the last call the peers write one
    more input, as a caller's next call would)."""
    if load not in LOADS:
        raise ValueError(f"load: {load!r} is not one of {list(LOADS)}")
    if load == "gemm" and ctx.device.type != "cuda":
        raise ValueError(
            "load: 'gemm' overlaps a GEMM with the collective on a GPU; the emulated world has 'late' and 'held'"
        )
    if load == "held" and ctx.device.type == "cuda":
        raise ValueError(
            "load: 'held' holds interpreted loads on the host: the emulated world only; GPUs have 'late' and 'gemm'"
        )
    dtype = getattr(torch, dtype_name)
    w = ctx.world_size
    buf = symm.empty(
        n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir, workspace=algorithm.endswith("ce_in_place")
    )
    inputs, everyone = [], []
    for t in range(trials):
        x, xs = rank_inputs(ctx, n, dtype, seed * 100_000 + t)
        inputs.append(x)
        everyone.append(xs)
    outs = [torch.empty(n, dtype=dtype, device=ctx.device) for _ in range(trials)]
    on_gpu = ctx.device.type == "cuda"
    cycles = 0
    gemm = _gemm_load(ctx.device) if load == "gemm" else None
    if gemm:
        with torch.cuda.stream(gemm[3]):  # cuBLAS's per-stream set-up before the trials, not in them
            torch.matmul(gemm[0], gemm[1], out=gemm[2])
    agree_first(buf, outs[0], algorithm, variant=variant)  # not inside the first, disturbed, trial
    if on_gpu:
        from labkit.workbench.bench import sleep_cycles_per_ms

        cycles = int(late_us / 1e3 * sleep_cycles_per_ms(ctx.device.index))
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    start = time.perf_counter()
    for t in range(trials):
        disturbed = _disturbed_rank(t, w) == ctx.rank  # this rank is disturbed for this call
        if disturbed and load != "held":
            if gemm:
                a, b, c, side = gemm
                side.wait_stream(torch.cuda.current_stream())  # starts with the collective
                with torch.cuda.stream(side):
                    torch.matmul(a, b, out=c)
            elif on_gpu:
                torch.cuda._sleep(cycles)
            else:
                time.sleep(late_us / 1e6)
        buf.tensor.copy_(inputs[t])  # the next input overwrites the buffer, in stream order
        if load == "held":
            _say_if_a_peer_held(ctx, buf, t - 1)
        with _held(ctx, buf, t) if load == "held" and disturbed else contextlib.nullcontext():
            y = all_reduce_form(buf, outs[t], algorithm, variant=variant)
        if y is buf.tensor:  # in place: the caller copies the result out before the next input
            outs[t].copy_(y)
    if load == "held":  # a held last call: its peers write a next input, as a caller's next call would
        buf.tensor.copy_(inputs[0])
        _say_if_a_peer_held(ctx, buf, trials - 1)
    if on_gpu:
        torch.cuda.synchronize(ctx.device)
    seconds = time.perf_counter() - start
    wrong = [t for t in range(trials) if not close_to_sum(outs[t], everyone[t], dtype, w)]
    pads_zero = quiet_pads_zero(ctx, buf)
    return {
        "variant": variant,
        "algorithm": algorithm,
        "trials": trials,
        "n": n,
        "dtype": dtype_name,
        "world_size": w,
        "rank": ctx.rank,
        "load": load,
        "late_us": late_us,
        "wrong": len(wrong),
        "first_wrong": wrong[:5],
        "seconds": seconds,
        "pads_zero": pads_zero,
    }


def _disturbed_rank(t: int, world_size: int) -> int | None:
    """The rank ``broken_trials`` disturbs before call ``t``: every third call, the ranks in turn."""
    return (t // 3) % world_size if t % 3 == 0 else None


def _held_round_name(buf, t: int) -> str:
    return f"broken-{buf.serial}-{t}"


def _held(ctx, buf, t: int):
    """Load "held", on the rank disturbed for call ``t``: its first read of a peer's buffer waits
    for the peers (``held_reader`` steps 1, 2 and 4)."""
    from labkit.check.held_reader import hold_peer_reads

    return hold_peer_reads(buf, ctx.scratch_dir, _held_round_name(buf, t), HOLD_S)


def _say_if_a_peer_held(ctx, buf, t: int) -> None:
    """Load "held", after this rank wrote the input that follows call ``t``: if a peer was held in
    that call, tell it (``held_reader`` step 3)."""
    from labkit.check.held_reader import say_next_input_written

    held = _disturbed_rank(t, ctx.world_size) if t >= 0 else None
    if held is not None and held != ctx.rank:
        say_next_input_written(ctx.scratch_dir, _held_round_name(buf, t), ctx.rank)


def broken_matrix(
    ctx, runs: list, trials: int, n: int, dtype_name: str = "float32", late_us: float = 200.0, load: str = "late"
) -> list[dict]:
    """``broken_trials`` for each (variant, algorithm) of ``runs``, one after another in this one
    world: starting a world costs far more than a trial (seconds where the ranks are spawned on
    GPUs). A run that hangs or crashes takes
    the whole world down with it, which ``live_broken`` answers by running each in a world of its own."""
    return [
        broken_trials(ctx, variant, algorithm, trials, n, dtype_name, late_us, seed=i, load=load)
        for i, (variant, algorithm) in enumerate(runs)
    ]


def live_broken(
    variants,
    algorithms,
    trials: int,
    n: int,
    late_us: float,
    load: str = "late",
    world_size: int = 2,
    timeout: float = 600.0,
    ran: list | None = None,
) -> list[dict]:
    """The notebook's live broken-variant rows (kind "broken"), one per variant x algorithm.
    Runs them all in one world first; if that world fails (a hang, a crash), says so and runs
    each in a world of its own with its own timeout, so the failure is pinned to its run.
    ``ran``: every rank's ``broken_matrix`` value over these runs from a world that already ran
    them (``shared_world``); then no world starts here."""
    from labkit.kernels.comm.ranks import run_ranks

    runs = [(v, a) for v in variants for a in algorithms]

    def row(variant, algorithm, per_rank, failure=None):
        wrong = sum(r["wrong"] for r in per_rank) if per_rank else None
        return {
            "kind": "broken",
            "impl": f"labkit_{algorithm}",
            "variant": variant,
            "load": load,
            "world_size": world_size,
            "bytes": n * 4,
            "ranks_x_trials": trials * world_size,
            "wrong_results": wrong,
            "outcome": f"{wrong} wrong of {trials * world_size}" if failure is None else "run failed: " + failure,
        }

    if ran is not None:
        return [row(v, a, [rank[i] for rank in ran]) for i, (v, a) in enumerate(runs)]
    res = run_ranks(broken_matrix, world_size, runs, trials, n, "float32", late_us, load=load, timeout=timeout)
    if res.ok:  # res.values: per rank, a list of one dict per run
        return [row(v, a, [rank[i] for rank in res.values]) for i, (v, a) in enumerate(runs)]
    print(
        "the world running every variant failed (" + res.summary().splitlines()[0] + "): running each variant "
        "in a world of its own to find which"
    )
    rows = []
    for i, (v, a) in enumerate(runs):
        one = run_ranks(broken_trials, world_size, v, a, trials, n, "float32", late_us, i, load=load, timeout=timeout)
        rows.append(row(v, a, one.values) if one.ok else row(v, a, None, one.summary().splitlines()[0]))
    return rows


def unguarded_leaf(ctx, n: int = 4096) -> bool:
    """The broken tree: on most machines this never returns (a crash); if it does, says whether
    the result was right anyway."""
    x, xs = rank_inputs(ctx, n, torch.float32, 7)
    buf = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    buf.tensor.copy_(x)
    y = C.all_reduce(buf, algorithm="tree", variant="unguarded_leaf")
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    return close_to_sum(y, xs, torch.float32, ctx.world_size)


IN_BARRIER = "rank 0 enters the barrier at unix time "  # what lonely_barrier's rank 0 prints first


def lonely_barrier(ctx, blocks: int = 1) -> None:
    """Only rank 0 enters the barrier; the others return. Rank 0 spins forever on signals that
    never come: the hang ``run_ranks`` turns into a timeout. Rank 0 prints ``IN_BARRIER`` and the
    time as it enters (``hang_demo`` reads it from the rank's stdout)."""
    buf = symm.empty(16, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    if ctx.rank == 0:
        print(f"{IN_BARRIER}{time.time():.3f}", flush=True)
        C.barrier(buf, blocks)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)


def hang_demo(timeout: float = 10.0, min_spin_s: float = 3.0, retry_timeout: float | None = 60.0):
    """``lonely_barrier`` on 2 ranks with a short timeout, for the notebook: (the run, seconds rank 0
    spun in the barrier before it was killed). A timeout shows the hang only if the ranks started
    and rank 0 spun in the barrier for a while: rank 1 must have returned and rank 0 must have
    printed ``IN_BARRIER`` at least ``min_spin_s`` before the end. A slow start (a loaded machine)
    fails that, and the run is repeated once with ``retry_timeout`` (None: never). spun is None
    when rank 0 never entered the barrier."""
    from labkit.kernels.comm.ranks import run_ranks

    for t in (timeout,) if retry_timeout is None else (timeout, retry_timeout):
        res = run_ranks(lonely_barrier, 2, timeout=t)
        ended = time.time()
        lines = [ln for ln in res.results[0].stdout.splitlines() if ln.startswith(IN_BARRIER)]
        spun = ended - float(lines[0][len(IN_BARRIER) :]) if lines else None
        if res.results[1].ok and spun is not None and spun >= min_spin_s:
            break
    return res, spun
