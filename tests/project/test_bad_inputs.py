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


def test_every_case_names_its_function_and_finding():
    """A failing row says what it was given to and why it is here."""
    unnamed = [(c.row, c.what) for c in CASES if not (c.function and c.finding)]
    assert unnamed == []
