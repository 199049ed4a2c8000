"""One-shot all-reduce: every rank reads every peer's whole buffer and sums it.

Data movement per rank: reads (W-1) x N elements over NVLink, writes N locally. One round trip
of synchronisation (the start barrier) plus the end barrier; the best choice when latency, not
bandwidth, dominates (small messages).

Barrier semantics:
* start: program b of every rank has entered, so every rank's input (written before this
  kernel, in stream order) is visible to program b here (release/acquire at system scope).
* end: program b of every rank has finished reading. Without it a fast rank returns, its
  caller writes the next input into its buffer, and a slow peer still summing reads the new
  data (the ``no_end_barrier`` variant).

The device helpers the other collectives' kernels share live here too: ``peer_ptr``,
``sum_peers``, and ``for_each_block``, the one loop over a program's share of a range (full
blocks unmasked, the tail masked), with the bodies ``reduce_block`` and ``copy_block``.
"""

import triton
import triton.language as tl

from labkit.kernels.comm.signals import block_barrier, slow_down


@triton.jit
def peer_ptr(data_ptrs, r, ELEM: tl.constexpr):
    """Rank r's buffer as a typed pointer; symm.empty checked it is 16-byte aligned, which lets
    Triton use 16-byte vector loads on it."""
    return tl.multiple_of(tl.load(data_ptrs + r).to(tl.pointer_type(ELEM)), 16)


@triton.jit
def sum_peers(
    data_ptrs, offs, mask, WORLD: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr
):
    """fp32 sum over all ranks of elements ``offs`` of their buffers."""
    acc = tl.zeros([BLOCK], tl.float32)
    for r in tl.static_range(WORLD):
        p = peer_ptr(data_ptrs, r, ELEM)
        if MASKED:
            acc += tl.load(p + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            acc += tl.load(p + offs).to(tl.float32)
    return acc


@triton.jit
def for_each_block(lo, hi, pid, nprog, BODY: tl.constexpr, body_args, BLOCK: tl.constexpr, ALIGN: tl.constexpr):
    """Program ``pid`` of ``nprog``'s share of elements [lo, hi) (every collective's loop over its
    shard): blocks of BLOCK, its first at lo + pid x BLOCK, then one in every ``nprog``, and
    ``BODY(offs, rel, mask, MASKED, *body_args)`` on each, ``rel`` = ``offs - lo`` (the
    positions inside [lo, hi); a body that does not use it costs nothing). A full block runs
    unmasked (mask None, MASKED False: vectorisable); only the tail is masked to ``offs < hi``.
    ``ALIGN``: the multiple every block's start is declared to be (``tl.multiple_of``: vector
    loads and stores where the addresses allow them); 0 declares nothing. The kernel passes
    ``pid`` and ``nprog``, read once at its start: where they are read changes the code."""
    for start in range(lo + pid * BLOCK, hi, nprog * BLOCK):
        if ALIGN > 0:
            offs = tl.multiple_of(start, ALIGN) + tl.arange(0, BLOCK)
        else:
            offs = start + tl.arange(0, BLOCK)
        rel = offs - lo
        if start + BLOCK <= hi:
            BODY(offs, rel, None, False, *body_args)
        else:
            BODY(offs, rel, offs < hi, True, *body_args)


@triton.jit
def reduce_block(
    offs, rel, mask, MASKED: tl.constexpr, data_ptrs, src_offset, dst, WORLD: tl.constexpr, ELEM: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """A ``for_each_block`` body: ``dst[offs]`` = the sum over ranks of ``src_offset + offs``."""
    acc = sum_peers(data_ptrs, src_offset + offs, mask, WORLD, ELEM, BLOCK, MASKED)
    tl.store(dst + offs, acc.to(ELEM), mask=mask)


@triton.jit
def copy_block(offs, rel, mask, MASKED: tl.constexpr, src, dst, row, row_len):
    """A ``for_each_block`` body: ``dst[row x row_len + offs] = src[offs]`` (row 0 of length 0:
    ``dst[offs]``). The row's start is computed here, next to its use, not by the caller: where
    it sits changes the generated code."""
    tl.store(dst + row * row_len + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def one_shot_all_reduce_kernel(
    data_ptrs,  # int64 [W]: every rank's symmetric buffer (N elements each)
    pad_ptrs,  # int64 [W]: every rank's signal pad
    out_ptr,  # *T [N]: this rank's result (local memory)
    n,  # N: elements per rank
    rank,  # this rank
    WORLD: tl.constexpr,  # number of ranks (2..8)
    MAX_BLOCKS: tl.constexpr,  # rows of the signal pad (programs allowed)
    BLOCK: tl.constexpr,  # elements per program per step
    SEM: tl.constexpr,  # 0 acquire/release; 1 relaxed (broken); 2 gpu scope (broken)
    END_BARRIER: tl.constexpr,  # False: the broken variant without the end barrier
    DELAY: tl.constexpr = 0,  # lab 06's stress: volatile loads on SLOW_RANK before the reads (0: none)
    SLOW_RANK: tl.constexpr = 0,  # the rank DELAY slows
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ELEM = out_ptr.dtype.element_ty
    block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
    slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)
    for_each_block(0, n, pid, nprog, reduce_block, (data_ptrs, 0, out_ptr, WORLD, ELEM, BLOCK), BLOCK, BLOCK)
    if END_BARRIER:
        block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
