"""Input checks shared by every public labkit function. Each error names the argument and what
was expected, so a wrong call fails at the call site instead of crashing a kernel later."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from labkit.workbench import tier
from labkit.workbench.errors import UsageError


def check_tensor(
    name: str,
    t,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    ndim: int | None = None,
    contiguous: bool = True,
    allow_empty: bool = True,
) -> torch.Tensor:
    """Raise TypeError/ValueError unless ``t`` is a tensor that a labkit kernel can launch on."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(
                f"{name}: dtype {str(t.dtype).replace('torch.', '')} is not supported; expected one of {allowed}"
            )
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()); got strides {t.stride()}")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor")
    check_kernel_device(name, t)
    return t


def check_kernel_device(name: str, t: torch.Tensor) -> None:
    """Triton kernels take CUDA tensors, or CPU tensors when the interpreter runs them."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and tier.interpreted():
        return
    where = "CUDA tensors" + (" (or CPU tensors under TRITON_INTERPRET=1)" if tier.TIER != "gpu" else "")
    raise ValueError(f"{name}: is on {t.device}; labkit's Triton kernels take {where}")


def check_device(name: str, device, *, types: Iterable[str] = ("cpu", "cuda")) -> torch.device:
    """``device`` as a torch.device that exists on this machine, or an error naming ``name``.

    Without this, a CUDA device on a machine without one fails deep inside torch with a bare
    ``AssertionError: Torch not compiled with CUDA enabled`` (or an invalid-ordinal error for
    an index past the last GPU). TypeError for a value that is no device at all; UsageError (a
    ValueError) for a bad device string, a device type outside ``types``, or a CUDA device this
    machine lacks. A bare "cuda" becomes the current CUDA device.
    """
    types = tuple(types)
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"{name}: expected a device such as 'cpu' or 'cuda:0', got {type(device).__name__} {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"{name}: {device!r} is not a device (expected e.g. 'cpu', 'cuda' or 'cuda:1')") from None
    if dev.type not in types:
        raise UsageError(f"{name}: expected one of the device types {types}, got {str(dev)!r}")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(
                f"{name}: {str(dev)!r} asked for a CUDA device, but this machine has 0 CUDA devices"
                " (torch.cuda.is_available() is False)"
            )
        if dev.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        if dev.index >= count:
            raise UsageError(
                f"{name}: {str(dev)!r} does not exist: this machine has {count} CUDA device"
                f"{'s' if count > 1 else ''} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
            )
    return dev
