"""What a test needs to start a world of ranks here, and the skip that says so."""

from __future__ import annotations

import pytest
import torch

import labkit  # noqa: F401  (picks the tier first)
from labkit.workbench import tier


def skip_without_a_world(world_size: int = 2) -> None:
    """W ranks running labkit's kernels need the CPU tier's emulated world or W GPUs: on the
    compiled tier with fewer GPUs (one GPU of the GPU tier's per-GPU test processes, say) the
    emulated ranks hold CPU tensors, which compiled kernels cannot take (``symm.empty`` refuses
    them). The skip names the GPUs needed, so the GPU tier runs the test again on every GPU."""
    if not tier.interpreted() and torch.cuda.device_count() < world_size:
        pytest.skip(
            f"a world of {world_size} ranks needs {world_size} CUDA GPUs on the compiled tier (the CPU "
            f"tier emulates them); this machine has {torch.cuda.device_count()}"
        )
