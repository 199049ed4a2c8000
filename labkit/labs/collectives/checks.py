"""Lab 02's correctness checks that run on every rank (``run_ranks``), and what every experiment of
the lab checks results with.

* ``rank_inputs``, ``sum_tolerance``, ``close_to_sum``, ``quiet_pads_zero``: every rank's fresh
  random input, the fp64 sum they must reduce to within the rounding an all-reduce may do, and the
  signal pads back at zero once every rank has finished.
* ``ALL_REDUCE_FORMS``, ``all_reduce_form``, ``agree_first``: every all-reduce the tests and the
  lab check (the algorithms out of place, then in place), one call of one of them, and its plan
  made (agreed across ranks) before a loop whose ranks keep their own timing.
* ``check_algorithms``: every algorithm and op against an fp64 reference on fresh inputs, and
  the signal pads back at zero afterwards: what the tests and the notebook's correctness table run
  (the all-gather in both orders: "direct", the default rotated one, and "naive").
* ``check_dtypes``: ``check_algorithms`` for several dtypes in one world (the notebook's table:
  one start of the ranks and one process group for all of them).
* ``check_all_gather_orders``: both all-gather orders, eager and planned, on several fresh inputs.
* ``misuse_errors`` and ``one_rank``: what each misuse the lab names raises, on every rank.
"""

from __future__ import annotations

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


def all_reduce_form(buf, out, form: str, config=None, variant: str = "correct") -> torch.Tensor:
    """One all-reduce in one of ``ALL_REDUCE_FORMS``; in place, the result is ``buf.tensor``
    (``buf`` needs a workspace for "two_shot_ce_in_place")."""
    if form.endswith("_in_place"):
        return C.all_reduce(buf, buf.tensor, algorithm=form.removesuffix("_in_place"), config=config, variant=variant)
    return C.all_reduce(buf, out, algorithm=form, config=config, variant=variant)


def agree_first(buf, out, form: str, config=None, variant: str = "correct") -> None:
    """Make the plan of ``all_reduce_form(buf, out, form, ...)`` without launching it: the first plan
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
            y = all_reduce_form(buf, None, alg, cfg)
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
