"""The links themselves: how many GB/s one GPU moves to and from a peer's memory over NVLink,
by SM loads, by SM stores, and by ``cudaMemcpyAsync`` (``labkit bench collectives_links``).

Why it is in the lab: at 256 MiB labkit's all-reduce moves well short of NV18's 450 GB/s per
direction on paper over the links (reference/<machine>/collectives.json, field ``busbw_GBps``).
Is that the kernels or the links? Here each rank copies N bytes between its local memory and the
next rank's symmetric buffer, nothing else:

* ``sm_read``:  local <- peer, a Triton kernel whose loads cross the link (how labkit's
  kernels, and the pull half of every two-shot, move data);
* ``sm_write``: peer <- local, its stores cross the link (how a push collective moves data:
  the in-place two-shot's second half, NCCL);
* ``memcpy_read`` / ``memcpy_write``: the same copies by ``Tensor.copy_``, which for two
  contiguous tensors of one device is ``cudaMemcpyAsync`` (the driver picks copy engines or
  SMs; no labkit code involved).

``direction``: "both" has every rank copy at once (rank r with rank r+1 mod W): every link
busy in both directions, as in a collective; "one" has rank 0 copy alone while the others wait.
GB/s = N / time, per copying GPU; an all-reduce's busbw on 2 GPUs is the same quantity.
"""

from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl

from labkit.kernels.comm import symm
from labkit.labs.collectives.rank_timing import samples_us
from labkit.workbench import tier
from labkit.workbench.errors import UsageError
from labkit.workbench.guard import on_device_of

MODES = ("sm_read", "sm_write", "memcpy_read", "memcpy_write")
DIRECTIONS = ("both", "one")
REQUIRED = ("impl", "direction", "world_size", "bytes", "us", "GBps", "correct")
SIZES = [64 << 20, 256 << 20]
#: SM launches tried: 16-byte vectors per thread x warps x programs per SM
GRID = {"vectors": (1, 2, 4, 8), "num_warps": (8, 16), "programs_per_sm": (1, 2)}


@triton.jit
def link_copy_kernel(
    src_ptr,  # *T [N]: where the bytes come from (a peer's buffer for a read)
    dst_ptr,  # *T [N]: where they go (a peer's buffer for a write)
    n,  # N elements
    BLOCK: tl.constexpr,  # elements per program per step: 16-byte vectors x 32 x warps
):
    """Grid-stride copy; full blocks unmasked so the loads and stores are 16-byte vectors (both
    pointers are 16-byte aligned: symmetric buffers by ``symm.empty``'s check, local tensors by
    the caching allocator)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
        if start + BLOCK <= n:
            tl.store(dst_ptr + offs, tl.load(src_ptr + offs))
        else:
            mask = offs < n
            tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def link_copy(
    src: torch.Tensor, dst: torch.Tensor, *, vectors: int = 4, num_warps: int = 16, programs: int = 132
) -> torch.Tensor:
    """Copy ``src`` into ``dst`` with ``link_copy_kernel``; one of them is normally a peer's
    buffer (``SymmBuffer.peers[p]``, mapped on this device). Returns ``dst``."""
    for name, t in (("src", src), ("dst", dst)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: must be 16-byte aligned for vector copies (address % 16 = {t.data_ptr() % 16})")
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise ValueError(f"dst: {dst.numel()} x {dst.dtype} does not match src: {src.numel()} x {src.dtype}")
    if src.device != dst.device:
        raise ValueError(
            f"dst: on {dst.device}, src on {src.device}; map the peer's buffer on this device "
            "(SymmBuffer.peers) instead"
        )
    if (
        vectors not in (1, 2, 4, 8)
        or num_warps not in (4, 8, 16, 32)
        or not (isinstance(programs, int) and programs > 0)
    ):
        raise ValueError(
            f"launch: vectors {vectors} (1, 2, 4, 8), num_warps {num_warps} (4..32), programs {programs} (> 0)"
        )
    n = src.numel()
    block = 4096 if tier.interpreted() else vectors * (16 // src.element_size()) * 32 * num_warps
    grid = max(1, min(4 if tier.interpreted() else programs, triton.cdiv(n, block)))
    with on_device_of(src=src, dst=dst):
        link_copy_kernel[(grid,)](src, dst, n, BLOCK=block, num_warps=num_warps)
    return dst


def probe(ctx, sizes=SIZES, grid=None, reps: int = 7, iters: int = 5, progress: bool = True) -> list[dict]:
    """One rank's part of ``labkit bench collectives_links`` (``run_ranks`` runs it on every rank); rank 0's
    records are the result: every mode, both directions, every SM launch of ``grid``."""
    import functools
    import itertools

    import torch.distributed as dist
    from tqdm.auto import tqdm

    if ctx.device.type != "cuda":
        raise UsageError("labkit.labs.collectives.links.probe measures NVLink: it needs GPUs (no emulated form)")
    grid = grid or GRID
    w, rank, dev = ctx.world_size, ctx.rank, ctx.device
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    launches = [
        {"vectors": v, "num_warps": nw, "programs": p * sms}
        for v, nw, p in itertools.product(grid["vectors"], grid["num_warps"], grid["programs_per_sm"])
    ]
    records = []
    total = len(sizes) * len(DIRECTIONS) * (2 * len(launches) + 2)
    bar = tqdm(total=total, desc=f"links W={w}", disable=not progress or rank != 0)
    for nbytes in sizes:
        n = nbytes // 2
        buf = symm.empty(n, torch.bfloat16, device=dev)
        g = torch.Generator(device=dev).manual_seed(11 + rank)
        local = torch.randn(n, device=dev, generator=g).to(torch.bfloat16)
        sink = torch.empty_like(local)
        peer = buf.peers[(rank + 1) % w]
        buf.tensor.copy_(local)
        torch.cuda.synchronize()
        dist.barrier()
        for direction in DIRECTIONS:
            active = direction == "both" or rank == 0
            cases = []
            for cfg in launches:
                cases.append(("sm_read", cfg, functools.partial(link_copy, peer, sink, **cfg)))
                cases.append(("sm_write", cfg, functools.partial(link_copy, local, peer, **cfg)))
            cases.append(("memcpy_read", None, functools.partial(sink.copy_, peer)))
            cases.append(("memcpy_write", None, functools.partial(peer.copy_, local)))
            for mode, cfg, fn in cases:
                rec = {
                    "kind": "link",
                    "impl": mode,
                    "op": "copy",
                    "direction": direction,
                    "world_size": w,
                    "bytes": n * 2,
                    "dtype": "bfloat16",
                    **(cfg or {"vectors": None, "num_warps": None, "programs": None}),
                }
                correct = True
                if active:  # the copy is checked once before it is timed
                    sink.zero_()
                    fn()
                    torch.cuda.synchronize()
                    # a read lands in sink; a write lands in the peer's buffer, read back here
                    # (only this rank writes the next rank's buffer, so nobody changes it under the check;
                    # what a buffer holds is otherwise irrelevant to the timing)
                    correct = bool(torch.equal(sink, peer) if mode.endswith("read") else torch.equal(peer, local))
                dist.barrier()
                samples = samples_us(fn, iters, reps, active=active)
                us = statistics.median(samples) if samples else None
                dist.barrier()
                ok = torch.tensor([1 if correct else 0], device=dev)
                dist.all_reduce(ok, op=dist.ReduceOp.MIN)
                rec.update(
                    correct=bool(ok.item()),
                    us=us,
                    GBps=(n * 2 / us / 1e3) if us else None,
                    spread_us=[min(samples), max(samples)] if samples else None,
                )
                records.append(rec)
                bar.update()
        del buf
        torch.cuda.synchronize()
        dist.barrier()
    bar.close()
    return records


def best_links(records: list[dict]) -> list[dict]:
    """Per (mode, direction, bytes): the fastest correct measurement (for SM copies, the best
    launch of the grid, which is what a kernel could get)."""
    best: dict = {}
    for r in records:
        if r.get("kind") == "link" and r.get("correct") and r.get("GBps"):
            key = (r["impl"], r["direction"], r["bytes"], r["world_size"])
            if key not in best or r["GBps"] > best[key]["GBps"]:
                best[key] = r
    return [best[k] for k in sorted(best)]


def links_markdown(records: list[dict]) -> str:
    """``best_links`` as a table."""
    rows = best_links(records)
    if not rows:
        return "(no link records)"
    out = [
        "| W | bytes | direction | mode | GB/s per GPU | µs | launch (vectors x warps x programs) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        launch = f"{r['vectors']} x {r['num_warps']} x {r['programs']}" if r.get("vectors") else "cudaMemcpyAsync"
        out.append(
            f"| {r['world_size']} | {r['bytes']:,} | {r['direction']} | {r['impl']} | {r['GBps']:.0f} | "
            f"{r['us']:.0f} | {launch} |"
        )
    return "\n".join(out)


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench collectives_links``: ``probe`` on every GPU of this machine."""
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.workbench import gates

    gates.requires(gpus=2, peer_access=True, compiled=True).check()
    return run_ranks(probe, torch.cuda.device_count(), timeout=600).unwrap()[0]
