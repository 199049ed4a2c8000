"""A grouped GEMM for mixture-of-experts layers that reads the token counts on the device.

An MoE layer routes each token to a few experts and then multiplies every expert's rows by
that expert's weight: E matrix products of different heights, one per expert. The heights
(``m_splits``, tokens per expert) are computed on the GPU by the router. The common way to run
the products, a Python loop of ``x_e @ w_e``, needs those heights on the host first
(``m_splits.tolist()``): a device-to-host copy that waits for the router, stalls the CPU while
the GPU drains, and cannot be captured in a CUDA graph. ``grouped_mm`` takes ``m_splits`` as a
CUDA tensor and never looks at it from the host: every program of the kernel reads the counts
itself and walks the experts' row ranges on the GPU.

The schedule (persistent, after the grouped GEMM of Triton's tutorials and vLLM's ``fused_moe``):

* the grid is a fixed number of programs P (one per SM, sized from what the host knows: M, E,
  N), so it never depends on the counts;
* the work is numbered as one list of output tiles: expert 0's tiles (ceil(m_0 / BLOCK_M) x
  ceil(N / BLOCK_N) of them), then expert 1's, ...; program p takes tiles p, p + P, p + 2P, ...;
* each program walks the experts in order, reading ``m_splits[e]`` from global memory and keeping
  a running row offset, so it knows where each expert's rows start without a prefix-sum kernel
  and without the host. An expert with 0 tokens has no tiles; a split of any size is fine (the
  last tile of an expert is masked), so nothing is asked of the caller's alignment;
* or (``GroupedConfig.flat``) each program runs one loop over its tiles of every expert, finding
  a tile's expert from the counts held as one vector; Triton fuses that loop with the tile's
  reduction loop, so the pipeline of loads runs on from one tile into the next.

A wrong device-side ``m_splits`` cannot be checked without a sync, so the kernel makes it safe
instead: a negative count is read as 0, and every expert's range is clamped to the M rows of x,
so a bad count gives wrong rows (or rows of ``out`` left unwritten), never an out-of-bounds
access. ``check_splits=True`` adds the check (and its sync) for debugging.

Backward needs two more products over the same ragged rows:

* dgrad, dx_e = dy_e @ w_e^T: the same kernel, given ``w.transpose(1, 2)`` (it takes any
  strides; nothing is copied);
* wgrad, dW_e = x_e^T @ dy_e, whose ragged dimension is the REDUCTION: ``grouped_mm_wgrad``,
  a second kernel with a fixed number of tiles per expert (K/BLOCK_K x N/BLOCK_N), each summing
  over its expert's rows. It can add into an fp32 ``main_grad`` buffer, per expert: an
  ``accumulate`` mask held on the device says which experts add (True) and which overwrite.

Precision: bf16, fp16 (fp32 accumulation) or fp32 inputs. Under the Triton interpreter (CPU
tier) bf16 tiles are upcast to fp32 before ``tl.dot`` (the interpreter multiplies bf16 bit
patterns: upstream issue #11584); products of bf16 values are exact in fp32, so results agree.

Where it lives: this module holds the launchers (``grouped_mm``, ``grouped_mm_wgrad``: input
checks, the device guard, the grid, the TMA scratch allocator) and ``device_counts``; the Triton
kernels are in ``labkit.kernels.grouped_gemm_kernels``, the configurations and per-GPU tables in
``labkit.kernels.grouped_gemm_configs``. Every name of those two is importable from here too.
The launchers look ``forward_config``, ``wgrad_config``, ``device_counts`` and ``needs_int64``
up in this module's namespace on each call, so replacing them here (the sweep's
``forced_config``, the tests) changes what the next launch uses.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from labkit.kernels.grouped_gemm_configs import (  # noqa: F401  (re-exported: this module is the public face)
    _H100_SWEEP,
    _H200_SWEEP,
    FP32,
    GENERIC_FORWARD,
    GENERIC_WGRAD,
    H100,
    H200,
    HOPPER_DEFAULTS,
    HOPPER_FORWARD,
    INTERPRETER,
    INTERPRETER_PROGRAMS,
    OPS,
    TABLES,
    ConfigTable,
    GroupedConfig,
    _cfg,
    _device_name,
    config_source,
    config_table,
    forward_config,
    hopper_config,
    wgrad_config,
)
from labkit.kernels.grouped_gemm_kernels import (  # noqa: F401  (re-exported, e.g. for lab 04's source listing)
    _grouped_mm_kernel,
    _grouped_wgrad_kernel,
    _mm_tile,
    _tile_of,
    _wgrad_tile,
)
from labkit.kernels.launch_helpers import dtype_name, fp32_input_precision, needs_int64
from labkit.workbench import tier
from labkit.workbench.checks import check_tensor
from labkit.workbench.guard import common_device, on_device_of

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: dtypes accepted for a tensor of token counts
COUNT_DTYPES = (torch.int32, torch.int64)

Splits = Sequence[int] | torch.Tensor


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _programs(device: torch.device, upper_bound_tiles: int, per_sm: int = 1) -> int:
    """Persistent grid size: ``per_sm`` programs per SM, never more than there can be tiles."""
    most = INTERPRETER_PROGRAMS if device.type != "cuda" else per_sm * _sm_count(device.index)
    return max(1, min(most, upper_bound_tiles))


def flops(M: int, N: int, K: int) -> int:
    """Floating-point operations of a grouped product over M rows in all: 2 per multiply-add."""
    return 2 * M * N * K


# ----------------------------------------------------------------------------------------------
# Launchers: input checks, the device guard, the launch.


def grouped_mm(
    x: torch.Tensor,
    w: torch.Tensor,
    m_splits: Splits,
    *,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    check_splits: bool = False,
) -> torch.Tensor:
    """out[rows of expert e] = x[rows of expert e] @ w[e] (+ bias[e]), for every expert at once.

    x: [M, K]; rows grouped by expert (expert 0's m_splits[0] rows, then expert 1's, ...).
    w: [E, K, N], x's dtype (bfloat16, float16 or float32), any strides (``w.transpose(1, 2)``
       of a [E, N, K] weight works without a copy: that is dgrad).
    m_splits: tokens per expert, E non-negative integers summing to M: a list or a CPU tensor
       (checked here in full, on every tier) or a CUDA tensor on x's device (int32/int64; only
       its dtype and shape are checked: never read by the host, so nothing synchronises and the
       call can be captured in a CUDA graph; a wrong count is clamped on the device, see above).
    bias: optional [E, N], x's dtype. out: optional [M, N], x's dtype, column stride 1.
    check_splits: also check a CUDA ``m_splits`` (non-negative, summing to M): this syncs.
    Accumulates in fp32. Returns ``out``.
    """
    for name, t in (("x", x), ("w", w), ("bias", bias), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            check_tensor(name, t)  # raises the TypeError naming the argument
    common_device(x=x, w=w, bias=bias, out=out)
    check_tensor("x", x, dtypes=DTYPES, ndim=2, contiguous=False)
    check_tensor("w", w, dtypes=DTYPES, ndim=3, contiguous=False)
    if w.dtype != x.dtype:
        raise TypeError(f"w: dtype {dtype_name(w.dtype)} differs from x's dtype {dtype_name(x.dtype)}")
    (M, K), (E, Kw, N) = x.shape, w.shape
    if Kw != K:
        raise ValueError(f"w: shape {tuple(w.shape)} is not [E, K, N] with K = {K} (x's columns)")
    counts = device_counts("m_splits", m_splits, E, M, x.device, check=check_splits)
    if bias is not None:
        check_tensor("bias", bias, dtypes=DTYPES, ndim=2, contiguous=False)
        if bias.dtype != x.dtype or tuple(bias.shape) != (E, N) or (N > 1 and bias.stride(1) != 1):
            raise ValueError(
                f"bias: expected [E, N] = {[E, N]} of {dtype_name(x.dtype)} with column stride 1, "
                f"got {tuple(bias.shape)} of {dtype_name(bias.dtype)}, strides {bias.stride()}"
            )
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    else:
        _check_out("out", out, (M, N), x.dtype)
    if M == 0 or N == 0 or E == 0:
        return out
    w_kmajor = w.stride(1) == 1 and w.stride(2) != 1 and N > 1
    cfg = forward_config(M, E, x.device, x.dtype, op="dgrad" if w_kmajor else "forward")
    int64 = needs_int64(x, w, out, pad=cfg.block_m)
    use_tma = cfg.tma and not int64 and tma_ok(x, w)
    if use_tma:
        _ensure_scratch_allocator()
    upper_tiles = (triton.cdiv(M, cfg.block_m) + E) * triton.cdiv(N, cfg.block_n)
    with on_device_of(x=x, w=w, out=out):
        _grouped_mm_kernel[(_programs(x.device, upper_tiles, cfg.programs_per_sm),)](
            x,
            w,
            out,
            bias if bias is not None else out,
            counts,
            M,
            N,
            K,
            E,
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            w.stride(2),
            out.stride(0),
            bias.stride(0) if bias is not None else 0,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            HAS_BIAS=bias is not None,
            EVEN_K=K % cfg.block_k == 0,
            UPCAST=tier.interpreted() and x.dtype == torch.bfloat16,
            INPUT_PRECISION=_input_precision(x.dtype),
            INT64=int64,
            USE_TMA=use_tma,
            W_KMAJOR=use_tma and w.stride(2) != 1,
            FLAT=cfg.flat,
            WARP_SPECIALIZE=cfg.warp_specialize,
            E_LANES=triton.next_power_of_2(E) if cfg.flat else 1,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out


def grouped_mm_wgrad(
    x: torch.Tensor,
    dy: torch.Tensor,
    m_splits: Splits,
    *,
    out: torch.Tensor | None = None,
    accumulate: bool | torch.Tensor = False,
    check_splits: bool = False,
) -> torch.Tensor:
    """dW[e] = x[rows of e]^T @ dy[rows of e]: the weight gradient of ``grouped_mm``, [E, K, N].

    x: [M, K] and dy: [M, N], one dtype, rows grouped by expert as in the forward.
    m_splits: as for ``grouped_mm`` (a CUDA tensor is never read by the host).
    out: optional [E, K, N] in float32 (a ``main_grad`` buffer) or x's dtype, column stride 1.
    accumulate: False (overwrite every dW[e]), True (add into every out[e]), or a bool tensor of
       E flags on out's device (per expert: True adds, False overwrites), read on the device.
    An expert with 0 tokens gets dW[e] = 0 (or keeps out[e] when it accumulates). Returns out.
    """
    for name, t in (("x", x), ("dy", dy), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            check_tensor(name, t)
    mask = accumulate if isinstance(accumulate, torch.Tensor) else None
    common_device(x=x, dy=dy, out=out, accumulate=mask)
    check_tensor("x", x, dtypes=DTYPES, ndim=2, contiguous=False)
    check_tensor("dy", dy, dtypes=DTYPES, ndim=2, contiguous=False)
    if dy.dtype != x.dtype:
        raise TypeError(f"dy: dtype {dtype_name(dy.dtype)} differs from x's dtype {dtype_name(x.dtype)}")
    (M, K), (Md, N) = x.shape, dy.shape
    if Md != M:
        raise ValueError(f"dy: has {Md} rows, x has {M}: both hold the same tokens")
    if mask is None and not isinstance(accumulate, bool):
        raise TypeError(f"accumulate: expected a bool or a bool tensor, got {type(accumulate).__name__}")
    E = _num_experts(m_splits)
    if E < 0:
        raise TypeError(
            f"m_splits: expected a list of ints or a 1-D integer tensor, got {type(m_splits).__name__}"
            + (f" of shape {tuple(m_splits.shape)}" if isinstance(m_splits, torch.Tensor) else "")
        )
    if out is None:
        if mask is not None or accumulate:
            raise ValueError("out: accumulating needs the buffer to add into (pass out=main_grad)")
        out = torch.empty(
            (E, K, N), dtype=torch.float32, device=x.device
        )  # fp32: accumulated gradients are not rounded to bf16
    _check_out("out", out, (E, K, N), None, allowed=(torch.float32, x.dtype))
    if mask is not None:
        check_tensor("accumulate", mask, dtypes=(torch.bool,), ndim=1, contiguous=True)
        if mask.shape[0] != E:
            raise ValueError(f"accumulate: has {mask.shape[0]} flags for {E} experts")
    counts = device_counts("m_splits", m_splits, E, M, x.device, check=check_splits)
    if E == 0 or K == 0 or N == 0:
        return out
    cfg = wgrad_config(M, E, x.device, x.dtype)
    mode = 2 if mask is not None else int(bool(accumulate))
    int64 = needs_int64(x, dy, out, pad=cfg.block_m)
    use_tma = cfg.tma and not int64 and tma_ok_wgrad(x, dy, out)
    if use_tma:
        _ensure_scratch_allocator()
    with on_device_of(x=x, dy=dy, out=out):
        _grouped_wgrad_kernel[
            (_programs(x.device, E * triton.cdiv(K, cfg.block_m) * triton.cdiv(N, cfg.block_n), cfg.programs_per_sm),)
        ](
            x,
            dy,
            out,
            counts,
            mask.view(torch.int8) if mask is not None else counts,
            M,
            K,
            N,
            E,
            x.stride(0),
            x.stride(1),
            dy.stride(0),
            dy.stride(1),
            out.stride(0),
            out.stride(1),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            MODE=mode,
            UPCAST=tier.interpreted() and x.dtype == torch.bfloat16,
            INPUT_PRECISION=_input_precision(x.dtype),
            INT64=int64,
            EVEN=K % cfg.block_m == 0 and N % cfg.block_n == 0,
            USE_TMA=use_tma,
            TMA_STORE=use_tma and out.element_size() == 2,
            FLAT=cfg.flat,
            WARP_SPECIALIZE=cfg.warp_specialize,
            E_LANES=triton.next_power_of_2(E) if cfg.flat else 1,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out


def device_counts(
    name: str, m_splits: Splits, E: int, M: int, device: torch.device, *, check: bool = False
) -> torch.Tensor:
    """``m_splits`` as an int32/int64 tensor of E counts on ``device``, for the kernels to read.

    A list or a CPU tensor is checked here in full (integers, E of them, none negative, summing
    to M), whatever ``device`` is: reading CPU counts costs no sync, so a CPU tensor is checked
    on the CPU tier too, where x is on the CPU. A CUDA tensor on ``device`` is checked for
    dtype, shape and device only (O(1) on the host, no sync; the kernels clamp its values so a
    wrong count cannot read out of bounds), unless ``check`` (which reads it back: a sync)."""
    if isinstance(m_splits, torch.Tensor):
        if m_splits.dtype not in COUNT_DTYPES:
            raise TypeError(
                f"{name}: dtype {dtype_name(m_splits.dtype)} is not an integer count type; expected int32 or int64"
            )
        if m_splits.dim() != 1 or m_splits.shape[0] != E:
            raise ValueError(f"{name}: expected {E} counts (one per expert of w), got shape {tuple(m_splits.shape)}")
        if m_splits.device.type == "cpu":  # the host reads it without a sync: always checked
            _check_values(name, m_splits.tolist(), M)
            if m_splits.device == device:
                return m_splits if m_splits.is_contiguous() else m_splits.contiguous()
            return m_splits.to(device=device, dtype=torch.int32)
        if m_splits.device != device:
            raise ValueError(
                f"{name}: is on {m_splits.device}, x is on {device}: pass the counts on "
                f"x's device (or on the CPU, or as a list)"
            )
        if check:
            _check_values(name, m_splits.tolist(), M)
        return m_splits if m_splits.is_contiguous() else m_splits.contiguous()
    elif isinstance(m_splits, (list, tuple)):
        values = list(m_splits)
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise TypeError(f"{name}: expected integer counts, got {type(bad[0]).__name__} {bad[0]!r}")
        if len(values) != E:
            raise ValueError(f"{name}: expected {E} counts (one per expert of w), got {len(values)}")
    else:
        raise TypeError(f"{name}: expected a list of ints or an integer tensor, got {type(m_splits).__name__}")
    _check_values(name, values, M)
    return torch.tensor(values, dtype=torch.int32, device=device)


def _check_values(name: str, values: list[int], M: int) -> None:
    negative = [i for i, v in enumerate(values) if v < 0]
    if negative:
        raise ValueError(f"{name}: count of expert {negative[0]} is negative ({values[negative[0]]})")
    if sum(values) != M:
        raise ValueError(f"{name}: counts sum to {sum(values)}, but x has M = {M} rows")


def _num_experts(m_splits: Splits) -> int:
    if isinstance(m_splits, torch.Tensor):
        return m_splits.shape[0] if m_splits.dim() == 1 else -1
    return len(m_splits) if isinstance(m_splits, (list, tuple)) else -1


def _check_out(name: str, out: torch.Tensor, shape: tuple, dtype: torch.dtype | None, allowed: tuple = ()) -> None:
    check_tensor(name, out, dtypes=DTYPES, contiguous=False)
    if dtype is not None and out.dtype != dtype:
        raise TypeError(f"{name}: dtype {dtype_name(out.dtype)} differs from x's dtype {dtype_name(dtype)}")
    if allowed and out.dtype not in allowed:
        names = ", ".join(dict.fromkeys(map(dtype_name, allowed)))  # once each: x's dtype may be float32 too
        raise TypeError(f"{name}: dtype {dtype_name(out.dtype)}; expected one of {names}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(out.shape)} is not {tuple(shape)}")
    if shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"{name}: needs column stride 1, got strides {out.stride()}")


def tma_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``grouped_mm`` can load through TMA descriptors: a GPU with TMA (sm_90+) or the
    interpreter, x with unit column stride, w with a unit stride along N (forward) or along K
    (dgrad's ``w.transpose(1, 2)``), and 16-byte aligned base pointers and other strides (what
    the hardware requires). Otherwise the pointer path runs: same results, any layout."""
    if not _tma_device(x.device) or x.stride(1) != 1:
        return False
    if w.stride(2) == 1:
        other = (w.stride(0), w.stride(1))
    elif w.stride(1) == 1:
        other = (w.stride(0), w.stride(2))
    else:
        return False
    return _aligned(x, w, x.stride(0), *other)


def tma_ok_wgrad(x: torch.Tensor, dy: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``grouped_mm_wgrad`` can move its tiles through TMA descriptors: as ``tma_ok``,
    x, dy and out with unit column strides, 16-byte aligned bases and other strides."""
    return (
        _tma_device(x.device)
        and x.stride(1) == 1
        and dy.stride(1) == 1
        and out.stride(2) == 1
        and _aligned(x, dy, x.stride(0), dy.stride(0))
        and out.data_ptr() % 16 == 0
        and all(v * out.element_size() % 16 == 0 for v in (out.stride(0), out.stride(1)))
    )


def _tma_device(device: torch.device) -> bool:
    if not hasattr(tl, "make_tensor_descriptor"):
        return False
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def _aligned(a: torch.Tensor, b: torch.Tensor, *strides: int) -> bool:
    size = a.element_size()
    return all(v % 16 == 0 for v in (a.data_ptr(), b.data_ptr(), *(s * size for s in strides)))


def _scratch(size: int, alignment: int, stream):
    """Global scratch for device-side TMA descriptors (128 bytes per program), from torch's
    caching allocator: stream-ordered, and legal inside CUDA-graph capture."""
    return torch.empty(
        size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() and not tier.interpreted() else "cpu"
    )


def _ensure_scratch_allocator() -> None:
    """Give Triton an allocator for descriptor scratch, unless the caller has set one.
    (Triton keeps it in a context variable: each thread starts without one.)"""
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
        if not isinstance(current, _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_scratch)


def _input_precision(dtype: torch.dtype) -> str:
    return fp32_input_precision() if dtype == torch.float32 else "ieee"


__all__ = [
    "COUNT_DTYPES",
    "DTYPES",
    "OPS",
    "TABLES",
    "ConfigTable",
    "GroupedConfig",
    "HOPPER_DEFAULTS",
    "HOPPER_FORWARD",
    "config_source",
    "config_table",
    "device_counts",
    "flops",
    "forward_config",
    "grouped_mm",
    "hopper_config",
    "grouped_mm_wgrad",
    "tma_ok",
    "tma_ok_wgrad",
    "wgrad_config",
]
