"""Every notebook: committed stripped, parameters first, hardware stated, every cell with its
own id, profile overrides naming real parameters, and executing top to bottom under papermill in
this machine's tier with its figures shown inline."""

import dataclasses
import json
import os
import re
import warnings
from pathlib import Path

import pytest
from nbformat.warnings import MissingIDFieldWarning

from labkit.app import catalogue, exercises
from labkit.app.runner import notebooks as nbs
from labkit.app.runner import profiles, run
from labkit.app.runner.child import execute as _execute
from labkit.app.runner.execute import resolve_jobs

NOTEBOOKS = nbs.discover()


def test_there_are_notebooks():
    assert "start_here" in NOTEBOOKS


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_stripped_with_parameters_first(name):
    nb = nbs.read(NOTEBOOKS[name])
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    assert nbs.parameters_cell(nb) is not None, "first code cell must be tagged 'parameters'"
    assert nb.cells[0].cell_type == "markdown" and "**Hardware:**" in nb.cells[0].source, (
        "the first cell must state the hardware the notebook needs"
    )
    assert nbs.parameters(nb), "the parameters cell defines no parameter"


#: nbformat 4.5's schema for a cell id
CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _cell_id_problems(cells) -> list[str]:
    ids = [c.get("id") for c in cells]
    problems = [f"cell {i} has no id" for i, x in enumerate(ids) if x is None]
    problems += [
        f"cell {i} has an invalid id {x!r}"
        for i, x in enumerate(ids)
        if x is not None and not (isinstance(x, str) and CELL_ID.fullmatch(x))
    ]
    problems += [
        f"cell id {x!r} is used {ids.count(x)} times" for x in sorted(set(ids) - {None}, key=str) if ids.count(x) > 1
    ]
    return problems


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_cells_have_unique_valid_ids(name):
    """Read as raw JSON: nbformat.read fills in missing ids in memory (with a MissingIDFieldWarning)."""
    doc = json.loads(NOTEBOOKS[name].read_text(encoding="utf-8"))
    assert (doc["nbformat"], doc["nbformat_minor"]) >= (4, 5), "nbformat 4.5 or later: cells carry ids"
    assert not _cell_id_problems(doc["cells"]), (
        f"{name}: {'; '.join(_cell_id_problems(doc['cells']))} (nbformat.validator.normalize adds the missing ones)"
    )


def test_runner_prepares_every_notebook_without_missing_id_warning(tmp_path):
    """The runner's steps before a kernel starts (its own read of each notebook, papermill's read,
    parameter injection and write) under the cpu profile's parameters, with the warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingIDFieldWarning)
        _, jobs = resolve_jobs(profile="cpu")
        for name, path, params, timeout, _needs in jobs:
            out = tmp_path / f"{name}.ipynb"
            assert _execute(str(path), str(out), params, str(path.parent), timeout, prepare_only=True) == {
                "status": "ran"
            }
            cells = json.loads(out.read_text(encoding="utf-8"))["cells"]
            assert any("injected-parameters" in c["metadata"].get("tags", []) for c in cells) or not params
            assert not _cell_id_problems(cells), f"{name}: {_cell_id_problems(cells)}"


def test_runner_gives_the_kernel_the_inline_backend(tmp_path, monkeypatch):
    """Whatever MPLBACKEND the caller exports, the notebook's process tree gets matplotlib-inline."""
    from helpers import fixture_workbook

    from labkit.app.runner import execute
    from labkit.workbench import sandbox

    folder, prof = fixture_workbook(tmp_path / "nb")
    seen = []

    def fake_run_isolated(fn, *args, env=None, **kwargs):
        seen.append(env)
        return sandbox.SandboxResult(status="ok", value={"status": "ran"})

    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setattr(execute.sandbox, "run_isolated", fake_run_isolated)
    run(
        only=["ok"], profile="cpu", runs_dir=tmp_path / "runs", notebooks_dir=folder, profiles_file=prof, progress=False
    )
    assert seen and seen[0]["MPLBACKEND"] == "module://matplotlib_inline.backend_inline"


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_profile_overrides_name_real_parameters(profile):
    prof = profiles.load()[profile]
    for name, entry in (prof.get("notebooks") or {}).items():
        assert name in NOTEBOOKS, f"profiles.yml: {profile}.{name} is not a notebook"
        nbs.validate(name, entry.get("parameters") or {}, nbs.parameters(NOTEBOOKS[name]))


@pytest.mark.notebook
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_executes(name, executed_notebooks):
    # Executed with MPLBACKEND=Agg exported, as on a headless GPU node (or read from the run
    # LABKIT_EXECUTED_RUN names, which .ci/run makes the same way): the runner still gives the
    # kernel the inline backend, so every figure is in the executed notebook, not only on disk.
    done = executed_notebooks(name)
    res = done.result
    assert res.status == "ran", f"{name}: {res.line()}"
    for part in res.skipped_parts:
        print(f"{name}: part skipped here: {part['part']}: {part['reason']}")
    cells = json.loads(done.notebook.read_text(encoding="utf-8"))["cells"]
    assert not _cell_id_problems(cells), f"{name}: {_cell_id_problems(cells)}"
    images = 0
    for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        outputs = cell.get("outputs", [])
        shown = sum("image/png" in o.get("data", {}) for o in outputs)
        saved = [
            line
            for o in outputs
            if o["output_type"] == "stream"
            for line in "".join(o["text"]).splitlines()
            if re.match(r"saved .*\.png$", line)
        ]
        assert shown >= len(saved), f"{name}: code cell {i} saved {saved} but shows {shown} image(s) inline"
        images += shown
    assert images >= len(res.figures), f"{name}: {len(res.figures)} figures saved, {images} shown inline"
    # the learner's notebook as committed: every exercise's check ran and failed on its starter
    mine = sorted(n for n in exercises.all_exercises() if n.split(".")[0] == catalogue.get(name).number)
    assert sorted(v["exercise"] for v in res.exercises) == mine, f"{name}: the checks that ran"
    assert not [v["line"] for v in res.exercises if v["passed"]], f"{name}: a starter passed its check"


@pytest.fixture(scope="session")
def solutions_run(tmp_path_factory):
    """Every notebook's exercise cells with the solutions in place (``labkit run --solutions
    --exercises-only``), or the run that ``LABKIT_SOLUTIONS_RUN`` names (.ci/run makes it)."""
    given = os.environ.get("LABKIT_SOLUTIONS_RUN")
    if given:
        summary = json.loads((Path(given) / "summary.json").read_text())
        assert summary["complete"] and summary["solutions"], f"LABKIT_SOLUTIONS_RUN={given}: not a solutions run"
        return {r["name"]: r for r in summary["results"]}
    report = run(
        profile="cpu",
        runs_dir=tmp_path_factory.mktemp("solutions"),
        progress=False,
        solutions=True,
        exercises_only=True,
    )
    return {r.name: dataclasses.asdict(r) for r in report.results}


@pytest.mark.notebook
@pytest.mark.xdist_group("solutions")  # one pytest-xdist worker runs them all: solutions_run executes once
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_every_solution_passes_its_check_in_the_notebook(name, solutions_run):
    res = solutions_run[name]
    assert res["status"] == "ran", f"{name}: {res['status']}: {res['detail']}"
    mine = sorted(n for n in exercises.all_exercises() if n.split(".")[0] == catalogue.get(name).number)
    assert sorted(v["exercise"] for v in res["exercises"]) == mine
    assert all(v["passed"] for v in res["exercises"]), [v["line"] for v in res["exercises"] if not v["passed"]]
