"""``labkit bench memory_model_litmus`` and ``labkit bench memory_model_litmus_two_gpus``: every
litmus test x semantics x scope x placement the model lists (``labkit.kernels.litmus.model.variants``),
under a few stress settings, one record per row.

Profiles:

* ``gpu``: every variant of the placements of the part, ``INSTANCES`` (1e7) instances per row,
  each row under the stresses of ``STRESSES`` (none, memory stress, memory stress + delay).
  ``litmus`` is one GPU (cross_cta, then same_cta: 7 tests x 14 variants x 2 placements x 3
  stresses = 588 rows); ``litmus_two_gpus`` is two GPUs over symmetric memory (294 rows), or,
  with fewer than 2 GPUs, one record per row saying skipped and why.
* ``cpu``: ``plain`` and ``volatile`` (the semantics the Triton interpreter runs) at
  ``CPU_INSTANCES`` instances, stress none, records labelled ``tier="interpreter"``: the
  interpreter runs programs one after another, so only sequentially consistent outcomes appear;
  ``litmus_two_gpus`` there runs an emulated world of two processes (the host's x86-TSO model).

**Wall time.** ``litmus_two_gpus`` does not fit one 10-minute call, and ``litmus`` may not. A
record's ``wall_s`` is the row's wall time in its worker (a batch's, shared equally) and
``seconds`` its timed launches (reference/h200x2/memory_model_litmus.json,
reference/h200x2/memory_model_litmus_two_gpus.json):
a one-GPU row spends most of its wall time outside the timed launches (a hypothesis not broken
down: compiles, a new kernel per variant and per delay, "none" and "memory" sharing one; the
layout's permutations; the host histogram). ``litmus_two_gpus`` runs the seven tests of one
semantics, scope and stress in one start of the two ranks (``run_rows_two_gpus``: 42 starts, not
294), and the starts and compiles still dominate, so its 294 rows take several calls. So each call
stops starting rows after ``BUDGET_S`` seconds (environment ``LABKIT_LITMUS_BUDGET_S``, default
480) and records the rest as pending; a later call given the earlier file
(``LABKIT_LITMUS_RESUME=path/to/memory_model_litmus.json``) keeps its finished rows, each marked
``resumed_from`` with the commit that measured it, and runs the pending ones. Repeat until
``pending(records)`` is empty.

**Every GPU at once.** The one-GPU rows need one GPU each, so ``labkit bench memory_model_litmus`` on a machine
of several GPUs deals them to one worker process per GPU (``devices``; each record's ``device``
says which GPU ran it; on 2x H100 each ran 294 of the 588). The tests named in
``LABKIT_LITMUS_FIRST`` (e.g. ``IRIW,2+2W``) run before the others, so that a call's budget
reaches the rows that matter most first; nothing is left out, only reordered.

    LABKIT_LITMUS_RESUME=OUT/reference/h100x2/memory_model_litmus.json \\
        python -m labkit bench memory_model_litmus --profile gpu --reference --out OUT
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from labkit.kernels.litmus import Stress, model, run_litmus, run_two_gpus
from labkit.kernels.litmus.catalogue import TESTS, get_test
from labkit.kernels.litmus.classify import lower_bound, upper_bound
from labkit.workbench import gates, tier
from labkit.workbench.errors import UsageError

#: fields every record carries (``labkit.workbench.results.write_results`` checks them)
REQUIRED = (
    "test",
    "semantics",
    "scope",
    "placement",
    "stress",
    "stress_name",
    "runs",
    "weak_outcomes",
    "counts",
    "verdict",
    "ptx_verdict",
    "rate",
    "lower",
    "upper",
    "timeouts",
    "unwritten",
    "seconds",
    "tier",
    "skipped",
)

#: the stress settings of the GPU sweep. "none" and "memory" compile to the same kernel (the
#: iteration count and lines are constexprs; the number of stress programs is not)
STRESSES = {
    "none": Stress(programs=0, iterations=256, lines=8),
    "memory": Stress(programs=128, iterations=256, lines=8),
    "memory+delay": Stress(programs=128, iterations=256, lines=8, delay=16),
}
#: instances per row on a GPU (the issue's target: at least 1e7)
INSTANCES = 10_000_000
#: instances per row under the interpreter (intra-GPU placements; two_gpus: TWO_RANK_CPU_INSTANCES)
CPU_INSTANCES = 512
TWO_RANK_CPU_INSTANCES = 128
#: seconds after which a GPU call starts no new row (the rest are recorded as pending)
BUDGET_S = 480.0
#: the interpreter's semantics
INTERPRETED = ("plain", "volatile")
PARTS = {"litmus": ("cross_cta", "same_cta"), "litmus_two_gpus": ("two_gpus",)}
PENDING = "pending: not run yet in this call's time budget; run again with LABKIT_LITMUS_RESUME"


def outcome_key(outcome) -> str:
    """(1, 0) -> "1,0": the outcome as a JSON object key."""
    return ",".join(str(int(v)) for v in outcome)


def rows(placements, semantics=None, tests=None, stresses=None) -> list[dict]:
    """The grid: one dict per (test, semantics, scope, placement, stress name), in run order
    (placement, test, variant, then stress: rows sharing a kernel run one after another)."""
    tests = list(tests or TESTS)
    for t in tests:
        get_test(t)
    stresses = list(stresses or STRESSES)
    for s in stresses:
        if s not in STRESSES:
            raise UsageError(f"stresses: {s!r} is not one of {list(STRESSES)}")
    for p in placements:
        if p not in model.PLACEMENTS:
            raise UsageError(f"placements: {p!r} is not one of {list(model.PLACEMENTS)}")
    for s in semantics or ():
        if s not in model.SEMANTICS:
            raise UsageError(f"semantics: {s!r} is not one of {list(model.SEMANTICS)}")
    out = []
    for p in placements:
        for t in tests:
            for sem, scope, placement in model.variants():
                if placement != p or (semantics and sem not in semantics):
                    continue
                out += [
                    {"test": t, "semantics": sem, "scope": scope, "placement": p, "stress_name": s} for s in stresses
                ]
    return out


def key_of(r: dict) -> tuple:
    return (r["test"], r["semantics"], r["scope"], r["placement"], r["stress_name"])


def record(
    row: dict, res=None, *, skipped: str | None = None, stress: Stress | None = None, wall_s: float = 0.0
) -> dict:
    """One row's record from a ``LitmusRun`` (or a skipped row: counts empty, runs 0)."""
    t = get_test(row["test"])
    sem, scope, placement = row["semantics"], row["scope"], row["placement"]
    ptx, why = model.ptx_verdict(t, sem, scope, placement)
    stress = stress or STRESSES[row["stress_name"]]
    base = dict(
        row,
        stress=dataclasses.asdict(stress),
        observed=list(t.observed),
        weak_outcome=outcome_key(t.weak),
        verdict=model.verdict(t, sem, scope, placement),
        ptx_verdict=ptx,
        ptx_note=why,
        model_outcomes=sorted(outcome_key(o) for o in model.outcomes(t, "relaxed", sem, scope, placement)),
        sc_outcomes=sorted(outcome_key(o) for o in model.outcomes(t, "sc")),
        tier="interpreter" if tier.interpreted() else "gpu",
        skipped=skipped,
        wall_s=round(wall_s, 3),
    )
    if res is None:
        return dict(
            base,
            runs=0,
            weak_outcomes=0,
            counts={},
            rate=None,
            lower=None,
            upper=None,
            timeouts=0,
            unwritten=0,
            seconds=0.0,
            not_possible=0,
            device=None,
            note="",
        )
    n = sum(res.counts.values())
    weak = res.counts.get(t.weak, 0)
    possible = model.possible(t, sem, scope, placement)
    return dict(
        base,
        runs=res.instances,
        classified=n,
        weak_outcomes=weak,
        counts={outcome_key(o): c for o, c in sorted(res.counts.items())},
        rate=weak / n if n else None,
        lower=lower_bound(weak, n) if n else None,
        upper=upper_bound(weak, n) if n else None,
        timeouts=res.timeouts,
        unwritten=res.unwritten,
        seconds=round(res.seconds, 4),
        warmup_s=round(res.warmup_s, 4),
        launches=res.launches,
        device=res.device,
        note=res.note,
        not_possible=sum(c for o, c in res.counts.items() if o not in possible),
    )


def run_row(
    row: dict, instances: int, stress: Stress | None = None, seed: int = 0, timeout: float = 300.0, device=None
) -> dict:
    """Run one row (a compiled GPU for scoped semantics; plain/volatile anywhere) -> its record.
    device: where a one-GPU row runs (default: the tier's device)."""
    stress = stress or STRESSES[row["stress_name"]]
    start = time.perf_counter()
    res = run_litmus(
        row["test"],
        row["semantics"],
        row["scope"],
        row["placement"],
        instances,
        stress=stress,
        seed=seed,
        timeout=timeout,
        device=device,
    )
    return record(row, res, stress=stress, wall_s=time.perf_counter() - start)


def run_rows_two_gpus(
    batch: list[dict], instances: int, stress: Stress | None = None, seed: int = 0, timeout_per_row: float = 300.0
) -> list[dict]:
    """Run two_gpus rows that share semantics, scope and stress in one start of the two ranks
    (``run_two_gpus``: a start costs about as much as a row) -> their records, in order. Each
    record's ``wall_s`` is the batch's wall time shared equally; ``batch_rows`` says how many."""
    first = batch[0]
    if any(
        (r["semantics"], r["scope"], r["placement"], r["stress_name"])
        != (first["semantics"], first["scope"], "two_gpus", first["stress_name"])
        for r in batch
    ):
        raise UsageError("batch: every row must be two_gpus with the same semantics, scope and stress")
    stress = stress or STRESSES[first["stress_name"]]
    start = time.perf_counter()
    runs = run_two_gpus(
        [r["test"] for r in batch],
        first["semantics"],
        first["scope"],
        instances,
        stress=stress,
        seed=seed,
        timeout=timeout_per_row * len(batch),
    )
    share = (time.perf_counter() - start) / len(batch)
    return [dict(record(r, res, stress=stress, wall_s=share), batch_rows=len(batch)) for r, res in zip(batch, runs)]


def batches(grid: list[dict], todo: list[int], first=()) -> list[list[int]]:
    """The rows to run (indices into ``grid``) in run order: two_gpus rows sharing semantics, scope
    and stress together (one start of the ranks each); one-GPU rows of one test and variant
    together (their stresses: one worker compiles the variant once). Batches of the tests in
    ``first`` come before the others, each side in grid order."""
    groups: dict[tuple, list[int]] = {}
    for i in todo:
        r = grid[i]
        key = (
            ("two_gpus", r["semantics"], r["scope"], r["stress_name"])
            if r["placement"] == "two_gpus"
            else (r["placement"], r["test"], r["semantics"], r["scope"])
        )
        groups.setdefault(key, []).append(i)
    out = list(groups.values())
    # two_gpus batches hold several tests; they count as first if any of theirs is
    return sorted(out, key=lambda b: not any(grid[i]["test"] in first for i in b))


def first_tests(value, name: str = "LABKIT_LITMUS_FIRST") -> tuple[str, ...]:
    """Checked test names from ``LABKIT_LITMUS_FIRST``'s text ("IRIW,2+2W") or a sequence of
    names (``sweep``'s ``first``); empty: none. ``name`` is what an error calls the argument."""
    parts = (value or "").split(",") if isinstance(value, str) or value is None else value
    names = tuple(str(t).strip() for t in parts if str(t).strip())
    for t in names:
        if t not in TESTS:
            raise UsageError(f"{name}: {t!r} is not a litmus test; expected names of {list(TESTS)}")
    return names


def _needs_compiled(row: dict) -> bool:
    """A row the interpreter cannot run here: its semantics are inline PTX."""
    return model.SEMANTICS.index(row["semantics"]) >= 2 and tier.interpreted()


def gpu_devices() -> list[str]:
    """Every GPU this process sees, as device strings ("cuda:0", ...); empty off a compiled GPU."""
    import torch

    if tier.interpreted() or not torch.cuda.is_available():
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def _run_one_gpu_batch(rows_: list[dict], instances: int, device) -> list[dict]:
    """A worker's job: one-GPU rows, one after another, on ``device`` (a worker process per GPU)."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        torch.cuda.set_device(device)  # kernels compiled and launched here land on this GPU
    return [run_row(r, instances, device=device) for r in rows_]


def _share_cores(threads: int) -> None:
    """A worker's initializer: its torch uses ``threads`` CPU threads."""
    import torch

    torch.set_num_threads(threads)


def _on_workers(grid, todo_batches, instances, devices, budget_s, start, out, bar) -> None:
    """Run one-GPU batches on one worker process per device (spawned: CUDA cannot be forked), a
    batch per worker at a time; after ``budget_s`` no batch starts and the rest are pending. A
    worker that dies (a crash in a kernel) costs its batch, recorded as skipped with the reason."""
    import multiprocessing

    from labkit.kernels.comm.ranks import rank_threads

    ctx = multiprocessing.get_context("spawn")
    # each worker's torch gets its share of the cores (the layout's permutations run on the host);
    # left alone, every worker takes them all and their threads fight (see rank_threads)
    share = (rank_threads(len(devices)),)

    def pool():
        return ProcessPoolExecutor(1, mp_context=ctx, initializer=_share_cores, initargs=share)

    pools = [pool() for _ in devices]
    queue, running = list(todo_batches), {}
    try:
        while queue or running:
            busy = {w for w, _ in running.values()}
            for w in range(len(devices)):
                if w not in busy and queue and time.perf_counter() - start <= budget_s:
                    batch = queue.pop(0)
                    fut = pools[w].submit(_run_one_gpu_batch, [grid[i] for i in batch], instances, devices[w])
                    running[fut] = (w, batch)
            if not running:
                break
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                w, batch = running.pop(fut)
                try:
                    for i, rec in zip(batch, fut.result()):
                        out[i] = rec
                except Exception as e:
                    for i in batch:
                        out[i] = record(grid[i], skipped=f"worker on {devices[w]} failed: {type(e).__name__}: {e}")
                    pools[w].shutdown(wait=False, cancel_futures=True)
                    pools[w] = pool()
                bar.update(len(batch))
    finally:
        for worker in pools:
            worker.shutdown(wait=True, cancel_futures=True)
    for batch in queue:
        for i in batch:
            out[i] = record(grid[i], skipped=PENDING)
        bar.update(len(batch))


def load_resume(path) -> dict:
    """Finished records of an earlier results file, by row key (pending and skipped rows dropped),
    each marked ``resumed_from`` with the commit that measured it (``results.resumable``)."""
    from labkit.workbench import results

    return {key_of(r): r for r in results.resumable(path)}


def pending(records) -> list[dict]:
    """Rows recorded as not run yet (a later call with LABKIT_LITMUS_RESUME runs them)."""
    return [r for r in records if (r.get("skipped") or "").startswith("pending")]


def sweep(
    placements,
    profile: str = "cpu",
    *,
    instances: int | None = None,
    semantics=None,
    tests=None,
    stresses=None,
    budget_s: float | None = None,
    resume: dict | None = None,
    progress: bool = True,
    devices=None,
    first=(),
) -> list[dict]:
    """The grid for ``placements`` run as ``profile`` says (module docstring); returns records.

    devices: with two or more, the one-GPU rows (cross_cta, same_cta) run in one worker process
             per device, at once (``gpu_devices()`` gives every GPU); None or one: in this process
    first:   test names whose rows run before the others' (``LABKIT_LITMUS_FIRST``)"""
    first = first_tests(first, "first")
    if devices is not None and (isinstance(devices, str) or not all(isinstance(d, str) for d in devices)):
        raise UsageError(f"devices: expected a list of device strings such as ['cuda:0', 'cuda:1'], got {devices!r}")
    gpu = profile == "gpu"
    if gpu:
        instances = instances or INSTANCES
        grid = rows(placements, semantics, tests, stresses)
    else:
        instances = instances or CPU_INSTANCES
        grid = rows(placements, semantics or INTERPRETED, tests, stresses or ("none",))
    budget_s = BUDGET_S if budget_s is None else budget_s
    resume = resume or {}
    from tqdm.auto import tqdm

    out: list[dict | None] = [None] * len(grid)
    todo = []
    for i, row in enumerate(grid):
        done = resume.get(key_of(row))
        if done is not None and done.get("runs", 0) >= instances:
            out[i] = done
        else:
            todo.append(i)
    start = time.perf_counter()
    bar = tqdm(total=len(todo), desc="litmus rows", disable=not progress)
    order = batches(grid, todo, first)
    if devices is not None and len(devices) > 1:
        on_one = [b for b in order if grid[b[0]]["placement"] != "two_gpus" and not _needs_compiled(grid[b[0]])]
        _on_workers(grid, on_one, instances, list(devices), budget_s if gpu else float("inf"), start, out, bar)
        order = [b for b in order if out[b[0]] is None]
    for batch in order:
        if gpu and time.perf_counter() - start > budget_s:
            for i in batch:
                out[i] = record(grid[i], skipped=PENDING)
        elif _needs_compiled(grid[batch[0]]):
            for i in batch:  # a batch shares its semantics
                out[i] = record(grid[i], skipped="needs a compiled GPU (inline PTX)")
        elif grid[batch[0]]["placement"] == "two_gpus":
            n = instances if gpu else TWO_RANK_CPU_INSTANCES
            for i, rec in zip(batch, run_rows_two_gpus([grid[i] for i in batch], n)):
                out[i] = rec
        else:
            for i in batch:
                out[i] = run_row(grid[i], instances)
        bar.update(len(batch))
    bar.close()
    return out


def _benchmark(part: str, profile: str) -> list[dict]:
    placements = PARTS[part]
    if profile == "gpu":
        gate = (
            gates.requires(gpus=2, peer_access=True, compiled=True)
            if part == "litmus_two_gpus"
            else gates.requires(gpus=1, compiled=True)
        )
        if not gate.ok:
            return [record(r, skipped=gate.reason) for r in rows(placements)]
        budget = float(os.environ.get("LABKIT_LITMUS_BUDGET_S", BUDGET_S))
        first = first_tests(os.environ.get("LABKIT_LITMUS_FIRST"))
        devices = gpu_devices() if part == "litmus" else None  # two_gpus rows need both GPUs at once
        return sweep(
            placements,
            "gpu",
            budget_s=budget,
            resume=load_resume(os.environ.get("LABKIT_LITMUS_RESUME")),
            devices=devices,
            first=first,
        )
    return sweep(placements, "cpu")


def benchmark(profile: str) -> list[dict]:
    """Entry point of ``labkit bench memory_model_litmus`` (one GPU: cross_cta and same_cta)."""
    return _benchmark("litmus", profile)


def benchmark_two_gpus(profile: str) -> list[dict]:
    """Entry point of ``labkit bench memory_model_litmus_two_gpus`` (two GPUs over symmetric memory)."""
    return _benchmark("litmus_two_gpus", profile)


#: the rows the notebook's first screen quotes from each recorded sweep (stress "memory"): message
#: passing with plain accesses, and the anchor's IRIW (relaxed at gpu scope, then with fence.sc)
HEADLINE_ROWS = (
    ("MP", "plain", None, "cross_cta"),
    ("MP", "plain", None, "two_gpus"),
    ("IRIW", "relaxed", "gpu", "cross_cta"),
    ("IRIW", "fence_sc", "gpu", "cross_cta"),
    ("IRIW", "relaxed", "sys", "two_gpus"),
)


def find(records, test: str, semantics: str, scope, placement: str, stress_name: str = "memory") -> dict | None:
    """The record of one row that ran (None where it is absent, skipped or pending)."""
    key = (test, semantics, scope, placement, stress_name)
    return next((r for r in records if key_of(r) == key and not r.get("skipped")), None)


def summary(records) -> str:
    """One line per record: the weak count out of N, or why the row was not run."""
    lines = []
    for r in records:
        head = f"{r['test']:<5} {r['semantics']:<8} {str(r['scope']):<4} {r['placement']:<9} {r['stress_name']:<12}"
        if r.get("skipped"):
            lines.append(f"{head} skipped: {r['skipped']}")
        elif r["weak_outcomes"]:
            lines.append(
                f"{head} weak {r['weak_outcomes']:,} of {r['runs']:,} (rate {r['rate']:.3g}, "
                f"95% [{r['lower']:.2g}, {r['upper']:.2g}]; model: {r['verdict']}, PTX: {r['ptx_verdict']})"
            )
        else:
            lines.append(
                f"{head} weak not observed in {r['runs']:,} (rate < {r['upper']:.2g}; "
                f"model: {r['verdict']}, PTX: {r['ptx_verdict']})"
            )
    return "\n".join(lines)


#: the variants whose PTX the notebook lists (one compile each)
PTX_VARIANTS = (
    ("MP", "plain", None),
    ("MP", "volatile", None),
    ("MP", "relaxed", "gpu"),
    ("MP", "acq_rel", "gpu"),
    ("MP", "acq_rel", "sys"),
    ("MP", "fence", "cta"),
    ("SB", "fence_sc", "gpu"),
)


def ptx_rows(variants=PTX_VARIANTS, placement: str = "cross_cta") -> list[dict]:
    """The memory instructions each variant compiles to for sm_90 (no GPU needed; call in a process
    with TRITON_INTERPRET=0: ``sandbox.run_isolated(ptx_rows, env={"TRITON_INTERPRET": "0"})``)."""
    from collections import Counter

    from labkit.kernels.litmus import ptx

    out = []
    for t, s, sc in variants:
        text = ptx.compile_kernel(t, s, sc, placement).asm["ptx"]
        ops = Counter(m.group(0) for m in ptx.MEMORY_OP.finditer(text) if not m.group(0).startswith("ld.param"))
        out.append({"test": t, "semantics": s, "scope": sc, "ops": sorted(ops), "counts": dict(ops)})
    return out
