"""Misuse of the collectives on an emulated world of 2 ranks: each case is tried on every rank and must
give an error naming the function and the argument, never a hang, a crash or a silent wrong
answer. The rank functions are in tests/misuse_fns.py."""

import re
import time

import misuse_fns
import pytest
import rank_fns
from worlds import skip_without_a_world

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm.ranks import run_ranks
from labkit.workbench import tier

#: under pytest-xdist (make test) every test of this file runs in one worker: the worlds of its module fixtures
#: runs once, not once per worker
pytestmark = pytest.mark.xdist_group("collectives_misuse")


@pytest.fixture(scope="module")
def other_outs():
    skip_without_a_world()
    return run_ranks(misuse_fns.plan_launch_other_outs, 2, timeout=300).unwrap()


@pytest.mark.parametrize(
    "case, pattern",
    [
        ("smaller out", r"UsageError: plan\.launch: out: shape \(16,\) .*\(4096,\)"),
        ("larger out", r"UsageError: plan\.launch: out: shape \(8192,\) .*\(4096,\)"),
        ("same numel, other shape", r"UsageError: plan\.launch: out: shape \(64, 64\) .*\(4096,\)"),
        ("other dtype", r"UsageError: plan\.launch: out: dtype torch\.bfloat16 .*torch\.float32"),
        ("non-contiguous out", r"UsageError: plan\.launch: out: .*not contiguous"),
        ("other device", r"UsageError: plan\.launch: out: is on (meta|cpu)"),
        ("not a tensor", r"TypeError: plan\.launch: out: expected a torch\.Tensor or None, got list"),
        ("out in a peer's buffer", r"UsageError: plan\.launch: out: shares memory with rank \d's symmetric buffer"),
        ("new-tensor plan, smaller out", r"UsageError: plan\.launch: out: shape \(16,\) .*\(4096,\)"),
        ("in-place plan, another out", r"UsageError: plan\.launch: out: the plan computes in place"),
    ],
)
def test_plan_launch_refuses_an_out_it_was_not_made_for(other_outs, case, pattern):
    """``plan.launch(guard[:16])`` on a plan for 4096 elements overwrote 4080 elements past
    the view on both ranks."""
    for rank, found in enumerate(other_outs):
        assert re.match(pattern, found[case]), (rank, case, found[case])
        assert found["guard untouched"] is True, rank


def test_a_held_plan_refuses_its_out_re_strided(other_outs):
    for rank, found in enumerate(other_outs):
        assert found["held plan, out re-strided"].startswith("UsageError: plan: its out tensor moved"), rank
        assert found["re-strided guard untouched"] is True, rank


def test_plan_launch_still_takes_the_outs_it_can(other_outs):
    for rank, found in enumerate(other_outs):
        for k in ("own out", "another good out", "new tensor", "eager, cached"):
            assert found[k] is True, (rank, k, found)


@pytest.fixture(scope="module")
def disagreements():
    skip_without_a_world()
    return run_ranks(misuse_fns.ranks_disagree, 2, timeout=300).unwrap()


@pytest.mark.parametrize(
    "case, op, pattern",
    [
        ("algorithm", "all_reduce", r"algorithm \(rank 0: 'one_shot', rank 1: 'two_shot'\)"),
        ("blocks", "all_reduce", r"blocks \(rank 0: 1, rank 1: 2\)"),
        (
            "config",
            "all_reduce",
            r"config \(rank 0: LaunchConfig\(.*num_warps=4.*\), rank 1: LaunchConfig\(.*num_warps=8.*\)\)",
        ),
        ("variant", "all_reduce", r"variant \(rank 0: 'correct', rank 1: 'relaxed'\)"),
        ("in place or not", "all_reduce", r"out \(rank 0: buf\.tensor \(in place\), rank 1: a separate tensor\)"),
        (
            "another buffer",
            "all_reduce",
            r"buf \(rank 0: allocation #\d+, \(4096,\) float32, rank 1: allocation #\d+, \(4096,\) float32\)",
        ),
        ("another size", "all_reduce", r"buf \(rank 0: .*\(4096,\) float32, rank 1: .*\(2048,\) float32\)"),
        ("another dtype", "all_reduce", r"buf \(rank 0: .*\(4096,\) float32, rank 1: .*\(4096,\) bfloat16\)"),
        ("held plan, algorithm", "all_reduce", r"algorithm \(rank 0: 'tree', rank 1: 'one_shot'\)"),
        ("reduce_scatter blocks", "reduce_scatter", r"blocks \(rank 0: 1, rank 1: 2\)"),
        ("all_gather order", "all_gather", r"order \(rank 0: 'rotated', rank 1: 'naive'\)"),
        ("all_gather blocks", "all_gather", r"blocks \(rank 0: 1, rank 1: 2\)"),
        ("into blocks", "all_reduce_into", r"blocks \(rank 0: 1, rank 1: 2\)"),
        (
            "into config",
            "all_reduce_into",
            r"config \(rank 0: LaunchConfig\(.*num_warps=4.*\), rank 1: LaunchConfig\(.*num_warps=8.*\)\)",
        ),
        (
            "into another out",
            "all_reduce_into",
            r"out \(rank 0: allocation #(\d+), \(4096,\) float32, rank 1: allocation #(?!\1)\d+, \(4096,\) float32\)",
        ),
    ],
)
def test_ranks_that_disagree_get_an_error_naming_the_argument(disagreements, case, op, pattern):
    """``algorithm="one_shot"`` on rank 0 and ``"two_shot"`` on rank 1 (or blocks 1 and 2)
    hung rank 1 until run_ranks' timeout. Now every rank raises, naming what differs."""
    for rank, found in enumerate(disagreements):
        assert re.match(rf"UsageError: {op}: the ranks disagree on {pattern}; every rank must", found[case]), (
            rank,
            found[case],
        )
        assert found[case + ", then agreeing"] is True, (rank, case)


def test_the_ranks_exchange_once_per_new_set_of_arguments(disagreements):
    """Not per call, not per plan: three eager calls into new outs and a held plan of the same
    arguments, called three times, exchange once; a second set of arguments once more."""
    for found in disagreements:
        assert found["exchanges, one set of arguments"] == 1
        assert found["exchanges, a second set"] == 2


def test_push_with_counts_that_differ_by_rank_is_caught_by_the_protocol():
    """push with 256 elements on rank 0 and 128 on rank 1, after two good calls, summed
    rank 0's elements past rank 1's count with what rank 1 left in the inbox slot two calls
    earlier, silently. The count travels in a header beside the flag: that call's output is NaN on
    every rank, every rank counts it once, and the next agreeing call sums right (fp64 reference)."""
    skip_without_a_world()
    found = run_ranks(misuse_fns.push_counts_differ, 2, timeout=120).unwrap()
    for rank, f in enumerate(found):
        assert f["all NaN"] is True, (rank, f)
        assert f["disagreements"] == 1, (rank, f)
        assert f["next call's error"] <= 2 * 2**-24 * f["next call's scale"], (rank, f)


@pytest.fixture(scope="module")
def planted():
    skip_without_a_world()
    if not tier.interpreted():
        pytest.skip("the scratch files are the CPU emulation's (GPU buffers need none)")
    return run_ranks(misuse_fns.planted_scratch, 2, timeout=120).unwrap()


def test_symlinks_and_stale_files_in_the_scratch_folder_are_left_alone(planted):
    """a symlink ``symm1-data-rank0 -> victim.txt`` in ``scratch_dir`` had its target
    overwritten with the buffer, and non-zero pad files left by an earlier run hung both ranks."""
    for rank, found in enumerate(planted):
        assert found["sum"] == [3.0], rank
        assert found["victim"] == "precious" and found["victim after"] == "precious", rank
        assert found["planted untouched"] is True, rank
        assert found["left behind"] == [], (rank, found["left behind"])


def test_scratch_names_are_random_and_created_exclusively(planted):
    for rank, found in enumerate(planted):
        assert found["created"] and found["exclusive, no symlink followed"] is True, (rank, found["created"])
        assert len(found["tokens"]) == 2, (rank, found["created"])  # one per allocation
    assert planted[0]["tokens"] == planted[1]["tokens"]  # agreed by the ranks


def test_a_taken_scratch_name_is_an_error_on_every_rank(planted):
    for rank, found in enumerate(planted):
        assert re.match(
            r"UsageError: scratch_dir: .*rank \d.*labkit-symm-(ab){16}-3-data-rank\d", found["names taken"]
        ), (
            rank,
            found["names taken"],
        )


def test_a_rank_asking_something_new_while_its_peer_repeats_fails_at_once():
    """Both ranks agree on one_shot once; then rank 0 repeats it (its kept plan, no exchange on
    GPUs) while rank 1 asks two_shot: both waited until the world's timeout (reliability 15 b).
    In the emulated world every call posts its fingerprint, and a call that differs from the
    rank's last reads its peers' posts: rank 1 raises, rank 0 (in the kernel) is aborted, naming it."""
    skip_without_a_world()
    if not tier.interpreted():
        pytest.skip("the per-call posts are the emulated world's")
    t0 = time.monotonic()
    res = run_ranks(misuse_fns.algo_mismatch_after_agreed, 2, timeout=120)
    assert time.monotonic() - t0 < 60, res.summary()
    said = "all_reduce: the ranks disagree on algorithm (rank 0: 'one_shot', rank 1: 'two_shot'); every rank must"
    r0, r1 = res.results
    assert r1.status == "exception" and r1.message.startswith(said), res.summary()
    assert r0.status == "aborted" and said in r0.message, res.summary()


def test_calls_that_alternate_alike_on_every_rank_exchange_and_sum_right():
    skip_without_a_world()
    if not tier.interpreted():
        pytest.skip("the per-call posts are the emulated world's")
    for sums, exchanges in run_ranks(misuse_fns.alternate_calls, 2, timeout=120).unwrap():
        assert sums == [3.0] * 4
        assert exchanges == 4  # each call's fingerprint (buffer, algorithm) differs from the last


def test_a_rank_that_skips_a_call_is_named_in_the_timeout_lines():
    """Reliability 15 a and c: bounded, and saying what happened."""
    skip_without_a_world()
    if not tier.interpreted():
        pytest.skip("the per-call posts are the emulated world's")
    res = run_ranks(rank_fns.rank_0_catches_its_error, 2, timeout=60)
    assert res.values[0].startswith("caught") and "a peer left (returned or failed) without making it" in res.values[1]
    res = run_ranks(rank_fns.last_rank_skips_a_call, 3, timeout=8)
    assert [r.status for r in res.results] == ["timeout", "timeout", "ok"], res.summary()
    for r in res.results[:2]:
        assert r.where == "all_reduce (one_shot), call 2", r
