"""Small decisions every GEMM launcher of labkit makes the same way: when element offsets need
int64, how fp32 inputs meet tl.dot, and how a dtype is named in an error message."""

from __future__ import annotations

import torch


def needs_int64(*tensors: torch.Tensor, pad: int = 0) -> bool:
    """True if an element offset a kernel forms (up to ``pad`` elements past each edge, for
    masked lanes) might not fit in int32."""
    return any(sum((size + pad) * abs(stride) for size, stride in zip(t.shape, t.stride())) >= 2**31 for t in tensors)


def fp32_input_precision() -> str:
    """tl.dot's input_precision for fp32 operands, following torch's fp32 matmul setting
    (``torch.set_float32_matmul_precision``): "highest" gives "ieee", otherwise "tf32"."""
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16'."""
    return str(dtype).replace("torch.", "")
