"""Double-binary-tree all-reduce (the algorithm NCCL uses across nodes), over symmetric memory.

Two binary trees over the ranks: tree A is the heap order (children of i: 2i+1, 2i+2), tree B
its mirror (rank r plays node W-1-r), so a rank that is a leaf in one is (mostly) interior in
the other. Half the elements go up and down tree A, half tree B, on different programs.

Per tree, per program, point-to-point signals instead of barriers:
* up (channel 1): a node waits for each child's "partial ready" signal, adds the children's
  partial sums (read from their buffers) to its own buffer in place, then signals its parent.
* down (channel 2): the root's buffer holds the result. A node waits for its parent's
  "result ready", copies the result from the parent's buffer into its own and its output,
  then signals its children.
* end barrier: a parent must not overwrite its buffer (the next call's input) while a child
  may still copy the result from it.

``GUARD_LEAF=False`` is the deliberately broken variant: a node skips the *wait* for a child it
does not have (child index -1) but still *reads* that child's buffer, through entry -1 of the
pointer table: whatever 8 bytes precede the table are used as an address. That is one way a
tree all-reduce written by hand segfaults (an illegal memory access on a GPU); whether it is the
way the story's did is not known.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from labkit.kernels.comm.one_shot import peer_ptr
from labkit.kernels.comm.signals import block_barrier, pad_slot, send, slow_down, wait


class TreeLinks(NamedTuple):
    """A rank's neighbours in both trees, -1 where there is none: ``tree_all_reduce_kernel``'s
    link arguments, in its order (a tuple, so that a launch passes them as ``*links``)."""

    a_parent: int
    a_child0: int
    a_child1: int
    b_parent: int
    b_child0: int
    b_child1: int


def tree_links(rank: int, world: int) -> TreeLinks:
    """The parent and children of ``rank`` in tree A, then in tree B; -1 where there is none."""

    def heap(node):
        parent = (node - 1) // 2 if node > 0 else -1
        kids = [c for c in (2 * node + 1, 2 * node + 2) if c < world]
        return [parent] + kids + [-1] * (2 - len(kids))

    a = heap(rank)
    b = [(world - 1 - x) if x >= 0 else -1 for x in heap(world - 1 - rank)]
    return TreeLinks(*a, *b)


@triton.jit
def _add_child(data_ptrs, acc, child, offs, mask, ELEM: tl.constexpr, GUARD_LEAF: tl.constexpr):
    if GUARD_LEAF:
        if child >= 0:
            acc += tl.load(peer_ptr(data_ptrs, child, ELEM) + offs, mask=mask, other=0.0).to(tl.float32)
    else:  # broken: reads "child -1" through the pointer table's entry -1
        acc += tl.load(peer_ptr(data_ptrs, child, ELEM) + offs, mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def tree_all_reduce_kernel(
    data_ptrs,  # int64 [W]: every rank's symmetric buffer (N elements each)
    pad_ptrs,  # int64 [W]: every rank's signal pad
    out_ptr,  # *T [N]: this rank's result
    n,  # N
    half,  # elements per tree (a multiple of BLOCK); tree B takes the rest
    rank,
    a_parent,
    a_child0,
    a_child1,  # links in tree A (-1: none)
    b_parent,
    b_child0,
    b_child1,  # links in tree B
    WORLD: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEM: tl.constexpr,
    END_BARRIER: tl.constexpr,
    GUARD_LEAF: tl.constexpr,  # False: the broken variant (module docstring)
    DELAY: tl.constexpr = 0,  # lab 06's stress: volatile loads on SLOW_RANK before it copies from its parent (0: none)
    SLOW_RANK: tl.constexpr = 0,  # the rank DELAY slows
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tprog = nprog // 2  # programs per tree (the launcher makes nprog even)
    tree = pid // tprog
    tpid = pid - tree * tprog
    ELEM = out_ptr.dtype.element_ty
    if tree == 0:
        parent, child0, child1 = a_parent, a_child0, a_child1
    else:
        parent, child0, child1 = b_parent, b_child0, b_child1
    lo = tree * half
    hi = tl.minimum(lo + half, n)
    mine = peer_ptr(data_ptrs, rank, ELEM)
    # up: children's partial sums into mine
    if child0 >= 0:
        wait(pad_slot(pad_ptrs, rank, 1, pid, child0, WORLD, MAX_BLOCKS), SEM)
    if child1 >= 0:
        wait(pad_slot(pad_ptrs, rank, 1, pid, child1, WORLD, MAX_BLOCKS), SEM)
    tl.debug_barrier()
    for start in range(lo + tpid * BLOCK, hi, tprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < hi
        acc = tl.load(mine + offs, mask=mask, other=0.0).to(tl.float32)
        acc = _add_child(data_ptrs, acc, child0, offs, mask, ELEM, GUARD_LEAF)
        acc = _add_child(data_ptrs, acc, child1, offs, mask, ELEM, GUARD_LEAF)
        tl.store(mine + offs, acc.to(ELEM), mask=mask)
    tl.debug_barrier()
    if parent >= 0:
        send(pad_slot(pad_ptrs, parent, 1, pid, rank, WORLD, MAX_BLOCKS), SEM)
        # down: the result from my parent's buffer
        wait(pad_slot(pad_ptrs, rank, 2, pid, parent, WORLD, MAX_BLOCKS), SEM)
        slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)
        tl.debug_barrier()
        src = peer_ptr(data_ptrs, parent, ELEM)
        for start in range(lo + tpid * BLOCK, hi, tprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < hi
            v = tl.load(src + offs, mask=mask)
            tl.store(mine + offs, v, mask=mask)
            tl.store(out_ptr + offs, v, mask=mask)
    else:
        for start in range(lo + tpid * BLOCK, hi, tprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < hi
            tl.store(out_ptr + offs, tl.load(mine + offs, mask=mask), mask=mask)
    tl.debug_barrier()
    if child0 >= 0:
        send(pad_slot(pad_ptrs, child0, 2, pid, rank, WORLD, MAX_BLOCKS), SEM)
    if child1 >= 0:
        send(pad_slot(pad_ptrs, child1, 2, pid, rank, WORLD, MAX_BLOCKS), SEM)
    if END_BARRIER:
        block_barrier(pad_ptrs, rank, pid, WORLD, MAX_BLOCKS, SEM)
