"""The rules a notebook parameter's value must follow, and the ones every notebook shares.

A notebook's ``parameters`` cell declares each name, its default and so its type; ``labkit run``
refuses unknown names and wrong types from it. The VALUES are checked by rules built here, before
any cell runs: without them ``--set start_here.PROFILE=banana`` would run cells for seconds and die
with ``KeyError: 'banana'``, and ``HANG_TIMEOUT_S=-1`` as ``run_isolated``'s ``timeout``, naming
neither the parameter nor the notebook.

Each lab keeps its notebook's rules beside its story code (``labkit.labs.<lab>.parameters``,
``PARAMETERS``, built from the rules here, named by the lab's manifest); the runner applies them
(:mod:`labkit.app.runner.schema`). A rule takes a value and returns what is wrong with it, or "".

Every list rule bounds its length (``list_of``'s ``max_len`` has no default) and its items'
values: a list parameter is a loop in the notebook, and an unbounded one (``SWEEP_SIZES`` of 43
million items, ``COPY_SIZES_BYTES=[10**21]``) fails minutes later, or not at all, far from the
parameter that caused it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: a rule takes a value and returns what is wrong with it ("" if nothing)
Rule = Callable[[object], str]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def at_least(low: int) -> Rule:
    """An int >= low."""
    return lambda v: "" if _is_int(v) and v >= low else f"expected an int >= {low}, got {_short(v)}"


def int_range(low: int, high: int | Callable[[], int]) -> Rule:
    """An int from low to high (or to high(), computed when checked: it may need an import)."""

    def rule(v):
        top = high() if callable(high) else high
        return "" if _is_int(v) and low <= v <= top else f"expected an int from {low} to {top}, got {_short(v)}"

    return rule


def number(low: float, high: float | None = None, *, strict: bool = False) -> Rule:
    """A finite number >= low (> low when strict), and <= high where given."""
    sign = ">" if strict else ">="
    top = "" if high is None else f" and <= {high:g}"

    def rule(v):
        ok = _is_number(v) and math.isfinite(v) and (v > low if strict else v >= low)
        ok = ok and (high is None or v <= high)
        return "" if ok else f"expected a finite number {sign} {low:g}{top}, got {_short(v)}"

    return rule


def one_of(*choices, values: Callable[[], tuple] | None = None) -> Rule:
    """One of ``choices`` (or of ``values()``, computed when checked)."""

    def rule(v):
        allowed = tuple(values()) if values else choices
        return "" if v in allowed else f"{v!r} is not one of {', '.join(map(repr, allowed))}"

    return rule


def list_of(item: Rule, *, max_len: int, non_empty: bool = False) -> Rule:
    """A list of at most ``max_len`` items (at least one when ``non_empty``), each passing ``item``."""

    def rule(v):
        if not isinstance(v, (list, tuple)):
            return f"expected a list, got {_short(v)}"
        if non_empty and not v:
            return "expected at least one item, got []"
        if len(v) > max_len:
            return f"expected at most {max_len} items, got {len(v)}"
        for i, x in enumerate(v):
            bad = item(x)
            if bad:
                return f"item {i}: {bad}"
        return ""

    rule.max_len = max_len  # for the test that every list rule refuses max_len + 1 items
    return rule


def _short(v) -> str:
    """``repr(v)``, cut to a line (a refused value may be large)."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def optional(rule: Rule) -> Rule:
    """None (the notebook's default), or what ``rule`` allows."""
    return lambda v: "" if v is None else rule(v)


def _text(v) -> str:
    return "" if isinstance(v, str) and v else f"expected a non-empty string, got {_short(v)}"


COMMON: dict[str, Rule] = {
    "PROFILE": one_of("auto", "cpu", "gpu"),
    "REFERENCE_MACHINES": list_of(_text, max_len=64),
}
TRIALS = at_least(1)  # a check or measurement over 0 trials would show nothing, silently
SECONDS = number(0, strict=True)


__all__ = ["COMMON", "SECONDS", "TRIALS", "Rule", "at_least", "int_range", "list_of", "number", "one_of", "optional"]
