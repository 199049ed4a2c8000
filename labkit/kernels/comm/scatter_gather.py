"""Reduce-scatter and all-gather on their own (each half of a two-shot all-reduce).

reduce-scatter: every rank's buffer holds W x S elements; rank r's output is the sum over ranks
of elements [r S, (r+1) S). Reads (W-1) x S over NVLink.
all-gather: every rank's buffer holds S elements; every output is the W buffers concatenated.
Reads (W-1) x S over NVLink, one peer after another, each rank starting at a different peer
(ROTATE=False: every rank in the same order 0, 1, ..., the naive order lab 02 times beside it).

Both: a start barrier (inputs written) and an end barrier (no buffer reused while a peer reads).
"""

import triton
import triton.language as tl

from labkit.kernels.comm.one_shot import copy_block, for_each_block, peer_ptr, reduce_block
from labkit.kernels.comm.signals import block_barrier, slow_down


@triton.jit
def reduce_scatter_kernel(
    data_ptrs,  # int64 [W]: every rank's buffer (W x S elements each)
    pad_ptrs,  # int64 [W]: every rank's signal pad
    out_ptr,  # *T [S]: this rank's reduced shard
    shard,  # S
    rank,
    WORLD: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEM: tl.constexpr,
    END_BARRIER: tl.constexpr,
    DELAY: tl.constexpr = 0,  # lab 06's stress: volatile loads on SLOW_RANK before the peer reads (0: none)
    SLOW_RANK: tl.constexpr = 0,  # the rank DELAY slows
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ELEM = out_ptr.dtype.element_ty
    block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
    slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)
    # [0, S) of the output from [r S, (r+1) S) of every buffer
    for_each_block(0, shard, pid, nprog, reduce_block, (data_ptrs, rank * shard, out_ptr, WORLD, ELEM, BLOCK), BLOCK, 0)
    if END_BARRIER:
        block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)


@triton.jit
def all_gather_kernel(
    data_ptrs,  # int64 [W]: every rank's buffer (S elements each)
    pad_ptrs,  # int64 [W]: every rank's signal pad
    out_ptr,  # *T [W x S]: every rank's buffer, concatenated
    shard,  # S
    rank,
    WORLD: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEM: tl.constexpr,
    END_BARRIER: tl.constexpr,
    DELAY: tl.constexpr = 0,  # lab 06's stress: volatile loads on SLOW_RANK before the peer reads (0: none)
    SLOW_RANK: tl.constexpr = 0,  # the rank DELAY slows
    ROTATE: tl.constexpr = True,  # False: the naive order, every rank reads shard 0 first (compiled away when True)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ELEM = out_ptr.dtype.element_ty
    block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
    slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)
    for k in tl.static_range(WORLD):
        # rank r starts with its own shard, then r+1, ...: at any moment every GPU is read by
        # one peer. In the order 0, 1, ... all W ranks would read GPU 0 first, GPU 1 next: one
        # GPU's links busy, the others idle. On 4 H200 the naive order is the slower at every size
        # measured, most at the largest (reference/h200x4/collectives.json, kind "gather_order",
        # field ratio_to_rotated).
        if ROTATE:
            s = (rank + k) % WORLD
        else:  # the naive order: at step k every rank reads rank k's shard, all at once
            s = k
        src = peer_ptr(data_ptrs, s, ELEM)
        for_each_block(0, shard, pid, nprog, copy_block, (src, out_ptr, s, shard), BLOCK, 0)
    if END_BARRIER:
        block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
