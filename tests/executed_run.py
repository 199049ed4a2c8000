"""The workbook's notebooks as executed for the tests: each at most once per test session.

With ``LABKIT_EXECUTED_RUN`` set to a run folder of ``labkit run`` (``make workbook`` writes
``runs/<timestamp>_cpu/``), the notebook tests read the notebooks executed there instead of
executing them again: CI executes every notebook once (``make workbook``) and the tests check that
run. The folder must hold a complete run of every notebook, under the profile this machine picks,
with the parameters the profile gives today and the notebooks' cells as committed; anything else
fails the test that asked, saying what differs (a stale or partial run is never checked in place
of the notebooks). Unset, each notebook is executed the first time a test asks for it (with
MPLBACKEND=Agg exported, as on a headless GPU node: the runner must still give the kernel the
inline backend) and every later test of the session reads that execution.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import nbformat
import pytest

from labkit.app.runner import notebooks as nbs
from labkit.app.runner import run
from labkit.app.runner.execute import NotebookResult, choose_profile, resolve_jobs

#: the environment variable naming a run folder to read instead of executing (docs/testing.md)
ENV = "LABKIT_EXECUTED_RUN"


@dataclasses.dataclass
class Executed:
    """One notebook's outcome and the run folder holding it (``result.output`` is relative to it)."""

    result: NotebookResult
    run_dir: Path

    @property
    def notebook(self) -> Path | None:
        return self.run_dir / self.result.output if self.result.output else None


class ExecutedRun:
    """The session's executed notebooks: read from ``run_dir`` when given, else executed into
    ``runs_dir`` on first request (one run folder per notebook)."""

    def __init__(self, run_dir: Path | None, runs_dir: Path):
        self.given = Path(run_dir) if run_dir else None
        self.runs_dir = Path(runs_dir)
        self._done: dict[str, Executed] = {}
        self._summary: dict | None = None

    def __call__(self, name: str) -> Executed:
        if name not in self._done:
            self._done[name] = self._read(name) if self.given else self._execute(name)
        return self._done[name]

    def run_dirs(self) -> list[Path]:
        """The run folders the notebooks asked for so far live in (the given one, if any)."""
        return [self.given] if self.given else sorted({e.run_dir for e in self._done.values()})

    def _execute(self, name: str) -> Executed:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MPLBACKEND", "Agg")
            rep = run(only=[name], runs_dir=self.runs_dir, progress=False)
        (res,) = rep.results
        return Executed(res, rep.run_dir)

    def summary(self) -> dict:
        """The given run's summary.json, checked once: complete, and under this machine's profile."""
        if self._summary is None:
            path = self.given / "summary.json"
            if not path.is_file():
                pytest.fail(f"{ENV}={self.given}: no summary.json there: not a finished `labkit run` folder")
            doc = json.loads(path.read_text(encoding="utf-8"))
            if not doc.get("complete"):
                pytest.fail(f"{ENV}={self.given}: the run did not finish ({doc.get('stopped_by')})")
            if doc.get("solutions") or doc.get("exercises_only"):
                pytest.fail(f"{ENV}={self.given}: a run of the exercises' solutions, not of the notebooks as committed")
            profile = choose_profile("auto")
            if doc.get("profile") != profile:
                pytest.fail(f"{ENV}={self.given}: a {doc.get('profile')!r} run; this machine runs {profile!r}")
            self._summary = doc
        return self._summary

    def _read(self, name: str) -> Executed:
        by_name = {r["name"]: r for r in self.summary()["results"]}
        if name not in by_name:
            pytest.fail(f"{ENV}={self.given}: notebook {name} is not in that run (run `make workbook` without --only)")
        res = NotebookResult(**by_name[name])
        _, ((_, src, params, _, _),) = resolve_jobs(only=[name], profile=self.summary()["profile"])
        if res.parameters != params:
            pytest.fail(
                f"{ENV}={self.given}: {name} ran with {res.parameters}; the profile gives {params} "
                "(a run with --set or --params, or a stale run)"
            )
        done = Executed(res, self.given)
        if done.notebook is not None and done.notebook.is_file():
            stale = stale_cells(src, done.notebook)
            if stale:
                pytest.fail(f"{ENV}={self.given}: {name} ran other cells than the committed ones: {stale}")
        return done


def stale_cells(committed: Path, executed: Path) -> list[str]:
    """The committed notebook's cells whose source the executed copy lacks (matched by cell id;
    papermill adds its injected-parameters cell and keeps every other id)."""
    ran = {c.get("id"): c.source for c in nbs.read(executed).cells}
    return [
        c.get("id") or f"cell {i}"
        for i, c in enumerate(nbformat.read(str(committed), as_version=4).cells)
        if ran.get(c.get("id")) != c.source
    ]


def from_environment(runs_dir: Path) -> ExecutedRun:
    given = os.environ.get(ENV, "").strip()
    if given and not Path(given).is_dir():
        raise pytest.UsageError(f"{ENV}={given}: no such folder (a `labkit run` folder: runs/<timestamp>_cpu)")
    return ExecutedRun(Path(given) if given else None, runs_dir)
