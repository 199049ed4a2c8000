"""A Triton copy: the smallest real kernel, used by the workbench to exercise the guard, the
checks, the benchmark harness and the plots on both tiers.

A copy moves 2 bytes of memory traffic per byte copied (read + write) and does no arithmetic,
so its ceiling is the device's memory bandwidth (about 4.2 TB/s read+write on an H200 as
measured here at 1 GiB, 3.0 on an H100; a copy small enough to stay in L2, 16 MiB, reads faster).
``torch.Tensor.copy_`` is the baseline it is compared with.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit.kernels.launch_helpers import overlaps
from labkit.workbench import tier
from labkit.workbench.checks import check_tensor
from labkit.workbench.guard import common_device, on_device_of

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8)


@triton.jit
def _copy_kernel(
    src_ptr,  # *T: first element of the contiguous source
    dst_ptr,  # *T: first element of the contiguous destination, same dtype
    numel,  # int: number of elements; the last block is masked
    BLOCK: tl.constexpr,  # elements per program (a power of two)
):
    pid = tl.program_id(0)
    # int64 offsets: numel may exceed 2**31 elements on a 141 GB GPU.
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def copy(src: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy ``src`` into ``out`` (made if None) with a Triton kernel; returns ``out``.

    src: contiguous tensor of a supported dtype, on a CUDA device (or the CPU under the
         interpreter). out: same shape, dtype and device, contiguous; either the very memory of
         src (``copy(x, x)``: the identity) or memory disjoint from it. An out that partly
         overlaps src is refused (as torch's ``copy_`` does): the kernel would read elements it
         has already overwritten. Checked on the host in O(1) (pointers and sizes); the values
         are not looked at (NaN and inf are copied bit for bit).
    """
    check_tensor("src", src, dtypes=SUPPORTED_DTYPES)
    if out is None:
        out = torch.empty_like(src)  # on src's device, whatever the current device is
    elif isinstance(out, torch.Tensor):
        common_device(src=src, out=out)  # mixed devices first: the most telling message
    check_tensor("out", out, dtypes=SUPPORTED_DTYPES)
    if out.dtype != src.dtype:
        raise TypeError(f"out: dtype {out.dtype} differs from src dtype {src.dtype}")
    if out.shape != src.shape:
        raise ValueError(f"out: shape {tuple(out.shape)} differs from src shape {tuple(src.shape)}")
    if out.data_ptr() != src.data_ptr() and overlaps(out, src):
        raise ValueError(
            f"out: overlaps src in memory (out starts {out.data_ptr() - src.data_ptr():+d} bytes from src); "
            "the kernel would read elements it has already overwritten: pass disjoint memory, or src itself"
        )
    n = src.numel()
    if n == 0:
        return out
    # The interpreter pays about 1 ms per program: few, large programs there.
    block = 1 << 16 if tier.interpreted() else 4096
    with on_device_of(src=src, out=out):
        _copy_kernel[(triton.cdiv(n, block),)](src, out, n, BLOCK=block, num_warps=8)
    return out
