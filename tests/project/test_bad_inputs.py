"""Every case of tests/bad_inputs.py, checked against the verdict labkit must give: an error naming
the argument, or the right answer."""

import re

import pytest
from bad_inputs import CASES


def _id(case) -> str:
    return f"row{case.row:03d}-" + re.sub(r"[^A-Za-z0-9]+", "_", case.what).strip("_")[:60]


@pytest.mark.parametrize("case", [pytest.param(c, id=_id(c), marks=c.marks) for c in CASES])
def test_bad_input(case):
    case.verdict.check(case.call)
