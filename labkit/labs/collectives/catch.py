"""Lab 02's "catch it in your code": collectives over symmetric memory, for ``labkit.check.collective``.

Each takes ``buf`` (this rank's ``SymmBuffer``, holding its input) and returns this rank's sum:

* ``one_shot_seed``: labkit's one-shot all-reduce without its end barrier (variant
  ``no_end_barrier``): a rank that finishes first writes its next input while a peer still reads;
* ``one_shot_fixed``: the kernel as it should be;
* ``peers_seed``: an all-reduce written in plain torch on the peers' buffers with a barrier before
  the reads but none after them: the same race, in a user's own code;
* ``peers_fixed``: the same with both barriers.

* ``peers_with_your_barrier``: ``peers_fixed`` with exercise 02.barrier's answer as both of its
  barriers (two ranks): the exercise's check runs it through ``labkit.check.collective``. Each
  rank compiles the answer from its text, which the check hands over in the environment variable
  ``BARRIER_SOURCE_ENV`` (a rank is a fresh process: it cannot import a notebook's function).

``inputs(device)`` gives this rank's input (4096 float32 values).
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import textwrap
import zlib

import torch
import triton
import triton.language as tl

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm.signals import pad_slot
from labkit.workbench.errors import UsageError
from labkit.workbench.guard import on_device_of

NUMEL = 4096


def inputs(device) -> tuple[tuple, dict]:
    return (torch.randn(NUMEL, device=device),), {}


def one_shot_seed(buf):
    return C.all_reduce(buf, algorithm="one_shot", variant="no_end_barrier")


def one_shot_fixed(buf):
    return C.all_reduce(buf, algorithm="one_shot")


def _peers_sum(buf, end_barrier: bool):
    C.barrier(buf)  # every rank's input is written before anyone reads
    out = torch.zeros_like(buf.tensor, dtype=torch.float32)
    for peer in buf.peers:
        out += peer.float()
    if end_barrier:
        C.barrier(buf)  # nobody writes its next input while a peer still reads this one
    return out.to(buf.tensor.dtype)


def peers_seed(buf):
    return _peers_sum(buf, end_barrier=False)


def peers_fixed(buf):
    return _peers_sum(buf, end_barrier=True)


#: the environment variable that carries exercise 02.barrier's answer, as text, to every rank
BARRIER_SOURCE_ENV = "LABKIT_02_BARRIER_SOURCE"


def barrier_source(signal_then_wait) -> str:
    """The text of a ``@triton.jit`` function, from its ``def`` on (what a rank compiles again)."""
    fn = getattr(signal_then_wait, "fn", None)
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (TypeError, OSError):
        src = ""
    at = re.search(r"^def\s+\w+\s*\(", src, re.MULTILINE)
    if at is None:
        raise UsageError(
            f"barrier_source: signal_then_wait: expected a @triton.jit function whose text Python can read, "
            f"got {signal_then_wait!r:.60}"
        )
    return src[at.start() :]


@functools.cache
def _compiled(src: str):
    """``src`` (a function's text from its ``def``) as a ``@triton.jit`` function, with ``triton``
    and ``tl`` in scope. Its text goes into linecache under the name it is compiled with: Triton
    reads a function's source back."""
    text = f"import triton\nimport triton.language as tl\n\n\n@triton.jit\n{src}"
    filename = f"<02.barrier answer {zlib.crc32(text.encode()):08x}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    namespace: dict = {"__name__": "labkit_02_barrier_answer"}
    exec(compile(text, filename, "exec"), namespace)
    return namespace[re.search(r"^def\s+(\w+)", src, re.MULTILINE).group(1)]


@triton.jit
def _pair_barrier_kernel(pad_ptrs, rank, BARRIER: tl.constexpr, MAX_BLOCKS: tl.constexpr):
    """Two ranks meet through ``BARRIER(peer_slot, my_slot)``: this rank signals slot (channel 0,
    block 0, src = this rank) of the peer's pad and waits on the same slot of its own pad."""
    peer = 1 - rank
    tl.debug_barrier()
    BARRIER(pad_slot(pad_ptrs, peer, 0, 0, rank, 2, MAX_BLOCKS), pad_slot(pad_ptrs, rank, 0, 0, peer, 2, MAX_BLOCKS))
    tl.debug_barrier()


def peers_with_your_barrier(buf):
    """``peers_fixed`` on two ranks with the barrier compiled from ``$LABKIT_02_BARRIER_SOURCE``."""
    src = os.environ.get(BARRIER_SOURCE_ENV)
    if not src:
        raise UsageError(f"peers_with_your_barrier: ${BARRIER_SOURCE_ENV} is not set: no barrier to run")
    if buf.world_size != 2:
        raise UsageError(f"peers_with_your_barrier: buf: a barrier between two ranks, got a world of {buf.world_size}")
    barrier = _compiled(src)

    def meet():
        with on_device_of(buf=buf.tensor):
            _pair_barrier_kernel[(1,)](buf.pad_ptrs, buf.rank, barrier, MAX_BLOCKS=buf.max_blocks)

    meet()  # every rank's input is written before anyone reads
    out = torch.zeros_like(buf.tensor, dtype=torch.float32)
    for peer in buf.peers:
        out += peer.float()
    meet()  # nobody writes its next input while a peer still reads this one
    return out.to(buf.tensor.dtype)


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("collective", fn, inputs, {"world_size": 2}) for fn in (one_shot_seed, one_shot_fixed)]
