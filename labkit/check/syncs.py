"""``no_host_sync``: does ``fn`` make the host wait for the GPU?

On a GPU, ``fn`` runs once to warm up (first calls compile, autotune and create handles, and may
synchronise legitimately), then under ``torch.cuda.set_sync_debug_mode("error")``: the first
synchronising operation raises, and the report names it and the user's line that made it.

On the CPU tier nothing waits, so the check watches instead: every operation that reads a
tensor's values on the host (``.item()``, ``.tolist()``, ``int(t)``, ``if t:``, iterating,
``.cpu()``, ``nonzero``, boolean-mask indexing, ...), which on a GPU copies to the host and waits,
is listed with the line that made it (:class:`HostReads`). Reads made by the Triton interpreter to
run a kernel are not the user's: they are left out.
"""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

from labkit.check import report as R
from labkit.workbench import tier

NAME = "no_host_sync"

#: Tensor methods and torch functions that read values on the host (on a GPU: a copy and a wait)
HOST_READS = frozenset(
    {
        "tolist",
        "item",
        "cpu",
        "numpy",
        "__int__",
        "__float__",
        "__bool__",
        "__index__",
        "__iter__",
        "__repr__",
        "__str__",
        "__format__",
        "__array__",
        "nonzero",
        "argwhere",
        "repeat_interleave",
        "unique",
        "unique_consecutive",
        "masked_select",
        "equal",
        "allclose",
        "any",
        "all",
    }
)
#: of those, the ones that read values only when their result is looked at on the host (``any``,
#: ``all`` return a tensor: the read is the ``if`` that follows, itself listed as ``__bool__``)
LAZY_READS = frozenset({"any", "all"})
#: modules whose host reads only the CPU tier makes: the Triton interpreter copies every argument
#: to the host to run a kernel; labkit's grouped GEMM checks CPU counts on the host (on a GPU it
#: reads them on the device)
CPU_TIER_ONLY = ("triton", "labkit.kernels.grouped_gemm")


def _to_host(name: str, args, kwargs) -> bool:
    if name != "to":
        return False
    targets = list(args[1:]) + list(kwargs.values())
    return any(
        (isinstance(a, torch.device) and a.type == "cpu") or (isinstance(a, str) and a.startswith("cpu"))
        for a in targets
    )


def _bool_index(name: str, args) -> bool:
    """``x[mask]``: the output's size is the mask's count of True, read on the host."""
    if name != "__getitem__" or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def _excused() -> bool:
    """A read made inside one of ``CPU_TIER_ONLY``; but a read under ``check=True`` or
    ``check_splits=True`` (a check asked for, which reads back on a GPU too) is the user's."""
    f, inside = sys._getframe(2), False
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if any(name == m or name.startswith(m + ".") for m in CPU_TIER_ONLY):
            inside = True
            if f.f_locals.get("check") is True or f.f_locals.get("check_splits") is True:
                return False
        f = f.f_back
    return inside


class HostReads(TorchFunctionMode):
    """While active, ``reads`` collects one line per host read of a tensor's values:
    ``"item at file.py:12 (fn)"``."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        self._depth = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self._depth == 0 and name not in LAZY_READS:
            if (name in HOST_READS or _to_host(name, args, kwargs) or _bool_index(name, args)) and not _excused():
                shown = "x[bool mask]" if name == "__getitem__" else name
                self.reads.append(f"{shown} at {R.user_line(sys._getframe(1))}")
        self._depth += 1  # a read inside a read (repr calls item) is the same read
        try:
            return func(*args, **kwargs)
        finally:
            self._depth -= 1


def _gpu(fn, make_inputs, target: str) -> R.Report:
    device = torch.device("cuda", torch.cuda.current_device())
    args, kwargs = R.build_inputs(NAME, make_inputs, device)
    try:
        a, k = R.clone_inputs(args, kwargs)
        R.outputs(NAME, fn(*a, **k), a, k)
    except R.UsageError:
        raise
    except Exception as e:
        return R.Report(
            NAME,
            target,
            "error",
            "exception",
            f"fn raised {type(e).__name__}: {R.first_line(e)} on its first (warm-up) call, before any check",
        )
    torch.cuda.synchronize(device)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*args, **kwargs)
    except RuntimeError as e:
        if "synchroniz" not in str(e):
            return R.Report(NAME, target, "error", "exception", f"fn raised {type(e).__name__}: {R.first_line(e)}")
        at = R.user_line(tb=e.__traceback__)
        return R.Report(
            NAME,
            target,
            "failed",
            "host sync",
            f"{R.first_line(e)} at {at}",
            [f"the first synchronising operation was made at {at}"],
        )
    except Exception as e:
        return R.Report(NAME, target, "error", "exception", f"fn raised {type(e).__name__}: {R.first_line(e)}")
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return R.Report(
        NAME,
        target,
        "passed",
        "no host sync",
        "a call after the warm-up ran under sync-debug 'error' without synchronising",
    )


def _cpu(fn, make_inputs, target: str) -> R.Report:
    args, kwargs = R.build_inputs(NAME, make_inputs, tier.kernel_device())
    mode = HostReads()
    try:
        with mode:
            result = fn(*args, **kwargs)
    except Exception as e:
        return R.Report(
            NAME, target, "error", "exception", f"fn raised {type(e).__name__}: {R.first_line(e)}", mode.reads[:5]
        )
    R.outputs(NAME, result, args, kwargs)
    label = "CPU tier: no GPU to wait for; the host reads that synchronise on a GPU were listed instead"
    if mode.reads:
        shown = mode.reads[:8] + ([f"... {len(mode.reads)} in all"] if len(mode.reads) > 8 else [])
        return R.Report(
            NAME,
            target,
            "failed",
            "host sync",
            f"{len(mode.reads)} host read(s) of tensor values, each a sync on a GPU; the first: "
            f"{mode.reads[0]} ({label})",
            shown,
        )
    return R.Report(NAME, target, "passed", "no host sync", f"no host read of a tensor's values ({label})")


def no_host_sync(fn, make_inputs) -> R.Report:
    """Check that ``fn`` never makes the host wait for the GPU (lab 04's bug: ``m_splits.tolist()``).

    Args:
        fn: the function, or ``"module:function"``.
        make_inputs: ``make_inputs(device) -> (args, kwargs)``, or ``"module:function"``.

    Returns:
        a :class:`Report`: "no host sync", or "host sync" naming the operation and the line of
        ``fn`` (or below it) that made it; "error" if ``fn`` raised.

    Note:
        On a GPU the first call is a warm-up, not checked (compiling, autotuning and creating
        library handles may synchronise once). Sync-debug mode sees what torch's CUDA code
        declares as synchronising (copies to the host, ``item``, ``nonzero``, ...); a raw
        ``cudaDeviceSynchronize`` in an extension is not seen. On the CPU tier the check lists
        host reads of values instead: it also flags a read of a tensor that lives on the host on
        a GPU too (which costs no sync there).

    Example::

        >>> r = labkit.check.no_host_sync(experts_forward, make_moe_inputs)  # doctest: +SKIP
        >>> print(r.summary())  # doctest: +SKIP
        no_host_sync(...): FAILED: host sync: 3 host read(s) ...; the first: tolist at moe.py:41 (forward) ...
    """
    target = R.name_of(fn)
    fn, make_inputs = R.resolve(NAME, "fn", fn), R.resolve(NAME, "make_inputs", make_inputs)
    if tier.TIER == "gpu" and torch.cuda.is_available():
        return _gpu(fn, make_inputs, target)
    return _cpu(fn, make_inputs, target)
