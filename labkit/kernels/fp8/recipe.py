"""Delayed scaling: the FP8 recipe, the per-module state it keeps, and the rules that update it.

FP8 has few bits: E4M3 (3 mantissa bits, largest value 448) for forward tensors, E5M2 (2 mantissa
bits, largest 57344, more range) for gradients in the HYBRID format. A tensor is cast as
``fp8(clamp(x * scale))`` and read back as ``fp8 * scale_inv``; the scale must map the tensor's
largest magnitude (its *amax*) near the top of the format. Measuring the amax first and then
casting needs two passes over the tensor. *Delayed* scaling (TransformerEngine's
``DelayedScaling``) casts with a scale computed from the amaxes of EARLIER steps and records the
amax of this step on the way, so one pass suffices (``labkit.kernels.fp8.cast``).

The state, ``FP8Meta``, one per module and direction (forward: input and weight; backward: the
output gradient): ``scale`` [n], ``scale_inv`` [n] and ``amax_history`` [history_len, n], fp32.
Row 0 of the history is the slot the casts of the current step write their amax into (an atomic
max). On the context's exit the update runs, exactly as TransformerEngine's Python path
(``_amax_and_scale_update``: ``_default_get_amax_and_update_history`` + ``_default_sf_compute``):

* amax: ``max`` over the whole history (row 0 included), or ``most_recent`` = row 0;
* roll: ``torch.roll(history, -1, 0)``, then row 0 = 0. The newest amax (old row 0) ends in the
  LAST row, row 0 (which received the oldest, old row 1) is cleared for the next step: a window
  of ``history_len`` steps;
* scale: ``sf = (fp8_max / amax) / 2**margin``; where amax is 0, inf or NaN the previous scale is
  kept; an infinite sf (amax below ~fp8_max / fp32_max) becomes the largest fp32;
* ``scale_inv = 1 / scale`` (the dequantisation factor the GEMM multiplies by).

TransformerEngine's default fused CUDA update (``kernel_bulk``) differs in one edge case: a
column whose new amax is 0 is neither rolled nor rescaled. Here the Python path is followed
everywhere, so both of labkit's update implementations agree bit for bit.

Where the state lives is the lab's subject: ``FP8Meta.create`` takes the device explicitly;
labkit's modules make it on their weight's device at construction.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch

#: the recipe's names, with what each selects
FORMATS = {"HYBRID": "E4M3 forward tensors, E5M2 gradients", "E4M3": "E4M3 everywhere"}
AMAX_ALGOS = {"max": "largest amax in the history", "most_recent": "the newest amax only"}
#: largest finite value of each FP8 dtype (torch.finfo: 448 and 57344)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FP32_MAX = torch.finfo(torch.float32).max


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """The delayed-scaling recipe (TransformerEngine's ``DelayedScaling``, a subset).

    margin: the scale leaves 2**margin of headroom above the amax (a number >= 0).
    amax_history_len: steps of amax kept per tensor (>= 1). amax_compute_algo: "max" or
    "most_recent". fp8_format: "HYBRID" (E4M3 forward, E5M2 gradients) or "E4M3"."""

    margin: float = 0
    amax_history_len: int = 16
    amax_compute_algo: str = "max"
    fp8_format: str = "HYBRID"

    def __post_init__(self):
        if (
            isinstance(self.margin, bool)
            or not isinstance(self.margin, numbers.Real)
            or not math.isfinite(self.margin)
            or self.margin < 0
        ):
            raise ValueError(f"margin: expected a finite number >= 0, got {self.margin!r}")
        if (
            isinstance(self.amax_history_len, bool)
            or not isinstance(self.amax_history_len, int)
            or self.amax_history_len < 1
        ):
            raise ValueError(f"amax_history_len: expected an int >= 1, got {self.amax_history_len!r}")
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise ValueError(
                f"amax_compute_algo: {self.amax_compute_algo!r} is not one of {', '.join(map(repr, AMAX_ALGOS))}"
            )
        if self.fp8_format not in FORMATS:
            raise ValueError(f"fp8_format: {self.fp8_format!r} is not one of {', '.join(map(repr, FORMATS))}")

    @property
    def fwd_dtype(self) -> torch.dtype:
        """FP8 dtype of forward tensors (inputs and weights)."""
        return torch.float8_e4m3fn

    @property
    def bwd_dtype(self) -> torch.dtype:
        """FP8 dtype of gradients: E5M2 (range) in HYBRID, E4M3 otherwise."""
        return torch.float8_e5m2 if self.fp8_format == "HYBRID" else torch.float8_e4m3fn

    def dtype(self, direction: str) -> torch.dtype:
        return self.fwd_dtype if _direction(direction) == "forward" else self.bwd_dtype

    def fp8_max(self, direction: str) -> float:
        return FP8_MAX[self.dtype(direction)]


def _direction(direction: str) -> str:
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction: expected 'forward' or 'backward', got {direction!r}")
    return direction


@dataclasses.dataclass
class FP8Meta:
    """Delayed-scaling state of n tensors: scale [n], scale_inv [n], amax_history [len, n], fp32,
    all on one device. Updates are in place, so views handed out earlier stay valid."""

    scale: torch.Tensor
    scale_inv: torch.Tensor
    amax_history: torch.Tensor

    @classmethod
    def create(cls, n_tensors: int, history_len: int, device) -> FP8Meta:
        """Fresh state on ``device``: scale 1, empty history (what TransformerEngine starts from)."""
        if isinstance(n_tensors, bool) or not isinstance(n_tensors, int) or n_tensors < 1:
            raise ValueError(f"n_tensors: expected an int >= 1, got {n_tensors!r}")
        if isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 1:
            raise ValueError(f"history_len: expected an int >= 1, got {history_len!r}")
        f32 = dict(dtype=torch.float32, device=device)
        return cls(
            torch.ones(n_tensors, **f32), torch.ones(n_tensors, **f32), torch.zeros(history_len, n_tensors, **f32)
        )

    def __post_init__(self):
        for name in ("scale", "scale_inv", "amax_history"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
                raise TypeError(f"{name}: expected an fp32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        n = self.scale.shape[0] if self.scale.dim() == 1 else -1
        if n < 1 or self.scale_inv.shape != (n,) or self.amax_history.dim() != 2 or self.amax_history.shape[1] != n:
            raise ValueError(
                f"amax_history: expected scale [n], scale_inv [n], amax_history [len, n]; got "
                f"{tuple(self.scale.shape)}, {tuple(self.scale_inv.shape)}, "
                f"{tuple(self.amax_history.shape)}"
            )
        devices = {self.scale.device, self.scale_inv.device, self.amax_history.device}
        if len(devices) > 1:
            raise ValueError(f"scale, scale_inv, amax_history: must share one device, got {sorted(map(str, devices))}")

    @property
    def device(self) -> torch.device:
        return self.scale.device

    @property
    def n_tensors(self) -> int:
        return self.scale.shape[0]

    @property
    def history_len(self) -> int:
        return self.amax_history.shape[0]

    def update_(self, fp8_max: float, recipe: DelayedScaling) -> None:
        """Roll the history and recompute scale and scale_inv, in place (torch ops on the
        state's own device)."""
        history, scale, scale_inv = updated(
            self.amax_history, self.scale, fp8_max, recipe.margin, recipe.amax_compute_algo
        )
        self.amax_history.copy_(history)
        self.scale.copy_(scale)
        self.scale_inv.copy_(scale_inv)


def amax_from_history(amax_history: torch.Tensor, algo: str) -> torch.Tensor:
    """The amax each scale is computed from: the column max ("max") or row 0 ("most_recent")."""
    if algo == "max":
        return amax_history.amax(dim=-2)
    if algo == "most_recent":
        return amax_history.select(-2, 0).clone()
    raise ValueError(f"algo: {algo!r} is not one of {', '.join(map(repr, AMAX_ALGOS))}")


def rolled_history(amax_history: torch.Tensor) -> torch.Tensor:
    """``roll(-1)`` along the history, then row 0 cleared for the next step's amax (a new tensor)."""
    out = torch.roll(amax_history, -1, dims=-2) if amax_history.shape[-2] > 1 else amax_history.clone()
    out.select(-2, 0).zero_()
    return out


def scale_from_amax(amax: torch.Tensor, scale: torch.Tensor, fp8_max: float, margin: float) -> torch.Tensor:
    """TransformerEngine's ``_default_sf_compute``: ``(fp8_max / amax) / 2**margin``, the previous
    scale where amax is 0, inf or NaN, the largest fp32 where the quotient overflows."""
    # Tensor-by-tensor true divisions: a Python number over a tensor is reciprocal-then-multiply in
    # torch, and CUDA divides by a scalar the same way (two roundings each). For an integer margin
    # this equals TransformerEngine's CUDA update (scaled_max / amax) bit for bit.
    sf = torch.div(torch.full_like(amax, fp8_max), amax).div(torch.full_like(amax, 2.0**margin))
    sf = torch.where(amax > 0.0, sf, scale)
    sf = torch.where(torch.isfinite(amax), sf, scale)
    return torch.where(torch.isinf(sf), torch.full_like(sf, FP32_MAX), sf)


def updated(
    amax_history: torch.Tensor, scale: torch.Tensor, fp8_max: float, margin: float, algo: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(new history, new scale, new scale_inv) from the current state; pure (nothing is changed).

    Works on one state ([len, n], [n]) or a stack of them ([m, len, n], [m, n])."""
    amax = amax_from_history(amax_history, algo)
    scale = scale_from_amax(amax, scale, fp8_max, margin)
    return rolled_history(amax_history), scale, torch.reciprocal(scale)


__all__ = [
    "DelayedScaling",
    "FP8Meta",
    "FORMATS",
    "AMAX_ALGOS",
    "FP8_MAX",
    "amax_from_history",
    "rolled_history",
    "scale_from_amax",
    "updated",
]
