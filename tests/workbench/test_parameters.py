"""The rules of ``labkit.workbench.parameters``: each returns what is wrong with a value, or ""."""

import pytest

from labkit.workbench.parameters import at_least, int_range, list_of, number


def test_a_list_rule_needs_a_length_bound():
    with pytest.raises(TypeError):
        list_of(at_least(1))  # max_len has no default: an unbounded list is a loop of any length
    rule = list_of(at_least(1), max_len=3, non_empty=True)
    assert rule([1, 2, 3]) == "" and rule.max_len == 3
    assert rule([1, 2, 3, 4]) == "expected at most 3 items, got 4"
    assert rule([]) == "expected at least one item, got []"
    assert rule([1, 0]).startswith("item 1: expected an int >= 1")


def test_bounds_and_short_messages():
    assert int_range(1, 10)(11) == "expected an int from 1 to 10, got 11"
    assert int_range(1, lambda: 5)(5) == ""
    assert number(0, 10)(10.5) == "expected a finite number >= 0 and <= 10, got 10.5"
    assert number(0, strict=True)(0) == "expected a finite number > 0, got 0"
    bad = list_of(at_least(1), max_len=2)([[1] * 1000])
    assert bad.startswith("item 0: expected an int >= 1, got [1, 1") and bad.endswith("...") and len(bad) < 140
