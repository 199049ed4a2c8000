"""Stochastic-computing matmul (the seed story's kernel): encoding, literal reference, Triton kernel."""

from labkit.kernels.sc.matmul import (
    GRANULARITIES,
    PreparedB,
    SCConfig,
    prepare_b,
    sc_counts,
    sc_matmul,
    sc_matmul_prepared,
    sc_matmul_reference,
)

__all__ = [
    "sc_matmul",
    "sc_matmul_prepared",
    "prepare_b",
    "PreparedB",
    "sc_counts",
    "sc_matmul_reference",
    "SCConfig",
    "GRANULARITIES",
]
