"""The eager series of lab 02's sweep (records of kind "eager"): labkit's all-reduce called eagerly
on every path of ``EAGER_PATHS`` (no plan, the plan kept on the buffer, a plan held by the caller),
out of place and in place, beside torch's eager symm_mem all-reduces at the same size, timed in the
same interleaved rounds; ``eager_verdicts`` sums the series up at the small messages, where a
call's host time, not the links, decides. ``sweep_bench.sweep`` runs it at every size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.kernels.comm import collectives as C
from labkit.labs.collectives.messages import BUS_FACTOR
from labkit.labs.collectives.messages import agreed_everywhere as _everywhere

#: The ways to call labkit's all-reduce eagerly that the sweep times beside torch's eager
#: symm_mem ops (records of kind "eager", field ``path``).
EAGER_PATHS = {
    "eager_uncached": "no plan: checks, choices, guard and Triton's launch on every call",
    "plan_cached": "collectives.all_reduce(buf, out): the plan it keeps on the buffer",
    "plan": "plan() of a plan held by the caller (collectives.all_reduce_plan)",
}
#: The small messages (bytes per rank, inclusive) over which ``eager_verdicts`` summarises the
#: eager series: where a call's host time, not the links, decides.
EAGER_SMALL_BYTES = (4 << 10, 1 << 20)


def torch_eager_ops(ctx, n: int, dtype, x: torch.Tensor, close) -> dict:
    """torch's eager symm_mem all-reduces for ``eager_series``: name -> (fields, call, check), on
    a symmetric tensor of their own; {} where this torch lacks them."""
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    st = symm_mem.empty(n, dtype=dtype, device=ctx.device)
    symm_mem.rendezvous(st, group)
    ops = {}
    one = getattr(torch.ops.symm_mem, "one_shot_all_reduce", None)
    if one is not None:
        ops["torch_one_shot"] = (
            {"impl": "torch_one_shot", "in_place": False, "algorithm": "one_shot"},
            lambda: one(st, "sum", group),
            lambda: (st.copy_(x), close(one(st, "sum", group)))[-1],
        )
    two = getattr(torch.ops.symm_mem, "two_shot_all_reduce_", None)
    if two is not None:  # in place
        ops["torch_two_shot"] = (
            {"impl": "torch_two_shot", "in_place": True, "algorithm": "two_shot"},
            lambda: two(st, "sum", group),
            lambda: (st.copy_(x), two(st, "sum", group), close(st))[-1],
        )
    return ops


def _labkit_calls(buf, out: torch.Tensor, x: torch.Tensor, close) -> dict:
    """labkit's candidates of ``eager_series``: name -> (fields, call, check) for every path of
    ``EAGER_PATHS``, out of place then in place; the field ``_plan`` says, once timed, which launch
    the path took."""
    from labkit.labs.collectives import host_cost

    cands = {}
    for in_place in (False, True):
        target = buf.tensor if in_place else out
        held = C.all_reduce_plan(buf, target)
        suffix = "_in_place" if in_place else ""
        key = C.plan_key("all_reduce", target)  # all_reduce's own cache key
        calls = {
            "eager_uncached": lambda t=target: host_cost.eager_uncached(buf, t),
            "plan_cached": lambda t=target: C.all_reduce(buf, t),
            "plan": held,
        }
        for path, call in calls.items():
            fields = {
                "impl": "labkit_all_reduce",
                "path": path,
                "in_place": in_place,
                "algorithm": held.algorithm,
                "_plan": (lambda: "triton (no plan)")
                if path == "eager_uncached"
                else (lambda h=held: h.launch_path)
                if path == "plan"
                else (lambda k=key: buf._plans[k].launch_path if k in buf._plans else None),
            }
            cands[f"labkit_{path}{suffix}"] = (fields, call, lambda c=call: (buf.tensor.copy_(x), close(c()))[-1])
    return cands


def eager_series(
    ctx,
    buf,
    out: torch.Tensor,
    x: torch.Tensor,
    close,
    torch_ops: dict | None = None,
    *,
    iters: int,
    reps: int,
    warmup: int = 3,
    dtype_name: str = "bfloat16",
) -> list[dict]:
    """Records of kind "eager": labkit's all-reduce called eagerly on every path of ``EAGER_PATHS``,
    out of place (into ``out``) and in place (``out=buf.tensor``), algorithm "auto", beside
    ``torch_ops`` (``torch_eager_ops``: name -> (fields, call, check)), all at one size.

    Each candidate is checked once on this rank's input ``x`` (``close(y)``: y is the sum over
    ranks; the outcome agreed by every rank), then all are timed in the same rounds, interleaved
    (``labkit.workbench.bench.compare``: CUDA events around ``iters`` back-to-back calls per sample
    on GPUs, the CPU clock on the emulated world), every sample starting with the device idle and
    the ranks lined up at a barrier, ``reps`` samples each: the median µs per call and its
    quartiles. Each labkit record has ``ratio_to_torch_best``: the median over rounds of its time
    over that round's time of torch's fastest op at this size (``baseline``), with quartiles. Call
    on every rank with the same arguments."""
    from labkit.workbench import bench as wb

    w, dev = ctx.world_size, buf.tensor.device
    nbytes = buf.tensor.numel() * buf.tensor.element_size()
    cands = {**(torch_ops or {}), **_labkit_calls(buf, out, x, close)}
    base = {"kind": "eager", "op": "all_reduce", "world_size": w, "bytes": nbytes, "dtype": dtype_name}
    rows, timed = {}, {}
    for name, (fields, call, check) in cands.items():
        rec = {**base, "path": "torch_eager", **{k: v for k, v in fields.items() if not k.startswith("_")}}
        try:
            rec["correct"] = _everywhere(bool(check()), dev)
            timed[name] = call
        except Exception as e:
            rec.update(
                correct=False, us=None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            )
        rows[name] = rec

    def line_up():
        ctx.barrier()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    cmp = (
        wb.compare(
            timed,
            baseline=next(iter(timed)),
            device=dev if dev.type == "cuda" else None,
            warmup=warmup,
            reps=reps,
            inner=iters,
            method="cuda_events" if dev.type == "cuda" else "cpu_clock",
            line_up=line_up,
        )
        if timed
        else None
    )
    torch_timed = [nm for nm in timed if rows[nm]["impl"].startswith("torch_")]
    best = min(torch_timed, key=lambda nm: cmp.timings[nm].median_us) if torch_timed else None
    records = []
    for name, rec in rows.items():
        fields = cands[name][0]
        if name in timed:
            t = cmp.timings[name]
            rec.update(t.as_dict())
            rec["busbw_GBps"] = nbytes / t.median_us / 1e3 * BUS_FACTOR["all_reduce"](w)
        else:
            rec.setdefault("busbw_GBps", None)
        if "_plan" in fields:
            rec["launch_path"] = fields["_plan"]()
            rec["baseline"] = best
            if best is not None and name in timed:
                med, p25, p75 = cmp.ratio_to(name, best)
                rec.update(ratio_to_torch_best=med, ratio_p25=p25, ratio_p75=p75)
            else:
                rec.update(ratio_to_torch_best=None, ratio_p25=None, ratio_p75=None)
        records.append(rec)
    return records


def eager_verdicts(records: list[dict]) -> list[str]:
    """One line per world size, out of place and in place, and labkit path: the range of its paired
    ratios to torch's best eager op (its time over torch's, median over rounds) at the sizes of
    ``EAGER_SMALL_BYTES``, and at how many of them labkit is faster (ratio < 1). [] without eager
    records."""
    from labkit.workbench.plot import format_bytes

    lo, hi = EAGER_SMALL_BYTES
    eager = [r for r in records if r.get("kind") == "eager" and r.get("impl") == "labkit_all_reduce"]
    lines = []
    for w in sorted({r["world_size"] for r in eager}):
        for in_place in (False, True):
            for path in EAGER_PATHS:
                pts = sorted(
                    (r["bytes"], r.get("ratio_to_torch_best"))
                    for r in eager
                    if r["world_size"] == w
                    and r["in_place"] == in_place
                    and r["path"] == path
                    and lo <= r["bytes"] <= hi
                )
                if not pts:
                    continue
                where = "in place" if in_place else "out of place"
                if any(v is None for _, v in pts):
                    lines.append(
                        f"W={w}, {path}, {where}: no torch eager op timed beside it at "
                        f"{sum(v is None for _, v in pts)} of {len(pts)} sizes: no ratio"
                    )
                    continue
                faster = sum(v < 1 for _, v in pts)
                lines.append(
                    f"W={w}, {path}, {where}: x{min(v for _, v in pts):.2f}..x{max(v for _, v in pts):.2f} "
                    f"of torch's best eager op (paired medians) at {format_bytes(pts[0][0])}.."
                    f"{format_bytes(pts[-1][0])}; faster than torch's best at {faster} of {len(pts)} sizes"
                )
    return lines
