"""Small decisions labkit's launchers make the same way: when element offsets need int64, how fp32
inputs meet tl.dot, how a dtype is named in an error message (the GEMM launchers), and whether two
tensors share memory (an output refused where a kernel reads while it writes: ``matmul``, the
collectives, the push all-reduce)."""

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


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of ``a`` and ``b`` share a byte. A tensor's span runs from its first
    element to the end of its last, by its strides: exact for contiguous tensors, conservative for
    strided views (the gaps between their elements count). An empty tensor spans nothing.

    Addresses are compared, not storages: two tensors over the same memory through different
    storages (a peer's mapped buffer, memory wrapped from a raw pointer) overlap too."""
    na, nb = a.numel(), b.numel()
    if not na or not nb:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1 = a0 + (na * a.element_size() if a.is_contiguous() else _strided_span(a))
    b1 = b0 + (nb * b.element_size() if b.is_contiguous() else _strided_span(b))
    return a0 < b1 and b0 < a1


def _strided_span(t: torch.Tensor) -> int:
    """Bytes from the first element of a non-empty strided view to the end of its last."""
    return (sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()
