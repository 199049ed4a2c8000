"""``GroupedLinear``: E linear layers over the ragged rows of an MoE layer, with backward.

One module holds every expert's weight, ``weight[e]`` of shape [in_features, out_features] (the
layout ``grouped_mm`` multiplies by, x @ w[e]; note it is the transpose of ``nn.Linear``'s), and
an optional ``bias[e]``. ``forward(x, m_splits)`` runs one grouped GEMM; backward runs two more
(dgrad against the transposed weights, wgrad summing over each expert's tokens) and a bias
gradient, all reading ``m_splits`` on the device: a CUDA ``m_splits`` makes forward and backward
free of host syncs, so both can be captured in one CUDA graph.

Weight-gradient accumulation (Megatron's ``main_grad``, the story's ``fuse_wgrad_accumulation``):
with ``fuse_wgrad_accumulation=True`` the module keeps an fp32 buffer ``weight.main_grad`` and
backward writes dW there instead of returning it. ``wgrad_accumulation_mask``, a bool tensor of E
flags on the device, says per expert whether dW_e is ADDED to ``main_grad[e]`` (True: gradient
accumulation across micro-batches) or OVERWRITES it (False: the first micro-batch of a step).
The story's version of this was a nested, immediately-invoked lambda per expert; here it is one
flag tensor that the wgrad kernel reads (see ``labkit.kernels.grouped_gemm.grouped_mm_wgrad``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from labkit.kernels.grouped_gemm import Splits, device_counts, grouped_mm, grouped_mm_wgrad
from labkit.workbench.checks import check_tensor


def bias_grad(dy: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """db[e] = sum of dy over expert e's rows, in fp32, without reading the counts on the host.

    Each row's expert comes from ``repeat_interleave`` with its output size given (so torch does
    not sync to learn it), then one ``index_add_`` sums the rows per expert."""
    E, (M, N) = counts.shape[0], dy.shape
    expert_of_row = torch.repeat_interleave(torch.arange(E, device=dy.device), counts, output_size=M)
    return torch.zeros((E, N), dtype=torch.float32, device=dy.device).index_add_(0, expert_of_row, dy.float())


class GroupedLinearFunction(torch.autograd.Function):
    """Forward: y = grouped_mm(x, weight, counts) + bias. Backward: dgrad, wgrad, bias grad."""

    @staticmethod
    def forward(ctx, x, counts, weight, bias, main_grad, accumulate):
        ctx.save_for_backward(x, counts, weight)
        ctx.has_bias = bias is not None
        ctx.main_grad = main_grad  # fp32 [E, K, N] or None
        ctx.accumulate = accumulate  # bool tensor [E] on the device, or None (overwrite)
        return grouped_mm(x, weight, counts, bias=bias)

    @staticmethod
    def backward(ctx, dy):
        x, counts, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = grouped_mm(dy, weight.transpose(1, 2), counts)
        if ctx.needs_input_grad[2]:
            dw = weight_grad(x, dy, counts, ctx.main_grad, ctx.accumulate, weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            db = bias_grad(dy, counts).to(dy.dtype)
        return dx, None, dw, db, None, None


def weight_grad(
    x: torch.Tensor,
    dy: torch.Tensor,
    counts: torch.Tensor,
    main_grad: torch.Tensor | None,
    accumulate: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """dW for autograd, or None after writing it into ``main_grad`` (fused accumulation).

    Fused: experts flagged True in ``accumulate`` add into main_grad[e], the others overwrite it;
    with no mask every expert adds (gradient accumulation, Megatron's default)."""
    if main_grad is None:
        return grouped_mm_wgrad(x, dy, counts).to(dtype)
    grouped_mm_wgrad(x, dy, counts, out=main_grad, accumulate=accumulate if accumulate is not None else True)
    return None


class GroupedLinear(nn.Module):
    """E experts' linear layers, applied to the rows of x grouped by expert.

    num_experts, in_features, out_features: E, K, N. bias: one [out_features] bias per expert.
    fuse_wgrad_accumulation: keep fp32 ``weight.main_grad`` [E, K, N] and write dW there (backward
    returns no ``weight.grad``). forward(x, m_splits, wgrad_accumulation_mask=None):
    x [M, K], m_splits E counts summing to M: a list or CPU tensor is checked in full (an error
    naming m_splits), a CUDA tensor on x's device only for dtype and shape (no host sync; its
    values are clamped on the device, as ``grouped_mm`` documents)."""

    def __init__(
        self,
        num_experts: int,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        fuse_wgrad_accumulation: bool = False,
        dtype: torch.dtype | None = None,
        device=None,
    ):
        super().__init__()
        for name, v in (("num_experts", num_experts), ("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        self.num_experts, self.in_features, self.out_features = num_experts, in_features, out_features
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.weight = nn.Parameter(torch.empty((num_experts, in_features, out_features), dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty((num_experts, out_features), dtype=dtype, device=device)) if bias else None
        self.reset_parameters()
        if fuse_wgrad_accumulation:
            self.weight.main_grad = torch.zeros(self.weight.shape, dtype=torch.float32, device=self.weight.device)

    def reset_parameters(self) -> None:
        # nn.Linear's default, per expert: U(-1/sqrt(K), 1/sqrt(K))
        bound = 1 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(
        self, x: torch.Tensor, m_splits: Splits, wgrad_accumulation_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        check_tensor("x", x, dtypes=(self.weight.dtype,), ndim=2, contiguous=False)
        if x.shape[1] != self.in_features:
            raise ValueError(f"x: expected [M, in_features] = [M, {self.in_features}], got shape {tuple(x.shape)}")
        counts = device_counts("m_splits", m_splits, self.num_experts, x.shape[0], self.weight.device)
        if wgrad_accumulation_mask is not None and not self.fuse_wgrad_accumulation:
            raise ValueError("wgrad_accumulation_mask: only meaningful with fuse_wgrad_accumulation=True")
        main_grad = None
        if self.fuse_wgrad_accumulation:  # O(1) checks: backward writes into this buffer
            main_grad = getattr(self.weight, "main_grad", None)
            w = self.weight
            if not (
                isinstance(main_grad, torch.Tensor)
                and main_grad.dtype == torch.float32
                and main_grad.shape == w.shape
                and main_grad.device == w.device
            ):
                got = (
                    f"{str(main_grad.dtype).replace('torch.', '')} {tuple(main_grad.shape)} on {main_grad.device}"
                    if isinstance(main_grad, torch.Tensor)
                    else "none"
                    if main_grad is None
                    else type(main_grad).__name__
                )
                raise ValueError(
                    f"weight.main_grad: fuse_wgrad_accumulation=True needs an fp32 tensor of the weight's shape "
                    f"{tuple(w.shape)} on {w.device}; got {got}"
                )
        return GroupedLinearFunction.apply(x, counts, self.weight, self.bias, main_grad, wgrad_accumulation_mask)

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, fuse_wgrad_accumulation={self.fuse_wgrad_accumulation}"
        )


__all__ = ["GroupedLinear", "GroupedLinearFunction", "bias_grad", "weight_grad"]
