"""Lab 02's push one-shot (``labkit.kernels.comm.push``) against the pull one-shot and PyTorch's
symmetric-memory ops, at a few sizes, in one comparison per size and timing: CUDA-graph replay
(the floor of each kernel: no Python per call) and eager calls. Records of kind "push", written
by ``labkit bench collectives`` beside its sweep.

Per size, every candidate is checked once against the sum over ranks; then each is timed in the
same interleaved rounds (``labkit.workbench.bench.compare``: CUDA events, every sample starting
with both GPUs idle and the ranks at a barrier), medians and quartiles, and each record carries
its time over torch's fastest op of the same round, paired, with quartiles. After the graph
replays the push all-reduce is checked again: its epoch counters live on the device, so replays
must leave every rank's counters in step (``correct_after``).

The push and flag-in-data candidates read a plain local tensor and write a plain output (only the
inbox is symmetric), so they need no copy into a symmetric buffer; the pull one-shot, the public
``all_reduce`` calls and torch's ops read a symmetric buffer that holds the input already (what
their callers must arrange). ``labkit_all_reduce`` (and ``_in_place``) is what ``all_reduce``'s
auto runs on a buffer without an inbox: the graph times of it and of ``labkit_fid_one_shot`` give
the limit up to which auto takes flag-in-data (``collectives.fid_limits_from``);
``labkit_all_reduce_fid`` is flag-in-data through the public call, its plan kept on the buffer.
"""

from __future__ import annotations

import torch

from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import flag_in_data, push, symm

#: message sizes per rank (bytes); 4 KiB .. 1 MiB is where latency decides, 256 MiB bandwidth
SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)
REQUIRED = ("kind", "impl", "timing", "bytes", "world_size", "us", "correct")
#: the push one-shot without its count headers: the baseline of ``count_check_ratio``
UNCHECKED = "labkit_push_one_shot_unchecked"


def _candidates(ctx, n: int, dtype, x: torch.Tensor, close) -> dict:
    """name -> (fields, call, check) at one size; torch's ops only where this torch has them."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    dev = ctx.device
    box = push.inbox(n, dtype, device=dev)
    ubox = push.inbox(n, dtype, device=dev)  # the protocol without count headers: an inbox of its own
    fbox = flag_in_data.inbox(n, dtype, device=dev)
    out, mine, u_out = torch.empty_like(x), x.clone(), torch.empty_like(x)
    f_out, f_mine = torch.empty_like(x), x.clone()
    buf = symm.empty(n, dtype, device=dev)  # no inbox: what auto runs without one
    pull_out, auto_out = torch.empty_like(x), torch.empty_like(x)
    ibuf = symm.empty(n, dtype, device=dev)
    flag_in_data.attach(ibuf, fbox)  # the public call, on the same inbox (one stream)
    i_out = torch.empty_like(x)
    group = dist.group.WORLD.group_name
    st = symm_mem.empty(n, dtype=dtype, device=dev)
    symm_mem.rendezvous(st, group)
    cands = {
        **_one_shot_candidates(x, close, box, ubox, fbox, (out, mine, u_out, f_out, f_mine)),
        **_all_reduce_candidates(x, close, buf, ibuf, (pull_out, auto_out, i_out)),
        **_torch_candidates(x, close, st, group),
    }
    return cands, (box, ubox, fbox, ibuf), (out, u_out, f_out, i_out)


def _one_shot_candidates(x: torch.Tensor, close, box, ubox, fbox, outs: tuple) -> dict:
    """The push and flag-in-data one-shots, called on their inboxes: name -> (fields, call, check)."""
    out, mine, u_out, f_out, f_mine = outs
    return {
        "labkit_push_one_shot": (
            {"in_place": False},
            lambda: push.all_reduce(x, box, out),
            lambda: close(push.all_reduce(x, box, out)),
        ),
        # the same without the count headers (steps 2a, 4a): what catching disagreeing counts costs
        "labkit_push_one_shot_unchecked": (
            {"in_place": False, "counts": False},
            lambda: push.all_reduce_variant(x, ubox, u_out, counts=False),
            lambda: close(push.all_reduce_variant(x, ubox, u_out, counts=False)),
        ),
        # in place: the input is replaced by the sum (timed repeatedly, the values grow: timing only)
        "labkit_push_one_shot_in_place": (
            {"in_place": True},
            lambda: push.all_reduce(mine, box, mine),
            lambda: (mine.copy_(x), close(push.all_reduce(mine, box, mine)))[-1],
        ),
        "labkit_fid_one_shot": (
            {"in_place": False},
            lambda: flag_in_data.all_reduce(x, fbox, f_out),
            lambda: close(flag_in_data.all_reduce(x, fbox, f_out)),
        ),
        "labkit_fid_one_shot_in_place": (
            {"in_place": True},
            lambda: flag_in_data.all_reduce(f_mine, fbox, f_mine),
            lambda: (f_mine.copy_(x), close(flag_in_data.all_reduce(f_mine, fbox, f_mine)))[-1],
        ),
    }


def _all_reduce_candidates(x: torch.Tensor, close, buf, ibuf, outs: tuple) -> dict:
    """The pull one-shot, ``all_reduce``'s own choice on a buffer without an inbox, and flag-in-data
    through the public call (``ibuf``, attached to the inbox): name -> (fields, call, check)."""
    pull_out, auto_out, i_out = outs
    return {
        "labkit_one_shot": (
            {"in_place": False},
            lambda: C.all_reduce(buf, pull_out, algorithm="one_shot"),
            lambda: (buf.tensor.copy_(x), close(C.all_reduce(buf, pull_out, algorithm="one_shot")))[-1],
        ),
        # what all_reduce's auto runs on a buffer without an inbox: what the flag-in-data limit
        # (collectives.fid_limits_from) compares flag-in-data with
        "labkit_all_reduce": (
            {"in_place": False, "algorithm": C.auto_algorithm(buf, False)},
            lambda: C.all_reduce(buf, auto_out),
            lambda: (buf.tensor.copy_(x), close(C.all_reduce(buf, auto_out)))[-1],
        ),
        "labkit_all_reduce_in_place": (
            {"in_place": True, "algorithm": C.auto_algorithm(buf, True)},
            lambda: C.all_reduce(buf, buf.tensor),
            lambda: (buf.tensor.copy_(x), close(C.all_reduce(buf, buf.tensor)))[-1],
        ),
        # flag-in-data through the public call (its plan kept on the buffer): its host path
        "labkit_all_reduce_fid": (
            {"in_place": False, "algorithm": "flag_in_data"},
            lambda: C.all_reduce(ibuf, i_out, algorithm="flag_in_data"),
            lambda: (ibuf.tensor.copy_(x), close(C.all_reduce(ibuf, i_out, algorithm="flag_in_data")))[-1],
        ),
        "labkit_all_reduce_fid_in_place": (
            {"in_place": True, "algorithm": "flag_in_data"},
            lambda: C.all_reduce(ibuf, ibuf.tensor, algorithm="flag_in_data"),
            lambda: (ibuf.tensor.copy_(x), close(C.all_reduce(ibuf, ibuf.tensor, algorithm="flag_in_data")))[-1],
        ),
    }


def _torch_candidates(x: torch.Tensor, close, st: torch.Tensor, group: str) -> dict:
    """torch's symm_mem all-reduces on the rendezvoused ``st``, where this torch has them."""
    cands = {}
    one = getattr(torch.ops.symm_mem, "one_shot_all_reduce", None)
    if one is not None:
        cands["torch_one_shot"] = (
            {"in_place": False},
            lambda: one(st, "sum", group),
            lambda: (st.copy_(x), close(one(st, "sum", group)))[-1],
        )
    two = getattr(torch.ops.symm_mem, "two_shot_all_reduce_", None)
    if two is not None:
        cands["torch_two_shot"] = (
            {"in_place": True},
            lambda: two(st, "sum", group),
            lambda: (st.copy_(x), two(st, "sum", group), close(st))[-1],
        )
    return cands


def _paired(cmp, name: str, best: str | None) -> dict:
    if best is None or name not in cmp.timings:
        return {"ratio_to_torch_best": None, "ratio_p25": None, "ratio_p75": None, "baseline": best}
    med, p25, p75 = cmp.ratio_to(name, best)
    return {"ratio_to_torch_best": med, "ratio_p25": p25, "ratio_p75": p75, "baseline": best}


def push_series(ctx, sizes=SIZES, dtype_name: str = "bfloat16", reps: int = 15, warmup: int = 3) -> list[dict]:
    """One rank's records (``run_ranks`` runs it on every rank; rank 0's are kept). GPUs only."""
    from labkit.labs.collectives import messages as lab02

    dtype, w, dev = getattr(torch, dtype_name), ctx.world_size, ctx.device
    records = []
    for nbytes in sizes:
        n, x, ref, scale = lab02.message(ctx, nbytes, dtype, seed=7000 + nbytes % 997)
        iters = lab02.iters_for(nbytes)
        close = lambda y, ref=ref, scale=scale: lab02.close_to_ref(y, ref, w, scale)  # noqa: E731
        cands, (box, ubox, fbox, ibuf), (out, u_out, f_out, i_out) = _candidates(ctx, n, dtype, x, close)
        base = {"kind": "push", "op": "all_reduce", "world_size": w, "bytes": n * dtype.itemsize, "dtype": dtype_name}
        ok, rows = lab02.check_candidates(cands, base, dev)
        torch_names = [nm for nm in ok if nm.startswith("torch_")]
        for timing, cmp, per_call in lab02.time_graph_and_eager(ok, iters, ctx, None, warmup, reps):
            best = min(torch_names, key=lambda nm: cmp.timings[nm].median_us) if torch_names else None
            for name, row in rows.items():
                rec = {**row, "timing": timing}
                if cmp is not None and name in cmp.timings:
                    t = cmp.timings[name]
                    rec.update(
                        us=t.median_us / per_call,
                        us_p25=t.p25_us / per_call,
                        us_p75=t.p75_us / per_call,
                        samples=len(t.samples_us),
                        iters=iters,
                        **_paired(cmp, name, best),
                    )
                    if name == "labkit_push_one_shot" and UNCHECKED in cmp.timings:
                        # what the count headers cost: time over the protocol without them, per round
                        med, p25, p75 = cmp.ratio_to(name, UNCHECKED)
                        rec.update(count_check_ratio=med, count_check_p25=p25, count_check_p75=p75)
                    rec["busbw_GBps"] = rec["bytes"] / rec["us"] / 1e3 * lab02.BUS_FACTOR["all_reduce"](w)
                else:
                    rec.setdefault("us", None)
                records.append(rec)
        for checked, prefix, again in (
            ("labkit_push_one_shot", "labkit_push", lambda x=x, box=box, out=out: push.all_reduce(x, box, out)),
            (
                "labkit_fid_one_shot",
                "labkit_fid",
                lambda x=x, fbox=fbox, f_out=f_out: flag_in_data.all_reduce(x, fbox, f_out),
            ),
            (
                "labkit_all_reduce_fid",
                "labkit_all_reduce_fid",
                lambda x=x, ibuf=ibuf, i_out=i_out: (
                    ibuf.tensor.copy_(x),
                    C.all_reduce(ibuf, i_out, algorithm="flag_in_data"),
                )[-1],
            ),
            (
                UNCHECKED,
                UNCHECKED,
                lambda x=x, ubox=ubox, u_out=u_out: push.all_reduce_variant(x, ubox, u_out, counts=False),
            ),
        ):
            if checked in ok:  # the epochs stayed in step through the replays
                after = lab02.agreed_everywhere(bool(close(again())), dev)
                for rec in records[-2 * len(rows) :]:
                    if rec["impl"].startswith(prefix) and (rec["impl"] == UNCHECKED) == (checked == UNCHECKED):
                        rec["correct_after"] = after
        del cands, box, out, ubox, u_out, fbox, f_out, ibuf, i_out
        torch.cuda.synchronize(dev)
        ctx.barrier()
    return records


def push_records(w: int, sizes=SIZES, timeout: float = 300.0) -> list[dict]:
    """``push_series`` on ``w`` GPUs in its own ranks (a hang or crash there costs these records
    only: one record saying what happened)."""
    from labkit.kernels.comm.ranks import run_ranks

    res = run_ranks(push_series, w, sizes, timeout=timeout)
    if res.ok:
        return res.unwrap()[0]
    return [
        {
            "kind": "push",
            "impl": "labkit_push_one_shot",
            "op": "all_reduce",
            "timing": None,
            "bytes": None,
            "world_size": w,
            "us": None,
            "correct": None,
            "error": f"run_ranks: {res.summary()}"[:300],
        }
    ]


def summary(records: list[dict]) -> list[str]:
    """One line per protocol and timing: the push (and flag-in-data) all-reduce's time and its
    ratio to torch's best op, per size; then, per timing, what the push one-shot's count check
    costs (its time over the protocol without it, median and quartiles of the paired rounds)."""
    lines = []
    protocols = (
        ("labkit_push_one_shot", "push one-shot"),
        ("labkit_fid_one_shot", "flag-in-data one-shot"),
        ("labkit_all_reduce_fid", "all_reduce, flag-in-data"),
    )
    for impl, label in protocols:
        for timing in ("graph", "eager"):
            for in_place in (False, True):
                name = impl + ("_in_place" if in_place else "")
                pts = sorted(
                    (r["bytes"], r)
                    for r in records
                    if r.get("kind") == "push"
                    and r.get("timing") == timing
                    and r.get("impl") == name
                    and r.get("us") is not None
                )
                if not pts:
                    continue
                body = ", ".join(
                    f"{_size(b)} {r['us']:.2f} µs"
                    + (f" ({r['ratio_to_torch_best']:.2f}x torch's best)" if r.get("ratio_to_torch_best") else "")
                    for b, r in pts
                )
                lines.append(f"{label}, {'in place' if in_place else 'out of place'}, {timing}: {body}")
    for timing in ("graph", "eager"):
        pts = sorted(
            (r["bytes"], r)
            for r in records
            if r.get("kind") == "push"
            and r.get("timing") == timing
            and r.get("impl") == "labkit_push_one_shot"
            and r.get("count_check_ratio") is not None
        )
        if pts:
            body = ", ".join(
                f"{_size(b)} {r['count_check_ratio']:.2f}x ({r['count_check_p25']:.2f} to {r['count_check_p75']:.2f})"
                for b, r in pts
            )
            lines.append(f"push one-shot's count check, {timing}: time over the protocol without it: {body}")
    return lines


def _size(nbytes: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{nbytes} B"


#: what the figure draws, in order: (impl, label, style)
SERIES = (
    ("labkit_push_one_shot", "labkit push one-shot (out of place)", dict(color="tab:green", marker="o")),
    ("labkit_push_one_shot_in_place", "labkit push one-shot (in place)", dict(color="tab:green", marker="o", ls="--")),
    ("labkit_fid_one_shot", "labkit flag-in-data one-shot (out of place)", dict(color="tab:red", marker="D")),
    (
        "labkit_fid_one_shot_in_place",
        "labkit flag-in-data one-shot (in place)",
        dict(color="tab:red", marker="D", ls="--"),
    ),
    ("labkit_one_shot", "labkit pull one-shot (out of place)", dict(color="tab:blue", marker="s")),
    (
        "labkit_all_reduce_fid",
        "labkit all_reduce(buf, out, algorithm='flag_in_data')",
        dict(color="tab:purple", marker="x"),
    ),
    ("labkit_all_reduce", "labkit all_reduce(buf, out), no inbox (auto)", dict(color="tab:cyan", marker="s")),
    ("torch_one_shot", "torch one_shot_all_reduce", dict(color="0.45", marker="^", ls=":")),
    ("torch_two_shot", "torch two_shot_all_reduce_ (in place)", dict(color="black", marker="v", ls=":")),
)


def plot_push(records: list[dict], ax, title: str, timing: str = "graph") -> int:
    """µs per call against message size for every candidate of one timing, medians with quartile
    bars; returns the number of series drawn (0: the records have none, said on the axes)."""
    drawn = 0
    for impl, label, style in SERIES:
        pts = sorted(
            (r["bytes"], r)
            for r in records
            if r.get("kind") == "push" and r.get("timing") == timing and r.get("impl") == impl and r.get("us")
        )
        if not pts:
            continue
        xs = [b for b, _ in pts]
        ys = [r["us"] for _, r in pts]
        lo = [r["us"] - r.get("us_p25", r["us"]) for _, r in pts]
        hi = [r.get("us_p75", r["us"]) - r["us"] for _, r in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], label=label, capsize=2, ms=4, **style)
        drawn += 1
    if not drawn:
        ax.text(
            0.5,
            0.5,
            "no push one-shot records here\n(files recorded before it existed lack them)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=9,
        )
        ax.set_axis_off()
    else:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({r["bytes"] for r in records if r.get("kind") == "push" and r.get("bytes")})
        ax.set_xticks(ticks, [_size(b) for b in ticks])
        ax.set_xlabel("message size per rank")
        ax.set_ylabel(
            f"µs per call ({'CUDA-graph replay' if timing == 'graph' else 'called from Python'}; median, quartiles)"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=9)
    return drawn
