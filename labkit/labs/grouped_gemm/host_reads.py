"""A counting stand-in for token counts that live on the GPU: every host read of them is counted.

On a GPU, reading ``m_splits`` on the host (``.tolist()``, ``.item()``, ``int(...)``, iterating,
``.cpu()``, slicing with a count) is a device-to-host copy that waits for the GPU: the sync lab 04
removes. On the CPU tier the counts are already on the host, so nothing waits; ``CountedSplits``
makes those reads visible instead. Wrap the counts (``CountedSplits.wrap(t)``), run the code, read
``reads``: one line per read, naming the operation and the line of code that made it. Tensors
computed from the counts (a cumsum, a slice) are counted too.

Two kinds of read are not counted, because on a GPU they do not happen: inside labkit's grouped
GEMM (``labkit.kernels.grouped_gemm``), the CPU tier's own full check of CPU counts and the Triton
interpreter's copy of its arguments; on a GPU that kernel reads device counts on the device. Its
``check_splits=True`` reads them back on a GPU too (a sync), so a read under it is counted.
"""

from __future__ import annotations

import sys

import torch

from labkit.check import syncs

#: Tensor operations that read a tensor's values on the host (on a GPU: a copy and a wait): the
#: checker's list (``labkit.check.no_host_sync``), less the reductions whose read is the ``if``
#: that looks at their result (counted there, as ``__bool__``)
HOST_READS = syncs.HOST_READS - syncs.LAZY_READS
_KERNEL_MODULE = "labkit.kernels.grouped_gemm"


def _to_host(func, args, kwargs) -> bool:
    """``t.to("cpu")``-like calls: a copy to the host."""
    if getattr(func, "__name__", "") != "to":
        return False
    targets = list(args[1:]) + list(kwargs.values())
    return any(
        (isinstance(a, torch.device) and a.type == "cpu") or (isinstance(a, str) and a.startswith("cpu"))
        for a in targets
    )


def _excused() -> bool:
    """Inside labkit's grouped GEMM without ``check_splits``: a read only the CPU tier makes."""
    frame, inside = sys._getframe(2), False
    while frame is not None:
        if frame.f_globals.get("__name__") == _KERNEL_MODULE:
            inside = True
            if frame.f_locals.get("check") is True or frame.f_locals.get("check_splits") is True:
                return False
        frame = frame.f_back
    return inside


def _caller() -> str:
    """The first line outside torch and this module that led to the read."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("torch") or name == __name__):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class CountedSplits(torch.Tensor):
    """Integer counts whose host reads are counted in ``CountedSplits.reads`` (module docstring)."""

    reads: list[str] = []

    @classmethod
    def wrap(cls, counts: torch.Tensor) -> CountedSplits:
        """``counts`` (an integer tensor) as a counted stand-in; clears ``reads``."""
        if not isinstance(counts, torch.Tensor) or counts.is_floating_point():
            raise TypeError(f"CountedSplits.wrap: counts: expected an integer tensor, got {counts!r:.60}")
        cls.reads = []
        return counts.clone().as_subclass(cls)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if (name in HOST_READS or _to_host(func, args, kwargs)) and not _excused():
            cls.reads.append(f"{name} at {_caller()}")
        return super().__torch_function__(func, types, args, kwargs)
