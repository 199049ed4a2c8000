"""The collectives' argument checks: what each call accepts, and the errors, naming the argument,
for what it does not (``collectives`` runs them when a plan is made, once per buffer and set of
arguments).

* the names a call takes: ``ALGORITHMS`` (and the in-place and inbox ones), ``VARIANTS`` (the
  lab's deliberately broken barriers, ``barrier_semantics`` their constexprs),
  ``ALL_GATHER_ORDERS``;
* ``check_all_reduce``: the buffer, the output (in place or a separate tensor that shares no
  memory with any rank's buffer or inbox) and what the algorithm needs of the buffer;
* ``check_shards``: the same for ``reduce_scatter`` / ``all_gather`` (dim 0 splits into W shards),
  ``check_shards_call`` their op and order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit.kernels.comm import inbox_call
from labkit.kernels.comm.signals import SEM_ACQ_REL, SEM_GPU_SCOPE, SEM_RELAXED
from labkit.kernels.comm.symm import SymmBuffer, check_buffer
from labkit.kernels.launch_helpers import overlaps
from labkit.workbench.errors import UsageError

ALGORITHMS = ("one_shot", "two_shot", "tree")
#: what ``all_reduce(buf, buf.tensor)`` (in place) can run: two-shot with the reduced shards
#: pushed; "two_shot_ce" also has the copy engines do the first shot (needs ``buf.workspace``)
IN_PLACE_ALGORITHMS = ("two_shot", "two_shot_ce")
#: what a buffer with a flag-in-data inbox (``flag_in_data.attach``) can also run, in
#: place or not: the flag-in-data one-shot (``labkit.kernels.comm.flag_in_data``)
INBOX_ALGORITHMS = ("flag_in_data",)
#: deliberately broken variants, for the lab: (what changes, which algorithms have it)
VARIANTS = {
    "correct": "the kernels as they should be",
    "relaxed": "barrier atomics relaxed instead of release/acquire: time is synchronised, memory is not",
    "no_end_barrier": "no barrier at the end: a fast rank's next input overwrites a buffer a peer still reads",
    "unguarded_leaf": "tree only: a leaf reads its missing child through pointer-table entry -1",
    "gpu_scope": "barrier atomics release/acquire at gpu scope instead of sys: ordering promised within one GPU only",
}
#: the orders in which ``all_gather`` reads the shards (correct either way; they differ in which
#: GPU's links are busy at once)
ALL_GATHER_ORDERS = {
    "rotated": "rank r reads r, r+1, ... (mod W): at every step each GPU is read by one peer (the default)",
    "naive": "every rank reads 0, 1, ...: at step k all ranks read rank k's shard at once",
}


@dataclass(frozen=True, slots=True)
class BarrierSemantics:
    """What a variant (``VARIANTS``) makes of the kernels' barriers: their constexprs."""

    sem: int  # SEM: the barrier atomics' order and scope (signals.SEM_ACQ_REL, SEM_RELAXED, SEM_GPU_SCOPE)
    end_barrier: bool  # END_BARRIER: the kernels end with a barrier (False: "no_end_barrier")
    guard_leaf: bool  # GUARD_LEAF: the tree waits for a child before reading it (False: "unguarded_leaf")


#: variant -> its ``BarrierSemantics``, made once: looked up when a plan (or a ``barrier``) is made
_BARRIER_SEMANTICS = {
    variant: BarrierSemantics(
        sem={"relaxed": SEM_RELAXED, "gpu_scope": SEM_GPU_SCOPE}.get(variant, SEM_ACQ_REL),
        end_barrier=variant != "no_end_barrier",
        guard_leaf=variant != "unguarded_leaf",
    )
    for variant in VARIANTS
}


def barrier_semantics(variant: str, algorithm: str) -> BarrierSemantics:
    """The barriers of ``variant``, checked: a variant ``algorithm`` has (errors name the argument)."""
    if variant not in VARIANTS:
        raise UsageError(f"variant: {variant!r} is not one of {list(VARIANTS)}")
    if variant == "unguarded_leaf" and algorithm != "tree":
        raise UsageError("variant 'unguarded_leaf' exists only for algorithm='tree'")
    return _BARRIER_SEMANTICS[variant]


def is_in_place(out, buf: SymmBuffer) -> bool:
    """``out`` is this rank's symmetric buffer itself (same memory, shape and dtype)."""
    x = buf.tensor
    return (
        isinstance(out, torch.Tensor)
        and out.device == x.device
        and out.dtype == x.dtype
        and tuple(out.shape) == tuple(x.shape)
        and out.is_contiguous()
        and out.data_ptr() == x.data_ptr()
    )


def check_out(name: str, out, shape: tuple, like: torch.Tensor, buf: SymmBuffer) -> torch.Tensor | None:
    """The output tensor, checked (None stays None: the launch makes one); it may not share
    memory with any rank's buffer: the kernels read those buffers while they write ``out`` (an
    output inside a peer's buffer, or inside this rank's, would be overwritten by, or overwrite,
    data still being read)."""
    if out is None:
        return None
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(out).__name__}")
    if out.device != like.device:
        raise ValueError(f"{name}: is on {out.device}; the buffer is on {like.device}")
    if out.dtype != like.dtype:
        raise TypeError(f"{name}: dtype {out.dtype} differs from the buffer's {like.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(out.shape)}, expected {tuple(shape)}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    for r, peer in enumerate(buf.peers):
        if overlaps(out, peer):
            whose = "this rank's" if r == buf.rank else f"rank {r}'s"
            raise ValueError(
                f"{name}: shares memory with {whose} symmetric buffer, which the kernel reads while "
                "it writes out; pass a separate tensor"
                + (" (or, for all_reduce, out=buf.tensor itself: in place)" if r == buf.rank else "")
            )
    return out


@dataclass(frozen=True, slots=True)
class CheckedAllReduce:
    """``all_reduce``'s arguments after ``check_all_reduce``."""

    buf: SymmBuffer  # the symmetric buffer, checked
    out: torch.Tensor | None  # the output: checked, or None (a new tensor per launch), or buf.tensor in place
    in_place: bool  # out is buf.tensor: the sum replaces the input


def check_all_reduce(buf, out, algorithm: str) -> CheckedAllReduce:
    """The argument checks of ``all_reduce``. Errors name the argument."""
    buf = check_buffer("buf", buf)
    x = buf.tensor
    in_place = is_in_place(out, buf)
    if algorithm == "flag_in_data" and buf.inbox is None:
        raise UsageError(
            "algorithm 'flag_in_data': buf has no flag-in-data inbox; give it one with "
            "flag_in_data.attach(buf) (or attach(buf, box) with a flag_in_data.inbox(...) of at least its size)"
        )
    if in_place:
        if algorithm in ("one_shot", "tree"):
            raise UsageError(
                f"out: is buf.tensor (in place), which algorithm={algorithm!r} cannot do: it reads "
                "every rank's whole buffer until its end barrier, so writing the sum there races with "
                "the peers' reads; use algorithm='two_shot', 'two_shot_ce' or 'auto', or pass "
                "another out"
            )
        if algorithm == "two_shot_ce" and buf.workspace is None:
            raise UsageError(
                "algorithm 'two_shot_ce': buf has no workspace for the copy engines to fill; allocate "
                "it with symm.empty(..., workspace=True)"
            )
    else:
        if algorithm == "two_shot_ce":
            raise UsageError("algorithm 'two_shot_ce' works in place only: pass out=buf.tensor")
        out = check_out("out", out, tuple(x.shape), x, buf)
        if out is not None and buf.inbox is not None:  # the peers store into the inboxes during a call
            inbox_call.outside_inboxes("out", out, buf.inbox)
    return CheckedAllReduce(buf, out, in_place)


@dataclass(frozen=True, slots=True)
class CheckedShards:
    """``reduce_scatter``'s or ``all_gather``'s arguments after ``check_shards``."""

    buf: SymmBuffer  # the symmetric buffer, checked
    out: torch.Tensor | None  # the output, checked, or None (a new tensor per launch)
    out_shape: tuple  # the output's shape: one shard (reduce-scatter), or W of them (all-gather)


def check_shards(op: str, buf, out) -> CheckedShards:
    """The argument checks of ``reduce_scatter`` / ``all_gather``. Errors name the argument."""
    buf = check_buffer("buf", buf)
    x = buf.tensor
    w = buf.world_size
    if op == "reduce_scatter":
        if x.shape[0] % w:
            raise ValueError(
                f"buf: dim 0 of shape {tuple(x.shape)} does not split into {w} equal shards "
                f"({x.shape[0]} % {w} = {x.shape[0] % w})"
            )
        shape = (x.shape[0] // w,) + tuple(x.shape[1:])
    else:
        shape = (x.shape[0] * w,) + tuple(x.shape[1:])
    return CheckedShards(buf, check_out("out", out, shape, x, buf), shape)


def check_shards_call(op: str, order: str) -> None:
    """The op and order of a reduce-scatter or all-gather plan (``plans.make_shards_plan``)."""
    if op not in ("reduce_scatter", "all_gather"):
        raise UsageError(f"op: {op!r} is not 'reduce_scatter' or 'all_gather'")
    if not isinstance(order, str) or order not in ALL_GATHER_ORDERS:
        raise UsageError(f"order: {order!r} is not one of {list(ALL_GATHER_ORDERS)}")
    if op == "reduce_scatter" and order != "rotated":
        raise UsageError(
            f"order: {order!r} exists only for the all-gather; the reduce-scatter reads every peer at once"
        )
