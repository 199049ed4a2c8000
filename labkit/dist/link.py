"""What the links themselves give: one rank's bytes per second to or from one peer, with every
rank doing the same at once (as in an all-reduce, both directions of every link busy).

* ``pull``: a Triton copy kernel reads the peer's symmetric buffer into local memory (loads over
  NVLink: every 16 bytes wait a round trip; what labkit's collectives do);
* ``push``: the same kernel writes local data into the peer's buffer (stores over NVLink: posted,
  nothing waits for an answer);
* ``ce_pull`` / ``ce_push``: the same copies by the copy engine (``Tensor.copy_`` between the
  mapped buffers, cudaMemcpyAsync), no SM involved.

Rank r works with peer (r + 1) % W, so each GPU is read (or written) by exactly one peer.
The probe is the ceiling to hold the collectives against: a one-shot all-reduce on 2 GPUs moves
exactly one buffer over the link per rank, so its busbw cannot beat ``pull`` by much.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def copy_kernel(
    src_ptr,              # *T [n]: read from (a peer's buffer for pull, local for push)
    dst_ptr,              # *T [n]: written to (local for pull, a peer's buffer for push)
    n,                    # elements
    BLOCK: tl.constexpr,  # elements per program per step
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
        if start + BLOCK <= n:
            tl.store(dst_ptr + offs, tl.load(src_ptr + offs))
        else:
            mask = offs < n
            tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def probe(ctx, nbytes: int = 256 << 20, configs=None, reps: int = 5) -> list[dict]:
    """One rank's part (``run_ranks``): GB/s of each way of moving ``nbytes`` to or from the
    next rank, timed by CUDA-graph replay; each copy is checked once."""
    import torch

    from labkit.dist import symm
    from labkit.dist.bench import _everywhere, _time
    from labkit.dist.collectives import LaunchConfig
    from labkit.guard import on_device_of

    dev, w = ctx.device, ctx.world_size
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    configs = configs or [LaunchConfig(1, 8, sms), LaunchConfig(4, 16, sms), LaunchConfig(8, 16, sms),
                          LaunchConfig(4, 16, 2 * sms)]
    n = nbytes // 2
    buf = symm.empty(n, torch.bfloat16, device=dev)
    local = torch.empty(n, dtype=torch.bfloat16, device=dev)
    peer = buf.peers[(ctx.rank + 1) % w]
    ramp = torch.arange(n, device=dev) % 31

    def pattern(r):  # small integers: exact in bf16, different for every rank
        return (ramp + 32 * r).to(torch.bfloat16)

    mine = pattern(ctx.rank)

    def triton_copy(src, dst, cfg):
        with on_device_of(src=src, dst=dst):
            copy_kernel[(cfg.programs,)](src, dst, n, BLOCK=cfg.block(2), num_warps=cfg.num_warps)

    ways = []
    for cfg in configs:
        tag = {"vectors": cfg.vectors, "num_warps": cfg.num_warps, "programs": cfg.programs}
        ways.append(("pull", tag, lambda cfg=cfg: triton_copy(peer, local, cfg)))
        ways.append(("push", tag, lambda cfg=cfg: triton_copy(local, peer, cfg)))
    ways.append(("ce_pull", {}, lambda: local.copy_(peer)))
    ways.append(("ce_push", {}, lambda: peer.copy_(local)))
    records = []
    for way, tag, call in ways:
        # pull: my buffer holds my data, the peer reads it; push: I write my data to the peer
        buf.tensor.copy_(mine)
        local.copy_(mine)
        torch.cuda.synchronize(dev)
        ctx.barrier()
        call()
        torch.cuda.synchronize(dev)
        ctx.barrier()
        if way.endswith("pull"):
            ok = torch.equal(local, pattern((ctx.rank + 1) % w))
        else:  # what my left neighbour pushed into my buffer
            ok = torch.equal(buf.tensor, pattern((ctx.rank - 1) % w))
        rec = {"kind": "link", "impl": way, "op": "copy", "world_size": w, "bytes": nbytes, "dtype": "bfloat16",
               "timing": "graph_us", "multiprocessors": sms, **tag}
        rec["correct"] = _everywhere(ok, dev)
        rec["us"] = _time(call, 5, reps, graph=True)
        rec["GBps"] = nbytes / rec["us"] / 1e3
        rec["busbw_GBps"] = None
        records.append(rec)
    return records
