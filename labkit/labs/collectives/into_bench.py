"""The out-of-place all-reduce into a symmetric output (``labkit.kernels.comm.into``) against lab
02's out-of-place kernels, its in-place copy-engine two-shot and PyTorch's two-shot, at the
sizes where bandwidth decides, in one comparison per size. Records of kind "into", written by
``labkit bench collectives`` beside its sweep.

The question: out of place at 256 MiB, can the all-reduce pass what the best kernel that loads
the peers' data (the one-shot) reaches, by storing into a symmetric output instead of loading?
In place, the copy engines plus pushed stores (``two_shot_ce``) are its peer; what each reached
is in reference/<machine>/collectives.json, records of kind "into", fields ``busbw_GBps`` and
``ratio_to_baseline``, and what the links carry by loads and by stores in
reference/<machine>/collectives_links.json. Per size, every candidate is checked once against the sum over
ranks (and ``labkit_into`` for its input left unchanged); then all are timed in the same
interleaved rounds (``labkit.workbench.bench.compare``, CUDA events), twice, as the sweep
times: "graph", the replay of one CUDA graph of ``messages.iters_for(size)`` back-to-back calls
(what the GPU spends), and "eager", as many calls back to back from Python; medians and
quartiles per call. Each record carries its busbw and its time over ``labkit_one_shot``'s (the
best out-of-place kernel in the sweep), paired round by round.

Why back to back and not one call per sample: timed as single calls, each sample starting at a
barrier of the ranks, the candidates the sweep also times come out well above their sweep times
at 256 MiB, while the ratios between candidates stay near the sweep's (``summary`` names a file
timed that way). A hypothesis, not isolated: a single call carries the ranks' arrival skew and
the first barrier's wait, which back-to-back calls share out. So the ratios of single calls hold;
their absolute busbw does not.

Every candidate reads an input already in a symmetric buffer (the sweep's convention); the
in-place ones overwrite it with the sum on every call, so they are timed on values that grow
(timing only: their check runs once, on a fresh copy).
"""

from __future__ import annotations

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import into, symm

#: message sizes per rank (bytes): 1 MiB, where ``all_reduce_into`` pushes without the copy
#: engines (the out-of-place two-shot into a plain tensor pulls there), then from around where
#: the copy engines take over in place (``collectives.CE_FROM_BYTES``) to the sweep's largest
SIZES = (1 << 20, 16 << 20, 64 << 20, 256 << 20)
KIND = "into"
BASELINE = "labkit_one_shot"
#: the out-of-place size the summary's last line compares with its peers
BIG_BYTES = 256 << 20
#: the peers that line names beside the one-shot where the same timing holds them: impl -> label
PEERS = {"labkit_two_shot_ce_in_place": "two_shot_ce (in place)", "torch_two_shot": "torch two_shot (in place)"}
REQUIRED = ("kind", "impl", "bytes", "world_size", "us", "busbw_GBps", "correct")


def _candidates(ctx, n: int, dtype, x: torch.Tensor, close) -> dict:
    """name -> (fields, call, check) at one size; torch's two-shot where this torch has it."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    dev = ctx.device
    src = symm.empty(n, dtype, device=dev, workspace=True)
    dst = symm.empty(n, dtype, device=dev)
    src.tensor.copy_(x)
    plain_out = torch.empty_like(x)
    inp = symm.empty(n, dtype, device=dev, workspace=True)  # the in-place ones' buffer

    def into_check():
        y = into.all_reduce_into(src, dst)
        return close(y) and bool(torch.equal(src.tensor, x))

    cands = {
        "labkit_into": ({"in_place": False, "out": "symmetric"}, lambda: into.all_reduce_into(src, dst), into_check),
        "labkit_one_shot": (
            {"in_place": False, "out": "plain"},
            lambda: C.all_reduce(src, plain_out, algorithm="one_shot"),
            lambda: close(C.all_reduce(src, plain_out, algorithm="one_shot")),
        ),
        "labkit_two_shot": (
            {"in_place": False, "out": "plain"},
            lambda: C.all_reduce(src, plain_out, algorithm="two_shot"),
            lambda: close(C.all_reduce(src, plain_out, algorithm="two_shot")),
        ),
        "labkit_two_shot_ce_in_place": (
            {"in_place": True, "out": "in place"},
            lambda: C.all_reduce(inp, inp.tensor, algorithm="two_shot_ce"),
            lambda: (inp.tensor.copy_(x), close(C.all_reduce(inp, inp.tensor, algorithm="two_shot_ce")))[-1],
        ),
    }
    two = getattr(torch.ops.symm_mem, "two_shot_all_reduce_", None)
    if two is not None:
        group = dist.group.WORLD.group_name
        st = symm_mem.empty(n, dtype=dtype, device=dev)
        symm_mem.rendezvous(st, group)
        cands["torch_two_shot"] = (
            {"in_place": True, "out": "in place"},
            lambda: two(st, "sum", group),
            lambda: (st.copy_(x), two(st, "sum", group), close(st))[-1],
        )
    return cands


def into_series(ctx, sizes=SIZES, dtype_name: str = "bfloat16", reps: int = 15, warmup: int = 3) -> list[dict]:
    """One rank's records (``run_ranks`` runs it on every rank; rank 0's are kept), per size one
    record per candidate and timing ("graph", "eager"). GPUs only."""
    from labkit.labs.collectives import messages as lab02

    dtype, w, dev = getattr(torch, dtype_name), ctx.world_size, ctx.device
    bus = lab02.BUS_FACTOR["all_reduce"](w)
    records = []
    for nbytes in sizes:
        n, x, ref, scale = lab02.message(ctx, nbytes, dtype, seed=9000 + nbytes % 991)
        iters = lab02.iters_for(nbytes)
        close = lambda y, ref=ref, scale=scale: lab02.close_to_ref(y, ref, w, scale)  # noqa: E731
        cands = _candidates(ctx, n, dtype, x, close)
        base = {
            "kind": KIND,
            "op": "all_reduce",
            "world_size": w,
            "bytes": n * dtype.itemsize,
            "dtype": dtype_name,
            "method": "cuda_events",
        }
        ok, rows = lab02.check_candidates(cands, base, dev)
        for timing, cmp, per_call in lab02.time_graph_and_eager(ok, iters, ctx, BASELINE, warmup, reps):
            for name, row in rows.items():
                rec = dict(row, timing=timing, iters=iters, us=None, busbw_GBps=None)
                if cmp is not None and name in cmp.timings:
                    t = cmp.timings[name]
                    us, p25, p75 = (v / per_call for v in (t.median_us, t.p25_us, t.p75_us))
                    rec.update(
                        us=us,
                        us_p25=p25,
                        us_p75=p75,
                        samples=len(t.samples_us),
                        busbw_GBps=rec["bytes"] / us / 1e3 * bus,
                        busbw_p25=rec["bytes"] / p75 / 1e3 * bus,
                        busbw_p75=rec["bytes"] / p25 / 1e3 * bus,
                    )
                    if BASELINE in cmp.timings:
                        rec["ratio_to_baseline"], rec["ratio_p25"], rec["ratio_p75"] = cmp.ratio_to(name, BASELINE)
                        rec["baseline"] = BASELINE
                records.append(rec)
        del cands
        torch.cuda.synchronize(dev)
        ctx.barrier()
    return records


def timings_in(records: list[dict]) -> list[str]:
    """The timings these records hold, the graph replay first ("eager" alone in files recorded
    before the graph timing existed: single calls, see the module's docstring)."""
    found = {r.get("timing", "eager") for r in records if r.get("kind") == KIND and r.get("busbw_GBps")}
    return [t for t in ("graph", "eager") if t in found]


def _points(records: list[dict], impl: str, timing: str) -> list[tuple[int, dict]]:
    return sorted(
        (
            (r["bytes"], r)
            for r in records
            if r.get("kind") == KIND
            and r.get("impl") == impl
            and r.get("timing", "eager") == timing
            and r.get("busbw_GBps")
        ),
        key=lambda p: p[0],
    )


def summary(records: list[dict]) -> list[str]:
    """Per timing, one line per candidate: busbw per size (GB/s, median); then out of place into a
    symmetric output at ``BIG_BYTES`` beside its peers in the same timing (the graph replay where
    recorded): its busbw, its time over the one-shot's (paired round by round,
    ``ratio_to_baseline``) and over the in-place ``two_shot_ce``'s and torch's two-shot's (``PEERS``;
    ratio of the medians) where those records exist."""
    lines = []
    timings = timings_in(records)
    for timing in timings:
        impls = list(
            dict.fromkeys(
                r["impl"]
                for r in records
                if r.get("kind") == KIND and r.get("busbw_GBps") and r.get("timing", "eager") == timing
            )
        )
        for impl in impls:
            pts = _points(records, impl, timing)
            body = ", ".join(f"{b >> 20} MiB {r['busbw_GBps']:.0f} GB/s" for b, r in pts)
            lines.append(f"{timing}: {impl} ({pts[0][1].get('out', '?')} out): {body}")

    def at_big(impl):
        return next((r for b, r in _points(records, impl, timings[0]) if b == BIG_BYTES), None) if timings else None

    big = at_big("labkit_into")
    if timings == ["eager"] and not any(r.get("iters") for r in records if r.get("kind") == KIND):
        lines.append(
            "these records time single calls, each started at a barrier of the ranks (the first "
            "version of this benchmark): compare their ratios to the one-shot, not their busbw "
            "with the sweep's"
        )
    if big is not None:
        parts = [
            f"out of place at {BIG_BYTES >> 20} MiB into a symmetric output ({timings[0]}): "
            f"{big['busbw_GBps']:.0f} GB/s busbw (quartiles {big['busbw_p25']:.0f}-{big['busbw_p75']:.0f})"
        ]
        one = at_big(BASELINE)
        if big.get("ratio_to_baseline"):
            parts.append(
                "one-shot (out of place)"
                + (f" {one['busbw_GBps']:.0f} GB/s" if one is not None else "")
                + f", {big['ratio_to_baseline']:.2f}x its time (paired, quartiles {big['ratio_p25']:.2f}-"
                f"{big['ratio_p75']:.2f})"
            )
        for impl, label in PEERS.items():
            peer = at_big(impl)
            if peer is not None and peer.get("us") and big.get("us"):
                parts.append(f"{label} {peer['busbw_GBps']:.0f} GB/s, {big['us'] / peer['us']:.2f}x its time (medians)")
        lines.append("; ".join(parts))
    return lines


#: what the figure draws, in order: (impl, label, style)
SERIES = (
    ("labkit_into", "labkit into a symmetric out (out of place)", dict(color="tab:green", marker="o")),
    ("labkit_one_shot", "labkit one-shot (out of place)", dict(color="tab:blue", marker="s")),
    ("labkit_two_shot", "labkit two-shot (out of place)", dict(color="tab:cyan", marker="D")),
    ("labkit_two_shot_ce_in_place", "labkit two_shot_ce (in place)", dict(color="tab:green", marker="o", ls="--")),
    ("torch_two_shot", "torch two_shot_all_reduce_ (in place)", dict(color="black", marker="v", ls=":")),
)


def plot_into(records: list[dict], ax, title: str, timing: str | None = None) -> int:
    """busbw against message size for every candidate of one timing (default: the graph replay
    where recorded; medians, quartile bars); returns the number of series drawn (0: none in these
    records, said on the axes)."""
    drawn = 0
    timing = timing or next(iter(timings_in(records)), "graph")
    for impl, label, style in SERIES:
        pts = _points(records, impl, timing)
        if not pts:
            continue
        ys = [r["busbw_GBps"] for _, r in pts]
        lo = [r["busbw_GBps"] - r.get("busbw_p25", r["busbw_GBps"]) for _, r in pts]
        hi = [r.get("busbw_p75", r["busbw_GBps"]) - r["busbw_GBps"] for _, r in pts]
        ax.errorbar([b for b, _ in pts], ys, yerr=[lo, hi], label=label, capsize=2, ms=4, **style)
        drawn += 1
    if not drawn:
        ax.text(
            0.5,
            0.5,
            "no out-of-place-into records here\n(files recorded before it existed lack them)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=9,
        )
        ax.set_axis_off()
    else:
        ax.set_xscale("log", base=2)
        ticks = sorted({r["bytes"] for r in records if r.get("kind") == KIND and r.get("bytes")})
        ax.set_xticks(ticks, [f"{b >> 20} MiB" for b in ticks])
        ax.set_xlabel("message size per rank")
        ax.set_ylabel(
            f"busbw, GB/s ({'CUDA-graph replay' if timing == 'graph' else 'called from Python'}; median, quartiles)"
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=9)
    return drawn
