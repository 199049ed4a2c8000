# The counts moved to the CPU first, because CPU counts are "free" to check: the move is the sync.
import torch  # noqa: F401

from labkit.kernels import grouped_gemm as gg


def experts_forward(x, w, m_splits):
    return gg.grouped_mm(x, w, m_splits.cpu())
