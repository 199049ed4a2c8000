"""``FP8Linear``: a bias-optional linear layer that computes in FP8 inside ``fp8_autocast``.

y = x @ W.T with x and W cast to E4M3 (one pass each, ``quantize``) and multiplied by an FP8
GEMM with fp32 accumulation (``fp8_gemm``); backward casts the output gradient to E5M2 (HYBRID)
or E4M3 and runs dgrad (dy @ W) and wgrad (dy.T @ x) as FP8 GEMMs too, reusing the FP8 x and W
saved by the forward. Scales follow delayed scaling (``labkit.kernels.fp8.recipe``).

The scaling state (``fp8_meta("forward")``: input and weight; ``fp8_meta("backward")``: output
gradient) is made when the module is built, on the weight's device, as registered buffers: it
moves with ``.to()`` and with accelerate's ``dispatch_model``, and is saved in the state dict.

The weight is cast once and cached, not at every forward (report ``weight_casts``): the cache
is recast when the weight changes (its version counter: an optimizer step updates it in place),
moves, or ``refresh_weight_cache()`` is called; and once after the first scale update, because
a weight cast before any update used the initial scale 1 (no amax known yet).

Outside ``fp8_autocast`` (or with ``enabled=False``) the layer is ``F.linear`` in the weight's
dtype: the same module gives the bf16 reference.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from labkit.kernels.fp8 import autocast as _autocast
from labkit.kernels.fp8.cast import INPUT_DTYPES, Quantized
from labkit.kernels.fp8.gemm import BACKENDS, fp8_gemm
from labkit.kernels.fp8.recipe import DelayedScaling, FP8Meta


@dataclasses.dataclass
class _FP8Call:
    """One FP8 call's settings, what backward needs besides tensors: the state, the recipe, the policy
    and the cast weight."""

    module: FP8Linear
    fwd_meta: FP8Meta
    bwd_meta: FP8Meta
    recipe: DelayedScaling
    policy: object
    weight_fp8: Quantized
    backend: str


class _FP8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, call: _FP8Call):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        x8 = call.policy.quantize(x2, call.fwd_meta, 0, call.recipe.fwd_dtype)
        y = fp8_gemm(x8, call.weight_fp8, out_dtype=x.dtype, backend=call.backend, a_name="x", b_name="weight")
        if bias is not None:
            y = y + bias
        ctx.call, ctx.x8, ctx.has_bias, ctx.x_dtype = call, x8, bias is not None, x.dtype
        return y.reshape(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        call = ctx.call
        shape = dy.shape
        dy2 = dy.reshape(-1, shape[-1]).contiguous()
        dy8 = call.policy.quantize(dy2, call.bwd_meta, 0, call.recipe.bwd_dtype)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = fp8_gemm(
                dy8,
                call.module.transposed_weight(call.weight_fp8),
                out_dtype=ctx.x_dtype,
                backend=call.backend,
                a_name="grad_output",
                b_name="weight",
            )
            dx = dx.reshape(*shape[:-1], dx.shape[-1])
        if ctx.needs_input_grad[1]:
            dw = fp8_gemm(
                dy8.t(),
                ctx.x8.t(),
                out_dtype=call.module.weight.dtype,
                backend=call.backend,
                a_name="grad_output",
                b_name="x",
            )
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0).to(call.module.bias.dtype)
        return dx, dw, db, None


class FP8Linear(nn.Module):
    """y = x @ weight.T (+ bias), in FP8 inside ``fp8_autocast``, like ``nn.Linear`` outside.

    in_features, out_features: positive ints. recipe: the ``DelayedScaling`` whose history length
    sizes the state (default ``DelayedScaling()``); the context's recipe must agree on it.
    backend: "auto", "scaled_mm" or "emulated" (see ``labkit.kernels.fp8.gemm``)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        recipe: DelayedScaling | None = None,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        recipe = DelayedScaling() if recipe is None else recipe
        if not isinstance(recipe, DelayedScaling):
            raise TypeError(f"recipe: expected a DelayedScaling, got {type(recipe).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
        self.in_features, self.out_features, self.backend = in_features, out_features, backend
        self.weight = nn.Parameter(torch.empty((out_features, in_features), device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        dev = self.weight.device
        for direction, n in (("forward", 2), ("backward", 1)):
            meta = FP8Meta.create(n, recipe.amax_history_len, dev)
            for field in ("scale", "scale_inv", "amax_history"):
                self.register_buffer(f"fp8_{direction}_{field}", getattr(meta, field))
        self.fp8_name: str | None = None  # how records and errors name it (the model sets it)
        self.fp8_updates = {"forward": 0, "backward": 0}  # exits that updated each state
        self.weight_casts = 0
        self._weight_cache: tuple | None = None  # (key, Quantized, transposed Quantized or None)
        self.reset_parameters()

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> FP8Linear:
        """An FP8Linear sharing ``linear``'s parameters (the story's nn.Linear -> te.Linear swap)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        w = linear.weight
        m = cls(
            linear.in_features, linear.out_features, linear.bias is not None, device=w.device, dtype=w.dtype, **kwargs
        )
        m.weight, m.bias = linear.weight, linear.bias
        return m

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's initialisation
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def fp8_meta(self, direction: str) -> FP8Meta:
        """The scaling state of "forward" (input, weight) or "backward" (output gradient)."""
        if direction not in ("forward", "backward"):
            raise ValueError(f"direction: expected 'forward' or 'backward', got {direction!r}")
        return FP8Meta(*(getattr(self, f"fp8_{direction}_{f}") for f in ("scale", "scale_inv", "amax_history")))

    def refresh_weight_cache(self) -> None:
        """Forget the cast weight: the next FP8 forward casts it again."""
        self._weight_cache = None

    def cast_weight(self, policy=None, meta: FP8Meta | None = None, recipe: DelayedScaling | None = None) -> Quantized:
        """The FP8 weight, cast now if the cache is stale (see the module docstring)."""
        policy = policy or _autocast.DeviceAware()
        meta = meta if meta is not None else policy.meta(self, "forward")
        recipe = recipe or DelayedScaling(amax_history_len=meta.history_len)
        w = self.weight
        key = (policy.name, w._version, w.data_ptr(), w.device, self.fp8_updates["forward"] > 0)
        if self._weight_cache is None or self._weight_cache[0] != key:
            w8 = policy.quantize(w.detach().contiguous(), meta, 1, recipe.fwd_dtype)
            self._weight_cache = (key, w8, None)
            self.weight_casts += 1
        return self._weight_cache[1]

    def transposed_weight(self, w8: Quantized) -> Quantized:
        """W.T laid out row-major for dgrad, made once per cast weight."""
        cache = self._weight_cache
        if cache is None or cache[1] is not w8:
            return w8.t()
        if cache[2] is None:
            self._weight_cache = cache = (cache[0], cache[1], w8.t())
        return cache[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = _autocast.active()
        if ctx is None or not ctx.enabled:
            return F.linear(x, self.weight, self.bias)
        return fp8_linear(x, self, ctx)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"backend={self.backend!r}, history_len={self.fp8_forward_amax_history.shape[0]}"
        )


def fp8_linear(x: torch.Tensor, module: FP8Linear, ctx: _autocast.fp8_autocast | None = None) -> torch.Tensor:
    """One FP8 forward of ``module`` on ``x`` (autograd-aware) under ``ctx``, an entered
    ``fp8_autocast`` (default: the active one), whose recipe and policy it uses."""
    if not isinstance(module, FP8Linear):
        raise TypeError(f"module: expected an FP8Linear, got {type(module).__name__}")
    ctx = _autocast.active() if ctx is None else ctx
    if not isinstance(ctx, _autocast.fp8_autocast) or ctx not in _autocast._ACTIVE:
        raise ValueError(f"ctx: expected an entered fp8_autocast, got {ctx!r} (call it inside `with fp8_autocast():`)")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x: dtype {x.dtype} is not supported; expected bfloat16, float16 or float32")
    if x.dim() < 1 or x.shape[-1] != module.in_features or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty tensor of shape [..., {module.in_features}], got {tuple(x.shape)}")
    recipe, policy = ctx.recipe, ctx.policy
    have = module.fp8_forward_amax_history.shape[0]
    if recipe.amax_history_len != have:
        raise ValueError(
            f"recipe: amax_history_len={recipe.amax_history_len} but {_autocast.module_name(module)} "
            f"was built with {have}; build it with the same recipe"
        )
    policy.check_input(module, x)
    fwd, bwd = policy.meta(module, "forward"), policy.meta(module, "backward")
    ctx.register(module, "forward", fwd)
    ctx.register(module, "backward", bwd)
    w8 = module.cast_weight(policy, fwd, recipe)
    call = _FP8Call(module, fwd, bwd, recipe, policy, w8, module.backend)
    return _FP8LinearFunction.apply(x, module.weight, module.bias, call)


__all__ = ["FP8Linear", "fp8_linear"]
