"""What each notebook parameter may hold: one schema per notebook, checked before any cell runs.

A notebook's ``parameters`` cell declares each name, its default and so its type; ``labkit run``
refuses unknown names and wrong types from it (``notebooks.validate``). The VALUES are checked
here: ``--set 00_start_here.PROFILE=banana`` used to run 11 cells for 25 s and die with
``KeyError: 'banana'``, and ``HANG_TIMEOUT_S=-1`` died as ``run_isolated``'s ``timeout``, naming
neither the parameter nor the notebook.

``SCHEMAS[notebook][NAME]`` is a rule; ``check(notebook, params)`` applies them and raises a
``RunError`` naming the notebook, the parameter and what it expected. A test keeps the schemas
in step with the notebooks: every rule names a parameter of its notebook, and every default and
every value in ``profiles.yml`` passes. A name without a rule is checked for its type only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from labkit.workbench.runner.notebooks import RunError

#: a rule takes a value and returns what is wrong with it ("" if nothing)
Rule = Callable[[object], str]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def at_least(low: int) -> Rule:
    """An int >= low."""
    return lambda v: "" if _is_int(v) and v >= low else f"expected an int >= {low}, got {v!r}"


def int_range(low: int, high: Callable[[], int]) -> Rule:
    """An int from low to high() (high computed when checked: it may need an import)."""

    def rule(v):
        top = high()
        return "" if _is_int(v) and low <= v <= top else f"expected an int from {low} to {top}, got {v!r}"

    return rule


def number(low: float, *, strict: bool = False) -> Rule:
    """A finite number >= low (> low when strict)."""
    sign = ">" if strict else ">="

    def rule(v):
        ok = _is_number(v) and math.isfinite(v) and (v > low if strict else v >= low)
        return "" if ok else f"expected a finite number {sign} {low:g}, got {v!r}"

    return rule


def one_of(*choices, values: Callable[[], tuple] | None = None) -> Rule:
    """One of ``choices`` (or of ``values()``, computed when checked)."""

    def rule(v):
        allowed = tuple(values()) if values else choices
        return "" if v in allowed else f"{v!r} is not one of {', '.join(map(repr, allowed))}"

    return rule


def list_of(item: Rule, *, non_empty: bool = False) -> Rule:
    """A list whose every item passes ``item``."""

    def rule(v):
        if not isinstance(v, (list, tuple)):
            return f"expected a list, got {v!r}"
        if non_empty and not v:
            return "expected at least one item, got []"
        for i, x in enumerate(v):
            bad = item(x)
            if bad:
                return f"item {i}: {bad}"
        return ""

    return rule


def optional(rule: Rule) -> Rule:
    """None (the notebook's default), or what ``rule`` allows."""
    return lambda v: "" if v is None else rule(v)


def _text(v) -> str:
    return "" if isinstance(v, str) and v else f"expected a non-empty string, got {v!r}"


def _litmus_tests() -> tuple:
    from labkit.kernels.litmus import catalogue

    return tuple(catalogue.TESTS)


def _litmus_semantics() -> tuple:
    from labkit.kernels.litmus import model

    return model.SEMANTICS


def _litmus_most() -> int:
    from labkit.kernels.litmus.run import max_instances

    return max_instances(4)


def _all_reduce_forms() -> tuple:
    from labkit.labs.memory_model.broken_barriers import FORMS

    return FORMS


def _stresses() -> tuple:
    from labkit.labs.memory_model.sweep import STRESSES

    return tuple(STRESSES)


COMMON: dict[str, Rule] = {
    "PROFILE": one_of("auto", "cpu", "gpu"),
    "REFERENCE_MACHINES": list_of(_text),
}
TRIALS = at_least(1)  # a check or measurement over 0 trials would show nothing, silently
SECONDS = number(0, strict=True)

SCHEMAS: dict[str, dict[str, Rule]] = {
    "00_start_here": {
        **COMMON,
        "COPY_SIZES_BYTES": list_of(at_least(1)),
        "REPS": at_least(0),  # 0: the profile's default
        "HANG_TIMEOUT_S": SECONDS,
    },
    "01_wrong_device": {
        **COMMON,
        "MATRIX_BYTES": optional(at_least(1)),
        "CELL_TIMEOUT_S": SECONDS,
        "EXACTNESS_TRIALS": TRIALS,
        "MODEL_LAYERS": at_least(1),
        "NEW_TOKENS": at_least(1),
    },
    "02_collectives": {
        **COMMON,
        "WORLD_SIZES": list_of(at_least(2)),  # symmetric memory needs two ranks or more
        "CHECK_ELEMENTS": at_least(1),
        "BROKEN_TRIALS": TRIALS,
        "BROKEN_ELEMENTS": at_least(1),
        "LATE_US": number(0),
        "BROKEN_LOAD": one_of("late", "gemm"),
    },
    "03_stream_races": {
        **COMMON,
        "RACE_TRIALS": TRIALS,
        "RACE_SLEEPS_MS": list_of(number(0), non_empty=True),
        "RACE_NUMEL": optional(at_least(1)),
        "WGRAD_TRIALS": TRIALS,
        "SANITIZER_TRIALS": TRIALS,
        "GEMM_SIZE": at_least(1),
        "ALLOC_GROUPS": at_least(1),
    },
    "04_grouped_gemm": {
        **COMMON,
        "CHECK_TRIALS": TRIALS,
        "CHECK_TOKENS": at_least(38),  # the fixed split [7, 0, 31, CHECK_TOKENS - 38]
        "CHECK_K": at_least(1),
        "CHECK_N": at_least(1),
    },
    "05_fp8_dispatch": {
        **COMMON,
        "SIZE": number(0),  # 0: the profile's
        "STEPS": at_least(1),
        "CELL_TIMEOUT_S": SECONDS,
        "DRIFT_STEPS": at_least(1),
    },
    "06_memory_model": {
        **COMMON,
        "LIVE_INSTANCES": int_range(1, _litmus_most),
        "LIVE_TESTS": list_of(one_of(values=_litmus_tests), non_empty=True),
        "LIVE_STRESS": one_of(values=_stresses),
        "BROKEN_TRIALS": TRIALS,
        "BROKEN_DELAYS": list_of(at_least(0), non_empty=True),
        "BROKEN_FORMS": list_of(one_of(values=_all_reduce_forms), non_empty=True),
        "TWO_GPU_SEMANTICS": list_of(one_of(values=_litmus_semantics), non_empty=True),
    },
}


def check(notebook: str, params: dict) -> None:
    """Raise RunError naming the first parameter of ``params`` its notebook's schema refuses.
    A notebook without a schema (a reader's own, a test's fixture) gets the common rules only
    for the names it has."""
    rules = SCHEMAS.get(notebook, COMMON)
    for name, value in params.items():
        rule = rules.get(name)
        bad = rule(value) if rule else ""
        if bad:
            raise RunError(f"notebook {notebook}: parameter {name}: {bad}")


__all__ = ["SCHEMAS", "COMMON", "check"]
