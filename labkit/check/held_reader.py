"""A reader held between its barrier and its reads: the interleaving that breaks a collective
without an end barrier, made to happen instead of waited for (the emulated world only).

A late rank before the call does not produce it: the start barrier lines the ranks up again
and both read at once. What breaks the protocol is a rank B whose reads of peer A's buffer come
*after* A has returned and written its next input there. ``hold_peer_reads`` makes that order
happen, or proves it cannot:

1. Rank B arms the hold around one call of the collective. Every other rank runs the call as
   usual.
2. B's first read of a peer's buffer inside the call (a Triton load under the interpreter
   whose addresses fall in a peer's buffer, or a torch op that reads a peer's tensor) stops
   there, *before* reading, and waits.
3. Each other rank, once its call has returned, writes its next input into its buffer and then
   says so (``say_next_input_written``: a file in the world's scratch folder).
4. B's read goes on when every peer has said so (step 3), or after ``hold_s`` seconds.

Correctness argument: with an end barrier, no peer can return from the call before B has read
(the peers wait for B at that barrier), so step 3 never happens while B is held: B waits
``hold_s`` and reads the inputs of this call; the result is right, and the round costs
``hold_s``. Without one, every peer returns and writes its next input while B waits, so B reads
data of the next call, every time: the result is wrong whatever the machine's load, unless the
next input equals this one. Only the order is forced; what B reads is what the protocol lets it.

Why only the emulated world: under the Triton interpreter every load runs in Python on the
host, where it can stop, and a torch op on a peer's tensor is a call the dispatcher sees. On
GPUs a kernel's loads run on the device with no host in between; lab 06 slows a reader there
with a constexpr in labkit's own kernels, which the checker cannot add to a user's. So on a GPU
host ``labkit.check.collective`` runs its held rounds in an emulated world beside the GPU one.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: how often a held reader looks for its peers' files (seconds)
POLL_S = 1e-3

#: torch ops that take a peer's tensor without reading its values (views, metadata, allocation
#: like it): holding on them would stop the reader before its barrier, not after
_NO_READ = {"set_", "new_empty", "new_empty_strided", "empty_like", "detach", "alias", "lift_fresh", "zeros_like"}


def _flag(scratch_dir: str, round_name: str, rank: int) -> str:
    return os.path.join(scratch_dir, f"held-{round_name}-rank{rank}")


def say_next_input_written(scratch_dir: str, round_name: str, rank: int) -> None:
    """Step 3: this rank has returned from the held round's call and written its next input."""
    with open(_flag(scratch_dir, round_name, rank), "w"):
        pass


class HeldRead:
    """What one hold saw: whether the reader reached a peer's buffer, and what let it go on."""

    def __init__(self):
        self.reached = False  # the call read a peer's buffer while the hold was armed
        self.released_by = None  # "peers wrote their next input" or "timeout"
        self.waited_s = 0.0
        self.where = None  # "triton load" or the torch op

    def as_dict(self) -> dict:
        return {
            "reached": self.reached,
            "released_by": self.released_by,
            "waited_s": round(self.waited_s, 3),
            "where": self.where,
        }


def _peer_ranges(buf) -> list[tuple[int, int]]:
    """[start, end) byte ranges of every peer's buffer as this process maps them (a load's
    addresses are compared with them as unsigned 64-bit integers)."""
    return [
        (p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for r, p in enumerate(buf.peers) if r != buf.rank
    ]


class _Hold:
    def __init__(self, buf, scratch_dir, round_name, hold_s):
        self.ranges = _peer_ranges(buf)
        self.flags = [_flag(scratch_dir, round_name, r) for r in range(buf.world_size) if r != buf.rank]
        self.hold_s = hold_s
        self.seen = HeldRead()
        self.armed = True
        self.in_kernel = 0  # inside an interpreted launch: its loads are held, its torch calls not

    def touches(self, start: int, end: int) -> bool:
        """Whether bytes [start, end) overlap a peer's buffer."""
        return any(start < hi and lo < end for lo, hi in self.ranges)

    def reads_a_peer(self, addresses: np.ndarray) -> bool:
        """Whether any of these (unmasked) load addresses falls in a peer's buffer."""
        return any(bool(((addresses >= lo) & (addresses < hi)).any()) for lo, hi in self.ranges)

    def wait(self, where: str) -> None:
        """Step 2, then step 4: once per hold."""
        self.armed = False
        self.seen.reached, self.seen.where = True, where
        t0 = time.perf_counter()
        while not all(os.path.exists(f) for f in self.flags):
            if time.perf_counter() - t0 >= self.hold_s:
                self.seen.released_by = "timeout"
                break
            time.sleep(POLL_S)
        else:
            self.seen.released_by = "peers wrote their next input"
        self.seen.waited_s = time.perf_counter() - t0


class _TorchReads(TorchDispatchMode):
    """Step 2 for torch ops: an op that reads a peer's tensor waits first."""

    def __init__(self, hold: _Hold):
        super().__init__()
        self.hold = hold

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Newer torch wraps a mode's __torch_dispatch__ to keep torch.compile out of it when this
        # says True, and the wrapper's first call imports torch._dynamo: about 4 s per rank process
        # on the CPU tier, for a mode that never meets torch.compile. Older torch never asks.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if self.hold.armed and not self.hold.in_kernel and not func.is_view and name not in _NO_READ:
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
                    s = t.untyped_storage()
                    if self.hold.touches(s.data_ptr(), s.data_ptr() + s.nbytes()):
                        self.hold.wait(f"torch op aten.{name}")
                        break
        return func(*args, **kwargs)


@contextlib.contextmanager
def _triton_reads(hold: _Hold):
    """Step 2 for Triton kernels under the interpreter: every load goes through
    ``InterpreterBuilder.create_masked_load`` (``create_load`` calls it), whose first argument
    holds the addresses; a load that touches a peer's buffer waits first. The interpreter's
    launch (``GridExecutor.__call__``) moves tensor arguments in and out with torch calls before
    and after the kernel runs: those are not the kernel's reads, so the torch side looks away
    while a launch runs (a peer's tensor passed to a kernel would otherwise hold the launch
    before the kernel reaches its barrier)."""
    from triton.runtime import interpreter

    builder, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
    original, launch = builder.create_masked_load, executor.__call__

    def launch_marked(self, *args, **kwargs):
        hold.in_kernel += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            hold.in_kernel -= 1

    def create_masked_load(self, ptrs, mask, *rest, **kwargs):
        if hold.armed:
            addresses = np.asarray(ptrs.data, dtype=np.uint64).reshape(-1)
            if mask is not None:  # masked-off lanes read nothing, whatever their address
                addresses = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape).reshape(-1)]
            if addresses.size and hold.reads_a_peer(addresses):
                hold.wait("triton load")
        return original(self, ptrs, mask, *rest, **kwargs)

    builder.create_masked_load, executor.__call__ = create_masked_load, launch_marked
    try:
        yield
    finally:
        builder.create_masked_load, executor.__call__ = original, launch


@contextlib.contextmanager
def hold_peer_reads(buf, scratch_dir: str, round_name: str, hold_s: float):
    """Steps 1, 2 and 4 on the held rank, around one call of the collective: yields a
    :class:`HeldRead` that says, after the block, whether a peer read was held and what let it go.

    Args:
        buf: this rank's emulated ``SymmBuffer``; its peers' buffers are what the hold watches.
        scratch_dir: the world's shared scratch folder (``ctx.scratch_dir``), where the peers
            say they have written their next input.
        round_name: names this round's files, so that a late file of one round never releases
            another.
        hold_s: the longest wait (seconds).

    Note:
        Only ``buf``'s peers are watched, and in a Triton kernel only loads: a kernel whose first
        touch of a peer is a store (a push) runs on until its first peer load, if any. A torch op
        that takes a peer's tensor is held whether it reads or writes it. A collective that
        touches peers through another symmetric allocation is not held, and the result says
        ``reached`` False.
    """
    if not buf.emulated:
        raise ValueError("hold_peer_reads: buf: the emulated world only (interpreted kernels, shared memory)")
    hold = _Hold(buf, scratch_dir, round_name, hold_s)
    with _triton_reads(hold), _TorchReads(hold):
        yield hold.seen
