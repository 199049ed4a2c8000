"""The FP8 GEMM: ``torch._scaled_mm`` (or ``F.scaled_mm``) where the GPU has FP8 tensor cores,
an emulation with the same numerics everywhere else.

Every product of an FP8 linear layer is written in one form, ``y = a @ b.T`` with both operands
row-major [rows, K] (forward: x @ W.T; dgrad: dy @ (W.T).T; wgrad: dy.T @ (x.T).T). That is the
layout cuBLASLt's FP8 kernels take: ``b.T`` is column-major, as ``_scaled_mm`` requires of its
second operand. Both operands carry a per-tensor ``scale_inv``; the result is
``scale_inv_a * scale_inv_b * (a8 @ b8.T)`` accumulated in fp32.

Which call exists depends on the torch version (2.8 .. 2.13 are supported):

* ``torch.nn.functional.scaled_mm(a, b, scale_a, ScalingType.TensorWise, scale_b, ScalingType.TensorWise,
  output_dtype=...)``: the public API of recent releases, used where present;
* ``torch._scaled_mm(a, b, scale_a=..., scale_b=..., out_dtype=...)``: scales as fp32 tensors
  (required since 2.4), the same keywords through 2.13.

Both need every dimension (M, K, N) a multiple of 16 and FP8 tensor cores (sm_89 or newer; H100
and H200 are sm_90). E5M2 x E5M2 is refused by cuBLASLt, and never asked for: gradients (E5M2)
always meet E4M3 inputs or weights.

The emulation: ``(a8.float() @ b8.float().T) * (scale_inv_a * scale_inv_b)``. Products of FP8
values are exact in fp32 (4 x 4 significant bits), so it equals an FP8 GEMM that accumulates in
fp32 up to the order of the additions: the CPU tier checks the numerics with it. Hopper's FP8
tensor cores accumulate with fewer bits than fp32: on one H200 ``_scaled_mm`` differed from the
emulation by about 1e-4 of the largest output at K = 48 (tests/kernels/fp8/test_linear.py allows 1e-3
there). A GPU without FP8 warns once and uses the emulation.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import torch
import torch.nn.functional as F

from labkit.kernels.fp8.cast import FP8_DTYPES, Quantized
from labkit.kernels.launch_helpers import dtype_name

BACKENDS = ("auto", "scaled_mm", "emulated")
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: FP8 tensor cores: Ada (8.9), Hopper (9.0) and newer
MIN_CAPABILITY = (8, 9)
MULTIPLE = 16


@functools.cache
def scaled_mm_api() -> str | None:
    """Which scaled-matmul call this torch has: "F.scaled_mm", "torch._scaled_mm", or None."""
    fn = getattr(F, "scaled_mm", None)
    if fn is not None and hasattr(F, "ScalingType") and hasattr(F.ScalingType, "TensorWise"):
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        if {"scale_recipe_a", "scale_recipe_b", "output_dtype"} <= set(params):
            return "F.scaled_mm"
    return "torch._scaled_mm" if hasattr(torch, "_scaled_mm") else None


def fp8_gemm_support(device: torch.device) -> tuple[bool, str]:
    """(whether ``device`` runs FP8 GEMMs natively, the reason if not)."""
    device = torch.device(device)
    if device.type != "cuda":
        return False, f"{device} has no FP8 tensor cores (the emulated GEMM runs there)"
    if scaled_mm_api() is None:
        return False, f"torch {torch.__version__} has neither F.scaled_mm nor torch._scaled_mm"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return False, (
            f"{device} ({name}, sm_{cap[0]}{cap[1]}) has no FP8 tensor cores; they need "
            f"sm_{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]} or newer"
        )
    return True, ""


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(f"FP8 GEMM: {reason}; using the emulated GEMM (same numerics, no speed-up)", stacklevel=3)


def choose_backend(device: torch.device, backend: str = "auto") -> str:
    """ "scaled_mm" or "emulated" for a GEMM on ``device``; "auto" picks scaled_mm where it runs."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
    if backend != "auto":
        return backend
    ok, reason = fp8_gemm_support(device)
    if ok:
        return "scaled_mm"
    if torch.device(device).type == "cuda":
        _warn_once(reason)
    return "emulated"


def check_scaled_mm_shapes(a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    """Every dimension of both operands a multiple of 16, or a ValueError naming the operand."""
    for name, t in ((a_name, a), (b_name, b)):
        bad = [size for size in t.shape if size % MULTIPLE]
        if bad:
            raise ValueError(
                f"{name}: the FP8 GEMM (torch._scaled_mm) needs every dimension a multiple of "
                f"{MULTIPLE}; {name} has shape {tuple(t.shape)} (pad it, or use backend='emulated')"
            )


def _scaled_mm(
    a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    if scaled_mm_api() == "F.scaled_mm":
        tw = F.ScalingType.TensorWise
        return F.scaled_mm(a, b_t, scale_a, tw, scale_b, tw, output_dtype=out_dtype)
    return torch._scaled_mm(a, b_t, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


def fp8_gemm(
    a: Quantized,
    b: Quantized,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str = "auto",
    *,
    a_name: str = "a",
    b_name: str = "b",
) -> torch.Tensor:
    """``a @ b.T`` for FP8 operands a [M, K] and b [N, K] (both row-major), scaled by both
    ``scale_inv``s, accumulated in fp32, returned as ``out_dtype`` [M, N].

    backend: "auto" (scaled_mm on sm_89+ GPUs, else emulated), "scaled_mm" or "emulated".
    a_name, b_name: how errors name the operands (the caller's argument names)."""
    for name, q in ((a_name, a), (b_name, b)):
        if not isinstance(q, Quantized):
            raise TypeError(f"{name}: expected a Quantized (labkit.kernels.fp8.cast.quantize), got {type(q).__name__}")
        if q.data.dtype not in FP8_DTYPES:
            raise TypeError(f"{name}: FP8 data expected, got {dtype_name(q.data.dtype)}")
        if q.data.dim() != 2 or not q.data.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous 2-D FP8 tensor, got shape {tuple(q.data.shape)}")
    if a.data.shape[1] != b.data.shape[1]:
        raise ValueError(
            f"{a_name}, {b_name}: inner dimensions differ: {tuple(a.data.shape)} @ {tuple(b.data.shape)}.T"
        )
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {', '.join(map(dtype_name, OUT_DTYPES))}, got {out_dtype!r}")
    if choose_backend(a.data.device, backend) == "scaled_mm":
        check_scaled_mm_shapes(a_name, a.data, b_name, b.data)
        return _scaled_mm(a.data, b.data.t(), a.scale_inv, b.scale_inv, out_dtype)
    acc = torch.matmul(a.data.float(), b.data.float().t())
    return (acc * (a.scale_inv * b.scale_inv)).to(out_dtype)


__all__ = ["fp8_gemm", "scaled_mm_api", "fp8_gemm_support", "choose_backend", "check_scaled_mm_shapes", "BACKENDS"]
