"""Lab 02's experiments that run on every rank (``run_ranks``), including the ones that break.

* ``check_algorithms``: every algorithm and op against an fp64 reference on fresh inputs, and
  the signal pads back at zero afterwards: what the tests and the notebook's correctness table run
  (the all-gather in both orders: "direct", the default rotated one, and "naive").
* ``check_dtypes``: ``check_algorithms`` for several dtypes in one world (the notebook's table:
  one start of the ranks and one process group for all of them).
* ``check_all_gather_orders``: both all-gather orders, eager and planned, on several fresh inputs.
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
* ``parts`` and ``shared_world``: several rank functions one after another in one world (one start
  of the ranks and one process group for all); ``shared_world`` returns nothing if that world fails.
"""

from __future__ import annotations

import contextlib
import time

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import symm


def rank_inputs(ctx, n: int, dtype, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """This rank's input, and every rank's (the emulated world and the GPU tier alike build the
    fp64 reference from all of them, so no collective is trusted to check a collective)."""
    xs = []
    for r in range(ctx.world_size):
        g = torch.Generator().manual_seed(seed * 1009 + r)
        xs.append(torch.randn(n, generator=g).to(dtype))
    return xs[ctx.rank].to(ctx.device), xs


def sum_tolerance(dtype, w: int) -> float:
    """Allowed |result - fp64 sum|, relative to sum over ranks of |x_r| (the scale the rounding
    errors have, even where the sum itself cancels to near zero). One-shot and two-shot round the
    fp32 sum once to the output dtype; the tree stores a rounded partial at every level, so up to
    log2(W) + 1 roundings. A bf16 rounding is half an ulp (2^-8) compiled; the interpreter's
    fp32->bf16 cast truncates, a whole ulp (2^-7)."""
    import math

    roundings = math.ceil(math.log2(w)) + 1
    return (2**-7 if dtype == torch.bfloat16 else 2**-23 * w) * roundings


def close_to_sum(y: torch.Tensor, xs: list[torch.Tensor], dtype, w: int) -> bool:
    ref = sum(v.double() for v in xs)
    scale = sum(v.double().abs() for v in xs)
    return bool(((y.double().cpu() - ref).abs() <= sum_tolerance(dtype, w) * scale + 1e-30).all())


def quiet_pads_zero(ctx, buf) -> bool:
    """Whether this rank's pad is all zero once every rank has finished: checked between two
    host barriers, because a faster peer may already be signalling for its NEXT call."""
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    zero = buf.pads_are_zero()
    ctx.barrier()
    return zero


#: every all-reduce the tests and the lab check: the algorithms out of place, then in place
ALL_REDUCE_FORMS = C.ALGORITHMS + tuple(f"{a}_in_place" for a in C.IN_PLACE_ALGORITHMS)


def _all_reduce(buf, out, form: str, config=None, variant: str = "correct") -> torch.Tensor:
    """One all-reduce in one of ``ALL_REDUCE_FORMS``; in place, the result is ``buf.tensor``
    (``buf`` needs a workspace for "two_shot_ce_in_place")."""
    if form.endswith("_in_place"):
        return C.all_reduce(buf, buf.tensor, algorithm=form.removesuffix("_in_place"), config=config, variant=variant)
    return C.all_reduce(buf, out, algorithm=form, config=config, variant=variant)


def _agree_first(buf, out, form: str, config=None, variant: str = "correct") -> None:
    """Make the plan of ``_all_reduce(buf, out, form, ...)`` without launching it: the first plan
    of a set of arguments on a buffer is agreed across ranks (``plan.agree``, an exchange that
    lines the ranks up), so a loop whose ranks must keep their own timing makes it first; the
    loop's calls then reuse the agreement."""
    if form.endswith("_in_place"):
        C.all_reduce_plan(buf, buf.tensor, algorithm=form.removesuffix("_in_place"), config=config, variant=variant)
    else:
        C.all_reduce_plan(buf, out, algorithm=form, config=config, variant=variant)


def check_algorithms(
    ctx,
    n: int,
    dtype_name: str = "float32",
    seed: int = 0,
    trials: int = 1,
    algorithms=None,
    config: dict | None = None,
) -> list[dict]:
    """Every all-reduce algorithm, reduce-scatter and all-gather on fresh random inputs
    (``trials`` per op), against an fp64 reference; pads checked to be zero after each call.
    config: ``LaunchConfig`` fields (default: the default launch)."""
    dtype = getattr(torch, dtype_name)
    cfg = C.LaunchConfig(**config) if config else None
    w = ctx.world_size
    rows = []
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir, workspace=True)
    s = n // w
    gbuf = symm.empty(max(s, 1), dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    for t in range(trials):
        x, xs = rank_inputs(ctx, n, dtype, seed + t)
        for alg in algorithms or ALL_REDUCE_FORMS:
            buf.tensor.copy_(x)
            y = _all_reduce(buf, None, alg, cfg)
            rows.append(
                {
                    "op": "all_reduce",
                    "algorithm": alg,
                    "trial": t,
                    "n": n,
                    "dtype": dtype_name,
                    "world_size": w,
                    "correct": close_to_sum(y, xs, dtype, w),
                    "pads_zero": quiet_pads_zero(ctx, buf),
                }
            )
        if n % w == 0 and algorithms is None:
            buf.tensor.copy_(x)
            y = C.reduce_scatter(buf, config=cfg)
            rows.append(
                {
                    "op": "reduce_scatter",
                    "algorithm": "direct",
                    "trial": t,
                    "n": n,
                    "dtype": dtype_name,
                    "world_size": w,
                    "correct": close_to_sum(y, [v[ctx.rank * s : (ctx.rank + 1) * s] for v in xs], dtype, w),
                    "pads_zero": quiet_pads_zero(ctx, buf),
                }
            )
            expect = torch.cat([v[:s] for v in xs])
            for order, label in (("rotated", "direct"), ("naive", "naive")):  # "direct": the default order
                gbuf.tensor.copy_(x[:s])
                y = C.all_gather(gbuf, config=cfg, order=order)
                rows.append(
                    {
                        "op": "all_gather",
                        "algorithm": label,
                        "trial": t,
                        "n": n,
                        "dtype": dtype_name,
                        "world_size": w,
                        "correct": bool(torch.equal(y.cpu(), expect)),
                        "pads_zero": quiet_pads_zero(ctx, gbuf),
                    }
                )
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        ctx.barrier()
    return rows


def check_all_gather_orders(
    ctx, shard: int, dtype_name: str = "bfloat16", seed: int = 0, trials: int = 2
) -> list[dict]:
    """Both orders of the all-gather (``collectives.ALL_GATHER_ORDERS``), eagerly and through a
    held plan, on ``trials`` fresh inputs of ``shard`` elements per rank, each against the
    concatenation of every rank's input (exact: an all-gather only copies); pads checked."""
    dtype = getattr(torch, dtype_name)
    buf = symm.empty(shard, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    rows = []
    for t in range(trials):
        x, xs = rank_inputs(ctx, shard, dtype, seed + t)
        expect = torch.cat(xs)
        for order in C.ALL_GATHER_ORDERS:
            for how, call in (
                ("eager", lambda o=order: C.all_gather(buf, order=o)),
                ("plan", lambda o=order: C.all_gather_plan(buf, order=o)()),
            ):
                buf.tensor.copy_(x)
                y = call()
                rows.append(
                    {
                        "order": order,
                        "how": how,
                        "trial": t,
                        "shard": shard,
                        "dtype": dtype_name,
                        "world_size": ctx.world_size,
                        "rank": ctx.rank,
                        "correct": bool(torch.equal(y.cpu(), expect)),
                        "pads_zero": quiet_pads_zero(ctx, buf),
                    }
                )
    return rows


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
    _agree_first(buf, outs[0], algorithm, variant=variant)  # not inside the first, disturbed, trial
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
            y = _all_reduce(buf, outs[t], algorithm, variant=variant)
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


def parts(ctx, calls: list) -> dict:
    """Several rank functions one after another in this one world: ``calls`` is a list of
    (name, fn, args, kwargs), fn a module-level function or "module:function"; returns
    {name: this rank's value}. A barrier after
    each part: no rank starts the next while a peer is still in the last. A part that hangs or
    crashes takes the whole world down, which ``shared_world`` answers by returning nothing."""
    import importlib

    out = {}
    for name, fn, args, kwargs in calls:
        if isinstance(fn, str):
            module, _, qualname = fn.partition(":")
            fn = getattr(importlib.import_module(module), qualname)
        out[name] = fn(ctx, *args, **kwargs)
        ctx.barrier()
    return out


def shared_world(calls: list, world_size: int = 2, timeout: float = 600.0) -> dict:
    """``parts`` on ``world_size`` ranks, from the notebook's process: {name: [each rank's value]},
    or {} (and a line that says so) if the world failed, so that each part runs in a world of its
    own and the failure is pinned to its part."""
    from labkit.kernels.comm.ranks import run_ranks

    res = run_ranks(parts, world_size, calls, timeout=timeout)
    if res.ok:
        return {name: [rank[name] for rank in res.values] for name, *_ in calls}
    print(
        f"the {world_size}-rank world running {', '.join(n for n, *_ in calls)} failed ("
        + res.summary().splitlines()[0]
        + "): each runs in a world of its own"
    )
    return {}


def misuse_errors(ctx) -> dict:
    """Each misuse the lab names, tried on every rank; returns the error each one raised
    (type and message), or "no error" (which a test treats as a failure)."""

    def attempt(fn):
        try:
            fn()
        except (TypeError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
        return "no error"

    dev = ctx.device
    found = {
        "plain tensor": attempt(lambda: C.all_reduce(torch.zeros(8, device=dev))),
        "unsupported dtype": attempt(lambda: symm.empty(8, torch.float16, device=dev, scratch_dir=ctx.scratch_dir)),
    }
    # sizes differing across ranks: rank r asks for 8 + r elements (every rank reaches the check)
    found["sizes differ"] = attempt(
        lambda: symm.empty(8 + ctx.rank, torch.float32, device=dev, scratch_dir=ctx.scratch_dir)
    )
    buf = symm.empty(64, torch.float32, device=dev, max_blocks=2, scratch_dir=ctx.scratch_dir)
    found["more blocks than the pad"] = attempt(lambda: C.all_reduce(buf, blocks=3))
    found["uneven reduce-scatter"] = attempt(
        lambda: C.reduce_scatter(
            symm.empty(ctx.world_size * 4 + 1, torch.float32, device=dev, scratch_dir=ctx.scratch_dir)
        )
    )
    found["wrong out shape"] = attempt(lambda: C.all_reduce(buf, torch.empty(63, device=dev)))
    peer = buf.peers[(ctx.rank + 1) % ctx.world_size]  # a peer's buffer, mapped here
    found["out in a peer's buffer"] = attempt(lambda: C.all_reduce(buf, peer))
    found["out inside the buffer"] = attempt(lambda: C.reduce_scatter(buf, buf.tensor[: 64 // ctx.world_size]))
    found["one-shot in place"] = attempt(lambda: C.all_reduce(buf, buf.tensor, algorithm="one_shot"))
    found["copy engines without a workspace"] = attempt(lambda: C.all_reduce(buf, buf.tensor, algorithm="two_shot_ce"))
    found["copy engines out of place"] = attempt(lambda: C.all_reduce(buf, algorithm="two_shot_ce"))
    return found


def one_rank(ctx) -> str:
    """World size 1: what symm.empty says."""
    try:
        symm.empty(8, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    except ValueError as e:
        return f"ValueError: {e}"
    return "no error"


def check_dtypes(ctx, n: int, dtype_names=("bfloat16", "float32"), seed: int = 0) -> list[dict]:
    """``check_algorithms`` once per dtype in this world, on ``n`` elements per rank; float32 takes
    ``n`` rounded up to a multiple of the world size so that reduce-scatter and all-gather run too."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"check_dtypes: n={n!r}: expected a positive int")
    if isinstance(dtype_names, str) or not dtype_names:
        raise ValueError(f"check_dtypes: dtype_names={dtype_names!r}: expected a non-empty list of dtype names")
    w = ctx.world_size
    rows = []
    for name in dtype_names:
        rows += check_algorithms(ctx, n if name != "float32" else n + (-n) % w, name, seed)
    return rows


def back_to_back(ctx, inputs: list, call, late_s=None) -> list[torch.Tensor]:
    """The loop ``push_trials`` and ``fid_trials`` share: one all-reduce per input, back to back
    without a host barrier between them (a fast rank may run calls ahead). ``inputs``: this
    rank's input and every rank's, per call (``rank_inputs``); ``call(x)``: one all-reduce of a
    fresh copy ``x`` of this rank's input (in place may overwrite it), returning the result;
    ``late_s(c)``: seconds this rank sleeps before call c (None: never). Returns the results,
    the device synchronised."""
    outs = []
    for c, (x, _) in enumerate(inputs):
        pause = late_s(c) if late_s is not None else 0.0
        if pause:
            time.sleep(pause)
        outs.append(call(x.clone()))
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    return outs


def wrong_calls(outs: list, inputs: list, dtype, w: int, keep=None) -> list[int]:
    """The calls whose result is not within ``sum_tolerance`` of the fp64 sum of every rank's
    input; ``keep``: the elements compared (default all)."""
    pick = (lambda v: v) if keep is None else (lambda v: v[keep])
    return [
        c
        for c, (y, (_, xs)) in enumerate(zip(outs, inputs))
        if not close_to_sum(pick(y), [pick(v) for v in xs], dtype, w)
    ]


def digests(outs: list) -> list[str]:
    """A short hash of each result's bytes: ranks that computed the same bits have equal lists."""
    import hashlib

    return [hashlib.sha1(y.cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16] for y in outs]


def push_trials(
    ctx,
    n: int,
    dtype_name: str = "float32",
    seed: int = 0,
    calls: int = 6,
    *,
    in_place: bool = False,
    slots: int = 2,
    delay: int = 0,
    late_rank: int | None = None,
    late_s: float = 0.0,
    rotate_late: bool = False,
    capacity: int | None = None,
    short_call: int | None = None,
    counts: bool = True,
) -> dict:
    """``calls`` push all-reduces (``labkit.kernels.comm.push``) back to back on one inbox, fresh
    inputs every call, no host barrier between them (a fast rank may run a call ahead). Rank
    ``late_rank`` sleeps ``late_s`` before every other call (``rotate_late``: call c makes rank
    c % W sleep ``late_s`` first instead); ``delay`` slows rank 1 inside the kernel between its
    wait and its sum; ``slots=1`` is the broken one-slot protocol; ``counts=False`` the protocol
    without its count headers. ``short_call``: in that call, rank ``short_call % W`` passes about
    two thirds of its elements (counts that disagree, which the protocol must catch). Returns
    which other calls were wrong on this rank (against the fp64 sum of every rank's input), the
    calls whose output was NaN everywhere, the disagreements the inbox counted, the epochs and
    digests of the results."""
    from labkit.kernels.comm import push

    dtype = getattr(torch, dtype_name)
    box = push.inbox(capacity or n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    inputs = [rank_inputs(ctx, n, dtype, seed * 1000 + c) for c in range(calls)]
    short = short_call is not None and short_call % ctx.world_size == ctx.rank
    if short:
        x, xs = inputs[short_call]
        inputs[short_call] = (x[: n - n // 3], xs)
    if rotate_late:
        late = lambda c: late_s if c % ctx.world_size == ctx.rank else 0.0  # noqa: E731
    else:
        late = (lambda c: late_s if c % 2 == 0 else 0.0) if late_rank == ctx.rank else None
    outs = back_to_back(
        ctx,
        inputs,
        lambda x: push.all_reduce_variant(x, box, x if in_place else None, slots=slots, delay=delay, counts=counts),
        late,
    )
    agreeing = [c for c in range(calls) if c != short_call]
    wrong = wrong_calls([outs[c] for c in agreeing], [inputs[c] for c in agreeing], dtype, ctx.world_size)
    return {
        "rank": ctx.rank,
        "calls": calls,
        "wrong": [agreeing[i] for i in wrong],
        "nan_calls": [c for c, y in enumerate(outs) if bool(torch.isnan(y).all())],
        "disagreements": box.disagreements(),
        "epochs": box.epochs(),
        "digests": digests([outs[c] for c in agreeing]),
    }


def fid_trials(
    ctx,
    n: int,
    dtype_name: str = "float32",
    seed: int = 0,
    calls: int = 6,
    *,
    in_place: bool = False,
    late_s: float = 0.0,
    capacity: int | None = None,
    start_epoch: int | None = None,
    sizes: dict | None = None,
    signed_zeros: bool = False,
    specials: bool = False,
    graph_replays: int = 0,
) -> dict:
    """``calls`` flag-in-data all-reduces (``labkit.kernels.comm.flag_in_data``) back to back on one
    inbox, fresh inputs every call, no host barrier between them. The late rank rotates: call c
    makes rank c % W sleep ``late_s`` first. ``start_epoch`` sets every counter there first (next to
    the wrap-around); ``sizes`` {rank: n} gives some ranks another element count (a disagreement
    the protocol must catch); ``signed_zeros`` puts -0.0 and +0.0 into the inputs (even indices
    -0.0 on every rank); ``specials`` puts NaN at element 1 of rank 0's inputs and inf at element 3
    of rank 1's (they must come out NaN and inf; the other elements are checked as usual).
    ``graph_replays`` (GPUs): one call captured in a CUDA graph, then replayed
    that many times with fresh inputs written into its input on the device, each result checked.

    Returns, on this rank: the calls whose result was wrong (against the fp64 sum of every rank's
    input), the epochs, digests of the results, the disagreements the inbox counted, whether
    the inbox is armed again at the end, and for the graph the replays that were wrong."""
    from labkit.kernels.comm import flag_in_data as fid

    dtype = getattr(torch, dtype_name)
    mine = (sizes or {}).get(ctx.rank, n)
    box = fid.inbox(
        capacity or max([n, *(sizes or {}).values()]), dtype, device=ctx.device, scratch_dir=ctx.scratch_dir
    )
    if start_epoch is not None:
        fid.set_epochs(box, start_epoch)
        ctx.barrier()
    inputs = [rank_inputs(ctx, mine, dtype, seed * 1000 + c) for c in range(calls)]
    if signed_zeros:
        for x, xs in inputs:
            for v in (x, *xs):
                v[0::2] = -0.0
    if specials:
        for x, xs in inputs:
            for v, r in ((x, ctx.rank), *((v, r) for r, v in enumerate(xs))):
                if r == 0:
                    v[1] = float("nan")
                if r == 1:
                    v[3] = float("inf")
    outs = back_to_back(
        ctx,
        inputs,
        lambda x: fid.all_reduce(x, box, x if in_place else None),
        lambda c: late_s if c % ctx.world_size == ctx.rank else 0.0,
    )
    special = [1, 3] if specials else []
    wrong = wrong_calls(outs, inputs, dtype, ctx.world_size, [i for i in range(mine) if i not in special])
    specials_ok = (
        all(bool(torch.isnan(y[1]).item()) and y[3].item() == float("inf") for y in outs) if specials else None
    )
    graph_wrong = []
    if graph_replays and ctx.device.type == "cuda":
        from labkit.check.graphs import replay_with_fresh_inputs

        x_static = inputs[0][0].clone()
        out_static = torch.empty_like(x_static)

        def refill(i):
            # every rank's input of replay i, from the same seeds on every rank (fp64 reference)
            xs = [
                torch.randn(
                    mine,
                    generator=torch.Generator(device=ctx.device).manual_seed(seed + 104729 * i + r),
                    device=ctx.device,
                ).to(dtype)
                for r in range(ctx.world_size)
            ]
            x_static.copy_(xs[ctx.rank])
            return xs

        def check(i, out, xs):
            ref = sum(v.double() for v in xs)
            scale = sum(v.double().abs() for v in xs)
            return not bool(((out.double() - ref).abs() <= sum_tolerance(dtype, ctx.world_size) * scale + 1e-30).all())

        # one eager call first (on a side stream): compiled and armed before capture
        ran = replay_with_fresh_inputs(
            lambda: fid.all_reduce(x_static, box, out_static), refill, check, replays=graph_replays, warmup=1
        )
        graph_wrong = [i for i, _ in ran.wrong]
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()  # every rank done: the inbox must be armed again
    armed = box.armed()
    return {
        "rank": ctx.rank,
        "calls": calls,
        "wrong": wrong,
        "nan_calls": [c for c, y in enumerate(outs) if bool(torch.isnan(y).all())],
        "negative_zeros": [
            int(
                (y.view(torch.int16 if dtype.itemsize == 2 else torch.int32) == fid.SENTINEL_BITS[dtype.itemsize]).sum()
            )
            for y in outs
        ],
        "epochs": box.epochs(),
        "disagreements": box.disagreements(),
        "armed": armed,
        "graph_wrong": graph_wrong,
        "specials_ok": specials_ok,
        "digests": digests(outs),
    }


def push_trials_per_slots(ctx, slot_counts, n: int, dtype_name: str = "float32", seed: int = 0, calls: int = 6, **kw):
    """``push_trials`` once per slot count in ``slot_counts``, in this world, each on its own inbox
    (a barrier between them: no rank starts the next series while a peer is in the last one).
    Returns {slots: this rank's push_trials result}."""
    if isinstance(slot_counts, int) or not slot_counts:
        raise ValueError(f"push_trials_per_slots: slot_counts={slot_counts!r}: expected a non-empty list")
    out = {}
    for slots in slot_counts:
        out[slots] = push_trials(ctx, n, dtype_name, seed, calls, slots=slots, **kw)
        ctx.barrier()
    return out


def into_trials(
    ctx,
    n: int,
    dtype_name: str = "float32",
    seed: int = 0,
    calls: int = 4,
    *,
    late_rank: int | None = None,
    late_s: float = 0.0,
    algorithm: str = "auto",
) -> dict:
    """``calls`` out-of-place all-reduces into a symmetric output (``labkit.kernels.comm.into``,
    ``algorithm``) back to back on one pair of buffers, fresh inputs every call, each result
    copied out in stream order before the next call overwrites ``out``. Rank ``late_rank`` sleeps
    ``late_s`` before every other call. Returns which calls were wrong on this rank (against the
    fp64 sum), and which left the input changed."""
    from labkit.kernels.comm import into

    dtype = getattr(torch, dtype_name)
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir, workspace=True)
    out = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    inputs = [rank_inputs(ctx, n, dtype, seed * 1000 + c) for c in range(calls)]
    results, kept = [], []
    for c, (x, _) in enumerate(inputs):
        if late_rank == ctx.rank and c % 2 == 0:
            time.sleep(late_s)
        buf.tensor.copy_(x)
        y = into.all_reduce_into(buf, out, algorithm=algorithm)
        results.append(y.clone())  # stream-ordered: before the next call's pushes
        kept.append(torch.equal(buf.tensor, x))  # the input is only read
    # a second output buffer: launches of its own (kept per output, never the first one's)
    other = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    buf.tensor.copy_(inputs[0][0])
    second = into.all_reduce_into(buf, other, algorithm=algorithm).clone()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    wrong = [c for c, (y, (_, xs)) in enumerate(zip(results, inputs)) if not close_to_sum(y, xs, dtype, ctx.world_size)]
    return {
        "rank": ctx.rank,
        "calls": calls,
        "wrong": wrong,
        "input_changed": [c for c, k in enumerate(kept) if not k],
        "returned_out": all(r.shape == out.tensor.shape for r in results),
        "pads_zero": quiet_pads_zero(ctx, buf),
        "second_out_right": close_to_sum(second, inputs[0][1], dtype, ctx.world_size),
        "kept": len(buf._into),
    }


def into_errors(ctx) -> dict:
    """What ``all_reduce_into`` says to each misuse, on every rank."""
    from labkit.kernels.comm import into

    def err(fn) -> str:
        try:
            fn()
        except Exception as e:  # reported, not raised: the test says what failed
            return f"{type(e).__name__}: {e}"
        return "no error"

    d, s = ctx.device, ctx.scratch_dir
    buf = symm.empty(64, torch.float32, device=d, scratch_dir=s, workspace=True)
    plain = symm.empty(64, torch.float32, device=d, scratch_dir=s)
    other = {
        "shape": symm.empty(32, torch.float32, device=d, scratch_dir=s),
        "dtype": symm.empty(64, torch.bfloat16, device=d, scratch_dir=s),
    }
    found = {
        "plain tensor out": err(lambda: into.all_reduce_into(buf, torch.empty(64, device=d))),
        "out is buf": err(lambda: into.all_reduce_into(buf, buf)),
        "no workspace": err(lambda: into.all_reduce_into(plain, buf, algorithm="two_shot_ce")),
        "algorithm": err(lambda: into.all_reduce_into(buf, plain, algorithm="one_shot")),
        "shape": err(lambda: into.all_reduce_into(buf, other["shape"])),
        "dtype": err(lambda: into.all_reduce_into(buf, other["dtype"])),
        "not a buffer": err(lambda: into.all_reduce_into("buf", plain)),
        "blocks": err(lambda: into.all_reduce_into(buf, plain, blocks=[2])),
        "config": err(lambda: into.all_reduce_into(buf, plain, config={"programs": 2})),
    }
    ctx.barrier()
    return found
