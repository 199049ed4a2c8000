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


@pytest.mark.parametrize(
    "raised,said",
    [
        (SystemExit(143), "terminated (SIGTERM)"),  # what sandbox.signals_raise makes of SIGTERM
        (KeyboardInterrupt(), "interrupted (SIGINT)"),
        (RuntimeError("a bug"), "RuntimeError: a bug"),
        (SystemExit(3), "SystemExit: 3"),
    ],
)
def test_a_run_stopped_by_an_exception_writes_an_incomplete_summary(workbook, tmp_path, monkeypatch, raised, said):
    folder, prof = workbook
    monkeypatch.setattr(ex.sandbox, "run_isolated", lambda *a, **k: (_ for _ in ()).throw(raised))
    with pytest.raises(type(raised)) as stopped:
        run(
            only=["ok"],
            profile="cpu",
            runs_dir=tmp_path / "runs",
            notebooks_dir=folder,
            profiles_file=prof,
            progress=False,
        )
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert stopped.value.run_dir == run_dir  # what the CLI names in its one line
    done = json.loads((run_dir / "summary.json").read_text())
    assert done["complete"] is False and done["stopped_by"] == said
    assert "INCOMPLETE" in (run_dir / "index.md").read_text()
    assert not (run_dir / ex.RUNTIME_DIR).exists()


def test_bad_lines_in_a_notebooks_records_are_left_out_and_the_run_goes_on(workbook, tmp_path, monkeypatch):
    """A notebook can write anything into its exercises.jsonl and skips.jsonl (N115): each bad
    line is named in its outcome, its good lines count, and the next notebook runs."""
    folder, prof = workbook
    written = {
        "exercises.jsonl": 'not json\n{"exercise": "01.guard", "passed": true}\n[1, 2]\n'
        '{"exercise": "x", "passed": "yes"}\n',
        "skips.jsonl": '{"part": "p", "reason": "r"}\n{"part": 3}\n{"unterminated\n',
    }

    def garbage(*args, **kwargs):
        out = Path(kwargs["env"]["LABKIT_OUTPUT_DIR"])
        if out.name == "ok":
            for name, text in written.items():
                (out / name).write_text(text)
        return _ran()

    monkeypatch.setattr(ex.sandbox, "run_isolated", garbage)
    rep = run(
        only=["ok", "fails"],
        profile="cpu",
        runs_dir=tmp_path / "runs",
        notebooks_dir=folder,
        profiles_file=prof,
        progress=False,
    )
    ok, fails = rep.results
    assert [ok.status, fails.status] == ["ran", "ran"] and fails.bad_lines == []
    assert ok.exercises == [{"exercise": "01.guard", "passed": True}]
    assert ok.skipped_parts == [{"part": "p", "reason": "r"}]
    assert ok.bad_lines == [
        "skips.jsonl line 2: not a skipped part",
        "skips.jsonl line 3: not JSON (Unterminated string starting at)",
        "exercises.jsonl line 1: not JSON (Expecting value)",
        "exercises.jsonl line 3: not a verdict",
        "exercises.jsonl line 4: not a verdict",
    ]
    assert "5 bad line(s) left out (skips.jsonl line 2: not a skipped part;" in ok.line()
    done = json.loads((rep.run_dir / "summary.json").read_text())
    assert done["complete"] is True and done["results"][0]["bad_lines"] == ok.bad_lines


def test_a_symbolic_link_for_a_record_file_is_not_read(workbook, tmp_path, monkeypatch):
    folder, prof = workbook
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"exercise": "01.guard", "passed": true}\n')

    def planted(*args, **kwargs):
        os.symlink(secret, Path(kwargs["env"]["LABKIT_OUTPUT_DIR"]) / "exercises.jsonl")
        return _ran()

    monkeypatch.setattr(ex.sandbox, "run_isolated", planted)
    rep = run(
        only=["ok"], profile="cpu", runs_dir=tmp_path / "runs", notebooks_dir=folder, profiles_file=prof, progress=False
    )
    (ok,) = rep.results
    assert ok.exercises == [] and ok.bad_lines == ["exercises.jsonl: not read (a symbolic link)"]


def test_the_kernels_runtime_folder_is_the_runs_and_stale_ones_go(workbook, tmp_path, monkeypatch):
    """JUPYTER_RUNTIME_DIR (the connection files) is in the run folder while it runs, gone at its
    end; a run folder a killed run left (its process gone) loses its runtime folder at the next run,
    one whose process lives keeps it."""
    folder, prof = workbook
    runs = tmp_path / "runs"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name, pid in (("killed", dead.pid), ("alive", os.getppid()), ("unmarked", None)):
        (runs / name / ex.RUNTIME_DIR).mkdir(parents=True)
        (runs / name / ex.RUNTIME_DIR / "kernel-1.json").write_text("{}")
        if pid is not None:
            (runs / name / ex.RUNNING).write_text(json.dumps({"pid": pid}))
    seen = []

    def look(*args, **kwargs):
        runtime = Path(kwargs["env"]["JUPYTER_RUNTIME_DIR"])
        seen.append((runtime, runtime.is_dir(), oct(runtime.stat().st_mode & 0o777)))
        return _ran()

    monkeypatch.setattr(ex.sandbox, "run_isolated", look)
    rep = run(only=["ok"], profile="cpu", runs_dir=runs, notebooks_dir=folder, profiles_file=prof, progress=False)
    assert seen == [(rep.run_dir / ex.RUNTIME_DIR, True, "0o700")]
    assert not (rep.run_dir / ex.RUNTIME_DIR).exists()
    assert not (runs / "killed" / ex.RUNTIME_DIR).exists() and not (runs / "unmarked" / ex.RUNTIME_DIR).exists()
    assert (runs / "alive" / ex.RUNTIME_DIR / "kernel-1.json").exists()


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
