"""The collectives' plans: a call's checks (``checks``) and choices (``chooser``) made into a
``plan.CollectivePlan`` (what a plan is and what it checks on every call: ``plan``).

* ``make_all_reduce_plan``, ``make_shards_plan``: the plan of a call, checked and agreed on by
  the ranks (``plan.agree``); ``all_reduce_plan``, ``reduce_scatter_plan``, ``all_gather_plan``
  are their public forms (a plan to hold);
* ``plan_key``: the key under which an eager call keeps its plan on the buffer (``buf._plans``);
  ``cached_call``: the eager calls' one way through that cache.
"""

from __future__ import annotations

import torch

from labkit.kernels.comm import plan, scatter_gather, tables
from labkit.kernels.comm.checks import check_all_reduce, check_shards, check_shards_call
from labkit.kernels.comm.chooser import LaunchConfig, choose_all_reduce, shard_steps
from labkit.kernels.comm.symm import SymmBuffer
from labkit.workbench.errors import UsageError

#: the ops ``plan_key`` knows, and the arguments of each call that its key holds (in order)
KEY_ARGUMENTS = {
    "all_reduce": ("algorithm", "blocks", "variant", "config"),
    "reduce_scatter": ("blocks", "variant", "config", "order"),
    "all_gather": ("blocks", "variant", "config", "order"),
}


def plan_key(
    op: str,
    out: torch.Tensor | None = None,
    *,
    algorithm: str = "auto",
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    order: str = "rotated",
) -> tuple:
    """The key under which ``op``'s eager call with these arguments keeps its plan on the buffer
    (``buf._plans[plan_key(...)]``; ``plan.kept``): the op, ``plan.out_key(out)`` and the call's
    other arguments (``KEY_ARGUMENTS``). ``cached_call`` builds the same tuple."""
    if op not in KEY_ARGUMENTS:
        raise UsageError(f"op: {op!r} is not one of {list(KEY_ARGUMENTS)}")
    given = {"algorithm": algorithm, "blocks": blocks, "variant": variant, "config": config, "order": order}
    return (op, plan.out_key(out), *(given[name] for name in KEY_ARGUMENTS[op]))


def cached_call(op: str, buf, out, arguments: tuple, make) -> torch.Tensor:
    """``op`` through the plan kept on the buffer under ``(op, plan.out_key(out), *arguments)``
    (``plan_key``'s tuple: ``arguments`` in ``KEY_ARGUMENTS[op]``'s order), made by
    ``make(buf, out, *arguments, keep=False, fast=...)`` and kept when there is none. A plan for
    this call alone (made, launched once, not kept) where plans are off, ``buf`` is not a plain
    ``SymmBuffer`` or ``out`` not a tensor (its checks then name the argument), or an argument is
    unhashable."""
    key = None
    if type(buf) is SymmBuffer and plan.CACHE_PLANS and (out is None or isinstance(out, torch.Tensor)):
        key = (op, plan.out_key(out), *arguments)
        try:
            kept = plan.kept(buf, key)
        except TypeError:  # an unhashable argument: a plan for this call alone, whose checks name it
            key = None
        else:
            if kept is not None:
                if buf.emulated:  # every call counts there (``agreement``)
                    plan.call_made(kept)
                return kept._launch(out)
    made = make(buf, out, *arguments, keep=False, fast=key is not None)
    if key is not None:
        plan.keep(buf, key, made)
    return made._launch(out)


def _chooser_table(buf: SymmBuffer) -> str:
    return tables.table_for(tables.gpu_name(buf.tensor.device), buf.world_size).describe()


def make_all_reduce_plan(
    buf,
    out=None,
    algorithm: str = "auto",
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    keep: bool = True,
    fast: bool = True,
) -> plan.CollectivePlan:
    """``check_all_reduce`` then ``choose_all_reduce``, as a plan (``all_reduce_plan``).
    keep=False: a plan for the buffer's own cache (holds the buffer weakly, and not ``out``);
    fast=False: a plan launched once, which prepares no compiled-launcher path."""
    checked = check_all_reduce(buf, out, algorithm)
    choice = choose_all_reduce(checked.buf, checked.in_place, algorithm, blocks, variant, config)
    made = plan.CollectivePlan(
        "all_reduce",
        checked.buf,
        choice.steps,
        algorithm=choice.algorithm,
        in_place=checked.in_place,
        out_shape=tuple(checked.buf.tensor.shape),
        out=checked.out if keep else None,
        checked_out=checked.out,
        keep_buffer=keep,
        fast=fast,
        chooser_table=choice.table.describe(),
    )
    plan.agree(made, {"algorithm": algorithm, "blocks": blocks, "variant": variant, "config": config})
    return made


def make_shards_plan(
    op: str,
    buf,
    out=None,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    keep: bool = True,
    fast: bool = True,
    order: str = "rotated",
) -> plan.CollectivePlan:
    """``reduce_scatter``'s or ``all_gather``'s checks and choices, as a plan (``reduce_scatter_plan``,
    ``all_gather_plan``); keep and fast as for ``make_all_reduce_plan``; order: the all-gather's
    (``ALL_GATHER_ORDERS``; the reduce-scatter has only "rotated")."""
    check_shards_call(op, order)
    checked = check_shards(op, buf, out)
    buf = checked.buf
    x = buf.tensor
    if op == "reduce_scatter":
        steps = shard_steps(
            op, scatter_gather.reduce_scatter_kernel, buf, x.numel() // buf.world_size, blocks, variant, config
        )
    else:
        steps = shard_steps(
            op,
            scatter_gather.all_gather_kernel,
            buf,
            x.numel(),
            blocks,
            variant,
            config,
            {"ROTATE": False} if order == "naive" else None,
        )
    made = plan.CollectivePlan(
        op,
        buf,
        steps,
        algorithm="direct",
        in_place=False,
        out_shape=checked.out_shape,
        out=checked.out if keep else None,
        checked_out=checked.out,
        keep_buffer=keep,
        fast=fast,
        chooser_table=_chooser_table(buf),
    )
    plan.agree(made, {"blocks": blocks, "variant": variant, "config": config, "order": order})
    return made


def all_reduce_plan(
    buf,
    out: torch.Tensor | None = None,
    *,
    algorithm: str = "auto",
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
) -> plan.CollectivePlan:
    """A plan for ``all_reduce(buf, out, ...)`` (same arguments, same checks, made now);
    ``plan()`` launches it. out=None: each call returns a new tensor; out=buf.tensor: in place.
    Every rank makes the same plan and calls it the same number of times (the barriers pair
    program b of every rank's launch); making it checks the ranks agree, as ``all_reduce`` does
    (collective when the buffer has not seen these arguments). The plan keeps ``buf`` alive."""
    return make_all_reduce_plan(buf, out, algorithm, blocks, variant, config)


def reduce_scatter_plan(
    buf,
    out: torch.Tensor | None = None,
    *,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
) -> plan.CollectivePlan:
    """A plan for ``reduce_scatter(buf, out, ...)``; as ``all_reduce_plan``."""
    return make_shards_plan("reduce_scatter", buf, out, blocks, variant, config)


def all_gather_plan(
    buf,
    out: torch.Tensor | None = None,
    *,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    order: str = "rotated",
) -> plan.CollectivePlan:
    """A plan for ``all_gather(buf, out, ...)``; as ``all_reduce_plan``."""
    return make_shards_plan("all_gather", buf, out, blocks, variant, config, order=order)


def reduce_scatter_made(buf, out, blocks, variant, config, order, *, keep: bool, fast: bool) -> plan.CollectivePlan:
    """``make_shards_plan("reduce_scatter", ...)`` in ``cached_call``'s argument order."""
    return make_shards_plan("reduce_scatter", buf, out, blocks, variant, config, keep, fast, order)


def all_gather_made(buf, out, blocks, variant, config, order, *, keep: bool, fast: bool) -> plan.CollectivePlan:
    """``make_shards_plan("all_gather", ...)`` in ``cached_call``'s argument order."""
    return make_shards_plan("all_gather", buf, out, blocks, variant, config, keep, fast, order)
