import torch  # noqa: F401  (the starter's import, kept: the cell stays self-contained)

from labkit.kernels import grouped_gemm as gg


def experts_forward(x, w, m_splits):
    # One launch for every expert: the kernel reads m_splits from GPU memory itself, so the host
    # never waits for the router, and the step can be captured in a CUDA graph.
    return gg.grouped_mm(x, w, m_splits)
