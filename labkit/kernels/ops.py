"""labkit's public kernels as PyTorch custom ops: ``torch.ops.labkit.<name>``, importing this module
registers them (torch >= 2.8; ``torch.library.custom_op``).

    import labkit.kernels.ops                       # registers torch.ops.labkit.*
    y = torch.ops.labkit.copy(x)
    z = torch.ops.labkit.sc_matmul(a, b, 8, 256, "per_row", 0, "bitrev", "counter_alt", False)
    name = symm.register(buf)                       # every rank, same order: the buffer's name
    s = torch.ops.labkit.all_reduce(x, name, "auto")

Why ops: ``torch.compile`` traces through an op as one node (``fullgraph=True`` works, no graph
break at a Triton launch), shape propagation uses the fake implementations registered here
(no kernel runs while tracing), and CUDA-graph capture of a compiled region sees one opaque call.

* ``copy(src) -> Tensor``: ``labkit.kernels.copy``.
* ``sc_matmul(a, b, sc_prec, stoc_len, granularity, chunk_d, a_seq, b_seq, halve) -> Tensor``:
  ``labkit.kernels.sc.sc_matmul``, its options as scalar arguments (same defaults).
* ``all_reduce(input, handle, algorithm="auto")``, ``reduce_scatter(input, handle)``,
  ``all_gather(input, handle) -> Tensor``: the collectives of ``labkit.kernels.comm.collectives``
  on the symmetric buffer registered as ``handle`` (``symm.register``), the way
  ``torch.ops.symm_mem`` names its process group by a string. ``input`` is this rank's
  contribution, shaped and typed as the buffer: when it is the buffer's tensor itself nothing is
  copied, otherwise it is copied into the buffer first (the buffer is the op's workspace: its
  content afterwards is unspecified). The result is a new tensor; the call is collective, with
  the barrier semantics of the functions it calls (every rank calls the op, in the same order).
  The plan cache of those functions applies (one plan per buffer and arguments).

Why ``custom_op`` and not ``triton_op``: ``triton_op`` lets Inductor see the Triton kernels
inside, but it traces the Python around them, and labkit's launchers do host work that must not
be traced (argument checks, the device guard, the plan cache, collectives' barriers that pair
launches across ranks), and under the interpreter (the CPU tier) the kernels are not
``JITFunction``s that ``wrap_triton`` accepts. An opaque op keeps every launch exactly as eager.
The ops have no autograd formula (none of these kernels is differentiable in labkit).
"""

from __future__ import annotations

import torch

from labkit.kernels.comm import collectives as _collectives
from labkit.kernels.comm import symm as _symm
from labkit.kernels.copy import copy as _copy
from labkit.kernels.sc import matmul as _sc
from labkit.workbench.errors import UsageError

#: every op registered here: torch.ops.labkit.<name>
OPS = ("copy", "sc_matmul", "all_reduce", "reduce_scatter", "all_gather")


@torch.library.custom_op("labkit::copy", mutates_args=())
def copy(src: torch.Tensor) -> torch.Tensor:
    """``labkit.kernels.copy(src)``: a new tensor, copied by the Triton kernel."""
    return _copy(src)


@copy.register_fake
def _copy_fake(src):
    return torch.empty_like(src)


#: plain ints, not the SymInts ``custom_op`` infers from ``int``: the options pick the kernel's
#: constants and tables, never a shape, and must stay concrete under dynamic-shape tracing
_SC_SCHEMA = (
    '(Tensor a, Tensor b, int sc_prec=8, int stoc_len=256, str granularity="per_row", int chunk_d=0, '
    'str a_seq="bitrev", str b_seq="counter_alt", bool halve=False) -> Tensor'
)


@torch.library.custom_op("labkit::sc_matmul", mutates_args=(), schema=_SC_SCHEMA)
def sc_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    sc_prec: int = 8,
    stoc_len: int = 256,
    granularity: str = "per_row",
    chunk_d: int = 0,
    a_seq: str = "bitrev",
    b_seq: str = "counter_alt",
    halve: bool = False,
) -> torch.Tensor:
    """``labkit.kernels.sc.sc_matmul(a, b, **options)``."""
    # (a 2-D product is a view of the kernel's [1, M, N] result: no input's memory, which is what
    # an op may not return; opcheck checks it)
    return _sc.sc_matmul(
        a,
        b,
        sc_prec=sc_prec,
        stoc_len=stoc_len,
        granularity=granularity,
        chunk_d=chunk_d,
        a_seq=a_seq,
        b_seq=b_seq,
        halve=halve,
    )


@sc_matmul.register_fake
def _sc_matmul_fake(
    a, b, sc_prec=8, stoc_len=256, granularity="per_row", chunk_d=0, a_seq="bitrev", b_seq="counter_alt", halve=False
):
    # the eager call's checks, on shapes and dtypes only: a bad call fails while tracing
    _sc._check_inputs(
        a,
        b,
        _sc.SCConfig(
            sc_prec=sc_prec,
            stoc_len=stoc_len,
            granularity=granularity,
            chunk_d=chunk_d,
            a_seq=a_seq,
            b_seq=b_seq,
            halve=halve,
        ),
    )
    return a.new_empty(tuple(a.shape[:-1]) + (b.shape[-1],))


def _buffer(handle: str, x: torch.Tensor) -> _symm.SymmBuffer:
    """The registered buffer, checked against this rank's input (shape, dtype, device)."""
    buf = _symm.lookup(handle)
    t = buf.tensor
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != tuple(t.shape) or x.dtype != t.dtype or x.device != t.device:
        raise UsageError(
            f"input: {tuple(x.shape)} {x.dtype} on {x.device} does not match the buffer {handle!r} "
            f"({tuple(t.shape)} {t.dtype} on {t.device}); an input is copied into the buffer, "
            "so it must have the buffer's shape, dtype and device"
        )
    return buf


def _stage(handle: str, x: torch.Tensor) -> _symm.SymmBuffer:
    """The buffer, with ``x`` in it (in stream order: the kernel's start barrier sees it)."""
    buf = _buffer(handle, x)
    if x.data_ptr() != buf.tensor.data_ptr():
        buf.tensor.copy_(x)
    return buf


@torch.library.custom_op("labkit::all_reduce", mutates_args=())
def all_reduce(input: torch.Tensor, handle: str, algorithm: str = "auto") -> torch.Tensor:
    """Sum over ranks of ``input`` through the symmetric buffer named ``handle`` (collective)."""
    return _collectives.all_reduce(_stage(handle, input), algorithm=algorithm)


@all_reduce.register_fake
def _all_reduce_fake(input, handle, algorithm="auto"):
    _buffer(handle, input)
    return torch.empty_like(input)


@torch.library.custom_op("labkit::reduce_scatter", mutates_args=())
def reduce_scatter(input: torch.Tensor, handle: str) -> torch.Tensor:
    """Rank r's shard (dim 0 split into W) of the sum over ranks (collective)."""
    return _collectives.reduce_scatter(_stage(handle, input))


@reduce_scatter.register_fake
def _reduce_scatter_fake(input, handle):
    w = _buffer(handle, input).world_size
    if input.shape[0] % w:
        raise ValueError(f"input: dim 0 of shape {tuple(input.shape)} does not split into {w} equal shards")
    return input.new_empty((input.shape[0] // w,) + tuple(input.shape[1:]))


@torch.library.custom_op("labkit::all_gather", mutates_args=())
def all_gather(input: torch.Tensor, handle: str) -> torch.Tensor:
    """Every rank's ``input`` concatenated along dim 0 (collective)."""
    return _collectives.all_gather(_stage(handle, input))


@all_gather.register_fake
def _all_gather_fake(input, handle):
    w = _buffer(handle, input).world_size
    return input.new_empty((input.shape[0] * w,) + tuple(input.shape[1:]))
