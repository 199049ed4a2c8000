"""``labkit.exercises``: the learner answers in a notebook cell, a check says in one line whether it is right.

Every lab's "Your turn" section holds exercises of three kinds:

* ``predict``: the learner writes a prediction (a value, a verdict); the check compares it with
  something that cannot vary from run to run: a model's verdict, a recorded file, an outcome
  fixed by the code;
* ``fix``: the cell holds the seed's buggy code; the learner fixes it; the check runs the code and
  observes the bug on the CPU tier (not only on GPUs);
* ``write``: the learner writes a piece (a launcher, a function); the check runs it.

How the parts fit:

1. A lab registers each exercise in its ``labkit/labs/<lab>/exercises.py`` with
   :func:`labkit.workbench.exercises.exercise`, decorating a *judge*: a function of the learner's
   answer that returns what it observed when the answer is right and raises
   :class:`~labkit.workbench.exercises.Wrong` (with what it observed) when not. The lab's manifest
   names that module; exercise ``NN.word`` belongs to the lab numbered ``NN``
   (:func:`labkit.app.catalogue.by_number`).
2. The notebook's answer cell is self-contained (it imports what it uses) and defines one name,
   the exercise's ``answer``; the cell carries ``{"labkit": {"answer": "<name>"}}`` in its
   metadata. The next cell calls ``labkit.exercises.check("<name>", <answer>)``.
3. :func:`check` prints one line, ``PASS`` with what was observed or ``FAIL`` with the reason and
   the hint, never the solution, and returns a bool. It never raises: a judge that raises anything
   but ``Wrong`` (the answer broke the check) is a failure with the exception named.
4. The solution of exercise ``NN.word`` is the file ``labkit/labs/<lab>/solutions/<word>.py``: the
   answer cell's text, solved. ``labkit run --solutions`` puts it in place of the starter
   (:func:`inject_solutions`) before the notebook runs; the learner's notebook never holds it.
5. Where ``labkit run`` executes a notebook, every check also appends its verdict to
   ``exercises.jsonl`` in the notebook's output folder, and the run summary counts them. The file
   is opened without following a symbolic link (one at that name is refused, and the verdict is
   not recorded); a line that is not a verdict is left out of the count and named in the summary.
   Notebook code can append to the file as well as a check can: the count is a report, not a grade.

Example::

    import labkit
    labkit.exercises.check("01.guard", launch)   # PASS 01.guard: ... / FAIL 01.guard: ... Hint: ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from labkit.app import catalogue
from labkit.workbench import gates, results
from labkit.workbench.errors import UsageError
from labkit.workbench.exercises import NAME, Exercise, Wrong, registered

#: the file, in a notebook's output folder, that collects its checks' verdicts
VERDICTS_FILE = "exercises.jsonl"


def _labs_with_exercises():
    return [lab for lab in catalogue.LABS if lab.exercises is not None]


def _load(number: str) -> None:
    lab = catalogue.by_number(number)
    if lab.exercises is not None:
        lab.load(lab.exercises)


def solution_path(exercise: Exercise) -> Path:
    """``labkit/labs/<lab>/solutions/<word>.py``, beside the lab's exercises module."""
    lab = catalogue.by_number(exercise.lab)
    return Path(lab.load(lab.exercises).__file__).parent / "solutions" / f"{exercise.word}.py"


def solution(name: str) -> str:
    """The text of exercise ``name``'s solution (what ``labkit run --solutions`` puts in place of
    the starter)."""
    return solution_path(get(name)).read_text()


def all_exercises() -> dict[str, Exercise]:
    """Every lab's exercises, by name (importing each lab's exercises module)."""
    for lab in _labs_with_exercises():
        lab.load(lab.exercises)
    return dict(sorted(registered().items()))


def get(name: str) -> Exercise:
    """The exercise ``name``; a UsageError naming the known ones otherwise."""
    m = NAME.match(name) if isinstance(name, str) else None
    if m and m.group(1) in {lab.number for lab in _labs_with_exercises()}:
        _load(m.group(1))
    found = registered().get(name)
    if found is None:
        known = ", ".join(all_exercises())
        raise UsageError(f"no exercise {name!r}; known: {known}")
    return found


def verdict(name: str, answer: Any) -> tuple[bool, str]:
    """(passed, the line check() prints), without printing: tests and the runner use it."""
    try:
        ex = get(name)
    except Exception as e:  # an unknown name, or a lab's exercises that do not import: said, not raised
        return False, f"FAIL {name}: {type(e).__name__}: {e}"
    if answer is Ellipsis:
        return False, f"FAIL {name}: not answered yet (the cell still holds `...`). Hint: {ex.hint}"
    try:
        seen = ex.judge(answer)
    except Wrong as e:
        return False, f"FAIL {name}: {e} Hint: {ex.hint}"
    except Exception as e:  # the answer broke the check: a failure, named, never a raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return False, f"FAIL {name}: checking your answer raised {type(e).__name__}: {first} Hint: {ex.hint}"
    return True, f"PASS {name}: {seen}"


def check(name: str, answer: Any) -> bool:
    """Check a learner's answer to exercise ``name``: print one line, PASS or FAIL, and return it.

    Args:
        name: the exercise, e.g. ``"01.guard"`` (the notebook's check cell names it).
        answer: the value the answer cell defined.

    Note:
        A failed check never raises: the notebook runs on, whatever the answer. Under ``labkit run``
        the verdict is also appended to ``exercises.jsonl`` in the notebook's output folder.

    Example::

        >>> import labkit
        >>> labkit.exercises.check("06.forbid", prediction)  # doctest: +SKIP
        PASS 06.forbid: ...
    """
    passed, line = verdict(name, answer)
    print(line)
    out = os.environ.get(results.OUTPUT_ENV)
    if out and Path(out).is_dir():
        record = json.dumps({"exercise": name, "passed": passed, "line": line}) + "\n"
        try:
            gates.append_line(Path(out) / VERDICTS_FILE, record)
        except gates.UnsafeFile as e:  # check never raises: say it, on one line
            print(f"labkit: verdict of {name} not recorded: {e}", file=sys.stderr)
    return passed


def _is_verdict(record) -> bool:
    return (
        isinstance(record, dict)
        and isinstance(record.get("exercise"), str)
        and isinstance(record.get("passed"), bool)
        and isinstance(record.get("line", ""), str)
    )


def read_verdicts(folder: str | os.PathLike, bad_lines: list | None = None) -> list[dict]:
    """The verdicts a notebook's checks wrote into its output folder (empty if none ran).

    A line that is not a verdict (not JSON, or not ``{"exercise": str, "passed": bool, "line":
    str}``) is left out; ``bad_lines``, if given, gets one entry per such line, naming the file,
    the line's number and what is wrong. So does a file that is a symbolic link (not read)."""
    return gates.read_jsonl(Path(folder) / VERDICTS_FILE, _is_verdict, "a verdict", bad_lines)


def answer_cells(nb) -> dict[str, Any]:
    """The notebook's answer cells, by exercise name (cells whose metadata names one)."""
    found = {}
    for cell in nb.cells:
        name = cell.get("metadata", {}).get("labkit", {}).get("answer")
        if name:
            if name in found:
                raise UsageError(f"two answer cells for exercise {name}")
            found[name] = cell
    return found


def exercise_cells(nb) -> list:
    """The cells that hold a notebook's exercises, in order: the first (title) cell, the
    parameters cell, ``import labkit``, then for every answer cell the markdown cell before it
    (its statement), the answer cell and the code cells after it that call ``exercises.check``."""
    import nbformat

    cells = nb.cells
    keep = [0] + [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    for i, cell in enumerate(cells):
        if not cell.get("metadata", {}).get("labkit", {}).get("answer"):
            continue
        if i > 0 and cells[i - 1].cell_type == "markdown":
            keep.append(i - 1)
        keep.append(i)
        j = i + 1
        while j < len(cells) and cells[j].cell_type == "code" and "exercises.check(" in cells[j].source:
            keep.append(j)
            j += 1
    chosen = [cells[i] for i in sorted(set(keep))]
    at = 2 if len(chosen) > 1 else len(chosen)
    importer = nbformat.v4.new_code_cell("import labkit  # picks the tier first")
    importer.id = "exercises-import-labkit"
    return chosen[:at] + [importer] + chosen[at:]


def inject_solutions(nb) -> list[str]:
    """Replace every answer cell's starter with its solution, in place; returns the names solved."""
    solved = []
    for name, cell in answer_cells(nb).items():
        cell.source = solution(name).rstrip("\n")
        solved.append(name)
    return solved
