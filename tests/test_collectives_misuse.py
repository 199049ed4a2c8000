"""Misuse of the collectives on an emulated world of 2 ranks (Part 2 of the bad-input report,
/work/shared/bad-inputs.md, the rows this suite fixes): each case is tried on every rank and must
give an error naming the function and the argument, never a hang, a crash or a silent wrong
answer. The rank functions are in tests/misuse_fns.py."""

import re

import misuse_fns
import pytest
from worlds import skip_without_a_world

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm.ranks import run_ranks


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
    """Part 2: ``plan.launch(guard[:16])`` on a plan for 4096 elements overwrote 4080 elements past
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
