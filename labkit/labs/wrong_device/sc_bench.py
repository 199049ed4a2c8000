"""The SC kernel against a bf16 matmul at Llama-3.1-8B MLP shapes, in one run per shape, and the
sweep of launch configurations the defaults of ``labkit.kernels.sc.matmul.launch_config`` come from.

The weight is quantised once (``prepare_b``), as an SC linear layer keeps it; the SC time
includes quantising the activations. M = 1 is a decode step, M = 512 a prefill chunk.
Accuracy is reported beside the timing: relative error of each result against an fp32 matmul.
Both are timed two ways: CUDA-graph replay (the GPU's time, launch overhead removed) and eager
calls between CUDA events (what a Python decode loop pays, launches included).
"""

from __future__ import annotations

import dataclasses

import torch
from tqdm.auto import tqdm

from labkit.kernels.sc.matmul import LaunchConfig, launch_config, prepare_b, sc_matmul_prepared, split_k
from labkit.workbench import bench, tier

# layer: (K, N, chunk_d). gate_up is the fused gate and up projection (N = 2 x 14336); the down
# projection uses the story's chunked path (chunk_d=128).
SHAPES = {
    "gpu": {"gate_up": (4096, 28672, 0), "down": (14336, 4096, 128)},
    "cpu": {"gate_up": (64, 96, 0), "down": (96, 64, 32)},
}
MS = {"gpu": (1, 512), "cpu": (1, 4)}
REQUIRED = (
    "layer",
    "M",
    "K",
    "N",
    "chunk_d",
    "impl",
    "us",
    "us_p25",
    "us_p75",
    "ratio_vs_bf16",
    "rel_err_vs_fp32",
    "method",
)


def _operands(K, N, M, chunk_d, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(K, N, device=dev, dtype=torch.bfloat16, generator=g) / K**0.5
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
    return x, w, prepare_b(w, chunk_d=chunk_d)


def kernel_vs_bf16(profile: str, reps: int | None = None) -> list[dict]:
    dev = tier.kernel_device()
    cuda = dev.type == "cuda"
    reps = reps or (20 if cuda else 2)
    methods = ("cuda_graph", "cuda_events") if cuda else ("cpu_clock",)
    records = []
    jobs = [
        (layer, K, N, cd, M, method)
        for layer, (K, N, cd) in SHAPES[profile].items()
        for M in MS[profile]
        for method in methods
    ]
    for layer, K, N, chunk_d, M, method in tqdm(jobs, desc="sc kernel vs bf16", unit="shape"):
        x, w, prepared = _operands(K, N, M, chunk_d, dev)
        exact = x.float() @ w.float()
        rel = lambda out, exact=exact: ((out.float() - exact).norm() / exact.norm()).item()  # noqa: E731
        errors = {"bf16 matmul": rel(x @ w), "sc_matmul": rel(sc_matmul_prepared(x, prepared))}
        cmp = bench.compare(
            {
                "bf16 matmul": lambda x=x, w=w: x @ w,
                "sc_matmul": lambda x=x, prepared=prepared: sc_matmul_prepared(x, prepared),
            },
            baseline="bf16 matmul",
            device=dev if cuda else None,
            # interpreted, a call is a full Python run: nothing left to warm after the one the errors above made
            warmup=3 if cuda else 0,
            reps=reps,
            method=method,
        )
        for impl, t in cmp.timings.items():
            records.append(
                {
                    "layer": layer,
                    "M": M,
                    "K": K,
                    "N": N,
                    "chunk_d": chunk_d,
                    "impl": impl,
                    **t.as_dict(),
                    "ratio_vs_bf16": cmp.ratio(impl),
                    "rel_err_vs_fp32": errors[impl],
                }
            )
    return records


def candidate_configs(M: int, H: int, N: int, K: int, C: int) -> dict[str, LaunchConfig]:
    """The launch configurations the sweep tries for one shape, named by their fields.

    Decode (M <= 4): one row per program; both lookups; K split 1x, as ``launch_config`` would
    (enough programs for ~4 waves), and 4x that. Prefill: a few tile shapes, both lookups."""
    out = {"auto": launch_config(H, M, N, K, C)}
    if M <= 4:
        for bn, bk in [(64, 16), (128, 8), (128, 16), (128, 32), (256, 8), (256, 16)]:
            auto = split_k(-(-N // bn) * H, K, bk)
            for gather, splits, warps in [(0, auto, 4), (1, 1, 4), (1, auto, 4), (1, 4 * auto, 4), (1, auto, 8)]:
                lc = LaunchConfig(gather=gather, block_m=1, block_n=bn, block_k=bk, splits=splits, num_warps=warps)
                out[f"g{gather} m1 n{bn} k{bk} s{splits} w{warps}"] = lc
    else:
        for bm, bn, bk in [(4, 128, 8), (8, 128, 4), (2, 256, 8), (4, 256, 4), (16, 64, 4), (8, 64, 8)]:
            for gather in (0, 1):
                out[f"g{gather} m{bm} n{bn} k{bk} s1 w4"] = LaunchConfig(
                    gather=gather, block_m=bm, block_n=bn, block_k=bk, splits=1
                )
    return out


SWEEP_REQUIRED = (
    "layer",
    "M",
    "config",
    "gather",
    "block_m",
    "block_n",
    "block_k",
    "splits",
    "num_warps",
    "us",
    "us_p25",
    "us_p75",
    "method",
    "ratio_vs_bf16",
)


def launch_sweep(profile: str, reps: int | None = None) -> list[dict]:
    """Every candidate configuration, timed by CUDA-graph replay beside the bf16 matmul."""
    dev = tier.kernel_device()
    cuda = dev.type == "cuda"
    reps = reps or (10 if cuda else 1)
    records = []
    jobs = [(layer, K, N, cd, M) for layer, (K, N, cd) in SHAPES[profile].items() for M in MS[profile]]
    for layer, K, N, chunk_d, M in tqdm(jobs, desc="sc launch sweep", unit="shape"):
        x, w, prepared = _operands(K, N, M, chunk_d, dev)
        C = prepared.sb.shape[1]
        configs = candidate_configs(M, 1, N, K, C)
        ref = sc_matmul_prepared(x, prepared, config=configs["auto"])
        fns = {"bf16 matmul": lambda x=x, w=w: x @ w}
        for name, lc in configs.items():
            out = sc_matmul_prepared(x, prepared, config=lc)
            if not torch.equal(out, ref):  # every configuration must give the same bits
                raise AssertionError(f"{layer} M={M}: config {name} ({lc}) changes the output bits")
            fns[name] = lambda lc=lc, x=x, prepared=prepared: sc_matmul_prepared(x, prepared, config=lc)
        cmp = bench.compare(
            fns,
            baseline="bf16 matmul",
            device=dev if cuda else None,
            warmup=2,
            reps=reps,
            method="cuda_graph" if cuda else "cpu_clock",
        )
        for name, t in cmp.timings.items():
            lc = configs.get(name)
            fields = (
                dataclasses.asdict(lc)
                if lc
                else dict.fromkeys(("gather", "block_m", "block_n", "block_k", "splits", "num_warps"))
            )
            records.append(
                {
                    "layer": layer,
                    "M": M,
                    "K": K,
                    "N": N,
                    "config": name,
                    **fields,
                    **t.as_dict(),
                    "ratio_vs_bf16": cmp.ratio(name),
                }
            )
    return records


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench wrong_device_sc_kernel``."""
    return kernel_vs_bf16(profile)
