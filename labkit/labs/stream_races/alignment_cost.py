"""What the fix costs: allocation time of views against bulk raw allocation, and GEMM speed when
a view is not 256-byte aligned.

The story measured 50 µs to make 64 views against 58 µs for TransformerEngine's C++
``bulk_allocate`` on a GB200. labkit's raw allocator is Python (``torch.as_tensor`` over
``__cuda_array_interface__``), so its absolute time is not TE's; the comparison that carries over
is views against N separate ``torch.empty`` calls, and what padding the views costs (nothing).

Packed views start at ``i * numel * itemsize`` bytes, so a weight shape whose byte size is not a
multiple of 256 leaves views at offsets like +2, +16 or +128 bytes. ``gemm_alignment`` times a
bf16 GEMM (cuBLAS through ``torch.matmul``, and labkit's Triton kernel) with its operands at such
offsets, each offset against the aligned baseline in the same interleaved rounds.
"""

from __future__ import annotations

import torch

from labkit.kernels import alloc
from labkit.kernels import matmul as tmm
from labkit.workbench import bench

OFFSETS = (0, 2, 16, 64, 128)
OPERANDS = ("out", "all")  # only the output (a wgrad view) misaligned, or A, B and C


def allocation_timing_isolated(groups: int = 64, timeout: float = 300.0, **kwargs) -> list[dict]:
    """``allocation_timing`` in a fresh child process: host-time microbenchmarks of the allocator
    depend on its state, and a notebook's earlier cells leave plenty of it."""
    from labkit.workbench import sandbox

    return sandbox.run_isolated(allocation_timing, groups, timeout=timeout, isolated=True, **kwargs).unwrap()


def allocation_timing(
    groups: int = 64,
    shape=(4096, 1024),
    dtype=torch.bfloat16,
    device=None,
    reps: int = 50,
    warmup: int = 10,
    isolated: bool = False,
) -> list[dict]:
    """Host time to hand out ``groups`` buffers of ``shape``, five ways, in interleaved rounds.
    The caching allocator is warm (the same blocks are reused each round), as in a training step.
    isolated: only recorded (True when ``allocation_timing_isolated`` runs it in a child)."""
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    shapes = [tuple(shape)] * groups
    candidates = {
        "views (one torch.empty, packed)": lambda: alloc.allocate_views(shapes, dtype, device),
        "views padded to 256 B": lambda: alloc.allocate_views(shapes, dtype, device, alignment=256),
        "story's views: torch.empty(G, *shape) then [w[i] for i]": lambda: (lambda w: [w[i] for i in range(groups)])(
            torch.empty(groups, *shape, dtype=dtype, device=device)
        ),
        f"{groups} x torch.empty": lambda: [torch.empty(shape, dtype=dtype, device=device) for _ in range(groups)],
        "raw pointers (labkit, Python)": lambda: alloc.allocate_raw(shapes, dtype, device),
    }
    segments = lambda: torch.cuda.memory_stats(device).get("segment.all.allocated", 0)  # noqa: E731
    before = segments()
    cmp = bench.compare(
        candidates,
        baseline="raw pointers (labkit, Python)",
        device=device,
        warmup=warmup,
        reps=reps,
        method="cpu_clock",
    )
    # cudaMalloc calls during the whole comparison (warm-up included): 0 after the first round
    # means every timed call was served from the cache, as the comparison intends
    new_segments = segments() - before
    rows = []
    for name, timing in cmp.timings.items():
        rows.append(
            {
                "kind": "alloc_time",
                "allocator": name,
                "groups": groups,
                "shape": list(shape),
                "dtype": str(dtype).replace("torch.", ""),
                **timing.as_dict(),
                "vs_raw": cmp.ratio(name),
                "new_segments_during_timing": new_segments,
                "isolated": isolated,
                "trial": None,
                "corrupted_elems": None,
                "offset_bytes": None,
                "tflops": None,
            }
        )
    return rows


def _operands(m: int, n: int, k: int, offset: int, operands: str, dtype, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    off_in = offset if operands == "all" else 0
    a = tmm.misaligned((m, k), dtype, device, off_in, generator=g)
    b = tmm.misaligned((k, n), dtype, device, off_in, generator=g)
    c = tmm.misaligned((m, n), dtype, device, offset, generator=g)
    return a, b, c


def gemm_alignment(
    m: int = 8192,
    n: int = 8192,
    k: int = 8192,
    offsets=OFFSETS,
    operands=OPERANDS,
    impls=("torch", "triton"),
    dtype=torch.bfloat16,
    device=None,
    reps: int = 20,
    warmup: int = 5,
    progress: bool = True,
) -> list[dict]:
    """TFLOP/s of C = A @ B with pointers ``offset`` bytes past a 256-byte boundary; each offset
    timed against offset 0 in the same interleaved rounds (ratio = time / time at offset 0)."""
    from tqdm.auto import tqdm

    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if 0 not in offsets:
        raise ValueError(f"offsets: must include 0 (the aligned baseline), got {tuple(offsets)}")
    rows = []
    cases = [(impl, ops) for impl in impls for ops in operands]
    for impl, ops in tqdm(cases, desc="GEMM alignment", disable=not progress):
        candidates, tensors = {}, {}
        for off in offsets:
            a, b, c = _operands(m, n, k, off, ops, dtype, device, seed=off)
            tensors[off] = (a, b, c)
            if impl == "torch":
                candidates[off] = lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)
            else:
                candidates[off] = lambda a=a, b=b, c=c: tmm.matmul(a, b, out=c)
        cmp = bench.compare(candidates, baseline=0, device=device, warmup=warmup, reps=reps)
        for off, timing in cmp.timings.items():
            a, b, c = tensors[off]
            # the result is checked, not assumed: every offset computes the same product
            ref = torch.matmul(a.float(), b.float())
            err = float((c.float() - ref).abs().max() / ref.abs().max())
            rows.append(
                {
                    "kind": "gemm_alignment",
                    "impl": impl,
                    "operands": ops,
                    "offset_bytes": off,
                    "m": m,
                    "n": n,
                    "k": k,
                    "dtype": str(dtype).replace("torch.", ""),
                    "ptr_mod_256": [t.data_ptr() % 256 for t in (a, b, c)],
                    **timing.as_dict(),
                    "tflops": tmm.flops(m, n, k) / timing.median_us / 1e6,
                    "time_vs_aligned": cmp.ratio(off),
                    "time_vs_aligned_p25": cmp.ratio_iqr(off)[0],
                    "time_vs_aligned_p75": cmp.ratio_iqr(off)[1],
                    "max_rel_err": err,
                    "allocator": None,
                    "trial": None,
                    "corrupted_elems": None,
                }
            )
        del candidates, tensors
    return rows
