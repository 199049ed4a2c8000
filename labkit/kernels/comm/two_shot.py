"""Two-shot all-reduce = reduce-scatter then all-gather, in one kernel.

Rank r owns shard r (``shard`` elements; the last shard may be short). Shot one: rank r reads
shard r from every peer, sums, and writes the sum into shard r of its OWN buffer (in place:
no peer reads shard r of rank r's buffer in this phase, each reads only its own shard). Shot
two: rank r copies shard s from rank s's buffer, for every s, into its output.

Data movement per rank: reads 2 (W-1)/W x N elements over NVLink instead of one-shot's (W-1) x N:
the bandwidth choice for large messages. Three barriers:
* start: every rank's input is in its buffer (as one-shot);
* middle: every rank has written its reduced shard (program b waits for program b of every
  rank: the same grid and the same chunking on every rank make chunk ownership identical);
* end: nobody overwrites its buffer while a peer may still copy a reduced shard out of it.

``two_shot_all_reduce_in_place_kernel`` is the in-place form (``all_reduce(buf, out=buf.tensor)``):
each rank pushes its reduced shard into every buffer instead of the peers pulling it, two
barriers instead of three and no copy out. ``two_shot_push_into_kernel`` pushes the same way into
a second symmetric buffer (``into.all_reduce_into``), out of place.
"""

import triton
import triton.language as tl

from labkit.kernels.comm.one_shot import copy_block, for_each_block, peer_ptr, reduce_block, sum_peers
from labkit.kernels.comm.signals import block_barrier, slow_down


@triton.jit
def two_shot_all_reduce_kernel(
    data_ptrs,  # int64 [W]: every rank's symmetric buffer (N elements each)
    pad_ptrs,  # int64 [W]: every rank's signal pad
    out_ptr,  # *T [N]: this rank's result (local memory)
    n,  # N: elements per rank
    shard_blocks,  # shard size in BLOCKs (elements per shard / BLOCK); ranks past N own nothing
    rank,  # this rank
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
    mine = peer_ptr(data_ptrs, rank, ELEM)
    # shard is passed in BLOCKs: the compiler then knows every offset below is a multiple of
    # BLOCK (16-byte vector loads) whatever the rank, the peer or the size (measured: with the
    # shard passed in elements and a tl.multiple_of hint, the PTX had only 2-byte loads)
    shard = shard_blocks * BLOCK
    block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
    lo = rank * shard
    hi = tl.minimum(lo + shard, n)
    # shot one: reduce my shard, in place
    for_each_block(lo, hi, pid, nprog, reduce_block, (data_ptrs, 0, mine, WORLD, ELEM, BLOCK), BLOCK, BLOCK)
    block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
    slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)  # before the reads the end barrier protects
    for k in tl.static_range(WORLD):  # shot two: gather every reduced shard
        s = (rank + k) % WORLD  # each rank starts at a different peer (see all_gather_kernel)
        src = peer_ptr(data_ptrs, s, ELEM)
        s_lo = s * shard
        s_hi = tl.minimum(s_lo + shard, n)
        for_each_block(s_lo, s_hi, pid, nprog, copy_block, (src, out_ptr, 0, 0), BLOCK, BLOCK)
    if END_BARRIER:
        block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)


@triton.jit
def store_everywhere(data_ptrs, offs, value, mask, rank, WORLD: tl.constexpr, ELEM: tl.constexpr, MASKED: tl.constexpr):
    """Store ``value`` at ``offs`` of every rank's buffer (the push of the in-place kernels),
    starting with this rank's and going round, so no buffer is written by all ranks at once."""
    for k in tl.static_range(WORLD):
        dst = peer_ptr(data_ptrs, (rank + k) % WORLD, ELEM) + offs
        if MASKED:
            tl.store(dst, value, mask=mask)
        else:
            tl.store(dst, value)


@triton.jit
def push_block(
    offs, rel, mask, MASKED: tl.constexpr, data_ptrs, dest_ptrs, rank, WORLD: tl.constexpr, ELEM: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """A ``for_each_block`` body: the sum over ``data_ptrs`` of ``offs``, stored at ``offs`` of
    every ``dest_ptrs`` buffer."""
    acc = sum_peers(data_ptrs, offs, mask, WORLD, ELEM, BLOCK, MASKED).to(ELEM)
    store_everywhere(dest_ptrs, offs, acc, mask, rank, WORLD, ELEM, MASKED)


@triton.jit
def two_shot_all_reduce_in_place_kernel(
    data_ptrs,  # int64 [W]: every rank's symmetric buffer (N elements each)
    pad_ptrs,  # int64 [W]: every rank's signal pad
    x_ptr,  # *T [N]: this rank's buffer: input, then the result
    n,  # N: elements per rank
    shard_blocks,  # shard size in BLOCKs, as in two_shot_all_reduce_kernel
    rank,  # this rank
    WORLD: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEM: tl.constexpr,
    END_BARRIER: tl.constexpr,
    DELAY: tl.constexpr = 0,  # lab 06's stress: volatile loads on SLOW_RANK before the peer reads (0: none)
    SLOW_RANK: tl.constexpr = 0,  # the rank DELAY slows
):
    """Two-shot in place, the result pushed: rank r sums shard r over all buffers (loads over
    NVLink) and stores the sum into shard r of EVERY rank's buffer (stores over NVLink), so no
    second gather phase, no middle barrier and no copy out are needed: the buffers hold the
    result when the kernel ends. Legal because shard r of any buffer is touched by rank r alone:
    program b of rank r has loaded a chunk from every buffer before it overwrites that chunk
    (the stores depend on the loaded values), and no other rank ever reads shard r.

    Two barriers:
    * start: every rank's input is in its buffer, and every rank's previous work on its buffer
      (the caller reading the last result) is finished, since its kernel has started;
    * end: program b of every rank has pushed its chunks into my buffer; without it a fast
      rank returns and its caller reads (or overwrites) a buffer peers are still writing.

    Data movement per rank: (W-1)/W x N loaded and (W-1)/W x N stored over NVLink, as the
    out-of-place kernel loads 2 (W-1)/W x N; PyTorch's ``two_shot_all_reduce_`` moves data the
    same way."""
    reduce_and_push(
        data_ptrs, pad_ptrs, data_ptrs, x_ptr, n, shard_blocks, rank,
        WORLD, MAX_BLOCKS, BLOCK, SEM, END_BARRIER, DELAY, SLOW_RANK,
    )  # fmt: skip


@triton.jit
def two_shot_push_into_kernel(
    data_ptrs,  # int64 [W]: every rank's symmetric input buffer (N elements each); only read
    pad_ptrs,  # int64 [W]: every rank's signal pad (the input buffer's)
    out_ptrs,  # int64 [W]: every rank's symmetric output (N elements each): where the sums go
    x_ptr,  # *T [N]: this rank's input (its element type is the kernel's)
    n,  # N: elements per rank
    shard_blocks,  # shard size in BLOCKs, as in two_shot_all_reduce_kernel
    rank,  # this rank
    WORLD: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEM: tl.constexpr,
    END_BARRIER: tl.constexpr,
):
    """The in-place kernel's protocol, out of place into a symmetric output
    (``into.all_reduce_into`` below the copy engines' sizes): rank r sums shard r over all
    inputs and stores the sum into shard r of EVERY rank's output. The inputs are only read, so
    shard r of every output is written by rank r alone, once per call. The same two barriers:
    start, every rank's earlier work on its output (its caller reading the last result) is
    finished; end, every peer has pushed into my output."""
    reduce_and_push(
        data_ptrs, pad_ptrs, out_ptrs, x_ptr, n, shard_blocks, rank,
        WORLD, MAX_BLOCKS, BLOCK, SEM, END_BARRIER, 0, 0,
    )  # fmt: skip


@triton.jit
def reduce_and_push(
    data_ptrs,
    pad_ptrs,
    dest_ptrs,  # int64 [W]: the buffers the sums go to (data_ptrs in place)
    x_ptr,
    n,
    shard_blocks,
    rank,
    WORLD: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEM: tl.constexpr,
    END_BARRIER: tl.constexpr,
    DELAY: tl.constexpr,
    SLOW_RANK: tl.constexpr,
):
    """The body of both pushed two-shot kernels: start barrier, sum shard r over every
    ``data_ptrs`` buffer, store the sum into shard r of every ``dest_ptrs`` buffer, end barrier."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ELEM = x_ptr.dtype.element_ty
    shard = shard_blocks * BLOCK
    block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
    slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)
    lo = rank * shard
    hi = tl.minimum(lo + shard, n)
    for_each_block(lo, hi, pid, nprog, push_block, (data_ptrs, dest_ptrs, rank, WORLD, ELEM, BLOCK), BLOCK, BLOCK)
    if END_BARRIER:
        block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)


@triton.jit
def ce_block(
    offs, rel, mask, MASKED: tl.constexpr, mine, received, shard, out_ptrs, rank, WORLD: tl.constexpr,
    ELEM: tl.constexpr,
):  # fmt: skip
    """A ``for_each_block`` body of ``two_shot_ce_kernel``: my shard's ``offs`` plus the W-1
    received copies of them (slot s of ``received``: rank s's), stored at ``offs`` of every
    ``out_ptrs`` buffer."""
    # rel: the position inside the shard, where each slot of the workspace holds it
    if MASKED:
        acc = tl.load(mine + offs, mask=mask, other=0.0).to(tl.float32)
        for k in tl.static_range(1, WORLD):
            acc += tl.load(received + ((rank + k) % WORLD) * shard + rel, mask=mask, other=0.0).to(tl.float32)
    else:
        acc = tl.load(mine + offs).to(tl.float32)
        for k in tl.static_range(1, WORLD):
            acc += tl.load(received + ((rank + k) % WORLD) * shard + rel).to(tl.float32)
    store_everywhere(out_ptrs, offs, acc.to(ELEM), mask, rank, WORLD, ELEM, MASKED)


@triton.jit
def two_shot_ce_kernel(
    data_ptrs,  # int64 [W]: every rank's symmetric buffer (N elements each)
    pad_ptrs,  # int64 [W]: every rank's signal pad
    out_ptrs,  # int64 [W]: where the sums go on every rank: data_ptrs in place, or
    #   a symmetric output's (``into.all_reduce_into``: out of place)
    x_ptr,  # *T [N]: this rank's buffer: input (and the result, in place)
    received_ptr,  # *T [W x S]: this rank's workspace; slot s holds rank s's shard r
    n,  # N: elements per rank
    shard_units,  # S / UNIT: shard size in units of UNIT elements
    rank,  # this rank
    WORLD: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEM: tl.constexpr,
    END_BARRIER: tl.constexpr,
    UNIT: tl.constexpr,  # symm.WORKSPACE_UNIT: shards start at multiples of it (16-byte aligned)
    DELAY: tl.constexpr = 0,  # lab 06's stress: volatile loads on SLOW_RANK before the reads (0: none)
    SLOW_RANK: tl.constexpr = 0,  # the rank DELAY slows
):
    """The second half of ``two_shot_ce`` (``collectives._two_shot_ce`` does the first: the
    copy engines have put shard r of every peer's input into slot s of this rank's workspace).
    Rank r sums its own shard r and the W-1 received copies, all LOCAL reads, and stores the sum
    into shard r of every rank's buffer (stores over NVLink, as the in-place two-shot), or of
    every rank's symmetric output when ``out_ptrs`` are another buffer's (out of place: the inputs
    are only read).

    Barriers:
    * start: program b of every rank has started, so every peer's copies into my workspace,
      queued before its kernel, have completed; and shard r of every peer's buffer has been
      copied out (by that peer's copy engine), so it may be overwritten;
    * end: every peer's program b has pushed into my buffer (or output), as in the in-place two-shot."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ELEM = x_ptr.dtype.element_ty
    # both 16-byte aligned (symm.empty checks it); said explicitly so that the compiler emits
    # vector loads whatever it was told about the arguments
    mine = peer_ptr(data_ptrs, rank, ELEM)
    received = tl.multiple_of(received_ptr, 16)
    shard = shard_units * UNIT
    block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
    slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)
    lo = rank * shard
    hi = tl.minimum(lo + shard, n)
    for_each_block(lo, hi, pid, nprog, ce_block, (mine, received, shard, out_ptrs, rank, WORLD, ELEM), BLOCK, UNIT)
    if END_BARRIER:
        block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
