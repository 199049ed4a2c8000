"""A run folder says whether the run finished: ``running.json`` and an index marked INCOMPLETE
from the start, the summary (and a complete index) only at the end. No notebook is executed:
``sandbox.run_isolated`` is replaced by a stand-in that returns, raises or never returns."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import fixture_workbook

from labkit.app.runner import execute as ex
from labkit.app.runner import run
from labkit.workbench import sandbox


@pytest.fixture
def workbook(tmp_path):
    return fixture_workbook(tmp_path / "notebooks")


def _ran(*args, **kwargs):
    return sandbox.SandboxResult(status="ok", value={"status": "ran"}, seconds=0.1)


def test_the_folder_is_marked_incomplete_until_the_summary(workbook, tmp_path, monkeypatch):
    folder, prof = workbook
    seen = []

    def fake(*args, **kwargs):  # look at the folder while "a notebook runs"
        run_dir = Path(kwargs["env"]["LABKIT_OUTPUT_DIR"]).parent
        seen.append(
            (
                json.loads((run_dir / "running.json").read_text()),
                (run_dir / "index.md").read_text(),
                (run_dir / "summary.json").exists(),
            )
        )
        return _ran()

    monkeypatch.setattr(ex.sandbox, "run_isolated", fake)
    rep = run(
        only=["ok", "fails"],
        profile="cpu",
        runs_dir=tmp_path / "runs",
        notebooks_dir=folder,
        profiles_file=prof,
        progress=False,
    )
    (marker, index, summary), (_, index2, _) = seen
    assert marker["pid"] == os.getpid() and marker["notebooks"] == ["ok", "fails"]
    assert "INCOMPLETE" in index and not summary
    assert "INCOMPLETE" in index2 and "| ok |" in index2.replace("[ok](ok/ok.ipynb)", "ok")  # results so far
    done = json.loads((rep.run_dir / "summary.json").read_text())
    assert done["complete"] is True and not (rep.run_dir / "running.json").exists()
    assert "INCOMPLETE" not in (rep.run_dir / "index.md").read_text()


def test_a_run_stopped_by_an_exception_writes_an_incomplete_summary(workbook, tmp_path, monkeypatch):
    folder, prof = workbook
    monkeypatch.setattr(ex.sandbox, "run_isolated", lambda *a, **k: (_ for _ in ()).throw(SystemExit(143)))
    with pytest.raises(SystemExit):
        run(
            only=["ok"],
            profile="cpu",
            runs_dir=tmp_path / "runs",
            notebooks_dir=folder,
            profiles_file=prof,
            progress=False,
        )
    (run_dir,) = (tmp_path / "runs").iterdir()
    done = json.loads((run_dir / "summary.json").read_text())
    assert done["complete"] is False and "SystemExit" in done["stopped_by"]
    assert "INCOMPLETE" in (run_dir / "index.md").read_text()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX")
def test_a_run_killed_by_sigkill_leaves_a_folder_marked_incomplete(workbook, tmp_path):
    folder, prof = workbook
    runs = tmp_path / "runs"
    code = textwrap.dedent(f"""
        import time
        from labkit.app.runner import execute as ex
        ex.sandbox.run_isolated = lambda *a, **k: time.sleep(300)  # a notebook that runs on
        ex.run(only=["ok"], profile="cpu", runs_dir={str(runs)!r}, notebooks_dir={str(folder)!r},
               profiles_file={str(prof)!r}, progress=False)
    """)
    # The checkout and tests/ go first; what the caller's PYTHONPATH holds stays (a node given its
    # packages as a folder of wheels, labkit gpu-tier --wheels, has nbformat only there).
    paths = [
        str(Path(__file__).resolve().parents[3]),
        str(Path(__file__).resolve().parents[2]),
        os.environ.get("PYTHONPATH", ""),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(runs.glob("*/running.json")):
        assert p.poll() is None, f"the run died before making its folder:\n{p.stderr.read()}"
        time.sleep(0.2)
    p.kill()
    p.wait()
    (run_dir,) = runs.iterdir()
    assert (run_dir / "running.json").exists() and not (run_dir / "summary.json").exists()
    assert "INCOMPLETE" in (run_dir / "index.md").read_text() and "INCOMPLETE" in (run_dir / "index.html").read_text()
