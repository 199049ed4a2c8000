"""Every row of /work/shared/bad-inputs.md in this change's scope (tests/bad_inputs.py), checked
against the verdict labkit must give now: an error naming the argument, or the right answer."""

import re

import pytest
from bad_inputs import CASES


def _id(case) -> str:
    return f"row{case.row:03d}-" + re.sub(r"[^A-Za-z0-9]+", "_", case.what).strip("_")[:60]


@pytest.mark.parametrize("case", [pytest.param(c, id=_id(c), marks=c.marks) for c in CASES])
def test_bad_input(case):
    case.verdict.check(case.call)


def test_the_rows_are_those_of_the_document():
    """Part 1's rows 1-189: each has at least one case."""
    assert sorted({c.row for c in CASES}) == list(range(1, 190))
