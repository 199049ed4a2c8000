"""The story's amax reduction: every module's state updated by ONE kernel on the current stream.

TransformerEngine's ``reduce_and_update_fp8_tensors`` concatenates the newest amax of every
module (``torch.cat``), optionally all-reduces it, and hands the concatenation plus the raw
addresses of every module's ``amax_history`` and ``scale`` to one CUDA kernel
(``kernel_bulk`` in ``common/recipe/delayed_scaling.cu``) launched on the CURRENT device's
current stream. Nothing in that path looks at where each module's state lives: it works while
all of it sits on the current device, which the lazy allocation on the current device
guarantees. Once the state is spread over GPUs, the kernel on the current device writes through
pointers into another GPU's memory: over NVLink if peer access happens to be on, out of order
with that GPU's own stream either way, and an illegal address if it is off.

``bulk_update`` rebuilds that: one program per module reads its column of the concatenated
amaxes, rolls its history and writes its scales, all through an int64 table of addresses. The
arithmetic is labkit's update rule (``labkit.kernels.fp8.recipe.updated``, TransformerEngine's
Python path), with IEEE divisions (``div_rn``), so on states that all live on one device the
result equals the product's per-device torch update bit for bit (a test checks it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit.kernels.fp8.recipe import FP32_MAX, FP8Meta


@triton.jit
def _bulk_update_kernel(
    amax_ptr,  # *fp32: the concatenated newest amaxes, N_SCALES per module, module after module
    history_table_ptr,  # *int64: per module, the address of its amax_history [LEN, N_SCALES] (row-major fp32)
    scale_table_ptr,  # *int64: per module, the address of its scale [N_SCALES] (fp32), updated in place
    scale_inv_table_ptr,  # *int64: per module, the address of its scale_inv [N_SCALES] (fp32), updated in place
    fp8_max,  # fp32: largest finite value of the format (448 or 57344)
    margin_factor,  # fp32: 2**margin, the headroom the scale leaves
    LEN: tl.constexpr,  # history length
    LEN_P2: tl.constexpr,  # LEN rounded up to a power of two (tile height)
    N_SCALES: tl.constexpr,  # tensors per module (2 forward: input, weight; 1 backward)
    N_P2: tl.constexpr,  # N_SCALES rounded up to a power of two (tile width)
    ALGO_MAX: tl.constexpr,  # True: amax = max over the history; False: the newest amax
    FP32_MAX_VALUE: tl.constexpr,  # the largest fp32, used where fp8_max / amax overflows
):
    pid = tl.program_id(0)
    history = tl.load(history_table_ptr + pid).to(tl.pointer_type(tl.float32))
    scale_p = tl.load(scale_table_ptr + pid).to(tl.pointer_type(tl.float32))
    scale_inv_p = tl.load(scale_inv_table_ptr + pid).to(tl.pointer_type(tl.float32))
    rows = tl.arange(0, LEN_P2)
    cols = tl.arange(0, N_P2)
    col_ok = cols < N_SCALES
    newest = tl.load(amax_ptr + pid * N_SCALES + cols, mask=col_ok, other=0.0)
    # The rolled history: row i takes old row i + 1, the last row the newest amax (roll(-1)).
    shifted_ok = (rows[:, None] + 1 < LEN) & col_ok[None, :]
    rolled = tl.load(history + (rows[:, None] + 1) * N_SCALES + cols[None, :], mask=shifted_ok, other=0.0)
    is_last = (rows[:, None] == LEN - 1) & col_ok[None, :]
    rolled = tl.where(is_last, newest[None, :], rolled)
    if ALGO_MAX:
        amax = tl.max(rolled, axis=0)  # the window: old rows 1.. plus the newest (= max of the old history)
    else:
        amax = newest
    old_scale = tl.load(scale_p + cols, mask=col_ok, other=1.0)
    valid = (amax > 0.0) & (amax <= FP32_MAX_VALUE)  # false for 0, inf and NaN
    divisor = tl.where(valid, amax, 1.0)  # (no division by 0 where the old scale is kept)
    sf = tl.math.div_rn(tl.math.div_rn(tl.zeros_like(amax) + fp8_max, divisor), tl.zeros_like(amax) + margin_factor)
    sf = tl.where(valid, sf, old_scale)
    sf = tl.where(sf > FP32_MAX_VALUE, FP32_MAX_VALUE, sf)
    rolled = tl.where(rows[:, None] == 0, 0.0, rolled)  # row 0: the slot of the next step's amax
    tl.store(history + rows[:, None] * N_SCALES + cols[None, :], rolled, mask=(rows[:, None] < LEN) & col_ok[None, :])
    tl.store(scale_p + cols, sf, mask=col_ok)
    tl.store(scale_inv_p + cols, tl.math.div_rn(tl.zeros_like(sf) + 1.0, sf), mask=col_ok)


def bulk_update(amax: torch.Tensor, metas: list[FP8Meta], fp8_max: float, margin: float, algo: str) -> None:
    """Update every state in ``metas`` from ``amax`` (their newest amaxes concatenated) with one
    launch on the CURRENT device, whatever device each state lives on (the story's mechanism:
    no guard, raw addresses). All states must have the same shape."""
    if not metas:
        return
    shape = metas[0].amax_history.shape
    if any(m.amax_history.shape != shape for m in metas):
        raise ValueError(
            f"metas: every state must have the same history shape, got "
            f"{sorted({tuple(m.amax_history.shape) for m in metas})}"
        )
    if algo not in ("max", "most_recent"):
        raise ValueError(f"algo: expected 'max' or 'most_recent', got {algo!r}")
    length, n = shape
    if amax.dtype != torch.float32 or not amax.is_contiguous() or amax.numel() != n * len(metas):
        raise ValueError(
            f"amax: expected {n * len(metas)} contiguous fp32 values, got {amax.dtype} {tuple(amax.shape)}"
        )

    def table(tensors):  # addresses, on the same device as the concatenated amaxes
        return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64).to(amax.device)

    _bulk_update_kernel[(len(metas),)](
        amax,
        table([m.amax_history for m in metas]),
        table([m.scale for m in metas]),
        table([m.scale_inv for m in metas]),
        float(fp8_max),
        float(2.0**margin),
        LEN=length,
        LEN_P2=triton.next_power_of_2(length),
        N_SCALES=n,
        N_P2=triton.next_power_of_2(n),
        ALGO_MAX=algo == "max",
        FP32_MAX_VALUE=FP32_MAX,
    )


__all__ = ["bulk_update"]
