"""Lab 02's trials of the all-reduces without an end barrier, on every rank (``run_ranks``): calls
back to back on fresh inputs, no host barrier between them, a rank made late before some.

* ``push_trials`` and ``push_trials_per_slots``: the push all-reduce (``labkit.kernels.comm.push``)
  on one inbox, its broken one-slot protocol and the protocol without count headers among them.
* ``fid_trials``: the flag-in-data all-reduce (``labkit.kernels.comm.flag_in_data``), the epochs
  next to their wrap-around, signed zeros, NaN and inf, and one call replayed from a CUDA graph.
* ``into_trials`` and ``into_errors``: the all-reduce into a symmetric output
  (``labkit.kernels.comm.into``), and what it says to each misuse.
* ``back_to_back``, ``wrong_calls``, ``digests``: the loop they share, the calls whose result is
  wrong, and a hash of each result (ranks that computed the same bits have equal lists).
"""

from __future__ import annotations

import time

import torch

from labkit.kernels.comm import symm
from labkit.labs.collectives.checks import close_to_sum, quiet_pads_zero, rank_inputs, sum_tolerance


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


def _fid_inputs(ctx, n: int, dtype, seed: int, calls: int, signed_zeros: bool, specials: bool) -> list:
    """``fid_trials``' inputs (``rank_inputs`` per call), with its signed zeros and specials put in."""
    inputs = [rank_inputs(ctx, n, dtype, seed * 1000 + c) for c in range(calls)]
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
    return inputs


def _fid_graph_wrong(ctx, box, first_input: torch.Tensor, mine: int, dtype, seed: int, replays: int) -> list[int]:
    """``fid_trials``' graph (GPUs): one flag-in-data call on ``box`` captured in a CUDA graph, then
    replayed ``replays`` times with fresh inputs written into its input on the device; the replays
    whose result was wrong."""
    from labkit.check.graphs import replay_with_fresh_inputs
    from labkit.kernels.comm import flag_in_data as fid

    x_static = first_input.clone()
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
        lambda: fid.all_reduce(x_static, box, out_static), refill, check, replays=replays, warmup=1
    )
    return [i for i, _ in ran.wrong]


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
    inputs = _fid_inputs(ctx, mine, dtype, seed, calls, signed_zeros, specials)
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
        graph_wrong = _fid_graph_wrong(ctx, box, inputs[0][0], mine, dtype, seed, graph_replays)
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
