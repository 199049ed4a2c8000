"""The SC kernel against a bf16 matmul at Llama-3.1-8B MLP shapes, in one run per shape.

The weight is quantised once (``prepare_b``), as an SC linear layer would keep it; the SC time
includes quantising the activations. M = 1 is a decode step, M = 512 a prefill chunk.
Accuracy is reported beside the timing: relative error of each result against an fp32 matmul.
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from labkit import bench, tier
from labkit.sc.matmul import prepare_b, sc_matmul_prepared

# layer: (K, N, chunk_d). The down projection uses the story's chunked path (chunk_d=128).
SHAPES = {
    "gpu": {"gate_up": (4096, 14336, 0), "down": (14336, 4096, 128)},
    "cpu": {"gate_up": (64, 96, 0), "down": (96, 64, 32)},
}
MS = {"gpu": (1, 512), "cpu": (1, 4)}
REQUIRED = ("layer", "M", "K", "N", "chunk_d", "impl", "us", "us_p25", "us_p75", "ratio_vs_bf16",
            "rel_err_vs_fp32", "method")


def kernel_vs_bf16(profile: str, reps: int | None = None) -> list[dict]:
    dev = tier.kernel_device()
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16
    reps = reps or (20 if cuda else 2)
    records = []
    jobs = [(layer, K, N, cd, M) for layer, (K, N, cd) in SHAPES[profile].items() for M in MS[profile]]
    for layer, K, N, chunk_d, M in tqdm(jobs, desc="sc kernel vs bf16", unit="shape"):
        w = torch.randn(K, N, device=dev, dtype=dtype) / K ** 0.5
        x = torch.randn(M, K, device=dev, dtype=dtype)
        prepared = prepare_b(w, chunk_d=chunk_d)
        exact = x.float() @ w.float()
        rel = lambda out: ((out.float() - exact).norm() / exact.norm()).item()  # noqa: E731
        errors = {"bf16 matmul": rel(x @ w), "sc_matmul": rel(sc_matmul_prepared(x, prepared))}
        cmp = bench.compare({"bf16 matmul": lambda: x @ w, "sc_matmul": lambda: sc_matmul_prepared(x, prepared)},
                            baseline="bf16 matmul", device=dev if cuda else None, warmup=3, reps=reps)
        for impl, t in cmp.timings.items():
            records.append({"layer": layer, "M": M, "K": K, "N": N, "chunk_d": chunk_d, "impl": impl,
                            **t.as_dict(), "ratio_vs_bf16": cmp.ratio(impl), "rel_err_vs_fp32": errors[impl]})
    return records


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench sc_kernel``."""
    return kernel_vs_bf16(profile)
