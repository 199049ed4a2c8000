"""The two execution tiers, chosen once per process.

* ``gpu``: a CUDA GPU is visible and TRITON_INTERPRET is not set; kernels compile for the GPU.
* ``interpreter``: no GPU (or TRITON_INTERPRET=1 was asked for); every ``@triton.jit`` kernel
  runs in the Triton interpreter on CPU tensors. Same code path, small sizes.

Triton reads TRITON_INTERPRET when a kernel is *decorated*, so this module must run before any
kernel module is imported; ``import labkit`` does that.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _choose() -> str:
    asked = os.environ.get("TRITON_INTERPRET")
    if asked == "1":  # asked for: chosen without importing torch (a notebook's runner process starts so)
        return "interpreter"
    import torch

    if asked is not None:
        return "gpu" if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available():
        return "gpu"
    os.environ["TRITON_INTERPRET"] = "1"
    return "interpreter"


#: "gpu", "interpreter", or "cpu" (no GPU and the interpreter explicitly switched off:
#: nothing Triton can run; labkit's gates say so).
TIER = _choose()


def interpreted() -> bool:
    """True when Triton kernels run in the interpreter (CPU tier)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_device() -> torch.device:
    """Where labkit puts the tensors of a demo or test: the GPU, or the CPU under the interpreter."""
    import torch  # on first use: a notebook's runner process never needs it

    return torch.device("cuda") if TIER == "gpu" else torch.device("cpu")
