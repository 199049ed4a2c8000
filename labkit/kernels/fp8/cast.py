"""Quantise a tensor to FP8 in one pass: its amax and its cast in the same kernel.

Casting with torch ops (``x.abs().amax()``, then ``(x * scale).to(float8)``) reads the input
twice and writes fp32 intermediates, several times the bytes of one pass that reads bf16 once and
writes FP8 once; what the one pass costs beside the GEMM is the gap between impls
'fp8_quantize_gemm' and 'fp8_gemm' in reference/h200x1/fp8_dispatch.json, kind 'speed'. Delayed scaling
makes one pass enough: the scale applied NOW comes from the history (earlier steps), and the amax
measured NOW only goes into the history. So ``_quantize_kernel`` reads each element once and, in
the same pass,

* takes the block's max |x| of the UNSCALED input and folds it into the amax slot (row 0 of the
  history) with one atomic max per program;
* writes ``clamp(x * scale, -fp8_max, fp8_max)`` (saturation, as TransformerEngine's casts do).

Non-finite input behaves as ``quantize_reference`` (torch): +-inf saturates to +-fp8_max and
makes the amax inf; NaN stays NaN in the data (and ``inf * 0`` with a zero scale is NaN) and
makes the amax NaN. The max is taken on the bits of |x| as int32 (non-negative floats order as
their bits; NaN above inf), so no float max can drop a NaN; the recipe then keeps the previous
scale while an inf or NaN amax is in the history (``recipe.scale_from_amax``). The slot's
earlier value takes part in the max like any other (a NaN there stays, unless its sign bit is set).

Where the final conversion to FP8 happens depends on the tier, behind one constexpr:

* GPU (``CAST_IN_KERNEL=True``): the kernel converts to ``float8e4nv`` / ``float8e5`` itself and
  writes 1 byte per element (round to nearest even; the clamp before it makes it saturating);
* Triton interpreter (``CAST_IN_KERNEL=False``): the interpreter's fp32 -> fp8 conversion is
  wrong: it loses the rounding carry (126.24 -> 64, not 128: triton-lang/triton PR #11897's
  example; issue #8322 reports its fp16 -> fp8e5 cast differing too) and does not saturate, so the
  kernel writes the clamped, scaled fp32 values and torch's ``.to(float8)`` (round to nearest even)
  finishes. Same values, one extra torch op, only on the CPU tier.

Program 0 also writes ``scale_inv = 1 / scale`` next to the output: the dequantisation factor
travels with the FP8 data (``Quantized``), so a scale updated later (on the context's exit,
before backward runs) never reinterprets data cast with the previous one.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from labkit.kernels.fp8.recipe import FP8_MAX
from labkit.kernels.launch_helpers import dtype_name, needs_int64
from labkit.workbench import tier
from labkit.workbench.checks import check_tensor
from labkit.workbench.guard import common_device, on_device_of

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES = tuple(FP8_MAX)
#: elements per block; GPU programs loop over several blocks so that the amax slot sees one atomic
#: per program, not one per block (at most PROGRAMS_PER_SM x SMs programs)
GPU_BLOCK, PROGRAMS_PER_SM = 4096, 4
#: under the interpreter each program costs about 1 ms: large blocks, few programs
INTERPRETER_BLOCK, INTERPRETER_PROGRAMS = 1 << 14, 4


@dataclasses.dataclass
class Quantized:
    """FP8 data and the factor that reads it back: ``value = data * scale_inv`` (fp32, 0-D)."""

    data: torch.Tensor
    scale_inv: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self) -> torch.Tensor:
        """The values this FP8 tensor stands for, in fp32."""
        return self.data.float() * self.scale_inv

    def t(self) -> Quantized:
        """The transpose, laid out row-major (a copy: FP8 GEMMs want both operands K-contiguous)."""
        return Quantized(self.data.t().contiguous(), self.scale_inv)


@triton.jit
def _quantize_kernel(
    x_ptr,  # *T (bf16/fp16/fp32): the input, n contiguous elements
    out_ptr,  # *fp8 (CAST_IN_KERNEL) or *fp32: the scaled, saturated output, n elements
    scale_ptr,  # *fp32: the scale to apply, one element (delayed: from the history)
    amax_ptr,  # *fp32: the amax slot, one element; receives max |x| (unscaled) by atomic max
    scale_inv_ptr,  # *fp32: one element; program 0 writes 1 / scale there
    n,  # int: number of elements
    blocks_per_program,  # int: consecutive blocks each program reads (the last ones masked)
    FP8_MAX: tl.constexpr,  # largest finite value of the output format (448 or 57344)
    BLOCK: tl.constexpr,  # elements per block (a power of two)
    CAST_IN_KERNEL: tl.constexpr,  # convert to FP8 here (GPU); False: store fp32, torch converts (interpreter)
    INT64: tl.constexpr,  # element offsets in int64 (n >= 2**31)
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    # the one scale, broadcast to a block (every lane loads the same address): vector operands
    # only, which every Triton version's div_rn takes
    scale = tl.load(scale_ptr + lanes * 0)
    first = pid * blocks_per_program
    if INT64:
        first = first.to(tl.int64)
    # max |x| on the BITS of |x| (sign bit cleared), as int32: for non-negative floats the integer
    # order is the float order, +inf above every finite value and NaN above +inf, so a NaN wins
    # the max (as torch's amax) where a float max (maxnumf) or Triton's float atomic_max (no
    # branch takes a NaN in older versions) would drop it
    running_max = tl.zeros((BLOCK,), dtype=tl.int32)
    for b in range(blocks_per_program):
        offs = (first + b) * BLOCK + lanes
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        running_max = tl.maximum(running_max, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        # clamp keeping NaN (torch's clamp does; the default maxnumf/minnumf turn it into -FP8_MAX)
        y = tl.maximum(x * scale, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        y = tl.minimum(y, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        if CAST_IN_KERNEL:
            y = y.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs, y, mask=mask)
    tl.atomic_max(amax_ptr.to(tl.pointer_type(tl.int32)), tl.max(running_max, axis=0))
    if pid == 0:  # an IEEE division, as torch.reciprocal (the plain `/` may be approximate on GPUs)
        tl.store(scale_inv_ptr + lanes * 0, tl.math.div_rn(tl.full((BLOCK,), 1.0, tl.float32), scale), mask=lanes == 0)


def cast_in_kernel() -> bool:
    """Whether the kernel converts to FP8 itself (compiled) or leaves it to torch (interpreter)."""
    return not tier.interpreted()


def empty_output(x: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """The buffer ``launch_quantize`` writes into, on x's device: FP8, or fp32 under the interpreter."""
    return torch.empty(x.shape, dtype=fp8_dtype if cast_in_kernel() else torch.float32, device=x.device)


def finish(out: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """The FP8 tensor from ``launch_quantize``'s buffer (the interpreter tier's torch conversion)."""
    return out if out.dtype == fp8_dtype else out.to(fp8_dtype)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def launch_quantize(
    x: torch.Tensor,
    out: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    scale_inv: torch.Tensor,
    fp8_dtype: torch.dtype,
) -> None:
    """The bare launch: no checks, NO device guard (it runs on the current device). ``quantize``
    calls it under ``on_device_of``; lab 05's naive mechanism calls it without."""
    n = x.numel()
    if tier.interpreted() or x.device.type != "cuda":
        block, most = INTERPRETER_BLOCK, INTERPRETER_PROGRAMS
    else:
        block, most = GPU_BLOCK, PROGRAMS_PER_SM * _sm_count(x.device.index)
    blocks = triton.cdiv(n, block)
    per_program = triton.cdiv(blocks, min(most, blocks))
    _quantize_kernel[(triton.cdiv(blocks, per_program),)](
        x,
        out,
        scale,
        amax,
        scale_inv,
        n,
        per_program,
        FP8_MAX=FP8_MAX[fp8_dtype],
        BLOCK=block,
        CAST_IN_KERNEL=out.dtype == fp8_dtype,
        INT64=needs_int64(x, pad=block),
        num_warps=8,
    )


def _check_slot(name: str, t) -> torch.Tensor:
    check_tensor(name, t, dtypes=(torch.float32,), contiguous=False)
    if t.numel() != 1:
        raise ValueError(f"{name}: expected one fp32 element (e.g. meta.scale[i:i + 1]), got shape {tuple(t.shape)}")
    return t


def quantize(
    x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> Quantized:
    """Cast ``x`` to ``fp8_dtype`` with ``scale`` and fold max |x| into ``amax``, in one pass.

    x: contiguous bf16/fp16/fp32, not empty. scale: one fp32 element, read on the device (no
    host sync). amax: one fp32 element, raised to max(amax, max |x|) in place (row 0 of a history:
    ``meta.amax_history[0, i:i + 1]``); NaN anywhere in x makes it NaN, inf inf. All on one
    device; the launch runs on it, whatever the current device. Returns ``Quantized(data,
    scale_inv)`` with ``scale_inv = 1 / scale``; NaN in x stays NaN in data, +-inf saturates to
    +-fp8_max (as ``quantize_reference``). Checked: types, dtypes, shapes, devices (on the host,
    O(1)); not checked: the values of scale and amax (on the device; read there, no sync)."""
    for name, t in (("x", x), ("scale", scale), ("amax", amax)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    common_device(x=x, scale=scale, amax=amax)  # mixed devices first: the most telling message
    check_tensor("x", x, dtypes=INPUT_DTYPES, allow_empty=False)
    _check_slot("scale", scale)
    _check_slot("amax", amax)
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype: expected one of {', '.join(dtype_name(d) for d in FP8_DTYPES)}, got {fp8_dtype!r}")
    out = empty_output(x, fp8_dtype)
    scale_inv = torch.empty((), dtype=torch.float32, device=x.device)
    with on_device_of(x=x, out=out, scale=scale, amax=amax, scale_inv=scale_inv):
        launch_quantize(x, out, scale, amax, scale_inv, fp8_dtype)
    return Quantized(finish(out, fp8_dtype), scale_inv)


def quantize_reference(
    x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure torch, two passes: (fp8 data, amax of |x| as fp32 0-D, scale_inv as fp32 0-D)."""
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype: expected one of {', '.join(dtype_name(d) for d in FP8_DTYPES)}, got {fp8_dtype!r}")
    xf, s = x.float(), scale.float().reshape(())
    fp8_max = FP8_MAX[fp8_dtype]
    data = (xf * s).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return data, xf.abs().amax(), torch.reciprocal(s)


__all__ = [
    "Quantized",
    "quantize",
    "quantize_reference",
    "launch_quantize",
    "empty_output",
    "finish",
    "cast_in_kernel",
    "INPUT_DTYPES",
    "FP8_DTYPES",
]
