"""Flag-in-data one-shot all-reduce: the data is its own readiness signal. No barrier, no flag
round trip: every rank stores its input into every peer's inbox, and a receiver knows an
element has arrived when it no longer holds the sentinel the inbox was armed with.

Why: the push one-shot (``labkit.kernels.comm.push``) stores the data, then releases a flag per
peer, and the receiver acquires that flag before it reads. The release has to wait until the
stores before it are visible across the link, and the acquire is a second trip: one signal
round on the critical path after the data's own trip. Here the receiver polls the data itself.
What makes that possible is a value no sender ever writes: negative zero. The inbox is armed
with -0.0 (bit pattern ``0x8000`` for 2-byte floats, ``0x80000000`` for float32), senders turn
every -0.0 of their input into +0.0 (the same number: a sum is unchanged, except that a result
that would be -0.0 comes out +0.0), so an element that does not hold the sentinel's bits holds
the sender's value. Each element is checked on its own, so how the link splits or orders the
stores does not matter: a naturally aligned 2- or 4-byte store is never seen half-written.
(TensorRT-LLM's "Lamport" all-reduce works on the same idea; this module is labkit's own.)

Memory (``inbox``, collective): per rank a symmetric allocation of ``2 x W x capacity``
elements, ``[slot][source rank][element]``, armed with the sentinel, and its signal pad
(int32 ``[3, programs, W]``). Pad slot (0, b, r) of rank r is program b's own epoch counter;
(1 + s, b, q) of rank r is the count header program b of rank q wrote for slot s (count + 1;
0 = nothing written); (0, b, (r + 1) % W) counts the calls in which program b of rank r saw a
count that differs from its own.

The protocol, per program b of rank r, one call of n elements:

1. ``e = counter[b] + 1`` (modulo 2^30), ``slot = e % 2``;
2. push: for every element i program b owns, store ``x[i]`` (-0.0 made +0.0) into
   ``inbox_p[slot][r][i]`` of every peer p; then the count header ``n + 1`` into pad slot
   (1 + slot, b, r) of every peer (plain stores, one vector, a lane per peer: the header orders
   nothing, it only carries n, polled as the data is);
3. per peer q: wait for q's header in slot ``slot``; ``n_q`` = header - 1; if any ``n_q != n``
   the call's counts disagree;
4. per element i program b owns (i < max(n, n_q)): wait until ``inbox_r[slot][q][i]`` (i < n_q)
   no longer holds the sentinel, for every peer q; sum in rank order (own x, peers' elements),
   store ``out[i]`` (NaN everywhere when the counts disagree); re-arm: store the sentinel back
   into every element just read;
5. clear the headers read in step 3, count a disagreement, ``counter[b] = e``.

Why two slots and re-arming at the end are enough (the correctness argument). A peer q writes
my slot s in its call e (s = e % 2) and next in its call e + 2. Its call e + 2 starts after its
call e + 1 ended, and that call waited for MY elements of call e + 1 (step 4), which I store only
in my call e + 1, after my call e re-armed slot s (stream order: a kernel starts after the one
before it ended). So q's next write into slot s comes after my re-arming of it, causally: my
re-arm stores, then the end of my kernel, then my pushes of call e + 1, which q observes before
it writes. And q cannot be two calls ahead: its call e + 1 waits for mine. While I am in call e a
peer writes slot e % 2 (its call e) or slot (e + 1) % 2 (its call e + 1), never the slot I read.
The same argument holds per program, because every call maps elements to programs alike (fixed
by the inbox: program b owns blocks b, b + P, b + 2P, ... whatever n is); the headers follow the
same rule as the data.

A count that disagrees is caught, not summed: every rank sees every peer's n in step 3. A
receiver still waits for (and re-arms) exactly the elements each peer sent, so the inbox is left
clean; its output is NaN, and ``Inbox.disagreements()`` counts the calls. (A rank that skips a
call altogether leaves its peers waiting in the kernel, as with any collective.)

Requirements that follow: calls on one inbox are stream-ordered on each rank; the epochs live on
the device (CUDA-graph replay keeps counting; nothing the host passes changes between calls);
every program of the grid is resident at once (``programs`` is at most the GPU's SM count, and
each program is small), since a program spins until its peers' programs have written.
``x`` and ``out`` are ordinary tensors (``out`` may be ``x``); only the inbox is symmetric.

Tested on the CPU tier (processes over shared memory, the Triton interpreter) and on GPUs
against an fp64 sum with fresh inputs every call, a rotating late rank, counts that disagree,
epochs started next to their wrap-around, and many captured-graph replays.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit.kernels.comm import inbox_call, symm
from labkit.workbench import tier

#: epochs count modulo this (even: the slot parity keeps alternating across the wrap)
EPOCH_MODULUS = 1 << 30
#: capacities are rounded up to this many elements: every region of the inbox starts aligned
CAPACITY_UNIT = 64
#: the sentinel an armed element holds, per element size: -0.0's bits, as a signed integer
SENTINEL_BITS = {2: -(1 << 15), 4: -(1 << 31)}
#: signal-pad channel of the epoch counters (and disagreement counts); headers of slot s: 1 + s
COUNTERS = tl.constexpr(0)


@triton.jit
def _header(pad, slot, block, src, WORLD: tl.constexpr, MAX_BLOCKS: tl.constexpr):
    """Address of the count header that rank ``src``'s program ``block`` writes for ``slot``."""
    return pad + ((1 + slot) * MAX_BLOCKS + block) * WORLD + src


@triton.jit
def fid_one_shot_kernel(
    x_ptr,  # *T [N]: this rank's input (ordinary local memory)
    inbox_ptrs,  # int64 [W]: every rank's inbox, T [2, W, CAP], armed with the sentinel
    pad_ptrs,  # int64 [W]: every rank's signal pad, int32 [3, MAX_BLOCKS, W]
    out_ptr,  # *T [N]: this rank's result (may be x_ptr: in place)
    n,  # N: elements per rank in this call (<= CAP)
    cap,  # CAP: inbox capacity per source rank and slot
    rank,  # this rank
    WORLD: tl.constexpr,  # number of ranks (2 or more)
    MAX_BLOCKS: tl.constexpr,  # rows of the signal pad (== the grid: fixed per inbox)
    BLOCK: tl.constexpr,  # elements per program per step
    BITS: tl.constexpr,  # integer type of T's size: the inbox is polled as bits
    SENTINEL: tl.constexpr,  # -0.0's bits as a BITS value: what an armed element holds
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ELEM = out_ptr.dtype.element_ty
    cap = tl.multiple_of(cap, 64)  # inbox() rounds it up: every source's region starts 128-byte aligned
    pad = tl.load(pad_ptrs + rank).to(tl.pointer_type(tl.int32))
    counter = pad + (COUNTERS * MAX_BLOCKS + pid) * WORLD + rank
    # 1. this call's epoch and slot
    epoch = (tl.load(counter) + 1) & 0x3FFFFFFF
    slot = epoch % 2
    # 2. push this program's elements, -0.0 made +0.0, into every peer's inbox; then the count
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
        mask = offs < n
        # as bits: a float compare would be exact too, but the interpreter compares bf16 as raw bits
        v = tl.load(x_ptr.to(tl.pointer_type(BITS)) + offs, mask=mask, other=0)
        v = tl.where(v == SENTINEL, 0, v).to(BITS)  # every -0.0 leaves as +0.0
        for p in tl.static_range(WORLD):
            if p != rank:
                box = tl.multiple_of(tl.load(inbox_ptrs + p).to(tl.pointer_type(BITS)), 16)
                tl.store(box + (slot * WORLD + rank) * cap + offs, v, mask=mask)
    # the count headers: plain vector stores, a lane per peer (8 lanes a store: one store up to 8
    # ranks), all in flight at once. A header orders nothing (the data is polled on its own in
    # step 4), so no atomic: per-peer scalar atomic exchanges cost a 4 KiB call about 10% more on
    # 2 H200s (a development experiment).
    for first in tl.static_range(0, WORLD, 8):
        lanes = first + tl.arange(0, 8)
        peer = tl.where(lanes < WORLD, lanes, rank)
        peer_pad = tl.load(pad_ptrs + peer).to(tl.pointer_type(tl.int32))
        header = _header(peer_pad, slot, pid, rank, WORLD, MAX_BLOCKS)
        tl.store(header, tl.full([8], 0, tl.int32) + (n + 1), mask=(lanes < WORLD) & (lanes != rank))
    # 3. every peer's count for this slot; the largest says how far this program must read
    longest = n
    disagree = 0
    for q in tl.static_range(WORLD):
        if q != rank:
            h = tl.load(_header(pad, slot, pid, q, WORLD, MAX_BLOCKS), volatile=True)
            while h == 0:
                h = tl.load(_header(pad, slot, pid, q, WORLD, MAX_BLOCKS), volatile=True)
            disagree = disagree | (h - 1 != n).to(tl.int32)
            longest = tl.maximum(longest, h - 1)
    # 4. wait for each element, sum in rank order (the same bits on every rank), re-arm
    mine = tl.load(inbox_ptrs + rank).to(tl.pointer_type(BITS)) + slot * WORLD * cap
    for start in range(pid * BLOCK, longest, nprog * BLOCK):
        offs = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32)
        for q in tl.static_range(WORLD):
            if q == rank:
                acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
            else:
                sent = tl.load(_header(pad, slot, pid, q, WORLD, MAX_BLOCKS)) - 1  # q's n, read in step 3
                arrived = offs < sent
                region = mine + q * cap + offs
                bits = tl.load(region, mask=arrived, other=0, volatile=True)
                while tl.max((bits == SENTINEL).to(tl.int32), axis=0) > 0:
                    bits = tl.load(region, mask=arrived, other=0, volatile=True)
                acc += bits.to(ELEM, bitcast=True).to(tl.float32)
                tl.store(region, tl.full([BLOCK], SENTINEL, BITS), mask=arrived)
        if disagree != 0:
            acc = tl.full([BLOCK], float("nan"), tl.float32)
        tl.store(out_ptr + offs, acc.to(ELEM), mask=offs < n)
    # 5. clear the headers, count a disagreement, close the epoch
    for q in tl.static_range(WORLD):
        if q != rank:
            tl.store(_header(pad, slot, pid, q, WORLD, MAX_BLOCKS), 0)
    if disagree != 0:
        seen = pad + (COUNTERS * MAX_BLOCKS + pid) * WORLD + (rank + 1) % WORLD
        tl.store(seen, tl.load(seen) + 1)
    tl.store(counter, epoch)


class Inbox(inbox_call.Inbox):
    """This rank's flag-in-data inbox for all-reduces of up to ``capacity`` elements (see the
    module's docstring; the fields are ``inbox_call.Inbox``'s): ``buf`` is T [2, W, capacity] per
    rank, armed with the sentinel, and its signal pad; the launches' variant is ``()``."""

    def epochs(self) -> list[int]:
        """Every program's epoch counter on this rank (calls made, modulo 2^30)."""
        pad = self.buf.local_pad[COUNTERS.value, : self.programs]
        return [int(pad[b, self.buf.rank]) for b in range(self.programs)]

    def disagreements(self) -> int:
        """Calls in which this rank saw a peer's element count differ from its own (the call's
        output was NaN): the most over the programs. Reads the device (a sync)."""
        other = (self.buf.rank + 1) % self.buf.world_size
        return inbox_call.disagreements(self.buf, COUNTERS.value, self.programs, other)

    def armed(self) -> bool:
        """True when every element of this rank's inbox holds the sentinel and no count header
        is set: what a completed series of calls leaves behind. Reads the device (a sync)."""
        bits = self.buf.tensor.view(_bits_dtype(self.dtype))
        headers = self.buf.local_pad[1:3, : self.programs]
        return bool((bits == SENTINEL_BITS[self.dtype.itemsize]).all()) and int(torch.count_nonzero(headers)) == 0


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.int16 if dtype.itemsize == 2 else torch.int32


def _default_launch(capacity: int, elem_size: int, device: torch.device) -> tuple[int, int, int]:
    """(programs, block, num_warps): 16 bytes per thread per step on a GPU; programs to cover the
    capacity in about one step each, at most one per SM (every program resident at once)."""
    if tier.interpreted() or device.type != "cuda":
        return 1, 1024, 4
    num_warps = 4
    block = (16 // elem_size) * 32 * num_warps
    return max(1, min(_sms(device), triton.cdiv(capacity, block))), block, num_warps


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


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
    """Allocate and arm this rank's inbox (collective: every rank calls it alike, as ``symm.empty``).

    Args:
        capacity: the most elements per rank one call may reduce (rounded up to ``CAPACITY_UNIT``).
        dtype: the elements' type (``symm.DTYPES``).
        device: this rank's device (default: the current CUDA device, else the CPU).
        programs, block, num_warps: the fixed launch (default: ``_default_launch``); on a GPU
            ``programs`` is at most its SM count, so that every program is resident at once.
        scratch_dir: the emulated world's shared folder (``RankContext.scratch_dir``).

    Note:
        Arming writes the sentinel into every element and then waits for every rank (one
        exchange): no peer pushes into an inbox that is still being armed.

    Example::

        box = flag_in_data.inbox(1 << 20, torch.bfloat16)
        y = flag_in_data.all_reduce(x, box)    # every rank, same x.numel()
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"inbox: capacity: expected a positive int (elements per rank), got {capacity!r}")
    world = symm._world()[1]
    dev = (
        torch.device(device)
        if device is not None
        else (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    )
    if dtype not in symm.DTYPES:
        raise TypeError(f"inbox: dtype: {dtype} is not supported; expected one of {[str(d) for d in symm.DTYPES]}")
    d_programs, d_block, d_warps = _default_launch(capacity, dtype.itemsize, dev)
    programs, block, num_warps = programs or d_programs, block or d_block, num_warps or d_warps
    for name, v in (("programs", programs), ("block", block), ("num_warps", num_warps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"inbox: {name}: expected a positive int, got {v!r}")
    if block & (block - 1):
        raise ValueError(f"inbox: block: expected a power of two (Triton's arange), got {block}")
    if dev.type == "cuda" and not tier.interpreted() and programs > _sms(dev):
        raise ValueError(
            f"inbox: programs: {programs} is more than the {_sms(dev)} SMs of {dev}: a program that is "
            "not resident would leave its peers' programs spinning (one per SM at most)"
        )
    capacity = -(-capacity // CAPACITY_UNIT) * CAPACITY_UNIT
    buf = symm.empty((2, world, capacity), dtype, device=dev, max_blocks=programs, scratch_dir=scratch_dir)
    buf.tensor.view(_bits_dtype(dtype)).fill_(SENTINEL_BITS[dtype.itemsize])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    symm.gather(None)  # every rank armed before anyone pushes
    return Inbox(buf, capacity, programs, block, num_warps)


def attach(buf: symm.SymmBuffer, box: Inbox | None = None, *, scratch_dir: str | None = None) -> Inbox:
    """Give ``buf`` a flag-in-data inbox, through which ``collectives.all_reduce(buf, ...)`` may
    take this protocol (``algorithm="flag_in_data"``, or ``"auto"`` up to its measured limit).

    Args:
        buf: a symmetric buffer (``symm.empty``).
        box: None: allocate a new inbox of ``buf``'s size, dtype and device (collective, as
            ``inbox``: every rank calls it alike); or an inbox already made, shared by several
            buffers (its capacity at least ``buf``'s elements, the same dtype, device and world
            size; checked on this rank, no exchange).
        scratch_dir: the emulated world's shared folder for a new inbox (``RankContext.scratch_dir``).

    Returns:
        the inbox, also ``buf.inbox``.

    Note:
        Buffers that share an inbox share its epochs: their calls must follow each other on one
        stream, as every call on one inbox must.

    Example::

        buf = symm.empty(4096, torch.bfloat16)
        flag_in_data.attach(buf)
        collectives.all_reduce(buf, out, algorithm="flag_in_data")
    """
    if not isinstance(buf, symm.SymmBuffer):
        raise TypeError(f"attach: buf: expected a symm.SymmBuffer, got {type(buf).__name__}")
    numel = buf.tensor.numel()
    if box is None:
        box = inbox(numel, buf.tensor.dtype, device=buf.tensor.device, scratch_dir=scratch_dir)
    elif not isinstance(box, Inbox):
        raise TypeError(f"attach: box: expected None or a flag_in_data.Inbox, got {type(box).__name__}")
    elif box.dtype != buf.tensor.dtype:
        raise TypeError(f"attach: box: its dtype {box.dtype} differs from the buffer's {buf.tensor.dtype}")
    elif box.device != buf.tensor.device:
        raise ValueError(f"attach: box: on {box.device}, the buffer on {buf.tensor.device}: they must share a device")
    elif box.capacity < numel:
        raise ValueError(
            f"attach: box: its capacity is {box.capacity} elements, the buffer has {numel}; make one of at "
            f"least {numel} (flag_in_data.inbox({numel}, ...)) or pass box=None"
        )
    elif box.buf.world_size != buf.world_size:
        raise ValueError(f"attach: box: made in a world of {box.buf.world_size} ranks, this one has {buf.world_size}")
    buf.inbox = box
    return box


def set_epochs(box: Inbox, epoch: int) -> None:
    """Test hook: set every program's epoch counter on this rank to ``epoch`` (collective in
    effect: every rank must set the same value between calls, with no call in flight). The tests
    start the counters next to their wrap-around."""
    if not isinstance(box, Inbox):
        raise TypeError(f"set_epochs: box: expected a flag_in_data.Inbox, got {type(box).__name__}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < EPOCH_MODULUS:
        raise ValueError(f"set_epochs: epoch: expected an int in [0, 2^30), got {epoch!r}")
    box.buf.local_pad[COUNTERS.value, : box.programs, box.buf.rank] = epoch
    if box.device.type == "cuda":
        torch.cuda.synchronize(box.device)


def all_reduce(x: torch.Tensor, box: Inbox, out: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of ``x`` over all ranks into ``out`` (a new tensor by default; ``out=x``: in place), by
    the flag-in-data protocol of this module. Collective: every rank calls it with the same number
    of elements on the same inbox, in the same order.

    Args:
        x: this rank's input, contiguous, of the inbox's dtype and device, 1 to ``box.capacity``
            elements; not inside any rank's inbox.
        box: the inbox (``inbox(...)``).
        out: None, ``x``, or a contiguous tensor like ``x`` that does not overlap it.

    Note:
        The first call with a given (x address, out address, size) checks everything; later calls
        with the same addresses find their launch with one dict lookup, check types, shapes,
        dtypes and devices (O(1) compares) and launch through Triton's compiled launcher
        (``labkit.kernels.comm.inbox_call``). Ranks whose element counts differ are caught by the
        protocol: every rank's output is NaN for that call and ``box.disagreements()`` counts it.
        -0.0 inputs are summed as +0.0 (the sentinel), so a sum that would be -0.0 is +0.0; NaN
        and inf propagate as in any sum.

    Example::

        box = flag_in_data.inbox(4096, torch.bfloat16)
        y = flag_in_data.all_reduce(x, box)
    """
    return inbox_call.call(box, x, out, Inbox, _check, _launch)


def _check(x, box, out) -> torch.Tensor:
    """The full checks of a call this inbox has not seen (``inbox_call.check_call``)."""
    return inbox_call.check_call(x, box, out, Inbox, "flag_in_data.inbox(...)")


def _launch(x: torch.Tensor, box: Inbox) -> inbox_call.InputLaunch:
    """The kernel's launch for ``x``'s size on ``box``, the input and output given per call."""
    return inbox_call.one_shot_launch(
        fid_one_shot_kernel,
        x,
        box,
        BITS=tl.int16 if x.element_size() == 2 else tl.int32,
        SENTINEL=SENTINEL_BITS[x.element_size()],
    )


__all__ = ["EPOCH_MODULUS", "Inbox", "all_reduce", "fid_one_shot_kernel", "inbox", "set_epochs"]
