"""A plain Triton matrix product, C = A @ B, for the lab that measures pointer ALIGNMENT.

Why a kernel of our own rather than ``torch.mm``: the lab asks how a GEMM's speed changes when
its operands start 2, 16 or 128 bytes past a 256-byte boundary, and it wants one fixed, readable
kernel at every offset, so that the only thing that changes between runs is the pointers.
cuBLAS picks a different kernel per shape and alignment behind our back; this one does not.

How alignment reaches the code: Triton specialises every pointer argument on whether it is
divisible by 16 bytes (and every integer on divisibility by 16 and on being 1). A pointer 16
or 128 bytes past a boundary gets the same compiled kernel as an aligned one; a pointer 2 bytes
past one gets a second specialisation, compiled with narrower (or no) vector loads. That is the
effect the lab measures, so the launcher adds no alignment hints of its own: a hint that claimed
more alignment than the pointer has would make the compiled loads wrong, not faster.

The kernel is the classic tiled GEMM (after the structure of Triton's matrix-multiplication
tutorial): each program computes one BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps
with an fp32 accumulator; programs are numbered in groups of GROUP_M tile-rows ("swizzle") so
that programs running at the same time share tiles of A and B in L2. On the GPU the config is
fixed (no autotuning): BLOCK 128 x 128 x 64, GROUP_M 8, 8 warps, 3 pipeline stages.

Interpreter (TRITON_INTERPRET=1, the CPU tier) notes, measured with triton 3.9:

* ``tl.dot`` on two bf16 tiles multiplies their raw bit patterns (upstream issue #11584), so
  under the interpreter bf16 tiles are upcast to fp32 before the dot (the UPCAST flag below).
  The products of bf16 values are exact in fp32, so this changes no result on the GPU either.
* the interpreter's fp32 -> bf16 conversion truncates instead of rounding to nearest, so a bf16
  result can be one bf16 unit below the GPU's: compare with a tolerance, never bitwise.
* each program costs about 1 ms, so the interpreter gets large tiles and few programs.

fp32 inputs follow torch's own setting for fp32 matrix products
(``torch.set_float32_matmul_precision``): "highest" (torch's default) gives full-precision
("ieee") dots, "high"/"medium" give TF32 tensor-core dots, as ``torch.mm`` would use.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from labkit.kernels.launch_helpers import dtype_name, fp32_input_precision, needs_int64, overlaps
from labkit.workbench import tier
from labkit.workbench.checks import check_tensor
from labkit.workbench.guard import common_device, on_device_of

DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The boundary that ``misaligned`` measures offsets from (bytes).
ALIGNMENT = 256


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatmulConfig:
    """Tile sizes and launch options of one kernel launch."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


#: The compiled (GPU) configuration, the same at every offset and every shape.
GPU_CONFIG = MatmulConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
#: Under the interpreter: large tiles, few programs (each costs ~1 ms); warps and stages are ignored.
INTERPRETER_CONFIG = MatmulConfig(block_m=64, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=1)


def launch_config() -> MatmulConfig:
    """The configuration ``matmul`` launches with on this tier."""
    return INTERPRETER_CONFIG if tier.interpreted() else GPU_CONFIG


def flops(M: int, N: int, K: int) -> int:
    """Floating-point operations of one [M, K] @ [K, N] product: a multiply and an add per term."""
    return 2 * M * N * K


@triton.jit
def _matmul_kernel(
    a_ptr,  # *T: A[0, 0]; A is [M, K] with any strides; may be misaligned
    b_ptr,  # *T: B[0, 0]; B is [K, N] with any strides; may be misaligned
    c_ptr,  # *T: C[0, 0]; C is [M, N], contiguous (column stride 1)
    M,
    N,
    K,  # int: the problem's sizes; M, N, K >= 1 (the launcher handles 0)
    stride_am,
    stride_ak,  # int: elements between consecutive rows / columns of A
    stride_bk,
    stride_bn,  # int: elements between consecutive rows / columns of B
    stride_cm,  # int: elements between consecutive rows of C (N when contiguous)
    BLOCK_M: tl.constexpr,  # rows of C per program (power of two, >= 16)
    BLOCK_N: tl.constexpr,  # columns of C per program (power of two, >= 16)
    BLOCK_K: tl.constexpr,  # depth of one step along K (power of two, >= 16)
    GROUP_M: tl.constexpr,  # tile-rows per swizzle group (L2 reuse between programs)
    UPCAST: tl.constexpr,  # convert A and B tiles to fp32 before tl.dot (interpreter + bf16)
    INPUT_PRECISION: tl.constexpr,  # "ieee" or "tf32": how tl.dot treats fp32 inputs
    INT64: tl.constexpr,  # compute element offsets in int64 (an operand spans >= 2**31 elements)
):
    # Which tile of C this program owns. Programs are numbered down the tile-rows of a group of
    # GROUP_M rows before moving one tile-column right, so consecutive programs reuse the same
    # B columns and a small set of A rows instead of sweeping a whole row of C each.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)  # the last group may have fewer rows
    tile_m = first_m + (pid % per_group) % group_rows
    tile_n = (pid % per_group) // group_rows

    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of A and C this tile covers
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)  # columns of B and C this tile covers
    ks = tl.arange(0, BLOCK_K)  # offsets along K within one step
    if INT64:
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
        ks = ks.to(tl.int64)
    row_ok = rows < M
    col_ok = cols < N

    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak  # [BLOCK_M, BLOCK_K]
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(tl.cdiv(K, BLOCK_K)):
        k_left = K - step * BLOCK_K  # the last step may be partial: mask it
        # Out-of-range elements load as 0 and add nothing to the dot.
        a = tl.load(a_ptrs, mask=row_ok[:, None] & (ks[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] < k_left) & col_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = a @ b with the Triton kernel above; returns ``out`` (made if None).

    a: [M, K] and b: [K, N], the same dtype (float16, bfloat16 or float32), any strides, any
    alignment, on one CUDA device (or the CPU under the interpreter). Sums are fp32.
    out: [M, N], contiguous, a's dtype, on the same device, not overlapping a or b.
    Empty M or N: ``out`` is returned untouched; K == 0: ``out`` is filled with zeros.
    """
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            check_tensor(name, t)  # raises the TypeError naming the argument
    common_device(a=a, b=b, out=out)  # mixed devices first: the most telling message
    check_tensor("a", a, dtypes=DTYPES, ndim=2, contiguous=False)
    check_tensor("b", b, dtypes=DTYPES, ndim=2, contiguous=False)
    if b.dtype != a.dtype:
        raise TypeError(f"b: dtype {dtype_name(b.dtype)} differs from a's dtype {dtype_name(a.dtype)}")
    (M, K), (Kb, N) = a.shape, b.shape
    if Kb != K:
        raise ValueError(
            f"a, b: inner dimensions differ: a has shape {tuple(a.shape)}, b has shape "
            f"{tuple(b.shape)} (a's columns must equal b's rows)"
        )
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    else:
        check_tensor("out", out, dtypes=DTYPES, ndim=2)
        if out.dtype != a.dtype:
            raise TypeError(f"out: dtype {dtype_name(out.dtype)} differs from a's dtype {dtype_name(a.dtype)}")
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out: shape {tuple(out.shape)} is not (M, N) = {(M, N)}")
        for name, t in (("a", a), ("b", b)):
            if overlaps(out, t):
                raise ValueError(f"out: overlaps {name} in memory; the kernel would overwrite its own input")
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    return _launch(a, b, out)


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    config: MatmulConfig | None = None,
    int64_offsets: bool | None = None,
) -> torch.Tensor:
    """Launch the kernel on checked, non-empty inputs. config / int64_offsets: forced for tests."""
    cfg = config or launch_config()
    (M, K), N = a.shape, b.shape[1]
    if int64_offsets is None:
        int64_offsets = needs_int64(a, b, out, pad=max(cfg.block_m, cfg.block_n, cfg.block_k))
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    with on_device_of(a=a, b=b, out=out):
        _matmul_kernel[grid](
            a,
            b,
            out,
            M,
            N,
            K,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            out.stride(0),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            UPCAST=tier.interpreted() and a.dtype == torch.bfloat16,
            INPUT_PRECISION=fp32_input_precision() if a.dtype == torch.float32 else "ieee",
            INT64=int64_offsets,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out


def misaligned(
    shape, dtype: torch.dtype, device, offset_bytes: int, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """A contiguous tensor of ``shape`` filled with standard-normal values whose data_ptr is
    exactly ``offset_bytes`` past a 256-byte-aligned address (when it has elements: torch reports
    data_ptr() == 0 for an empty tensor).

    offset_bytes: 0 <= offset_bytes < 256, a multiple of the dtype's item size (2 for bf16/fp16,
    4 for fp32). generator: draws the values (on the generator's own device, then copied), so a
    CPU generator gives the same values on any device.
    """
    dtype_ok = isinstance(dtype, torch.dtype) and dtype.is_floating_point and not dtype.is_complex
    if not dtype_ok:
        raise TypeError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
    if isinstance(offset_bytes, bool) or not isinstance(offset_bytes, int):
        raise TypeError(f"offset_bytes: expected an int, got {type(offset_bytes).__name__}")
    itemsize = dtype.itemsize
    if not 0 <= offset_bytes < ALIGNMENT:
        raise ValueError(f"offset_bytes: expected 0 <= offset_bytes < {ALIGNMENT}, got {offset_bytes}")
    if offset_bytes % itemsize:
        raise ValueError(
            f"offset_bytes: {offset_bytes} is not a multiple of the {dtype_name(dtype)} item size ({itemsize} bytes)"
        )
    shape = torch.Size((shape,) if isinstance(shape, int) else shape)
    numel = math.prod(shape)
    # Room for the walk to the first aligned element (< 256 bytes) plus the offset (< 256 bytes).
    # Allocators align far more than an item, so the walk is a whole number of items.
    buf = torch.empty(numel + 2 * ALIGNMENT // itemsize, dtype=dtype, device=device)
    to_boundary = -buf.data_ptr() % ALIGNMENT
    if to_boundary % itemsize:
        raise RuntimeError(
            f"misaligned: the allocator returned {buf.data_ptr():#x}, not a multiple of the item size {itemsize}"
        )
    start = (to_boundary + offset_bytes) // itemsize
    t = buf[start : start + numel].view(shape)
    values = torch.randn(
        shape, dtype=dtype, generator=generator, device=generator.device if generator is not None else t.device
    )
    t.copy_(values)
    # (An empty tensor has no address of its own: torch reports data_ptr() == 0 for it.)
    assert numel == 0 or t.data_ptr() % ALIGNMENT == offset_bytes
    return t


__all__ = [
    "ALIGNMENT",
    "DTYPES",
    "GPU_CONFIG",
    "INTERPRETER_CONFIG",
    "MatmulConfig",
    "flops",
    "launch_config",
    "matmul",
    "misaligned",
]
