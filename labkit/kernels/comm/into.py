"""Out-of-place all-reduce into a symmetric output: ``all_reduce_into(buf, out)``.

    buf = symm.empty(n, torch.bfloat16, device=dev, workspace=True)   # the input, every rank
    out = symm.empty(n, torch.bfloat16, device=dev)                   # the result, every rank
    buf.tensor.copy_(x)
    y = all_reduce_into(buf, out)      # out.tensor: the sum; buf.tensor: still x

Why: at 256 MiB out of place, the best of lab 02's kernels that LOAD the peers' data, the
one-shot, reached 323-331 GB/s busbw on 2x H200 (the pulled two-shot 301:
``reference/h200x2/collectives.json``), near what
the links carry for loads (333 GB/s, ``labkit bench links``), while the in-place ``two_shot_ce``
reached 361 GB/s: its first shot is done by the copy engines, its second STORES each reduced
shard into every buffer. Out of place, that second shot needs somewhere on every rank to store
into: an output that is itself a symmetric buffer. A plain-tensor ``out`` keeps working through
``collectives.all_reduce``; this is the other way, when the caller can keep its result in
symmetric memory.

The steps (``collectives._two_shot_ce``, with the stores aimed at ``out``):

1. a one-program barrier on ``buf``'s pad: every peer has finished its previous call on ``buf``,
   so nobody still reads the workspace slot this rank is about to overwrite;
2. the copy engines: for every peer s, shard s of this rank's input -> slot r of rank s's
   workspace (``Tensor.copy_`` between mapped buffers);
3. ``two_shot.two_shot_ce_kernel`` with ``out_ptrs`` = ``out``'s: rank r sums shard r of its own
   input and the W-1 received copies (local reads only) and stores the sum into shard r of EVERY
   rank's ``out`` (stores over NVLink).

Barrier semantics of step 3 (on ``buf``'s signal pad):

* start: program b of every rank has started, so every peer's copies into my workspace, queued
  before its kernel, have completed; and every rank's earlier work in stream order (its caller
  reading the previous result in ``out``) is finished before any peer stores the new one there;
* end: program b of every rank has pushed its chunks into my ``out``; without it a fast rank
  returns and its caller reads an ``out`` that peers are still writing.

Why it is correct: shard r of every ``out`` is written by rank r alone, once per call, between
the start and end barriers of that call; the inputs are only read (by the owner's copy engine
and kernel), so ``buf.tensor`` still holds the input afterwards. Data movement per rank, as the
in-place ``two_shot_ce``: (W-1)/W x N sent by the copy engines, (W-1)/W x N stored over NVLink.

Requirements: ``buf`` made with ``workspace=True``; ``out`` another symmetric buffer of the same
world, shape, dtype and device; every rank calls with the same buffers, ``blocks`` and
``config`` (program b meets program b of every peer). The launches are plain kernel launches
and copies on the current stream of the buffers' device: a CUDA graph can capture them. They are
made on the first call and kept on ``buf`` per output buffer, ``blocks`` and ``config`` (the
output held weakly: a new output buffer gets its own), so that later calls launch through
Triton's compiled launcher with the checks alone before them.

Tested on the CPU tier (processes over shared memory, the Triton interpreter) against an fp64
sum with fresh inputs on every call and a late rank; the GPU busbw is the sweep's
(``labkit bench collectives``, kind "into").
"""

from __future__ import annotations

import weakref

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import plan, symm
from labkit.kernels.comm.symm import SymmBuffer, check_buffer
from labkit.workbench.errors import UsageError
from labkit.workbench.guard import on_device


def check_into(buf, out, blocks=None, config=None) -> tuple[SymmBuffer, SymmBuffer]:
    """The argument checks of ``all_reduce_into``; errors name the argument and what was expected."""
    if blocks is not None and (not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 1):
        raise ValueError(f"blocks: expected a positive int, got {blocks!r}")
    if config is not None and not isinstance(config, C.LaunchConfig):
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
    C._out("out", out.tensor, tuple(buf.tensor.shape), buf.tensor, buf)
    if buf.workspace is None:
        raise UsageError(
            "buf: has no workspace for the copy engines to fill; allocate it with symm.empty(..., workspace=True)"
        )
    return buf, out


def into_steps(
    buf: SymmBuffer,
    out: SymmBuffer,
    blocks: int | None = None,
    config: C.LaunchConfig | None = None,
    fast: bool = False,
) -> tuple:
    """The launches of a call (checked buffers): barrier, copies, reduce-and-push. Every rank
    must make them with the same ``blocks`` and ``config``. fast: the kernels launch through
    Triton's compiled launcher after their first launch (``plan.KernelLaunch``), for steps kept
    and launched again."""
    launch = C.launch_common(buf, "correct", "two_shot_ce", config)
    steps = C._two_shot_ce(buf, buf.tensor.numel(), launch, blocks, out_ptrs=out.data_ptrs)
    for s in steps:
        if hasattr(s, "armable"):
            s.armable = fast  # launched once: no compiled-launcher fast path to prepare
    return steps


def all_reduce_into(buf, out, *, blocks: int | None = None, config: C.LaunchConfig | None = None) -> torch.Tensor:
    """Sum of ``buf.tensor`` over all ranks into ``out.tensor`` on every rank, out of place
    (``buf.tensor`` unchanged); returns ``out.tensor``. Collective: every rank calls it with
    its buffers of the same two allocations. blocks, config: as for ``collectives.all_reduce``.
    Ranks whose buffers or arguments differ get the same UsageError on every rank (``agree``)."""
    buf, out = check_into(buf, out, blocks, config)
    agree(buf, out, blocks, config)
    steps = _kept_steps(buf, out, blocks, config) if plan.CACHE_PLANS else into_steps(buf, out, blocks, config)
    with on_device(buf.tensor.device):
        for step in steps:
            step(None)
    return out.tensor


def agree(buf: SymmBuffer, out: SymmBuffer, blocks, config) -> None:
    """Every rank makes the same call: the first time ``buf`` meets these arguments the ranks
    exchange them (``symm.agree``, one small collective) and every rank raises the same UsageError
    naming what differs. The rule and its limits are ``plan.agree``'s: remembered on ``buf`` once
    agreed (later calls exchange nothing), skipped during CUDA-graph capture. Without it, ranks
    giving different ``blocks`` or ``config`` meet in barriers of different programs and wait
    until the world's timeout; ranks giving buffers of different sizes read past a peer's."""
    fields = {
        "buf": f"allocation #{buf.serial}, {tuple(buf.tensor.shape)} {str(buf.tensor.dtype).replace('torch.', '')}",
        "out": f"allocation #{out.serial}, {tuple(out.tensor.shape)} {str(out.tensor.dtype).replace('torch.', '')}",
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


def _kept_steps(buf: SymmBuffer, out: SymmBuffer, blocks, config) -> tuple:
    """The launches kept on ``buf`` for this ``out``, ``blocks`` and ``config`` (made on the first
    call: at 256 MiB, rebuilding them and launching through Triton's Python path every call would
    add host time before the first launch, which CUDA events count). ``out`` is held weakly and
    compared by identity: a new output buffer, even at a reused address, gets new launches."""
    key = (id(out), blocks, config)
    kept = buf._into.get(key)
    if kept is None or kept[0]() is not out:
        if len(buf._into) >= plan.MAX_PLANS:
            buf._into.clear()
        kept = (weakref.ref(out), into_steps(buf, out, blocks, config, fast=True))
        buf._into[key] = kept
    return kept[1]
