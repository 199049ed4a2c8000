"""``labkit bench collectives``: lab 02's benchmark, in parts that run in order, each in worlds of
its own (``PARTS``): the sweep (``sweep_bench``, with the eager series of ``eager_bench``), the
host-cost breakdown (``host_cost``), the all-gather orders and the ``two_shot_ce`` profile
(``gather_order``, ``ce_profile``), the push one-shot and the host µs of each public call
(``push_bench``, ``host_calls.call_costs``), the out-of-place series into a symmetric output
(``into_bench``), then the broken variants under load and the unguarded-leaf crash
(``broken``). ``PARTS_ENV`` and ``RESUME_ENV`` split it over several calls. The crossover records
are computed from the sweep records the file holds. ``labkit bench collectives_tune`` is
``tune_bench.tune_benchmark``.

The names of the sweep, the eager series and the search are importable from here too (what the
notebook and ``labkit bench`` use).
"""

from __future__ import annotations

from labkit.labs.collectives.eager_bench import EAGER_PATHS, EAGER_SMALL_BYTES, eager_series, eager_verdicts
from labkit.labs.collectives.messages import progress_main as _progress_main
from labkit.labs.collectives.sweep_bench import SIZES, crossover_bytes, sweep
from labkit.labs.collectives.tune_bench import (
    TUNE_GRID,
    TUNE_KERNELS,
    TUNE_SIZES,
    best_configs,
    launch_table_from,
    tune,
    tune_benchmark,
)
from labkit.workbench.errors import UsageError

__all__ = [
    "BROKEN_RUNS",
    "EAGER_PATHS",
    "EAGER_SMALL_BYTES",
    "PARTS",
    "PARTS_ENV",
    "REQUIRED",
    "RESUME_ENV",
    "SIZES",
    "TUNE_GRID",
    "TUNE_KERNELS",
    "TUNE_SIZES",
    "benchmark",
    "best_configs",
    "crossover_bytes",
    "eager_series",
    "eager_verdicts",
    "host_cost_records",
    "launch_table_from",
    "order_and_profile_records",
    "parts_to_run",
    "sweep",
    "tune",
    "tune_benchmark",
]

REQUIRED = ("impl", "op", "world_size", "bytes", "dtype", "us", "busbw_GBps", "correct")


def _failure_detail(res) -> str:
    """The one-line summary per rank plus the tail of what failed ranks wrote to stderr."""
    tails = [f"rank {r.rank} stderr: ...{r.stderr.strip()[-300:]}" for r in res.failed if r.stderr.strip()]
    return "\n".join([res.summary()] + tails[:2])


#: (variant, algorithm, load, trials, elements) of the broken-variant runs: every variant with a
#: late rank at 256K elements; the correct kernel and the one without end barrier again with a
#: GEMM overlapping the collective on one rank, at 8M elements (long enough reads to be overtaken).
BROKEN_RUNS = [
    (v, a, "late", 60, 1 << 18)
    for v in ("correct", "relaxed", "no_end_barrier")
    for a in ("one_shot", "two_shot", "two_shot_in_place", "two_shot_ce_in_place")
] + [(v, a, "gemm", 12, 1 << 23) for v in ("correct", "no_end_barrier") for a in ("one_shot", "two_shot")]


def _broken_records(w: int, runs=BROKEN_RUNS, timeout: float = 60.0) -> list[dict]:
    """Each run in its own world with its own timeout, so that one that hangs is recorded as
    such and the others still run. If the correct kernel itself does not finish, the rest are
    not started (a hang that is not the variant's) and say so."""
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.labs.collectives import broken

    rows = []
    blocked = None
    for variant, alg, load, trials, n in runs:
        row = {
            "kind": "broken",
            "impl": f"labkit_{alg}",
            "op": "all_reduce",
            "variant": variant,
            "load": load,
            "world_size": w,
            "bytes": n * 2,
            "dtype": "bfloat16",
            "us": None,
            "busbw_GBps": None,
            "trials": trials,
            "ranks_x_trials": trials * w,
            "wrong_results": None,
            "correct": False,
        }
        if blocked:
            rows.append(dict(row, outcome=f"not run: {blocked}"))
            continue
        res = run_ranks(broken.broken_trials, w, variant, alg, trials, n, load=load, timeout=timeout)
        if res.ok:
            wrong = sum(r["wrong"] for r in res.values)
            row.update(
                wrong_results=wrong,
                correct=wrong == 0,
                outcome=f"{wrong} wrong of {trials * w}",
                seconds=max(r["seconds"] for r in res.values),
            )
        else:
            row["outcome"] = _failure_detail(res)
            if variant == "correct" and not rows:
                blocked = "the correct kernel did not finish the first of these experiments"
        rows.append(row)
        _progress_main(
            {"phase": "broken", "variant": variant, "algorithm": alg, "load": load, "outcome": row["outcome"]}
        )
    return rows


def _crash_record(w: int) -> dict:
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.labs.collectives import broken

    res = run_ranks(broken.unguarded_leaf, w, timeout=120)
    return {
        "kind": "crash",
        "impl": "labkit_tree",
        "op": "all_reduce",
        "variant": "unguarded_leaf",
        "world_size": w,
        "bytes": 4096 * 4,
        "dtype": "float32",
        "us": None,
        "busbw_GBps": None,
        "correct": bool(res.ok and all(res.values)),
        "statuses": [r.status for r in res.results],
        "outcome": res.summary(),
    }


def host_cost_records(
    w: int, cases=None, reps: int | None = None, launch_reps: int | None = None, timeout: float = 300
) -> list[dict]:
    """Records of kind "host_cost": the breakdowns of ``cases`` (default
    ``labkit.labs.collectives.host_cost.BENCH_CASES``) on ``w`` ranks, every rank's records (one eager
    call, stage by stage, per path), with the fields every record of this benchmark carries
    (``REQUIRED``)."""
    from labkit.kernels.comm.ranks import run_ranks
    from labkit.labs.collectives import host_cost

    per_rank = run_ranks(
        host_cost.measure_cases, w, cases or host_cost.BENCH_CASES, "bfloat16", reps, launch_reps, timeout=timeout
    ).unwrap()
    return [
        dict(r, kind="host_cost", impl="labkit_all_reduce", busbw_GBps=None, correct=None)
        for rs in per_rank
        for r in rs
    ]


def _world_records(fn, w: int, kind: str, impl: str, op: str, timeout: float, rank0_only: bool) -> list[dict]:
    """``fn`` on ``w`` ranks in a world of its own (a failure or hang there costs its records, not
    the sweep's): rank 0's records (``rank0_only``) or every rank's, or one record of ``kind``
    saying how the run ended."""
    from labkit.kernels.comm.ranks import run_ranks

    res = run_ranks(fn, w, timeout=timeout)
    if res.ok:
        return list(res.values[0]) if rank0_only else [r for rs in res.values for r in rs]
    return [
        {
            "kind": kind,
            "impl": impl,
            "op": op,
            "world_size": w,
            "bytes": None,
            "dtype": "bfloat16",
            "us": None,
            "busbw_GBps": None,
            "correct": False,
            "outcome": _failure_detail(res),
        }
    ]


def order_and_profile_records(w: int) -> list[dict]:
    """The all-gather order comparison (``gather_order.compare_orders``, rank 0's timings, as the
    sweep's) and the profile of one ``two_shot_ce`` call (``ce_profile.profile_two_shot_ce``, every
    rank's activities), each in its own world. Estimated cost on 2 GPUs, not measured: about 20 s
    for the comparison (rank start-up, a fresh process compiling both orders at two launch configs,
    256 MiB inputs, 15 rounds x 2 orders x 3 sizes of graph replays) and about 15 s for the profile
    (rank start-up, warm-up calls, two profiles: the first starts CUPTI), so under a minute on the
    sweep's 274 s."""
    from labkit.labs.collectives import ce_profile, gather_order

    records = _world_records(
        gather_order.compare_orders, w, gather_order.KIND, "labkit", "all_gather", timeout=300, rank0_only=True
    )
    _progress_main({"phase": "all-gather orders done"})
    records += _world_records(
        ce_profile.profile_two_shot_ce,
        w,
        ce_profile.KIND,
        "labkit_two_shot_ce_in_place",
        "all_reduce",
        timeout=180,
        rank0_only=True,
    )
    _progress_main({"phase": "two_shot_ce profile done"})
    return records


#: The parts of ``labkit bench collectives``, in the order they run, each a function of the
#: world size returning its records (every one tagged ``part``). ``PARTS_ENV`` (comma-separated)
#: runs only some of them; ``RESUME_ENV`` names an earlier file whose records of the parts not run
#: now are kept (marked ``resumed_from``), so a machine whose 10-minute calls cannot hold the
#: whole benchmark records it over several calls, each starting from the file the last one wrote.
PARTS_ENV = "LABKIT_COLLECTIVES_PARTS"
RESUME_ENV = "LABKIT_COLLECTIVES_RESUME"


def _sweep_part(w: int) -> list[dict]:
    from labkit.kernels.comm.ranks import run_ranks

    return [dict(r, kind=r.get("kind", "sweep")) for r in run_ranks(sweep, w, timeout=900).unwrap()[0]]


def _push_part(w: int) -> list[dict]:
    """The push and flag-in-data one-shots beside the pull one, ``all_reduce`` and torch's ops
    (kind "push"), then each public call's host µs at 4 KiB of bf16, interleaved in one process
    (kind "host_call": ``host_calls.call_costs``, every rank's records)."""
    from labkit.labs.collectives import host_calls, push_bench

    calls = _world_records(host_calls.call_costs, w, "host_call", "labkit_fid", "all_reduce", 300, rank0_only=False)
    return push_bench.push_records(w) + [dict(r, kind="host_call", busbw_GBps=None) for r in calls]


def _into_part(w: int) -> list[dict]:
    from labkit.labs.collectives import into_bench  # out of place into a symmetric output, at bandwidth sizes

    return _world_records(
        into_bench.into_series, w, into_bench.KIND, "labkit_into", "all_reduce", timeout=300, rank0_only=True
    )


PARTS = {
    "sweep": _sweep_part,
    "host_cost": host_cost_records,
    "orders": order_and_profile_records,
    "push": _push_part,
    "into": _into_part,
    "broken": _broken_records,
    "crash": lambda w: [_crash_record(w)],
}


def _mark_resumed(record: dict, commit: str | None) -> dict:
    """A kept record, its ``resumed_from`` dropped where it names the commit writing the file: a
    record without it was measured at the file's own ``env.git_commit``."""
    if record.get("resumed_from") == commit:
        return {k: v for k, v in record.items() if k != "resumed_from"}
    return record


def parts_to_run(value: str | None) -> list[str]:
    """The parts named in ``value`` (comma-separated; None or empty: all), in ``PARTS`` order."""
    if not value:
        return list(PARTS)
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        raise UsageError(f"{PARTS_ENV}: unknown part(s) {unknown}; the parts are {', '.join(PARTS)}")
    return [n for n in PARTS if n in names]


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench collectives``: the sweep on every GPU of this machine (one
    world), the host-cost breakdown, the all-gather orders and the ``two_shot_ce`` profile, the push
    one-shot, the out-of-place series into a symmetric output, then the broken variants under load
    and the unguarded-leaf crash (``PARTS``; ``PARTS_ENV`` and ``RESUME_ENV`` split it over calls).
    The crossover records are computed from the sweep records the file holds."""
    import datetime
    import os
    import time

    import torch

    from labkit.workbench import env, gates, results

    run_now = parts_to_run(os.environ.get(PARTS_ENV))
    gates.requires(gpus=2, peer_access=True, compiled=True).check()
    w = torch.cuda.device_count()
    kept = [r for r in results.resumable(os.environ.get(RESUME_ENV)) if r.get("kind") != "crossover"]
    kept = [
        _mark_resumed(r, env.git_commit()) for r in kept if r.get("part") not in run_now and r.get("world_size") == w
    ]
    records = []
    for name in PARTS:
        if name in run_now:
            # when each part ran, and for how long: what else shared the machine then can be read
            # off the time (a part kept from an earlier file keeps its own)
            started = time.time()
            part = PARTS[name](w)
            when = {
                "part_started": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds"),
                "part_s": round(time.time() - started, 1),
            }
            records += [dict(r, part=name, **when) for r in part]
            _progress_main({"phase": f"{name} done"})
        else:
            records += [r for r in kept if r.get("part") == name]
    for key in ("us", "graph_us"):
        records.append(
            {
                "kind": "crossover",
                "impl": "labkit",
                "op": "all_reduce",
                "world_size": w,
                "bytes": crossover_bytes(records, w, key),
                "dtype": "bfloat16",
                "timing": key,
                "us": None,
                "busbw_GBps": None,
                "correct": None,
            }
        )
    return records
