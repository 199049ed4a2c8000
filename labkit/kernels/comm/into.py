"""Out-of-place all-reduce into a symmetric output: ``all_reduce_into(buf, out)``.

    buf = symm.empty(n, torch.bfloat16, device=dev, workspace=True)   # the input, every rank
    out = symm.empty(n, torch.bfloat16, device=dev)                   # the result, every rank
    buf.tensor.copy_(x)
    y = all_reduce_into(buf, out)      # out.tensor: the sum; buf.tensor: still x

Why: out of place into a plain tensor, the second shot of a two-shot must be PULLED (each rank
loads every reduced shard from its owner, behind a third barrier), while in place each rank
PUSHES its reduced shard into every buffer (stores over NVLink, two barriers). Out of place, the
push needs somewhere on every rank to store into: an output that is itself a symmetric buffer.
At 256 MiB the in-place ``two_shot_ce``, whose first shot the copy engines do, passes the best
loading kernel out of place in bus bandwidth (``reference/h200x2/collectives.json``, kind
"sweep"; lab 02 renders the numbers). A plain-tensor ``out`` keeps working through
``collectives.all_reduce``; this is the other way, when the caller can keep its result in
symmetric memory.

Two algorithms, the in-place ones with the stores aimed at ``out`` (``algorithm="auto"`` takes
``two_shot_ce`` from the table's ``ce_from`` on (``chooser.choose_in_place``) when ``buf`` has a workspace, as the
in-place chooser does, else ``two_shot``):

* ``"two_shot"``: ``two_shot.two_shot_push_into_kernel``: rank r sums shard r over every input
  (loads over NVLink) and stores the sum into shard r of EVERY rank's ``out``.
* ``"two_shot_ce"`` (``chooser.two_shot_ce_steps``; ``buf`` made with ``workspace=True``):

  1. a one-program barrier on ``buf``'s pad: every peer has finished its previous call on ``buf``,
     so nobody still reads the workspace slot this rank is about to overwrite;
  2. the copy engines: for every peer s, shard s of this rank's input -> slot r of rank s's
     workspace (``Tensor.copy_`` between mapped buffers);
  3. ``two_shot.two_shot_ce_kernel`` with ``out_ptrs`` = ``out``'s: rank r sums shard r of its own
     input and the W-1 received copies (local reads only) and stores the sum into shard r of
     EVERY rank's ``out`` (stores over NVLink).

Barrier semantics of either kernel (on ``buf``'s signal pad):

* start: program b of every rank has started, so every peer's copies into my workspace, queued
  before its kernel, have completed; and every rank's earlier work in stream order (its caller
  reading the previous result in ``out``) is finished before any peer stores the new one there;
* end: program b of every rank has pushed its chunks into my ``out``; without it a fast rank
  returns and its caller reads an ``out`` that peers are still writing.

Why it is correct: shard r of every ``out`` is written by rank r alone, once per call, between
the start and end barriers of that call; the inputs are only read (by the owner's copy engine
and kernel, or by the owner's loads), so ``buf.tensor`` still holds the input afterwards. Data
movement per rank, as the in-place kernels: (W-1)/W x N moved for the first shot (loaded, or
sent by the copy engines), (W-1)/W x N stored over NVLink.

Requirements: ``out`` another symmetric buffer of the same world, shape, dtype and device;
``two_shot_ce`` needs ``buf`` made with ``workspace=True``; every rank calls with the same
buffers, ``algorithm``, ``blocks`` and ``config`` (program b meets program b of every peer). The
launches are plain kernel launches and copies on the current stream of the buffers' device: a
CUDA graph can capture them. They are made on the first call and kept on ``buf`` per output
buffer, algorithm, ``blocks`` and ``config`` (the output held weakly: a new output buffer gets its
own), so that later calls launch through Triton's compiled launcher with the checks alone
before them.

Tested on the CPU tier (processes over shared memory, the Triton interpreter) against an fp64
sum with fresh inputs on every call and a late rank, both algorithms; the GPU busbw is the
sweep's (``labkit bench collectives``, kind "into").
"""

from __future__ import annotations

import weakref

import torch

from labkit.kernels.comm import chooser, plan, symm, tables, two_shot
from labkit.kernels.comm.checks import check_out
from labkit.kernels.comm.chooser import LaunchConfig
from labkit.kernels.comm.symm import SymmBuffer, check_buffer
from labkit.workbench.errors import UsageError
from labkit.workbench.guard import on_device

#: the algorithms ``all_reduce_into`` takes (besides "auto")
ALGORITHMS = ("two_shot", "two_shot_ce")


def check_into(buf, out, blocks=None, config=None, algorithm: str = "auto") -> tuple[SymmBuffer, SymmBuffer, str]:
    """The argument checks of ``all_reduce_into``; errors name the argument and what was expected.
    Returns the buffers and the algorithm ("auto" resolved)."""
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS + ("auto",):
        raise UsageError(f"algorithm: {algorithm!r} is not one of {ALGORITHMS} or 'auto'")
    if blocks is not None and (not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 1):
        raise ValueError(f"blocks: expected a positive int, got {blocks!r}")
    if config is not None and not isinstance(config, LaunchConfig):
        raise TypeError(f"config: expected a labkit.kernels.comm.collectives.LaunchConfig, got {type(config).__name__}")
    buf = check_buffer("buf", buf)
    out = check_buffer("out", out)
    if (out.world_size, out.rank) != (buf.world_size, buf.rank):
        raise UsageError(
            f"out: belongs to rank {out.rank} of a world of {out.world_size}; buf to rank {buf.rank} "
            f"of {buf.world_size}: allocate both with the same ranks"
        )
    # the checks of any all-reduce output: device, dtype, shape, and no memory shared with a
    # buffer the kernel reads (``out`` being ``buf`` included)
    check_out("out", out.tensor, tuple(buf.tensor.shape), buf.tensor, buf)
    if algorithm == "auto":
        nbytes = buf.tensor.numel() * buf.tensor.element_size()
        algorithm = chooser.choose_in_place(
            nbytes, buf.world_size, buf.workspace is not None, gpu=tables.gpu_name(buf.tensor.device)
        )
    if algorithm == "two_shot_ce" and buf.workspace is None:
        raise UsageError(
            "buf: has no workspace for the copy engines to fill (algorithm 'two_shot_ce'); allocate it with "
            "symm.empty(..., workspace=True), or pass algorithm='two_shot'"
        )
    return buf, out, algorithm


def into_steps(
    buf: SymmBuffer,
    out: SymmBuffer,
    algorithm: str,
    blocks: int | None = None,
    config: LaunchConfig | None = None,
    fast: bool = False,
) -> tuple:
    """The launches of a call (checked buffers, ``algorithm`` resolved): reduce-and-push
    ("two_shot"), or barrier, copies, reduce-and-push ("two_shot_ce"). Every rank must make them
    with the same algorithm, ``blocks`` and ``config``. fast: the kernels launch through Triton's
    compiled launcher after their first launch (``plan.KernelLaunch``), for steps kept and
    launched again."""
    n = buf.tensor.numel()
    launch = chooser.launch_common(buf, "correct", algorithm, config, in_place=True)  # the in-place kernels' launch
    if algorithm == "two_shot":
        shard_blocks, programs = chooser.two_shot_grid(buf, n, launch, blocks)
        steps = (
            plan.KernelLaunch(
                two_shot.two_shot_push_into_kernel,
                (programs,),
                (buf.data_ptrs, buf.pad_ptrs, out.data_ptrs, buf.tensor, n, shard_blocks, buf.rank),
                launch.constexprs,
                buf.tensor.device,
            ),
        )
    else:
        steps = chooser.two_shot_ce_steps(buf, n, launch, blocks, out_ptrs=out.data_ptrs)
    for s in steps:
        if hasattr(s, "armable"):
            s.armable = fast  # launched once: no compiled-launcher fast path to prepare
    return steps


def all_reduce_into(
    buf,
    out,
    *,
    algorithm: str = "auto",
    blocks: int | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Sum of ``buf.tensor`` over all ranks into ``out.tensor`` on every rank, out of place
    (``buf.tensor`` unchanged); returns ``out.tensor``. Collective: every rank calls it with
    its buffers of the same two allocations. algorithm: "two_shot", "two_shot_ce" (``buf`` made
    with a workspace) or "auto" (the module's docstring); blocks, config: as for
    ``collectives.all_reduce``. Ranks whose buffers or arguments differ get the same UsageError
    on every rank (``agree``)."""
    buf, out, algorithm = check_into(buf, out, blocks, config, algorithm)
    agree(buf, out, algorithm, blocks, config)
    if plan.CACHE_PLANS:
        steps = _kept_steps(buf, out, algorithm, blocks, config)
    else:
        steps = into_steps(buf, out, algorithm, blocks, config)
    with on_device(buf.tensor.device):
        for step in steps:
            step(None)
    return out.tensor


def agree(buf: SymmBuffer, out: SymmBuffer, algorithm: str, blocks, config) -> None:
    """Every rank makes the same call: the first time ``buf`` meets these arguments the ranks
    exchange them (``symm.agree``, one small collective) and every rank raises the same UsageError
    naming what differs. The rule and its limits are ``plan.agree``'s: remembered on ``buf`` once
    agreed (later calls exchange nothing), skipped during CUDA-graph capture. Without it, ranks
    giving different ``blocks`` or ``config`` meet in barriers of different programs and wait
    until the world's timeout; ranks giving buffers of different sizes read past a peer's."""
    fields = {
        "buf": f"allocation #{buf.serial}, {tuple(buf.tensor.shape)} {str(buf.tensor.dtype).replace('torch.', '')}",
        "out": f"allocation #{out.serial}, {tuple(out.tensor.shape)} {str(out.tensor.dtype).replace('torch.', '')}",
        "algorithm": algorithm,
        "blocks": repr(blocks),
        "config": repr(config),
    }
    key = ("all_reduce_into", *fields.items())
    if key in buf._agreed:
        return
    with on_device(buf.tensor.device):
        if buf.tensor.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return
        symm.agree("all_reduce_into", fields, plan.CONTRACT)
    buf._agreed.add(key)


def _kept_steps(buf: SymmBuffer, out: SymmBuffer, algorithm: str, blocks, config) -> tuple:
    """The launches kept on ``buf`` for this ``out``, algorithm, ``blocks`` and ``config`` (made on the first
    call: at 256 MiB, rebuilding them and launching through Triton's Python path every call would
    add host time before the first launch, which CUDA events count). ``out`` is held weakly and
    compared by identity: a new output buffer, even at a reused address, gets new launches."""
    key = (id(out), algorithm, blocks, config)
    kept = buf._into.get(key)
    if kept is None or kept[0]() is not out:
        if len(buf._into) >= plan.MAX_PLANS:
            buf._into.clear()
        kept = (weakref.ref(out), into_steps(buf, out, algorithm, blocks, config, fast=True))
        buf._into[key] = kept
    return kept[1]
