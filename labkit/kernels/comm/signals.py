"""Signals and barriers between ranks, in pure Triton atomics on the symmetric signal pads.

A signal is one int32 slot that goes 0 -> 1 -> 0:

* ``send``: spin until the slot reads 0, then set it to 1, with one compare-and-swap whose
  ``sem="release"`` makes every write this program did before it visible to whoever acquires
  the slot. Spinning on 0 first means a sender never overwrites a signal the receiver has not
  consumed yet (so back-to-back barriers may reuse one slot).
* ``wait``: spin until a compare-and-swap 1 -> 0 succeeds, with ``sem="acquire"``: after it,
  every write the sender made before its release is visible here. The reset is what makes the
  protocol self-cleaning: after a completed barrier every slot is 0 again (CUDA-graph safe).

``scope="sys"``: the peers are other GPUs (or, emulated, other processes); "gpu" scope would
order memory only within one device. A CTA barrier (``tl.debug_barrier``) before the send and
after the wait extends the ordering from the one thread that does the atomic to the whole
program (the release is cumulative over what the CTA barrier made it observe).

``SEM`` is constexpr: 0 is the correct acquire/release pair; 1 is the deliberately broken
variant with ``relaxed`` atomics, which still synchronises *time* but does not order memory;
2 is acquire/release at ``gpu`` scope, another broken variant: the ordering is promised only to
threads of the same GPU, too narrow a scope for a peer on another GPU (lab 06's scope lesson;
in the emulated world every scope behaves alike). ``send_sem``, ``wait_sem`` and
``signal_scope`` turn it into the ``sem=`` and ``scope=`` strings of the atomics, at compile
time: every atomic below takes them, none branches on ``SEM``.

``slow_down`` is lab 06's stress: a delay on one rank between a barrier and the reads it guards,
a constexpr that compiles to nothing when 0.
"""

import os

import triton
import triton.language as tl

from labkit.workbench import tier

SEM_ACQ_REL = 0
SEM_RELAXED = 1
SEM_GPU_SCOPE = 2
#: Signal all peers at once with one vector compare-and-swap (one lane per peer) on GPUs. The
#: Triton interpreter's vector atomic_cas on int32 writes wrong addresses (measured: lanes 1..7
#: land at the wrong offsets), so the interpreter takes the scalar loop, one peer at a time;
#: the protocol is the same, the GPU tier's tests check the vector form.
#: LABKIT_SCALAR_SIGNALS=1 forces the scalar loop on GPUs too (to compare the two).
VECTOR_SIGNALS = tl.constexpr(not tier.interpreted() and os.environ.get("LABKIT_SCALAR_SIGNALS") != "1")


@triton.jit
def pad_slot(pad_ptrs, rank_of_pad, channel, block, src, WORLD: tl.constexpr, MAX_BLOCKS: tl.constexpr):
    """Address of slot (channel, block, src) in rank ``rank_of_pad``'s signal pad."""
    pad = tl.load(pad_ptrs + rank_of_pad).to(tl.pointer_type(tl.int32))
    return pad + (channel * MAX_BLOCKS + block) * WORLD + src


@triton.constexpr_function
def send_sem(SEM):
    """The memory order of a send for ``SEM``: ``release``, or ``relaxed`` for the broken variant."""
    return "release" if SEM in (SEM_ACQ_REL, SEM_GPU_SCOPE) else "relaxed"


@triton.constexpr_function
def wait_sem(SEM):
    """The memory order of a wait for ``SEM``: ``acquire``, or ``relaxed`` for the broken variant."""
    return "acquire" if SEM in (SEM_ACQ_REL, SEM_GPU_SCOPE) else "relaxed"


@triton.constexpr_function
def signal_scope(SEM):
    """The scope of every signal's atomic for ``SEM``: ``sys`` (the peers are other GPUs), or
    ``gpu`` for the too-narrow variant."""
    return "gpu" if SEM == SEM_GPU_SCOPE else "sys"


@triton.jit
def send(addr, SEM: tl.constexpr):
    while tl.atomic_cas(addr, 0, 1, sem=send_sem(SEM), scope=signal_scope(SEM)) != 0:
        pass


@triton.jit
def wait(addr, SEM: tl.constexpr):
    while tl.atomic_cas(addr, 1, 0, sem=wait_sem(SEM), scope=signal_scope(SEM)) != 1:
        pass


@triton.jit
def block_barrier(pad_ptrs, rank, block, WORLD: tl.constexpr, MAX_BLOCKS: tl.constexpr, SEM: tl.constexpr):
    """Program ``block`` of every rank meets here. Entering: everything this program wrote is
    released to the peers. Leaving: everything the peers' programs ``block`` wrote before
    entering is visible. It synchronises one program per rank, not whole kernels: collectives
    that read data written by program b of a peer must have program b of this rank read it.

    All W signals go out at once, one lane per peer (8 lanes: the largest world), so a barrier
    costs one round trip over the links, not W. A lane that is done (or has no peer) keeps
    issuing a compare-and-swap that cannot match (compare with -1), which writes nothing:
    ``atomic_cas`` takes no mask."""
    tl.debug_barrier()
    if not VECTOR_SIGNALS:
        for p in tl.static_range(WORLD):
            send(pad_slot(pad_ptrs, p, 0, block, rank, WORLD, MAX_BLOCKS), SEM)
        for p in tl.static_range(WORLD):
            wait(pad_slot(pad_ptrs, rank, 0, block, p, WORLD, MAX_BLOCKS), SEM)
        tl.debug_barrier()
        return
    lanes = tl.arange(0, 8)
    valid = lanes < WORLD
    peer = tl.where(valid, lanes, rank)
    remote = tl.load(pad_ptrs + peer).to(tl.pointer_type(tl.int32))
    send_at = remote + block * WORLD + rank  # channel 0, slot (block, me) on each peer
    one = tl.full([8], 1, tl.int32)
    zero = tl.full([8], 0, tl.int32)
    never = tl.full([8], -1, tl.int32)  # a compare value no slot ever holds
    done = lanes >= WORLD
    while tl.sum((done == 0).to(tl.int32), axis=0) > 0:
        old = tl.atomic_cas(send_at, tl.where(done, never, zero), one, sem=send_sem(SEM), scope=signal_scope(SEM))
        done = done | (old == 0)
    local = tl.load(pad_ptrs + rank).to(tl.pointer_type(tl.int32))
    wait_at = local + block * WORLD + peer  # channel 0, slot (block, peer) on mine
    done = lanes >= WORLD
    while tl.sum((done == 0).to(tl.int32), axis=0) > 0:
        old = tl.atomic_cas(wait_at, tl.where(done, never, one), zero, sem=wait_sem(SEM), scope=signal_scope(SEM))
        done = done | (old == 1)
    tl.debug_barrier()


@triton.jit
def slow_down(pad_ptrs, rank, DELAY: tl.constexpr, SLOW_RANK: tl.constexpr):
    """On rank SLOW_RANK only, DELAY volatile loads of this rank's entry of the pad table (each
    a round trip to memory the compiler must keep): a reader made slow on purpose, placed by the
    kernels between a barrier and the peer reads it guards. DELAY=0 compiles to nothing."""
    if DELAY > 0:
        if rank == SLOW_RANK:
            for _ in range(DELAY):
                tl.load(pad_ptrs + rank, volatile=True)


@triton.jit
def barrier_kernel(pad_ptrs, rank, WORLD: tl.constexpr, MAX_BLOCKS: tl.constexpr, SEM: tl.constexpr):
    """Only a barrier: what tests use to check that the pads come back to zero."""
    block_barrier(pad_ptrs, rank, tl.program_id(0), WORLD, MAX_BLOCKS, SEM)
