"""The order in which an all-gather reads the shards: labkit's peer-rotated order beside the naive one.

The story's all-gather reads every rank's shard in the order 0, 1, ..., W-1 on every rank: at the
first step all W-1 readers pull from GPU 0 at once, then all from GPU 1, ...: one GPU's links
busy, the others idle. labkit's rotates the order (rank r reads r, r+1, ...), so that at every
step each GPU is read by one peer. ``collectives.all_gather(..., order="naive")`` runs the first
(the same kernel, ``ROTATE=False``), the default the second.

Expectation, by world size (a hypothesis the measurement tests):
* W = 2: each rank has one peer and reads it once in either order; the orders differ only in
  whether rank 1 copies its own shard before or after the peer's. No difference beyond the
  round-to-round spread is expected.
* W >= 3: the naive order puts W-1 readers (two or more) on one GPU's links at each step; the
  rotated order spreads them, one reader per GPU. Slower naive runs are expected there; 2 GPUs
  cannot show it (a 4-GPU machine, W = 4: three readers on one GPU).

``compare_orders`` runs on every rank (``run_ranks``): both orders checked on fresh inputs, then
timed in the same interleaved rounds (``labkit.workbench.bench.compare``: CUDA-graph replay of
``inner`` back-to-back calls per sample on GPUs, the CPU clock on the emulated world), every sample
starting with the ranks at a barrier and the device idle. Records of kind ``KIND``.
"""

from __future__ import annotations

import torch

KIND = "gather_order"
ORDERS = ("rotated", "naive")
#: bytes per rank (the all-gather's input) that ``labkit bench collectives`` compares the orders at
SHARD_BYTES = (1 << 20, 16 << 20, 256 << 20)


def _inner(shard_bytes: int) -> int:
    """Calls per sample: enough that a sample of small shards outlasts the timer's resolution."""
    return 20 if shard_bytes <= (16 << 20) else 5


def rank_shards(ctx, n: int, dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's shard, every rank's shards concatenated): each rank regenerates every rank's
    shard from its seed on its own device, so the expected result needs no collective (and no
    host copy of W large shards)."""

    def shard(r):
        g = torch.Generator(device=ctx.device).manual_seed(seed * 1009 + r)
        return torch.randn(n, generator=g, device=ctx.device).to(dtype)

    expected = torch.cat([shard(r) for r in range(ctx.world_size)])
    return expected[ctx.rank * n : (ctx.rank + 1) * n].clone(), expected


def _agreed(ok: bool, device) -> bool:
    """True only if ``ok`` on every rank."""
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _with_timings(rec: dict, cmp, w: int) -> dict:
    """``compare_orders``' record of one order with its timings from ``cmp`` (the comparison that
    timed it, and its ratio to the rotated order), or, with ``cmp`` None, why it was not timed."""
    if cmp is not None:
        order = rec["order"]
        t = cmp.timings[order]
        rec.update(t.as_dict())
        rec["busbw_GBps"] = rec["bytes"] / t.median_us / 1e3 * (w - 1) / w
        p25, p75 = cmp.ratio_iqr(order)
        rec.update(ratio_to_rotated=cmp.ratio(order), ratio_p25=p25, ratio_p75=p75)
    else:
        rec.update(
            us=None,
            busbw_GBps=None,
            ratio_to_rotated=None,
            ratio_p25=None,
            ratio_p75=None,
            error="not timed: "
            + (
                "this order gave a wrong result or left a pad set"
                if not rec["correct"]
                else "the rotated order, the baseline, did not"
            ),
        )
    return rec


def compare_orders(
    ctx,
    shard_bytes=SHARD_BYTES,
    dtype_name: str = "bfloat16",
    reps: int = 15,
    warmup: int = 3,
    seed: int = 0,
    inner: int | None = None,
) -> list[dict]:
    """Records of kind ``KIND``, one per size of ``shard_bytes`` (bytes per rank) and order: each
    order checked once against the concatenated shards (exact: an all-gather only copies), pads
    back at zero, agreed by every rank; then both timed in the same ``reps`` rounds (``inner``
    calls per sample; default by size). ``bytes`` is the all-gather's output, as in the sweep;
    ``ratio_to_rotated`` the median over rounds of that round's time over the rotated order's,
    with quartiles. Call on every rank with the same arguments."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm
    from labkit.labs.collectives.checks import quiet_pads_zero
    from labkit.workbench import bench as wb

    if not shard_bytes or any(not isinstance(b, int) or b < 1 for b in shard_bytes):
        raise ValueError(f"shard_bytes: expected positive ints (bytes per rank), got {shard_bytes!r}")
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps, warmup: expected >= 1 and >= 0, got {reps}, {warmup}")
    dtype = getattr(torch, dtype_name)
    w, dev = ctx.world_size, ctx.device
    on_gpu = dev.type == "cuda"

    def line_up():
        if on_gpu:
            torch.cuda.synchronize(dev)
        ctx.barrier()

    records = []
    for i, nbytes in enumerate(shard_bytes):
        n = max(1, nbytes // dtype.itemsize)
        x, expected = rank_shards(ctx, n, dtype, seed + i)
        buf = symm.empty(n, dtype, device=dev, scratch_dir=ctx.scratch_dir)
        plans, rows = {}, {}
        for order in ORDERS:
            out = torch.empty(w * n, dtype=dtype, device=dev)
            plans[order] = C.all_gather_plan(buf, out, order=order)
            buf.tensor.copy_(x)
            right = bool(torch.equal(plans[order](), expected))
            rows[order] = {
                "kind": KIND,
                "impl": "labkit",
                "op": "all_gather",
                "order": order,
                "world_size": w,
                "bytes": w * n * dtype.itemsize,
                "shard_bytes": n * dtype.itemsize,
                "dtype": dtype_name,
                "pads_zero": quiet_pads_zero(ctx, buf),
            }
            rows[order]["correct"] = _agreed(right and rows[order]["pads_zero"], dev)
        del expected
        timed = {o: plans[o] for o in ORDERS if rows[o]["correct"]}
        cmp = None
        if "rotated" in timed:
            cmp = wb.compare(
                timed,
                baseline="rotated",
                device=dev if on_gpu else None,
                warmup=warmup,
                reps=reps,
                inner=inner or _inner(nbytes),
                method="cuda_graph" if on_gpu else "cpu_clock",
                line_up=line_up,
            )
        records += [_with_timings(rows[order], cmp if order in timed else None, w) for order in ORDERS]
        line_up()
        del plans, buf
    return records


def read_order(rank: int, world: int, order: str) -> list[int]:
    """The shards ``rank`` reads, step by step, in ``order``: the ``s`` of ``all_gather_kernel``
    at each step k, ``(rank + k) % world`` rotated, ``k`` naive."""
    if order not in ORDERS:
        raise ValueError(f"read_order: order {order!r} is not one of {ORDERS}")
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(f"read_order: expected 0 <= rank < world, got rank={rank!r}, world={world!r}")
    return [(rank + k) % world if order == "rotated" else k for k in range(world)]


def most_readers(world: int, order: str) -> int:
    """The most peers that read one GPU's shard in the same step of ``order`` with ``world``
    ranks (a rank reading its own shard is no peer: it uses no link)."""
    orders = [read_order(r, world, order) for r in range(world)]
    return max(
        sum(1 for r in range(world) if orders[r][k] == gpu and gpu != r) for k in range(world) for gpu in range(world)
    )


def order_records(records: list[dict]) -> list[dict]:
    """The timed records of kind ``KIND``; [] in files made before the comparison."""
    return [r for r in records if r.get("kind") == KIND and r.get("us")]


def order_verdicts(records: list[dict]) -> list[str]:
    """One line per world size and size: the naive order's paired ratio to the rotated one (median
    and quartiles over rounds) and both busbw, then what the spread says. [] without records."""
    from labkit.workbench.plot import format_bytes

    recs = order_records(records)
    lines = []
    for w, shard in sorted({(r["world_size"], r["shard_bytes"]) for r in recs}):
        pair = {r["order"]: r for r in recs if (r["world_size"], r["shard_bytes"]) == (w, shard)}
        if set(pair) != set(ORDERS):
            lines.append(f"W={w}, {format_bytes(shard)} per rank: only {sorted(pair)} timed")
            continue
        nv, rot = pair["naive"], pair["rotated"]
        lo, mid, hi = nv["ratio_p25"], nv["ratio_to_rotated"], nv["ratio_p75"]
        if lo <= 1 <= hi:
            says = "1 lies within the quartiles: no difference beyond the round-to-round spread"
        elif lo > 1:
            says = "naive slower in most rounds (its lower quartile above 1)"
        else:
            says = "naive faster in most rounds (its upper quartile below 1)"
        lines.append(
            f"W={w}, {format_bytes(shard)} per rank: naive/rotated x{mid:.3f} (quartiles {lo:.3f}..{hi:.3f}, "
            f"{nv['samples']} paired rounds, {nv.get('method')}); busbw rotated {rot['busbw_GBps']:.0f}, "
            f"naive {nv['busbw_GBps']:.0f} GB/s: {says}"
        )
    return lines


def plot_gather_order(records: list[dict], axes, title: str) -> int:
    """Two axes: busbw of both orders per size (bars: quartiles), and the naive/rotated paired
    ratio with its quartiles and the line at 1, per world size. Returns the points drawn; says
    so on the axes where the records hold no comparison (files made before it)."""
    from labkit.workbench import plot

    recs = order_records(records)
    bw_ax, ratio_ax = axes
    if not recs:
        for ax in axes:
            ax.text(
                0.5,
                0.5,
                "no all-gather order records here\n(recorded before the comparison)",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=9,
            )
            ax.set_title(title, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        return 0
    drawn = 0
    for w in sorted({r["world_size"] for r in recs}):
        for order, style in (("rotated", "-o"), ("naive", "--s")):
            pts = sorted((r["shard_bytes"], r) for r in recs if r["world_size"] == w and r["order"] == order)
            if not pts:
                continue
            xs = [b for b, _ in pts]
            factor = (w - 1) / w
            bw = [r["bytes"] / r["us"] / 1e3 * factor for _, r in pts]
            lo = [b - r["bytes"] / r["us_p75"] / 1e3 * factor for b, (_, r) in zip(bw, pts)]
            hi = [r["bytes"] / r["us_p25"] / 1e3 * factor - b for b, (_, r) in zip(bw, pts)]
            bw_ax.errorbar(xs, bw, yerr=[lo, hi], fmt=style, capsize=3, label=f"W={w}, {order}")
            drawn += len(pts)
            if order == "naive":
                mid = [r["ratio_to_rotated"] for _, r in pts]
                ratio_ax.errorbar(
                    xs,
                    mid,
                    yerr=[
                        [m - r["ratio_p25"] for m, (_, r) in zip(mid, pts)],
                        [r["ratio_p75"] - m for m, (_, r) in zip(mid, pts)],
                    ],
                    fmt="-o",
                    capsize=3,
                    label=f"W={w}: naive / rotated",
                )
    ratio_ax.axhline(1.0, color="0.3", lw=0.8, ls=":", label="no difference")
    for ax in axes:
        plot.bytes_axis(ax)
        ax.set_xlabel("bytes per rank (the all-gather's input)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    bw_ax.set_ylabel("busbw (GB/s), median; bars: quartiles")
    bw_ax.set_title(f"{title}\nall-gather, both orders", fontsize=9)
    ratio_ax.set_ylabel("time naive / time rotated (paired per round)")
    ratio_ax.set_title(f"{title}\nabove 1: the naive order is slower", fontsize=9)
    return drawn


__all__ = [
    "KIND",
    "ORDERS",
    "SHARD_BYTES",
    "compare_orders",
    "order_records",
    "order_verdicts",
    "plot_gather_order",
    "rank_shards",
]
