"""Lab 02's findings in words: each sentence is computed from the records beside it."""

import pytest

import labkit  # noqa: F401  (must precede kernel imports)
from labkit.kernels.comm import collectives as C
from labkit.labs.collectives import findings, sweep_bench
from labkit.workbench import results


def _sweep(impl, nbytes, graph_us, us=None, w=2, op="all_reduce", busbw=None):
    return {
        "kind": "sweep",
        "impl": impl,
        "op": op,
        "world_size": w,
        "bytes": nbytes,
        "dtype": "bfloat16",
        "graph_us": graph_us,
        "us": us or graph_us * 1.5,
        "graph_busbw_GBps": busbw,
        "correct": True,
    }


def test_sweep_in_words_counts_and_names_what_trails():
    small, big = 4 << 10, 256 << 20
    recs = [
        _sweep("labkit_one_shot", small, 10.0),
        _sweep("labkit_two_shot", small, 12.0),
        _sweep("torch_one_shot", small, 8.0),
        _sweep("nccl", small, 20.0),
        _sweep("labkit_one_shot", big, 900.0, busbw=300.0),
        _sweep("labkit_two_shot", big, 800.0, busbw=330.0),
        _sweep("torch_two_shot", big, 820.0, busbw=320.0),
        _sweep("nccl", big, 850.0, busbw=310.0),
    ]
    text = findings.sweep_in_words(recs, 2)
    assert text.startswith("**W=2**")
    assert "x1.25 of the best peer's time under graph replay (faster at 0 of 1 sizes)" in text
    assert "4 KiB x1.25 (one_shot against torch_one_shot)" in text
    # the chooser's own tables pick the call (read from the recorded sweeps), not these records
    if C.choose(big, 2) == "one_shot":
        assert "as fast as the best peer or faster at 0 of 1 sizes" in text
        assert "256 MiB x1.10 (one_shot against torch_two_shot)" in text
    else:
        assert "as fast as the best peer or faster at 1 of 1 sizes" in text
    assert "two_shot, 330" in text and "NCCL 310" in text
    assert "two-shot is faster at every size above 4 KiB" in text
    assert findings.sweep_in_words(recs, 4) == ""


def test_wrong_or_unchecked_points_are_left_out():
    recs = [_sweep("labkit_one_shot", 4096, 1.0), _sweep("torch_one_shot", 4096, 8.0)]
    recs[0]["correct"] = False  # a wrong result is no speed
    assert "labkit trails" not in findings.sweep_in_words(recs, 2)
    assert "chosen all-reduce takes" not in findings.sweep_in_words(recs, 2)


def test_slowed_reader_counts():
    rows = [
        {"algorithm": a, "variant": "no_end_barrier", "delay": d, "trials": 60, "wrong_results": n}
        for a, d, n in (("one_shot", 1000, 58), ("two_shot", 10000, 60), ("one_shot", 100, 3))
    ]
    assert findings.slowed_reader_in_words(rows).startswith("58-60 wrong of 60 calls in each of the 2 forms")
    assert findings.slowed_reader_in_words(rows, variant="relaxed") == ""


@pytest.mark.parametrize("machine", sorted(results.load_references("collectives")))
def test_every_recorded_sweep_renders(machine):
    rs = results.load_references("collectives")[machine]
    links = results.load_references("collectives_links").get(machine)
    for w in sorted({r["world_size"] for r in rs.records if r.get("kind", "sweep") == "sweep"}):
        text = findings.sweep_in_words(rs.records, w)
        assert f"**W={w}**" in text and "one-shot or two-shot" in text
        cross = sweep_bench.crossover_bytes(rs.records, w, "graph_us")
        assert (cross is None) == ("one-shot is at least as fast at every size" in text)
        if links:
            assert "the links carry" in findings.pulls_against_links(rs.records, links.records, w)
            if any(r.get("kind") == "ce_profile" and r["world_size"] == w for r in rs.records):
                assert "which allows at most" in findings.two_shot_ce_bound(rs.records, links.records, w)


def test_the_two_shot_ce_bound_is_the_harmonic_mean_and_needs_shots_in_turn():
    def link(impl, gbps):
        base = {"kind": "link", "impl": impl, "direction": "both", "world_size": 2, "bytes": 1 << 28}
        return base | {"correct": True, "GBps": gbps}

    def profile(rank, name, start, us):
        activity = "memcpy" if name == "copy" else "kernel"
        base = {"kind": "ce_profile", "world_size": 2, "rank": rank, "activity": activity, "name": name}
        return base | {"start_us": start, "us": us}

    sweep = [_sweep("labkit_two_shot_ce_in_place", 1 << 28, 700.0, w=2) | {"graph_busbw_GBps": 350.0}]
    links = [link("memcpy_write", 400.0), link("sm_write", 300.0), link("sm_read", 250.0)]
    shots = (("copy", 0.0, 10.0), ("two_shot_ce_kernel", 12.0, 5.0))
    in_turn = [profile(r, n, s, u) for r in (0, 1) for n, s, u in shots]
    text = findings.two_shot_ce_bound(sweep + in_turn, links, 2)
    # 2 / (1/400 + 1/300) = 342.9: the kernel reaches 350, more than the bound says it can
    assert "allows at most 343 GB/s busbw (0.86x the fastest copy, 400)" in text and "(1.02x that bound)" in text
    overlapped = [p | {"start_us": 5.0} if p["name"] == "two_shot_ce_kernel" and p["rank"] == 1 else p for p in in_turn]
    assert findings.two_shot_ce_bound(sweep + overlapped, links, 2) == ""  # no claim when the shots overlap
    assert findings.two_shot_ce_bound(sweep, links, 2) == ""  # nor without a profile
    assert findings.two_shot_ce_bound(sweep + in_turn, [], 2) == ""


def test_talk_questions_from_records():
    recs = [
        _sweep("labkit_one_shot", 4096, 10.0, w=4),
        _sweep("labkit_two_shot", 4096, 8.0, w=4),
        _sweep("labkit_tree", 4096, 12.0, w=4),
        {
            "kind": "gather_order",
            "order": "naive",
            "world_size": 4,
            "shard_bytes": 1 << 20,
            "us": 22.0,
            "ratio_to_rotated": 1.17,
            "ratio_p25": 1.13,
            "ratio_p75": 1.18,
        },
        {"kind": "crash", "world_size": 4, "statuses": ["aborted", "illegal_memory_access"]},
    ]
    text = findings.talk_questions(recs, 4)
    assert "x1.17 (1.13-1.18) at 1 MiB per rank" in text
    assert "Where one-shot gives way to two-shot** (graph replay): two-shot is faster at every size." in text
    assert "x1.50 of labkit's faster of one-shot and two-shot" in text
    assert "illegal_memory_access" in text
    assert findings.talk_questions(recs, 2) == ""
