"""``run_litmus``: one litmus test, many instances, a few launches; outcome counts back.

    res = run_litmus("MP", "acq_rel", "gpu", "cross_cta", instances=100_000)
    res.counts          # {(0, 0): 51234, (0, 1): 12, (1, 1): 48754}  (outcome tuple -> count)
    res.classify().summary()

On the CPU tier (Triton interpreter) only ``plain`` and ``volatile`` run: the interpreter runs
programs one after another, so every outcome is one a sequentially consistent machine makes.
``two_gpus`` there runs on an emulated world of two processes over shared memory (lab 02's
``run_ranks`` and ``symm``): real concurrency, but the *host's* memory model (x86-TSO) applies,
not PTX's, and process start-up skew makes overlap rare.

The pieces a run is made of (``Stress``, buffers, layout, job tables, one launch, outcome
records) are in ``labkit.kernels.litmus.harness``; every name of it is importable from here too.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from labkit.kernels.litmus import kernels, model
from labkit.kernels.litmus.catalogue import get_test
from labkit.kernels.litmus.harness import (  # noqa: F401  (re-exported: run.<name> for every piece)
    EMULATED_NOTE,
    MAX_REGS,
    SLOTS,
    LitmusBuffers,
    LitmusRun,
    Stress,
    _block,
    _check_count,
    _check_fits,
    _check_runnable,
    _counts,
    _lanes,
    allocate,
    chunks,
    instances_per_launch,
    job_table,
    launch,
    layout,
    max_instances,
    needs_ptx,
    program_of,
    ptx_for,
    records_of,
    resident_programs,
    roles_on,
    same_cta_layout_ok,
)
from labkit.workbench import checks, gates, tier
from labkit.workbench.errors import UsageError
from labkit.workbench.gates import HardwareUnavailable

# --- the API ---------------------------------------------------------------------------------


def _checked(semantics, scope, placement, instances, seed, stress, programs_per_launch, stride, lanes):
    """The checks ``run_litmus`` and ``run_two_gpus`` share, in the order their errors are met;
    returns (stress, lanes) with their defaults filled in (the stride's depends on the caller's buffers)."""
    model.check_variant(semantics, scope, placement)
    _check_count("instances", instances)
    if stride is None or isinstance(stride, int):  # a bad stride is named below
        _check_fits("instances", instances, stride or 4)
    _check_count("seed", seed, low=0)
    if stride is not None:
        _check_count("stride", stride)
    stress = Stress() if stress is None else stress
    if not isinstance(stress, Stress):
        raise UsageError(f"stress: expected a labkit.kernels.litmus.Stress, got {type(stress).__name__}")
    stress.check()
    _check_runnable(semantics)
    if programs_per_launch is not None:
        _check_count("programs_per_launch", programs_per_launch)
    return stress, _lanes(lanes, placement)


def run_litmus(
    test,
    semantics: str = "plain",
    scope: str | None = None,
    placement: str = "cross_cta",
    instances: int = 4096,
    *,
    stress: Stress | None = None,
    device=None,
    seed: int = 0,
    stride: int | None = None,
    lanes: int | None = None,
    buffers: LitmusBuffers | None = None,
    timeout: float = 300.0,
    programs_per_launch: int | None = None,
    keep_records: bool = False,
) -> LitmusRun:
    """Run ``instances`` instances of ``test`` and count their outcomes (one launch per wave of
    resident programs: see ``programs_per_launch``).

    test:       a name of ``catalogue.TESTS`` ("MP", "SB", "LB", "CoRR", "IRIW", "2+2W", "RWC")
    semantics:  see ``model.SEMANTICS``; all but plain/volatile need a compiled GPU
    scope:      "cta", "gpu", "sys" (None for plain and volatile)
    placement:  "same_cta", "cross_cta" or "two_gpus" (lab 02's symmetric memory; 2 GPUs, or an
                emulated world of two processes under the interpreter: see EMULATED_NOTE)
    stress:     ``Stress(...)``; default none
    seed:       draws the location slots and the job order (same seed, same layout)
    stride:     int32 words between location slots (default 4: 16 bytes, as cuda-litmus's
                memStride; with ``buffers``, theirs)
    lanes:      instances per program (default 128 on a GPU, 32 under the interpreter and for same_cta)
    buffers:    ``allocate(...)`` buffers to reuse (one device only), at least ``instances`` large
    timeout:    two_gpus only: seconds for the whole two-rank run
    programs_per_launch: programs (test + stress) per launch; more instances are split over
                several launches, so that every program of a launch is resident and the start
                barrier completes (None: about one wave of the GPU; no limit under the interpreter)
    keep_records: keep the per-instance records ([instances, observed]) in the result
    """
    t = get_test(test)
    if buffers is not None and isinstance(buffers, LitmusBuffers) and stride not in (None, buffers.stride):
        raise UsageError(
            f"stride: {stride} differs from the buffers' stride {buffers.stride}; pass stride=None to use theirs"
        )
    stress, lanes = _checked(semantics, scope, placement, instances, seed, stress, programs_per_launch, stride, lanes)
    stride = stride or (buffers.stride if isinstance(buffers, LitmusBuffers) else 4)
    if placement == "two_gpus":
        if buffers is not None:
            raise UsageError(
                "buffers: placement='two_gpus' needs symmetric memory, which each rank "
                "allocates itself (labkit.kernels.comm.symm); pass buffers=None"
            )
        return _run_two_ranks(
            [t], semantics, scope, instances, stress, seed, stride, lanes, timeout, programs_per_launch, keep_records
        )[0]
    buffers = _buffers_for(buffers, instances, stride, device, stress)
    dev = buffers.out.device
    ran = _launches(t, semantics, scope, placement, instances, stress, seed, lanes, buffers, programs_per_launch)
    counts, unwritten = _counts(t, ran["records"])
    return LitmusRun(
        t.name,
        semantics,
        scope,
        placement,
        instances,
        stress,
        seed,
        buffers.stride,
        lanes,
        str(dev),
        counts,
        unwritten,
        ran["timeouts"],
        ran["seconds"],
        launches=ran["launches"],
        records=ran["records"] if keep_records else None,
        warmup_s=ran["warmup_s"],
    )


def _buffers_for(buffers, instances: int, stride: int, device, stress: Stress) -> LitmusBuffers:
    """``run_litmus``'s buffers: new ones for ``instances`` (``buffers`` None), else the caller's,
    checked to hold the run, on ``device`` (where given) and a device kernels run on."""
    if buffers is None:
        buffers = allocate(instances, stride, device, stress_lines=stress.lines, _name="instances")
    elif not isinstance(buffers, LitmusBuffers):
        raise UsageError(f"buffers: expected LitmusBuffers from allocate(), got {type(buffers).__name__}")
    if instances > buffers.capacity:
        raise UsageError(
            f"instances: {instances} is more than the buffers hold ({buffers.capacity}); "
            f"allocate({instances}, ...) or pass fewer"
        )
    if stress.lines > buffers.stress_lines:
        raise UsageError(
            f"stress.lines: {stress.lines} is more than the buffers' {buffers.stress_lines} "
            "scratch lines; allocate(..., stress_lines=...) more"
        )
    if device is not None and checks.check_device("device", device) != buffers.out.device:
        raise UsageError(f"device: {device!r} but the buffers are on {buffers.out.device}")
    checks.check_kernel_device("buffers", buffers.out)
    return buffers


def _launches(t, semantics, scope, placement, instances, stress, seed, lanes, buffers, programs_per_launch) -> dict:
    """One device's run in ``buffers``: a fresh layout, the instances in launches of resident
    programs (after an untimed warm-up launch on a compiled GPU); the records, timeouts, times."""
    dev = buffers.out.device
    slots, homes = (a.to(dev) for a in layout(instances, buffers.stride, seed))
    buffers.locations.zero_()
    buffers.out.fill_(kernels.UNWRITTEN)
    loc_bases = torch.tensor([buffers.locations.data_ptr()], dtype=torch.int64, device=dev)
    sync_bases = torch.tensor([buffers.sync.data_ptr()], dtype=torch.int64, device=dev)
    if programs_per_launch is None:
        programs_per_launch = resident_programs(dev, max(1, _block(t, placement, lanes) // 32))
    timeouts, seconds, warmup_s = 0, 0.0, 0.0
    parts = chunks(instances, instances_per_launch(t, placement, lanes, stress, programs_per_launch))

    def one_launch(i: int, c0: int, c1: int) -> float:
        jobs = job_table(t, c1 - c0, placement, lanes, seed * 1_000_003 + i).to(dev)
        buffers.sync.zero_()
        start = time.perf_counter()
        launch(
            t,
            semantics,
            scope,
            placement,
            c1 - c0,
            lanes,
            stress,
            loc_bases,
            slots[c0:c1],
            homes[c0:c1],
            jobs,
            buffers.out[c0:c1],
            sync_bases,
            buffers.scratch,
            jobs.numel() + stress.programs,
        )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - start

    if not tier.interpreted():
        # A kernel's first launch compiles it (or loads it from Triton's cache): seconds, against
        # 0.1-0.5 s for 1e7 instances. Run the first chunk once untimed, then start again clean,
        # so that ``seconds`` is the launches alone (the interpreter compiles nothing).
        warmup_s = one_launch(0, *parts[0])
        buffers.locations.zero_()
        buffers.out.fill_(kernels.UNWRITTEN)
    for i, (c0, c1) in enumerate(parts):
        seconds += one_launch(i, c0, c1)
        timeouts += int(buffers.sync[1])
    finals = buffers.locations[slots.long()]
    records = records_of(t, buffers.out[:instances], finals).cpu()
    return {"records": records, "timeouts": timeouts, "seconds": seconds, "launches": len(parts), "warmup_s": warmup_s}


# --- two GPUs (or two emulated ranks) --------------------------------------------------------


def run_two_gpus(
    tests,
    semantics: str = "plain",
    scope: str | None = None,
    instances: int = 4096,
    *,
    stress: Stress | None = None,
    seed: int = 0,
    stride: int | None = None,
    lanes: int | None = None,
    timeout: float = 300.0,
    programs_per_launch: int | None = None,
    keep_records: bool = False,
) -> list[LitmusRun]:
    """``run_litmus(test, semantics, scope, "two_gpus", instances, ...)`` for each of ``tests``,
    in one start of the two ranks: starting them (two processes, CUDA, symmetric memory) costs
    seconds, about as much as a run of 1e5 instances, so a sweep of several tests pays it once.

    tests:   names of ``catalogue.TESTS``, run in this order, each with its own locations and
             barrier and the same ``seed``; the other arguments as for ``run_litmus``
    timeout: seconds for the whole two-rank run (all the tests)
    Returns one ``LitmusRun`` per test, in order; each is what ``run_litmus`` returns for it.
    """
    if isinstance(tests, str) or not isinstance(tests, (list, tuple)) or not tests:
        raise UsageError(f"tests: expected a non-empty list of test names, got {tests!r}")
    ts = [get_test(t) for t in tests]
    stress, lanes = _checked(semantics, scope, "two_gpus", instances, seed, stress, programs_per_launch, stride, lanes)
    return _run_two_ranks(
        ts, semantics, scope, instances, stress, seed, stride or 4, lanes, timeout, programs_per_launch, keep_records
    )


def _run_two_ranks(
    ts, semantics, scope, instances, stress, seed, stride, lanes, timeout, programs_per_launch, keep_records
) -> list[LitmusRun]:
    from labkit.kernels.comm.ranks import run_ranks

    emulated = tier.interpreted()
    if not emulated:
        gate = gates.requires(gpus=2, peer_access=True, compiled=True)
        if not gate.ok:
            raise HardwareUnavailable(f"placement='two_gpus': {gate.reason}")
    specs = [
        {
            "test": t.name,
            "semantics": semantics,
            "scope": scope,
            "instances": instances,
            "stress": dataclasses.asdict(stress),
            "seed": seed,
            "stride": stride,
            "lanes": lanes,
            "programs_per_launch": programs_per_launch,
        }
        for t in ts
    ]
    res = run_ranks(rank_litmus_many, 2, specs, timeout=timeout)
    per_rank = res.unwrap()
    return [
        _merge_ranks(
            t,
            [per_rank[0][i], per_rank[1][i]],
            semantics,
            scope,
            instances,
            stress,
            seed,
            stride,
            lanes,
            emulated,
            keep_records,
        )
        for i, t in enumerate(ts)
    ]


def _merge_ranks(t, parts, semantics, scope, instances, stress, seed, stride, lanes, emulated, keep_records):
    """One test's run from both ranks' shares: each register from the rank of the thread that read
    it, each location's final value from the rank whose memory holds it."""
    out = torch.full((instances, MAX_REGS), kernels.UNWRITTEN, dtype=torch.int32)
    for reg_index, reg in enumerate(t.registers):
        out[:, reg_index] = parts[t.owner(reg) % 2]["out"][:, reg_index]
    finals = torch.where(parts[0]["homes"] == 0, parts[0]["finals"], parts[1]["finals"])
    records = records_of(t, out, finals)
    counts, unwritten = _counts(t, records)
    return LitmusRun(
        t.name,
        semantics,
        scope,
        "two_gpus",
        instances,
        stress,
        seed,
        stride,
        lanes,
        parts[0]["device"] + " + " + parts[1]["device"],
        counts,
        unwritten,
        parts[0]["timeouts"],
        max(p["seconds"] for p in parts),
        launches=parts[0]["launches"],
        note=EMULATED_NOTE if emulated else "",
        records=records if keep_records else None,
        warmup_s=max(p["warmup_s"] for p in parts),
    )


def rank_litmus_many(ctx, specs: list) -> list:
    """One rank's share of several two_gpus runs, one after another (called by run_ranks)."""
    return [rank_litmus(ctx, spec) for spec in specs]


def rank_litmus(ctx, spec: dict) -> dict:
    """One rank's share of a two_gpus run (called by run_ranks): allocate the locations and the
    barrier in symmetric memory, play this rank's thread roles, return registers and finals."""
    from labkit.kernels.comm import symm

    t = get_test(spec["test"])
    stress = Stress(**spec["stress"])
    n, stride, lanes = spec["instances"], spec["stride"], spec["lanes"]
    dev = ctx.device
    # symm buffers are float32 or bf16: an int32 view of a float32 buffer has the same bytes
    locs = symm.empty(n * 2 * stride, torch.float32, device=dev, max_blocks=1, scratch_dir=ctx.scratch_dir)
    sync = symm.empty(2, torch.float32, device=dev, max_blocks=1, scratch_dir=ctx.scratch_dir)
    slots, homes = layout(n, stride, spec["seed"], world=2)
    out = torch.full((n, MAX_REGS), kernels.UNWRITTEN, dtype=torch.int32, device=dev)
    scratch = torch.zeros(stress.lines * 32 + 1, dtype=torch.int32, device=dev)
    slots_d, homes_d = slots.to(dev), homes.to(dev)
    programs = spec["programs_per_launch"] or resident_programs(dev, max(1, lanes // 32))
    sync_mine = sync.tensor.view(torch.int32)  # rank 0's is the barrier; each rank zeroes its own
    parts = chunks(n, instances_per_launch(t, "two_gpus", lanes, stress, programs, 2))
    mine = locs.tensor.view(torch.int32)

    def one_launch(i: int, c0: int, c1: int) -> tuple[float, int]:
        seed = spec["seed"] * 1_000_003 + i
        jobs = job_table(t, c1 - c0, "two_gpus", lanes, seed, 2, ctx.rank).to(dev)
        everyone = sum(job_table(t, c1 - c0, "two_gpus", lanes, seed, 2, r).numel() for r in range(2))
        sync_mine.zero_()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        ctx.barrier()  # the barrier counter and (first time) both ranks' locations are zero
        start = time.perf_counter()
        launch(
            t,
            spec["semantics"],
            spec["scope"],
            "two_gpus",
            c1 - c0,
            lanes,
            stress,
            locs.data_ptrs,
            slots_d[c0:c1],
            homes_d[c0:c1],
            jobs,
            out[c0:c1],
            sync.data_ptrs[:1],
            scratch,
            everyone + 2 * stress.programs,
        )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        took = time.perf_counter() - start
        ctx.barrier()  # both ranks are done before rank 0's counter is read or reset
        gave_up = int(sync.peers[0].view(torch.int32)[1])
        ctx.barrier()
        return took, gave_up

    timeouts, seconds, warmup_s = 0, 0.0, 0.0
    if not tier.interpreted():
        # the first launch compiles or loads the kernel (see run_litmus): once untimed, on both
        # ranks at once (its start barrier spans them), then both start again from zero; the
        # next launch's host barrier orders every rank's zeroing before any kernel reads
        warmup_s = one_launch(0, *parts[0])[0]
        mine.zero_()
        out.fill_(kernels.UNWRITTEN)
    for i, (c0, c1) in enumerate(parts):
        took, gave_up = one_launch(i, c0, c1)
        seconds += took
        timeouts += gave_up
    finals = mine[slots.long().to(dev)].cpu()
    ctx.barrier()  # nobody frees its buffer while the other still reads
    return {
        "out": out.cpu(),
        "finals": finals,
        "homes": homes,
        "timeouts": timeouts,
        "seconds": seconds,
        "device": str(dev),
        "launches": len(parts),
        "warmup_s": warmup_s,
    }
