"""labkit: a workbook of multi-GPU bugs, with the kernels, guards and tools to prove and fix them.

Importing labkit does two things before anything else, because both must happen before any
Triton kernel is defined or any process group is made:

* it turns NVLink multicast off for this process and every child it starts
  (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1): on shared
  multi-GPU hosts a program using multicast can take the GPUs out of service;
* it picks the execution tier (see :mod:`labkit.workbench.tier`): on a machine without a CUDA GPU it sets
  TRITON_INTERPRET=1, so every labkit kernel runs under the Triton interpreter on the CPU.
"""

import os as _os

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
_os.environ.update(MULTICAST_OFF)

from labkit.workbench.tier import TIER, interpreted  # noqa: E402  (must follow the environment set-up)

__version__ = "0.1.0"
__all__ = ["TIER", "interpreted", "MULTICAST_OFF", "__version__", "exercises", "check"]


def __getattr__(name: str):
    """On first use: ``labkit.exercises``, the notebooks' checks (:mod:`labkit.app.exercises`), and
    ``labkit.check``, the checkers for a user's own code (the package :mod:`labkit.check`, which
    ``import labkit.check`` imports too)."""
    if name == "exercises":
        from labkit.app import exercises

        return exercises
    if name == "check":
        import labkit.check

        return labkit.check
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
