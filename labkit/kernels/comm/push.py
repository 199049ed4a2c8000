"""Push one-shot all-reduce: every rank STORES its input into every peer's inbox, signals once,
and sums what arrived in its own inbox. No start barrier, no end barrier, no remote loads.

Why: lab 02's one-shot pulls (remote loads, one round trip each) between two barriers (two more
round trips). Stores are posted (the writer does not wait for them), the links carry stores
faster than loads (``labkit bench collectives_links``: 361 vs 333 GB/s per GPU on 2x H200), and the end
barrier is replaced by double buffering. What is left on the critical path: the stores, one
release per peer and one acquire wait per peer.

Memory (``inbox``, collective): per rank a symmetric allocation of ``2 x W x capacity`` elements,
``[slot][source rank][element]``, and its signal pad, int32 ``[3, 2 x programs, W]`` (twice the
programs' rows: channel 2 holds one row per slot and program). Channel 0 (FLAGS), slot (program
b, source s) of rank r holds the newest epoch that program b of rank s has pushed to r; channel 1
(COUNTERS), slot (b, 0) is program b's own epoch counter and slot (b, 1) counts the calls in which
program b saw a count that differs from its own (both read and written only by program b of this
rank); channel 2 (HEADERS), slot (s x programs + b, q) holds the count header program b of rank q
wrote for inbox slot s (its element count + 1). Channels 0 and 1 use rows below ``programs`` only.

The protocol, per program b of rank r, one call of n elements:

1. ``e = counter[b] + 1`` (modulo 2^30), ``slot = e % 2``;
2. push: for every element i program b owns, store ``x[i]`` into ``inbox_p[slot][r][i]`` of every
   peer p;
   2a. the count: store ``n + 1`` into ``header_p[slot][b][r]`` of every peer p (a plain store:
   the release of step 3 publishes it with the data);
3. signal: a CTA barrier, then ``flag_p[b][r] = e`` with a release store at system scope, to
   every peer p (release is cumulative: every store of steps 2 and 2a by any thread of the
   program is visible to whoever acquires the flag);
4. wait: for every peer p, spin on an acquire load of ``flag_r[b][p]`` until it reads e or e + 1;
   then a CTA barrier;
   4a. read every peer's ``header_r[slot][b][p]``; the call's counts disagree if any differs
   from ``n + 1``;
5. counts that agree: sum, in rank order (so every rank computes the same bits): own ``x[i]``,
   peers' ``inbox_r[slot][p][i]``; store ``out[i]``;
   counts that disagree: store NaN into every ``out[i]`` program b owns and add 1 to
   ``disagreements[b]``;
   then ``counter[b] = e``.

Why no end barrier is needed (the correctness argument). A peer p writes into my slot s during
its call e (s = e % 2) and next into the same slot during its call e + 2. Its call e + 2 starts
only after its call e + 1 has finished, and that call waited for MY signal of epoch e + 1, which
my program b sends only in my call e + 1, after my call e had finished reading slot s (stream
order: my call e + 1 starts when my call e has ended). So a peer never overwrites a slot I may
still read. Nor can a peer be more than one call ahead of me: its call e + 1 cannot finish
before my signal e + 1. So while I wait for epoch e a flag reads e or e + 1, and two slots
suffice. The same argument holds per program because every call uses the same grid and the same
element-to-program mapping (fixed when the inbox is made, not by the call's size): program b of
every rank owns the same elements in every call.

The count headers follow the data's rule, slot for slot: the header I read in step 4a for slot
s was stored by the peer's call e before its release of epoch e (step 2a, then step 3), and my
acquire of e or e + 1 (the peer releases e + 1 after e, in program order) makes it visible; the
peer's next store into that header is its call e + 2's, which waits for my call e + 1, as above.
A peer one call ahead writes the other slot's header. So the header read belongs to this epoch,
and no header needs clearing (each call overwrites the one of two calls before).

A count that disagrees is caught, not summed: every rank reads every peer's n in step 4a, so
every rank of the call outputs NaN and counts it (``Inbox.disagreements()``). The pushes of such
a call stay within the inbox (each rank pushes its own n, at most the capacity), and the next
call overwrites every element it sums, so a call after a disagreement sums right. (A rank that
skips a call altogether leaves its peers waiting in the kernel, as with any collective.)

Requirements that follow: calls on one inbox are stream-ordered on each rank (one stream, or
events between streams); the epoch counters live on the device, so CUDA-graph replay keeps
counting (no host argument changes between calls). Epochs count modulo 2^30 and are compared by
their distance modulo 2^30, so the counters never overflow. ``x`` and ``out`` are ordinary
tensors (``out`` may be ``x``): only the inbox is symmetric, and nobody else reads a rank's ``x``.

Tested on the CPU tier (processes over shared memory, the Triton interpreter) against an fp64
sum with fresh inputs on every call, a late rank and counts that disagree; the GPU timings are
the sweep's (``labkit bench collectives``, implementation ``labkit_push_one_shot``). What the
count headers cost is timed there too, in the same rounds: ``labkit_push_one_shot_unchecked`` is
the protocol without them (``all_reduce_variant(counts=False)``), and each ``labkit_push_one_shot``
record carries its time over that one (``count_check_ratio``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit.kernels.comm import inbox_call, symm
from labkit.kernels.comm.signals import pad_slot, slow_down
from labkit.workbench import tier

#: epochs count modulo this (a power of two, so the slot parity keeps alternating across the wrap)
EPOCH_MODULUS = 1 << 30
#: capacities are rounded up to this many elements: every region of the inbox starts aligned
CAPACITY_UNIT = 64
#: the signal-pad channels this protocol uses (constexpr: compiled kernels may read only those globals)
FLAGS, COUNTERS, HEADERS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
#: column of a program's COUNTERS row that counts its disagreements (column 0: its epoch counter)
DISAGREEMENTS = tl.constexpr(1)


@triton.jit
def _epoch_distance(flag, epoch):
    """(flag - epoch) modulo 2^30: 0 when the flag holds this epoch, 1 when one ahead."""
    return (flag - epoch) & 0x3FFFFFFF


@triton.jit
def _push(
    x_ptr, inbox_ptrs, offs, mask, slot, cap, rank, WORLD: tl.constexpr, ELEM: tl.constexpr, MASKED: tl.constexpr
):
    """Store elements ``offs`` of x into this rank's region of slot ``slot`` of every peer's inbox."""
    if MASKED:
        v = tl.load(x_ptr + offs, mask=mask)
    else:
        v = tl.load(x_ptr + offs)
    for p in tl.static_range(WORLD):
        if p != rank:
            box = tl.multiple_of(tl.load(inbox_ptrs + p).to(tl.pointer_type(ELEM)), 16)
            if MASKED:
                tl.store(box + (slot * WORLD + rank) * cap + offs, v, mask=mask)
            else:
                tl.store(box + (slot * WORLD + rank) * cap + offs, v)


@triton.jit
def _sum(
    x_ptr,
    mine,
    out_ptr,
    offs,
    mask,
    cap,
    rank,
    WORLD: tl.constexpr,
    ELEM: tl.constexpr,
    BLOCK: tl.constexpr,
    MASKED: tl.constexpr,
):
    """out[offs] = the fp32 sum in rank order of x (this rank's) and the peers' regions of ``mine``
    (this rank's inbox slot)."""
    acc = tl.zeros([BLOCK], tl.float32)
    for p in tl.static_range(WORLD):
        src = x_ptr if p == rank else mine + p * cap
        if MASKED:
            acc += tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            acc += tl.load(src + offs).to(tl.float32)
    if MASKED:
        tl.store(out_ptr + offs, acc.to(ELEM), mask=mask)
    else:
        tl.store(out_ptr + offs, acc.to(ELEM))


@triton.jit
def _header(pad_ptrs, rank_of_pad, slot, block, src, WORLD: tl.constexpr, MAX_BLOCKS: tl.constexpr):
    """Address of the count header that program ``block`` of rank ``src`` writes for inbox slot
    ``slot`` into rank ``rank_of_pad``'s pad: channel HEADERS, row slot x programs + block."""
    return pad_slot(pad_ptrs, rank_of_pad, HEADERS, slot * (MAX_BLOCKS // 2) + block, src, WORLD, MAX_BLOCKS)


@triton.jit
def push_one_shot_kernel(
    x_ptr,  # *T [N]: this rank's input (ordinary local memory)
    inbox_ptrs,  # int64 [W]: every rank's inbox, T [2, W, CAP]
    pad_ptrs,  # int64 [W]: every rank's signal pad, int32 [3, MAX_BLOCKS, W]
    out_ptr,  # *T [N]: this rank's result (may be x_ptr: in place)
    n,  # N: elements per rank in this call (<= CAP)
    cap,  # CAP: inbox capacity per source rank and slot
    rank,  # this rank
    WORLD: tl.constexpr,  # number of ranks (2..8)
    MAX_BLOCKS: tl.constexpr,  # rows of the signal pad: 2 x the grid (one header row per slot and program)
    BLOCK: tl.constexpr,  # elements per program per step
    SLOTS: tl.constexpr = 2,  # 2: double buffering; 1: the broken variant (one slot, no end barrier)
    DELAY: tl.constexpr = 0,  # a slow reader: volatile loads on SLOW_RANK between the wait and the sum
    SLOW_RANK: tl.constexpr = 0,  # the rank DELAY slows
    COUNTS: tl.constexpr = True,  # False: no count headers (steps 2a, 4a): the bench's baseline for their cost
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ELEM = out_ptr.dtype.element_ty
    cap = tl.multiple_of(cap, 64)  # inbox() rounds it up: every source's region starts 128-byte aligned
    local_pad = tl.load(pad_ptrs + rank).to(tl.pointer_type(tl.int32))
    counter = local_pad + (COUNTERS * MAX_BLOCKS + pid) * WORLD
    # 1. this call's epoch and slot
    epoch = (tl.load(counter) + 1) & 0x3FFFFFFF
    slot = epoch % SLOTS
    # 2. push this program's elements into every peer's inbox (posted stores, no waiting);
    #    full blocks unmasked so that they compile to 16-byte vector accesses, the tail masked
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
        if start + BLOCK <= n:
            _push(x_ptr, inbox_ptrs, offs, None, slot, cap, rank, WORLD, ELEM, False)
        else:
            _push(x_ptr, inbox_ptrs, offs, offs < n, slot, cap, rank, WORLD, ELEM, True)
    # 2a. this call's count into every peer's header for this slot (published by step 3's release)
    if COUNTS:
        for p in tl.static_range(WORLD):
            if p != rank:
                tl.store(_header(pad_ptrs, p, slot, pid, rank, WORLD, MAX_BLOCKS), n + 1)
    # 3. one release per peer: every store above happens-before whoever acquires this flag
    tl.debug_barrier()
    for p in tl.static_range(WORLD):
        if p != rank:
            tl.atomic_xchg(
                pad_slot(pad_ptrs, p, FLAGS, pid, rank, WORLD, MAX_BLOCKS), epoch, sem="release", scope="sys"
            )
    # 4. wait until every peer's program pid has pushed this epoch (or is one call further)
    for p in tl.static_range(WORLD):
        if p != rank:
            flag = pad_slot(pad_ptrs, rank, FLAGS, pid, p, WORLD, MAX_BLOCKS)
            while _epoch_distance(tl.atomic_add(flag, 0, sem="acquire", scope="sys"), epoch) > 1:
                pass
    tl.debug_barrier()
    # 4a. every peer's count for this slot (stored before the release just acquired)
    disagree = 0
    if COUNTS:
        for p in tl.static_range(WORLD):
            if p != rank:
                h = tl.load(_header(pad_ptrs, rank, slot, pid, p, WORLD, MAX_BLOCKS))
                disagree = disagree | (h != n + 1).to(tl.int32)
    slow_down(pad_ptrs, rank, DELAY, SLOW_RANK)
    if disagree == 0:
        # 5. sum in rank order: the same bits on every rank
        mine = tl.multiple_of(tl.load(inbox_ptrs + rank).to(tl.pointer_type(ELEM)), 16) + slot * WORLD * cap
        for start in range(pid * BLOCK, n, nprog * BLOCK):
            offs = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
            if start + BLOCK <= n:
                _sum(x_ptr, mine, out_ptr, offs, None, cap, rank, WORLD, ELEM, BLOCK, False)
            else:
                _sum(x_ptr, mine, out_ptr, offs, offs < n, cap, rank, WORLD, ELEM, BLOCK, True)
    else:
        # 5. counts that disagree: NaN on every element this program owns, and count the call
        for start in range(pid * BLOCK, n, nprog * BLOCK):
            offs = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.full([BLOCK], float("nan"), tl.float32).to(ELEM), mask=offs < n)
        seen = counter + DISAGREEMENTS
        tl.store(seen, tl.load(seen) + 1)
    tl.store(counter, epoch)


class Inbox(inbox_call.Inbox):
    """This rank's inbox for push all-reduces of up to ``capacity`` elements (see the module's
    docstring; the fields are ``inbox_call.Inbox``'s): ``buf`` is T [2, W, capacity] per rank, and
    its signal pad (2 x programs rows) holds the epochs and counts; the launches' variant is
    (slots, delay, slow rank, counts)."""

    def epochs(self) -> list[int]:
        """Every program's epoch counter on this rank (calls made, modulo 2^30): all equal, and
        equal across ranks, after every completed call."""
        return [int(v) for v in self.buf.local_pad[COUNTERS.value, : self.programs, 0].tolist()]

    def disagreements(self) -> int:
        """Calls in which this rank saw a peer's element count differ from its own (the call's
        output was NaN): the most over the programs. Reads the device (a sync)."""
        if self.buf.world_size == 1:
            return 0  # no peer, no count to disagree with (and no column 1 in the pad)
        return inbox_call.disagreements(self.buf, COUNTERS.value, self.programs, DISAGREEMENTS.value)


def _default_launch(capacity: int, elem_size: int, device: torch.device) -> tuple[int, int, int]:
    """(programs, block, num_warps): 16 bytes per thread per step on a GPU; programs to cover the
    capacity in about one step each, at most one per SM (latency first: small messages want few
    programs, large ones every SM)."""
    if tier.interpreted() or device.type != "cuda":
        return 1, 1024, 4
    num_warps = 4
    block = (16 // elem_size) * 32 * num_warps
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(sms, triton.cdiv(capacity, block))), block, num_warps


def inbox(
    capacity: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    device=None,
    programs: int | None = None,
    block: int | None = None,
    num_warps: int | None = None,
    scratch_dir: str | None = None,
) -> Inbox:
    """Allocate this rank's inbox (collective: every rank calls it alike, as ``symm.empty``).

    capacity: the most elements per rank one call may reduce (rounded up to ``CAPACITY_UNIT``)
    programs, block, num_warps: the fixed launch (default: ``_default_launch``)
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"inbox: capacity: expected a positive int (elements per rank), got {capacity!r}")
    world = symm._world()[1]
    dev = (
        torch.device(device)
        if device is not None
        else (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    )
    d_programs, d_block, d_warps = _default_launch(capacity, torch.empty((), dtype=dtype).element_size(), dev)
    programs, block, num_warps = programs or d_programs, block or d_block, num_warps or d_warps
    for name, v in (("programs", programs), ("block", block), ("num_warps", num_warps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"inbox: {name}: expected a positive int, got {v!r}")
    if block & (block - 1):
        raise ValueError(f"inbox: block: expected a power of two (Triton's arange), got {block}")
    capacity = -(-capacity // CAPACITY_UNIT) * CAPACITY_UNIT
    # twice the programs' pad rows: the count headers take one row per inbox slot and program
    buf = symm.empty((2, world, capacity), dtype, device=dev, max_blocks=2 * programs, scratch_dir=scratch_dir)
    return Inbox(buf, capacity, programs, block, num_warps)


def _check(x, box, out) -> torch.Tensor:
    """The full checks of a call this inbox has not seen (``inbox_call.check_call``)."""
    return inbox_call.check_call(x, box, out, Inbox, "push.inbox(...)")


def all_reduce(x: torch.Tensor, box: Inbox, out: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of ``x`` over all ranks into ``out`` (new tensor by default; ``out=x``: in place),
    by the push protocol of this module. Collective: every rank calls it with the same number of
    elements on the same inbox, in the same order.

    Checked on this rank alone (host, O(W) the first time, O(1) compares after: see below):
    ``box`` is an inbox; ``x`` a contiguous tensor of the inbox's dtype and device with 1 to
    ``box.capacity`` elements; ``out`` None, ``x``, or a contiguous tensor like ``x`` that does
    not overlap it; neither inside any rank's inbox. Errors name the function and the argument.

    Ranks whose element counts differ are caught by the protocol, with nothing exchanged on the
    host (a call costs no more than its kernel and can be replayed in a CUDA graph): every rank's
    output is NaN for that call and ``box.disagreements()`` counts it. A rank that skips a call
    leaves the others waiting in the kernel until the world's timeout.

    The first call with a given (x address, out address, size) checks everything; later calls with
    the same addresses find their launch with one dict lookup, repeat the O(1) compares (dtype,
    device, shape, contiguity) and launch through Triton's compiled launcher
    (``labkit.kernels.comm.inbox_call``)."""
    return _call(x, box, out)


def all_reduce_variant(
    x: torch.Tensor,
    box: Inbox,
    out: torch.Tensor | None = None,
    *,
    slots: int = 2,
    delay: int = 0,
    slow_rank: int = 1,
    counts: bool = True,
) -> torch.Tensor:
    """``all_reduce`` with the lab's switches: ``slots=1`` is the broken protocol (one inbox slot
    and no end barrier: a fast rank's next call overwrites what a slow peer is still summing);
    ``delay`` volatile loads on ``slow_rank`` between its wait and its sum make that peer slow;
    ``counts=False`` leaves out the count headers (steps 2a and 4a: counts that disagree go
    unseen), the baseline against which the bench measures what they cost.
    Do not mix ``slots`` or ``counts`` on one inbox (the epochs would name the wrong slot; a
    call with counts would read a header left by a call two or more before it)."""
    if slots not in (1, 2):
        raise ValueError(f"all_reduce_variant: slots: expected 1 (the broken variant) or 2, got {slots!r}")
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise ValueError(f"all_reduce_variant: delay: expected an int >= 0 (volatile loads), got {delay!r}")
    if delay and (isinstance(slow_rank, bool) or not isinstance(slow_rank, int)):
        raise ValueError(f"all_reduce_variant: slow_rank: expected a rank (int), got {slow_rank!r}")
    if not isinstance(counts, bool):
        raise TypeError(f"all_reduce_variant: counts: expected a bool, got {type(counts).__name__}")
    return _call(x, box, out, slots, delay, slow_rank if delay else 0, counts)


def _call(x, box, out, slots: int = 2, delay: int = 0, slow_rank: int = 0, counts: bool = True) -> torch.Tensor:
    """The launch kept on ``box`` for this call (``inbox_call.call``; the switches are part of its key)."""

    def make(x: torch.Tensor, box: Inbox) -> inbox_call.InputLaunch:
        world = box.buf.world_size
        if delay and not 0 <= slow_rank < world:
            raise ValueError(f"all_reduce_variant: slow_rank: expected a rank in 0..{world - 1}, got {slow_rank!r}")
        return inbox_call.one_shot_launch(
            push_one_shot_kernel, x, box, SLOTS=slots, DELAY=delay, SLOW_RANK=slow_rank, COUNTS=counts
        )

    return inbox_call.call(box, x, out, Inbox, _check, make, (slots, delay, slow_rank, counts))
