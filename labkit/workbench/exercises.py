"""The exercise decorator a lab's ``exercises`` module uses, and :class:`Wrong`, which its judges raise.

Every lab's "Your turn" section holds exercises of three kinds:

* ``predict``: the learner writes a prediction (a value, a verdict); the check compares it with
  something that cannot vary from run to run: a model's verdict, a recorded file, an outcome
  fixed by the code;
* ``fix``: the cell holds the seed's buggy code; the learner fixes it; the check runs the code and
  observes the bug on the CPU tier (not only on GPUs);
* ``write``: the learner writes a piece (a launcher, a function); the check runs it.

A lab registers each exercise in its ``labkit/labs/<lab>/exercises.py`` with :func:`exercise`,
decorating a *judge*: a function of the learner's answer that returns what it observed when the
answer is right and raises :class:`Wrong` (with what it observed) when not. This module checks
only the shape of a name (``"NN.word"``); which lab ``NN`` is, and the check a notebook calls
(``labkit.exercises.check``), are the application's (:mod:`labkit.app.exercises`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from labkit.workbench.errors import UsageError

KINDS = ("predict", "fix", "write")
NAME = re.compile(r"^(\d\d)\.([a-z][a-z0-9_]*)$")


class Wrong(Exception):
    """Raised by a judge: the answer is wrong; the message says what was observed."""


def expect_choices(name: str, answer, keys, choices) -> dict:
    """A prediction given as a dict: exactly ``keys``, each value one of ``choices``; Wrong,
    naming ``name`` and what differs, otherwise. Returns the answer."""
    if not isinstance(answer, dict) or set(answer) != set(keys):
        raise Wrong(f"`{name}` must be a dict with the keys {list(keys)}; got {answer!r:.80}.")
    bad = {k: v for k, v in answer.items() if v not in choices}
    if bad:
        raise Wrong(f"each value of `{name}` is one of {list(choices)}; got {bad}.")
    return answer


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exercise:
    name: str  # "01.guard": the lab's number, a dot, a word
    kind: str  # one of KINDS
    question: str  # one line: what the learner does
    answer: str  # the name the answer cell defines; its value is what check() is given
    hint: str  # shown on a failure; never the solution
    judge: Callable[[Any], str]  # answer -> what was observed; raises Wrong

    @property
    def lab(self) -> str:
        return self.name.split(".")[0]

    @property
    def word(self) -> str:
        return self.name.split(".")[1]


_REGISTRY: dict[str, Exercise] = {}


def exercise(name: str, *, kind: str, question: str, answer: str, hint: str):
    """Decorator: register the decorated judge as exercise ``name``.

    Args:
        name: ``"NN.word"``: the lab's number (its notebook's prefix), a dot, a word.
        kind: ``"predict"``, ``"fix"`` or ``"write"``.
        question: what the learner does, in one line.
        answer: the name the notebook's answer cell defines.
        hint: one or two sentences pointing the way, without the answer.
    """
    m = NAME.match(name) if isinstance(name, str) else None
    if not m:
        raise UsageError(f"exercise: name {name!r} must be 'NN.word': a lab's two-digit number, a dot, a word")
    if kind not in KINDS:
        raise UsageError(f"exercise {name}: kind {kind!r} must be one of {KINDS}")
    if not (isinstance(answer, str) and answer.isidentifier()):
        raise UsageError(f"exercise {name}: answer {answer!r} must be a Python name")

    def register(judge: Callable[[Any], str]) -> Callable[[Any], str]:
        if name in _REGISTRY and _REGISTRY[name].judge.__qualname__ != judge.__qualname__:
            raise UsageError(f"exercise {name} is registered twice")
        _REGISTRY[name] = Exercise(name=name, kind=kind, question=question, answer=answer, hint=hint, judge=judge)
        return judge

    return register


def registered() -> dict[str, Exercise]:
    """The exercises registered so far (by the lab ``exercises`` modules imported so far), by name."""
    return dict(_REGISTRY)
