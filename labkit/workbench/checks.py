"""Input checks shared by every public labkit function. Each error names the argument and what
was expected, so a wrong call fails at the call site instead of crashing a kernel later."""
from __future__ import annotations

from typing import Iterable

import torch

from labkit.workbench import tier


def check_tensor(name: str, t, *, dtypes: Iterable[torch.dtype] | None = None, ndim: int | None = None,
                 contiguous: bool = True, allow_empty: bool = True) -> torch.Tensor:
    """Raise TypeError/ValueError unless ``t`` is a tensor that a labkit kernel can launch on."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name}: dtype {str(t.dtype).replace('torch.', '')} is not supported; expected one of {allowed}")
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
