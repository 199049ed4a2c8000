"""Lab 04's MoE layer: the same mixture-of-experts MLP run two ways, with the token counts read
by the host (the common way) or left on the device (the story's grouped GEMM).

One forward, for T tokens of hidden size H, E experts of FFN size F, each token sent to top_k:

    route      logits = x @ router^T + route_bias (fp32); softmax; top_k experts per token and
               their weights, renormalised to sum to 1
    permute    the T*k (token, expert) pairs sorted by expert (a stable argsort), the counts per
               expert, and x's rows gathered in that order: expert 0's rows, expert 1's, ...
    experts    per expert e: down_e(silu(gate_e(rows)) * up_e(rows)) (SwiGLU), gate and up fused
               into one [H, 2F] weight per expert
    unpermute  rows put back in (token, k) order by the inverse permutation, and each token's k
               rows summed with its routing weights

``sync="device"`` hands the counts tensor to ``GroupedLinear`` (``labkit.kernels.grouped_linear``),
whose kernels read it on the GPU: forward and backward never wait for the GPU, so the whole step
can be captured in one CUDA graph. ``sync="host"`` is the baseline the story replaces:
``counts.tolist()`` (the host stops until the router's kernels are done) and then a Python loop
of ``torch.matmul`` per expert on slices of the same weights. Both compute the same function.

Everything else stays on the device and free of syncs, on purpose:

* counts come from ``scatter_add_`` of ones, not ``torch.bincount``: on CUDA bincount reads the
  largest id back to size its output (a sync; unsloth-zoo issue #1248 hit it in an MoE router);
* rows move by ``index_select`` only. Writing through an index (``out[idx] = y``, ``index_put_``)
  is avoided: its CUDA kernels sort the indices, and whether they or their backward read
  anything back has varied between torch versions. ``index_select`` and its backward, an
  ``index_add_``, launch without reading anything back (``moe_graph.sync_debug_check`` is the
  test). ``index_add_`` adds with atomics: in bf16 the order of the k additions into a token's
  gradient varies from run to run (results agree to bf16 rounding, not bit for bit).

``route_bias`` is a buffer, not a parameter: it lets a caller move the token distribution ON THE
DEVICE (``layer.route_bias.copy_(...)``) between replays of a captured graph, which is how the
lab shows one graph serving any distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labkit.kernels.grouped_linear import GroupedLinear
from labkit.workbench.checks import check_tensor
from labkit.workbench.errors import UsageError

#: how the experts learn their token counts: on the device (grouped GEMM) or on the host (loop)
SYNCS = ("device", "host")
#: what a layer's parameters may be: the grouped GEMM's dtypes
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def route(
    x: torch.Tensor, router_weight: torch.Tensor, route_bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32 summing to 1 per token, expert ids [T, k] int64), on the device.

    The router runs in fp32 (as Megatron's ``moe_router_dtype="fp32"`` does): which experts a
    token gets is decided by comparing logits, and in bf16 (about 3 significant digits) near-ties
    would be decided by rounding. A flipped choice changes a token's output entirely, not by a
    rounding error, so it would also spoil every comparison of two ways of computing the step."""
    logits = F.linear(x.float(), router_weight.float()) + route_bias
    top_p, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return top_p / top_p.sum(dim=-1, keepdim=True), ids


def permute(x: torch.Tensor, ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows [T*k, H] grouped by expert, order [T*k], counts [E] int64), without a host sync.

    ``order[j]`` is the flat (token, k) pair whose row lands at position j; the sort is stable,
    so within an expert tokens keep their order. Row j is token ``order[j] // k``."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # not bincount: that syncs on CUDA
    rows = x.index_select(0, order // ids.shape[1])
    return rows, order, counts


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """inverse[order[j]] = j: one scatter on the device, cheaper than a second argsort."""
    positions = torch.arange(order.numel(), device=order.device)
    return torch.empty_like(order).scatter_(0, order, positions)


def unpermute(y: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[T, H]: each token's k expert rows of ``y`` (grouped by expert), summed with ``weights``.

    Gathers by the inverse permutation (``index_select``) instead of scattering by ``order``:
    same result, and its backward needs no index_put (see the module docstring). The weighted sum
    runs in fp32 (the weights are fp32) and is rounded once, to y's dtype."""
    T, k = weights.shape
    per_token = y.index_select(0, inverse_permutation(order)).view(T, k, -1)
    return (per_token.float() * weights.unsqueeze(-1)).sum(dim=1).to(y.dtype)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, with h = [gate | up] along its last dimension (the fused weight's output)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def experts_device(
    rows: torch.Tensor, counts: torch.Tensor, gate_up: GroupedLinear, down: GroupedLinear
) -> torch.Tensor:
    """The experts as two grouped GEMMs that read ``counts`` on the device: no host sync."""
    return down(swiglu(gate_up(rows, counts)), counts)


def experts_host_loop(
    rows: torch.Tensor, counts: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor
) -> torch.Tensor:
    """The baseline: counts read by the host, then one matmul pair per expert on its slice.

    ``counts.tolist()`` is the sync: the host waits until every kernel queued before it (the
    router, the sort) has run, and the GPU idles while the host then launches the loop. The
    weights are GroupedLinear's, ``weight[e]`` being [in, out], so this computes what
    ``experts_device`` computes. They are taken apart with ``unbind`` rather than indexed
    per expert: the backward of ``weight[e]`` builds a zero tensor of the WHOLE weight for each
    expert (E full-size allocations and adds), which would make the baseline a strawman;
    ``unbind``'s backward stacks the E gradients once, close to separate per-expert parameters."""
    splits = counts.tolist()  # the host sync the story removes
    outputs = [
        swiglu(rows_e @ w_gate_up) @ w_down
        for rows_e, w_gate_up, w_down in zip(rows.split(splits), gate_up_weight.unbind(0), down_weight.unbind(0))
    ]
    return torch.cat(outputs)


class MoELayer(nn.Module):
    """A top-k mixture-of-experts SwiGLU MLP whose experts learn their token counts on the
    device (``sync="device"``) or on the host (``sync="host"``); see the module docstring.

    hidden_size H, ffn_size F, num_experts E, top_k k (1 <= k <= E). Parameters: ``router``
    (``nn.Linear(H, E, bias=False)``), ``gate_up`` (``GroupedLinear(E, H, 2F)``, gate then up)
    and ``down`` (``GroupedLinear(E, F, H)``). Buffer: ``route_bias`` [E] fp32, added to the
    router's logits. forward(x [T, H]) -> [T, H]. After a forward, ``last_counts`` is the counts
    tensor it used (inside a captured graph: the static tensor every replay rewrites)."""

    def __init__(
        self,
        hidden_size: int,
        ffn_size: int,
        num_experts: int,
        top_k: int,
        *,
        sync: str = "device",
        dtype: torch.dtype | None = None,
        device=None,
    ):
        super().__init__()
        for name, value in (
            ("hidden_size", hidden_size),
            ("ffn_size", ffn_size),
            ("num_experts", num_experts),
            ("top_k", top_k),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name}: expected a positive int, got {value!r}")
        if top_k > num_experts:
            raise UsageError(f"top_k: {top_k} experts per token, but the layer has only num_experts={num_experts}")
        if sync not in SYNCS:
            raise UsageError(f"sync: {sync!r} is not one of {SYNCS}")
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in DTYPES:
            raise UsageError(f"dtype: {dtype} is not one of {DTYPES} (the grouped GEMM's)")
        self.hidden_size, self.ffn_size, self.num_experts, self.top_k = hidden_size, ffn_size, num_experts, top_k
        self.sync = sync
        self.router = nn.Linear(hidden_size, num_experts, bias=False, dtype=dtype, device=device)
        self.register_buffer("route_bias", torch.zeros(num_experts, dtype=torch.float32, device=device))
        self.gate_up = GroupedLinear(num_experts, hidden_size, 2 * ffn_size, bias=False, dtype=dtype, device=device)
        self.down = GroupedLinear(num_experts, ffn_size, hidden_size, bias=False, dtype=dtype, device=device)
        self.last_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.router.weight
        check_tensor("x", x, dtypes=(weight.dtype,), ndim=2, contiguous=False)
        if x.shape[1] != self.hidden_size:
            raise ValueError(f"x: shape {tuple(x.shape)} is not [tokens, hidden_size={self.hidden_size}]")
        if x.device != weight.device:
            raise ValueError(f"x: is on {x.device}, the layer's parameters on {weight.device}")
        weights, ids = route(x, weight, self.route_bias, self.top_k)
        rows, order, counts = permute(x, ids, self.num_experts)
        if self.sync == "device":
            y = experts_device(rows, counts, self.gate_up, self.down)
        else:
            y = experts_host_loop(rows, counts, self.gate_up.weight, self.down.weight)
        self.last_counts = counts
        return unpermute(y, order, weights)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, ffn_size={self.ffn_size}, num_experts={self.num_experts}, "
            f"top_k={self.top_k}, sync={self.sync!r}"
        )


def with_sync(layer: MoELayer, sync: str) -> MoELayer:
    """A new layer with ``layer``'s sizes, parameters and route_bias (copied) and another ``sync``:
    the two paths of one comparison compute the same function."""
    if not isinstance(layer, MoELayer):
        raise TypeError(f"layer: expected an MoELayer, got {type(layer).__name__}")
    weight = layer.router.weight
    twin = MoELayer(
        layer.hidden_size,
        layer.ffn_size,
        layer.num_experts,
        layer.top_k,
        sync=sync,
        dtype=weight.dtype,
        device=weight.device,
    )
    twin.load_state_dict(layer.state_dict())
    return twin


def grad_names(layer: MoELayer) -> tuple[str, ...]:
    """Names of the gradients ``forward_backward`` returns, in order: x, then every parameter."""
    return ("x",) + tuple(name for name, _ in layer.named_parameters())


def forward_backward(layer: MoELayer, x: torch.Tensor, grad_out: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """One training step's compute: (out, grads), grads being those of ``(out * grad_out).sum()``
    with respect to x and every parameter (``grad_names``), i.e. backward from ``grad_out``.

    ``torch.autograd.grad`` rather than ``.backward()``: nothing accumulates into ``.grad``, so
    the call has no state across calls and can be captured in a CUDA graph as is."""
    if not isinstance(layer, MoELayer):
        raise TypeError(f"layer: expected an MoELayer, got {type(layer).__name__}")
    check_tensor("x", x, contiguous=False)
    check_tensor("grad_out", grad_out, contiguous=False)
    if grad_out.shape != x.shape or grad_out.dtype != x.dtype:
        raise ValueError(
            f"grad_out: shape {tuple(grad_out.shape)} {grad_out.dtype} differs from x's {tuple(x.shape)} {x.dtype}"
        )
    x = x.detach().requires_grad_(True)  # shares x's storage: nothing is copied
    out = layer(x)
    grads = torch.autograd.grad(out, (x, *layer.parameters()), grad_outputs=grad_out)
    return out.detach(), grads


__all__ = [
    "DTYPES",
    "MoELayer",
    "SYNCS",
    "experts_device",
    "experts_host_loop",
    "forward_backward",
    "grad_names",
    "inverse_permutation",
    "permute",
    "route",
    "swiglu",
    "unpermute",
    "with_sync",
]
