"""FP8 linear layers with delayed scaling (TransformerEngine's HYBRID recipe, rebuilt small).

* ``recipe``: ``DelayedScaling`` (margin, history length, amax algorithm, format) and ``FP8Meta``,
  the per-module scale / scale_inv / amax history, with TransformerEngine's update rules;
* ``cast``: ``quantize``, one Triton pass that measures the amax and writes FP8;
* ``gemm``: ``fp8_gemm`` through ``torch._scaled_mm`` / ``F.scaled_mm`` on sm_89+, emulated elsewhere;
* ``linear``: ``FP8Linear`` (forward E4M3, backward E5M2 gradients, cached FP8 weight);
* ``autocast``: ``fp8_autocast``, which collects amaxes and updates the scales on exit, with its
  state on each weight's device and every launch guarded (``DeviceAware``).

Lab 05 (``labkit.labs.fp8_dispatch``) shows what happens when that state follows the current
device instead, as it does in the story.
"""

from labkit.kernels.fp8.autocast import DeviceAware, fp8_autocast
from labkit.kernels.fp8.cast import Quantized, quantize, quantize_reference
from labkit.kernels.fp8.gemm import fp8_gemm, scaled_mm_api
from labkit.kernels.fp8.linear import FP8Linear, fp8_linear
from labkit.kernels.fp8.recipe import DelayedScaling, FP8Meta

__all__ = [
    "DelayedScaling",
    "FP8Meta",
    "Quantized",
    "quantize",
    "quantize_reference",
    "fp8_gemm",
    "scaled_mm_api",
    "FP8Linear",
    "fp8_linear",
    "fp8_autocast",
    "DeviceAware",
]
