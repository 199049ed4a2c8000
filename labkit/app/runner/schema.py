"""Each notebook's parameter schema, checked before any cell runs.

``schema_of(notebook)`` is :data:`labkit.workbench.parameters.COMMON` plus the rules of the lab the
notebook belongs to (its manifest's ``parameters``); ``check(notebook, params)`` applies them and
raises a ``RunError`` naming the notebook, the parameter and what it expected. A test keeps the
schemas in step with the notebooks: every rule names a parameter of its notebook, and every
default and every value in ``profiles.yml`` passes. A name without a rule is checked for its type
only.
"""

from __future__ import annotations

from labkit.app import catalogue
from labkit.app.runner.notebooks import RunError
from labkit.workbench.parameters import COMMON, Rule


def schema_of(notebook: str) -> dict[str, Rule]:
    """The rules for ``notebook``'s parameters (its name: a lab's, ``"stream_races"``): ``COMMON``
    and its lab's own. A notebook the catalogue does not know (a reader's own, a test's fixture)
    gets ``COMMON``."""
    lab = next((lab for lab in catalogue.LABS if lab.name == notebook), None)
    if lab is None or lab.parameters is None:
        return COMMON
    return {**COMMON, **lab.load(lab.parameters)}


def schemas() -> dict[str, dict[str, Rule]]:
    """``schema_of`` for every lab of the catalogue."""
    return {lab.name: schema_of(lab.name) for lab in catalogue.LABS}


def check(notebook: str, params: dict) -> None:
    """Raise RunError naming the first parameter of ``params`` its notebook's schema refuses.
    A notebook without a schema (a reader's own, a test's fixture) gets the common rules only
    for the names it has."""
    rules = schema_of(notebook)
    for name, value in params.items():
        rule = rules.get(name)
        bad = rule(value) if rule else ""
        if bad:
            raise RunError(f"notebook {notebook}: parameter {name}: {bad}")
