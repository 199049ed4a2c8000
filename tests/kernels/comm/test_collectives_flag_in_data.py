"""``collectives.all_reduce`` reaching the flag-in-data one-shot: on a buffer with an inbox
(``flag_in_data.attach``), ``auto`` takes it up to the measured limit and explicit
``algorithm="flag_in_data"`` always; checked against an fp64 sum on fresh inputs every call, a
rotating late rank, in place and out of place, calls alternating paths (push, flag-in-data,
one-shot, two-shot) back to back on the same buffers, and ranks whose counts disagree caught.
The rule's table (``fid_limits_from``) is tested on records, and against the reference files."""

import dataclasses
import os
import secrets
import time

import pytest
import torch

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import flag_in_data as fid
from labkit.kernels.comm import push, symm, tables
from labkit.kernels.comm.ranks import run_ranks
from labkit.labs.collectives import experiments
from labkit.workbench import results, tier
from labkit.workbench.errors import UsageError

GPUS = torch.cuda.device_count() if torch.cuda.is_available() and not tier.interpreted() else 0
needs_world = pytest.mark.skipif(
    not (tier.interpreted() or GPUS >= 2), reason="needs 2 CUDA GPUs (or the interpreter's emulated world)"
)


def _worlds():
    """(world size, dtype): two worlds on the CPU tier, every GPU count on GPUs."""
    if tier.interpreted():
        return [(2, "bfloat16"), (3, "float32")]
    return [(w, d) for w in (2, 4, 8) if w <= GPUS for d in ("bfloat16", "float32")]


def _auto_key(out):
    return C.plan_key("all_reduce", out)


def alternating(ctx, n: int, dtype_name: str, seed: int, late_s: float) -> dict:
    """Rank function: one buffer of n elements and one of 2n share one flag-in-data inbox; the
    rule's table says flag-in-data up to n elements at this world size. Calls alternate paths on
    the same buffers and outputs, back to back with no host barrier (a rotating late rank), each
    on a fresh input written into the buffer; every result kept (cloned in stream order)."""
    dtype = getattr(torch, dtype_name)
    w = ctx.world_size
    limit = n * dtype.itemsize
    key = (tables.gpu_name(ctx.device), w)  # this rank's process only: the table of its GPU and world
    tables.TABLES[key] = dataclasses.replace(tables.table_for(*key), fid_out_of_place=limit, fid_in_place=limit)
    box = fid.inbox(2 * n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    pbox = push.inbox(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    big = symm.empty(2 * n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    fid.attach(buf, box), fid.attach(big, box)
    out = torch.empty(n, dtype=dtype, device=ctx.device)
    big_out = torch.empty(2 * n, dtype=dtype, device=ctx.device)
    found = {}

    # ranks that disagree the first time they make a call are stopped by the plan's agreement
    try:
        if ctx.rank == 0:
            C.all_reduce(buf, out, algorithm="flag_in_data")
        else:
            C.all_reduce(big, big_out, algorithm="flag_in_data")
        found["first disagreement"] = "no error"
    except UsageError as e:
        found["first disagreement"] = str(e)

    t = buf.tensor
    paths = [
        ("push", lambda: push.all_reduce(t, pbox, out)),
        ("auto", lambda: C.all_reduce(buf, out)),
        ("one_shot", lambda: C.all_reduce(buf, out, algorithm="one_shot")),
        ("push in place", lambda: push.all_reduce(t, pbox, t)),
        ("auto in place", lambda: C.all_reduce(buf, t)),
        ("two_shot in place", lambda: C.all_reduce(buf, t, algorithm="two_shot")),
        ("flag_in_data", lambda: C.all_reduce(buf, out, algorithm="flag_in_data")),
        ("push", lambda: push.all_reduce(t, pbox, out)),
        ("flag_in_data in place", lambda: C.all_reduce(buf, t, algorithm="flag_in_data")),
        ("auto, new out", lambda: C.all_reduce(buf)),
        ("push", lambda: push.all_reduce(t, pbox, out)),
    ]
    inputs = [experiments.rank_inputs(ctx, n, dtype, seed * 1000 + c) for c in range(len(paths))]
    outs = []
    for c, ((_, call), (x, _)) in enumerate(zip(paths, inputs)):
        if c % w == ctx.rank:
            time.sleep(late_s)
        t.copy_(x)
        outs.append(call().clone())
    # above the table's limit auto keeps to the barrier algorithms, on the buffer sharing the inbox
    big_inputs = [experiments.rank_inputs(ctx, 2 * n, dtype, seed * 1000 + 99 + c) for c in range(2)]
    big_outs = []
    for (x, _), target in zip(big_inputs, (big_out, big.tensor)):
        big.tensor.copy_(x)
        big_outs.append(C.all_reduce(big, target).clone())
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    found["paths"] = [name for name, _ in paths]
    found["wrong"] = experiments.wrong_calls(outs, inputs, dtype, w)
    found["big wrong"] = experiments.wrong_calls(big_outs, big_inputs, dtype, w)
    found["digests"] = experiments.digests(outs + big_outs)
    found["auto chose"] = {
        "out of place": buf._plans[_auto_key(out)].algorithm,
        "in place": buf._plans[_auto_key(t)].algorithm,
        "new out": buf._plans[_auto_key(None)].algorithm,
        "above the limit, out of place": big._plans[_auto_key(big_out)].algorithm,
        "above the limit, in place": big._plans[_auto_key(big.tensor)].algorithm,
    }

    # ranks that disagree on calls they have each made before, through held plans (whose calls
    # exchange nothing; an eager call that differs from the rank's last is exchanged in the
    # emulated world): the protocol sees the counts differ, every rank's output is NaN, the inbox
    # counts it
    small_plan = C.all_reduce_plan(buf, out, algorithm="flag_in_data")
    big_plan = C.all_reduce_plan(big, big_out, algorithm="flag_in_data")
    big.tensor.copy_(big_inputs[0][0])
    big_plan()  # agreed on both buffers now
    before = box.disagreements()
    t.copy_(inputs[0][0])
    big.tensor.copy_(big_inputs[0][0])
    y = small_plan() if ctx.rank == 0 else big_plan()
    found["mismatch all NaN"] = bool(torch.isnan(y).all())
    found["mismatch counted"] = box.disagreements() - before
    t.copy_(inputs[1][0])  # and the next agreeing call sums right
    after = C.all_reduce(buf, out, algorithm="flag_in_data").clone()
    found["after mismatch wrong"] = experiments.wrong_calls([after], [inputs[1]], dtype, w)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    found["armed"] = box.armed()
    return found


@needs_world
@pytest.mark.parametrize("w,dtype_name", _worlds())
def test_auto_reaches_flag_in_data_and_every_path_sums_right_back_to_back(w, dtype_name):
    n = 300 * w + 13 if tier.interpreted() else (1 << 14) + 13
    late = 0.1 if tier.interpreted() else 0.02
    seed = secrets.randbelow(2**20)  # fresh inputs every run; printed on failure
    parts = run_ranks(alternating, w, n, dtype_name, seed, late, timeout=600).unwrap()
    for p in parts:
        assert p["first disagreement"].startswith("all_reduce: the ranks disagree on buf"), p["first disagreement"]
        assert p["wrong"] == [] and p["big wrong"] == [], f"seed {seed}: {p['paths']} {p['wrong']} {p['big wrong']}"
        assert p["auto chose"]["out of place"] == p["auto chose"]["in place"] == "flag_in_data", p["auto chose"]
        assert p["auto chose"]["new out"] == "flag_in_data", p["auto chose"]
        assert p["auto chose"]["above the limit, out of place"] in ("one_shot", "two_shot"), p["auto chose"]
        assert p["auto chose"]["above the limit, in place"] in ("two_shot", "two_shot_ce"), p["auto chose"]
        assert p["mismatch all NaN"] and p["mismatch counted"] == 1, f"seed {seed}: {p}"
        assert p["after mismatch wrong"] == [] and p["armed"], f"seed {seed}: {p}"
    assert len({tuple(p["digests"]) for p in parts}) == 1, f"seed {seed}: ranks computed different bits"


def bad_inputs(ctx) -> list[str]:
    """Each misuse of the inbox path, with the argument its error names."""
    box = fid.inbox(64, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    buf = symm.empty(64, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    fid.attach(buf, box)
    plain = symm.empty(64, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    other_dtype = symm.empty(64, torch.bfloat16, device=ctx.device, scratch_dir=ctx.scratch_dir)
    larger = symm.empty(65, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    found = []
    for call in (
        lambda: C.all_reduce(plain, algorithm="flag_in_data"),
        lambda: C.all_reduce(buf, algorithm="flag_in_data", blocks=2),
        lambda: C.all_reduce(buf, algorithm="flag_in_data", config=C.LaunchConfig()),
        lambda: C.all_reduce(buf, algorithm="flag_in_data", variant="relaxed"),
        lambda: C.all_reduce(buf, box.buf.tensor[1, 0], algorithm="one_shot"),
        lambda: C.all_reduce_plan(buf).launch(box.buf.tensor[0, 1]),
        lambda: fid.attach(other_dtype, box),
        lambda: fid.attach(larger, box),
        lambda: fid.attach(plain, "yes"),
        lambda: fid.attach(box, None),
    ):
        try:
            call()
        except (TypeError, ValueError) as e:  # UsageError is a ValueError
            msg = str(e)
            found.append(msg.split(":", 2)[1].strip() if msg.startswith(("all_reduce:", "plan.launch:")) else msg)
        else:
            found.append("no error")
    refused = (other_dtype, larger, plain)
    found.append(f"refused buffers have no inbox: {all(b.inbox is None for b in refused)}")
    buf.tensor.fill_(1.0)
    found.append(f"sum {float(C.all_reduce(buf, algorithm='flag_in_data')[0])}")  # nothing half-done
    return found


@needs_world
def test_bad_input_on_the_inbox_path_is_refused_naming_the_argument():
    first = run_ranks(bad_inputs, 2, timeout=120).unwrap()[0]
    assert first[0].startswith("algorithm 'flag_in_data': buf has no flag-in-data inbox"), first[0]
    assert first[1].startswith("blocks: 2") and first[2].startswith("config:") and first[3].startswith("variant:")
    assert first[4] == "out" and first[5] == "out", first[4:6]
    assert first[6].startswith("attach: box: its dtype") and first[7].startswith("attach: box: its capacity is 64")
    assert first[8].startswith("attach: box: expected None or a flag_in_data.Inbox"), first[8]
    assert first[9].startswith("attach: buf: expected a symm.SymmBuffer"), first[9]
    assert first[10] == "refused buffers have no inbox: True" and first[11] == "sum 2.0", first[10:]


def _rec(w, impl, nbytes, us, in_place=False, correct=True):
    return {
        "kind": "push",
        "timing": "graph",
        "world_size": w,
        "impl": impl,
        "bytes": nbytes,
        "us": us,
        "in_place": in_place,
        "correct": correct,
    }


def test_the_limit_is_the_last_recorded_size_of_an_unbroken_run_of_wins():
    fid_out, other_out = C.FID_COMPARED[False]
    fid_in, other_in = C.FID_COMPARED[True]
    sizes = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
    recs = []
    # W=2 out of place: wins at 4 KiB and 64 KiB, loses at 1 MiB, "wins" again at 16 MiB (ignored)
    for b, f, o in zip(sizes, (1.0, 2.0, 9.0, 5.0), (2.0, 3.0, 8.0, 6.0)):
        recs += [_rec(2, fid_out, b, f), _rec(2, other_out, b, o)]
    # W=2 in place: loses at the smallest size: no entry
    recs += [_rec(2, fid_in, sizes[0], 3.0, True), _rec(2, other_in, sizes[0], 2.0, True)]
    # W=4 out of place: wins everywhere recorded, but the 64 KiB record was wrong: no pair there
    for b in sizes[:3]:
        recs += [_rec(4, fid_out, b, 1.0, correct=b != sizes[1]), _rec(4, other_out, b, 2.0)]
    # eager timings and other kinds do not count
    recs += [dict(_rec(4, fid_in, sizes[0], 1.0, True), timing="eager"), _rec(4, other_in, sizes[0], 2.0, True)]
    assert C.fid_limits_from(recs) == {(2, False): 64 << 10, (4, False): 1 << 20}
    assert C.fid_limits_from([]) == {}


def test_the_measured_table_agrees_with_every_reference_file():
    """Every entry of a GPU's tables is a recorded size at which flag-in-data won on that GPU's
    recording of that world size (tests/kernels/comm/test_chooser_tables.py holds each table equal to its file)."""
    for machine, rs in results.load_references("collectives").items():
        gpu = rs.env["gpus"][0]["name"]
        table = C.measured_fid_limits(gpu)
        for key, limit in C.fid_limits_from(rs.records).items():
            assert table.get(key) == limit, f"{machine}: {key} {limit} vs {table}"
        for (w, in_place), limit in table.items():
            assert any(
                r.get("kind") == "push" and r["world_size"] == w and r["bytes"] == limit
                for rs in results.load_references("collectives").values()
                for r in rs.records
            ), f"{(w, in_place)}: {limit} is not a recorded size"


def test_auto_without_an_inbox_or_with_a_launch_given_keeps_the_barrier_algorithms(monkeypatch):
    """The rule's other conditions, without a world: no inbox, a launch given or a broken variant
    never reach flag-in-data, whatever the table says; above the limit neither."""

    class Buf:
        def __init__(self, n, inbox):
            self.tensor, self.world_size, self.inbox, self.workspace = torch.empty(n), 2, inbox, None

    key = (tables.INTERPRETER_GPU, 2)  # the fake buffers are CPU tensors: the interpreter's tables
    monkeypatch.setitem(
        tables.TABLES, key, dataclasses.replace(tables.table_for(*key), fid_out_of_place=4096, fid_in_place=4096)
    )
    assert C.auto_algorithm(Buf(1024, object()), False) == "flag_in_data"
    assert C.auto_algorithm(Buf(1024, object()), True) == "flag_in_data"
    assert C.auto_algorithm(Buf(1024, None), False) == C.choose(4096, 2)
    assert C.auto_algorithm(Buf(1024, object()), False, launch_given=True) == C.choose(4096, 2)
    assert C.auto_algorithm(Buf(1024, object()), True, variant="relaxed") == "two_shot"
    assert C.auto_algorithm(Buf(1025, object()), False) == C.choose(4100, 2)


@needs_world
def test_call_costs_times_every_public_call_interleaved_after_checking_it():
    from labkit.labs.collectives import host_calls

    per_rank = run_ranks(host_calls.call_costs, 2, 256, "float32", 2, 2, timeout=300).unwrap()
    for recs in per_rank:
        by = {r["impl"]: r for r in recs}
        assert list(by) == list(host_calls.HOST_CALLS)
        timed = [r for r in recs if r["us"] is not None]
        assert {r["impl"] for r in timed} >= {"labkit_push", "labkit_fid", "labkit_all_reduce_fid", "labkit_all_reduce"}
        for r in timed:
            assert r["correct"] is True, r
            assert 0 < r["us_min"] <= r["us_p25"] <= r["us"] <= r["us_p75"] <= r["us_max"], r
            assert r["rounds"] == 2 and r["calls"] == 2 and r["bytes"] == 1024
            # where the rank ran: a core it may run on, and how many it may use
            assert r["cpus_allowed"] >= 1 and (r["cpu"] is None or 0 <= r["cpu"] < os.cpu_count()), r
        if not GPUS:
            assert by["torch_two_shot"]["us"] is None and "CUDA" in by["torch_two_shot"]["absent"]
    lines = host_calls.call_costs_summary([r for rs in per_rank for r in rs])
    assert len(lines) == 1 and "labkit_fid" in lines[0] and "rank 0" in lines[0]


def test_the_push_part_records_the_host_calls_beside_the_push_comparison(monkeypatch):
    from labkit.labs.collectives import bench, host_calls, push_bench

    asked = []
    monkeypatch.setattr(push_bench, "push_records", lambda w: [{"kind": "push", "world_size": w}])

    def world(fn, w, kind, impl, op, timeout, rank0_only):
        asked.append((fn, w, kind, rank0_only))
        return [{"impl": "labkit_fid", "rank": r, "us": 1.0} for r in range(w)]

    monkeypatch.setattr(bench, "_world_records", world)
    records = bench._push_part(2)
    assert asked == [(host_calls.call_costs, 2, "host_call", False)]
    assert [r["kind"] for r in records] == ["push", "host_call", "host_call"]
    assert all(r["busbw_GBps"] is None for r in records[1:])
