"""Lab 02's experiments that run on every rank (``run_ranks``), by module, and what runs several of
them in one world.

* ``checks``: every algorithm and op against an fp64 reference (``check_algorithms``,
  ``check_dtypes``, ``check_all_gather_orders``), the misuses (``misuse_errors``, ``one_rank``), and
  what every experiment checks results with (``rank_inputs``, ``close_to_sum``,
  ``quiet_pads_zero``, ``ALL_REDUCE_FORMS``).
* ``broken``: the deliberately broken variants under load (``broken_trials``, ``broken_matrix``,
  ``live_broken``), the unguarded leaf that crashes, the lonely barrier that hangs (``hang_demo``).
* ``protocol_trials``: the all-reduces without an end barrier, back to back (``push_trials``,
  ``fid_trials``, ``into_trials``).
* here: ``parts`` and ``shared_world``: several rank functions one after another in one world (one
  start of the ranks and one process group for all); ``shared_world`` returns nothing if that world
  fails.

Every public name of those modules is importable from here too: what the notebooks, the tests and
lab 06 call ``experiments.<name>``.
"""

from __future__ import annotations

from labkit.labs.collectives.broken import (
    HOLD_S,
    IN_BARRIER,
    LOADS,
    broken_matrix,
    broken_trials,
    hang_demo,
    live_broken,
    lonely_barrier,
    unguarded_leaf,
)
from labkit.labs.collectives.checks import (
    ALL_REDUCE_FORMS,
    agree_first,
    all_reduce_form,
    check_algorithms,
    check_all_gather_orders,
    check_dtypes,
    close_to_sum,
    misuse_errors,
    one_rank,
    quiet_pads_zero,
    rank_inputs,
    sum_tolerance,
)
from labkit.labs.collectives.protocol_trials import (
    back_to_back,
    digests,
    fid_trials,
    into_errors,
    into_trials,
    push_trials,
    push_trials_per_slots,
    wrong_calls,
)

__all__ = [
    "ALL_REDUCE_FORMS",
    "HOLD_S",
    "IN_BARRIER",
    "LOADS",
    "agree_first",
    "all_reduce_form",
    "back_to_back",
    "broken_matrix",
    "broken_trials",
    "check_algorithms",
    "check_all_gather_orders",
    "check_dtypes",
    "close_to_sum",
    "digests",
    "fid_trials",
    "hang_demo",
    "into_errors",
    "into_trials",
    "live_broken",
    "lonely_barrier",
    "misuse_errors",
    "one_rank",
    "parts",
    "push_trials",
    "push_trials_per_slots",
    "quiet_pads_zero",
    "rank_inputs",
    "shared_world",
    "sum_tolerance",
    "unguarded_leaf",
    "wrong_calls",
]


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
