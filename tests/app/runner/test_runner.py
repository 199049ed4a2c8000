"""labkit run: validation before anything runs, one child per notebook, summary and index."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fixture_workbook, make_notebook

from labkit.app.runner import RunError, profiles, run
from labkit.app.runner import notebooks as nbs
from labkit.app.runner.execute import resolve_jobs
from labkit.workbench import results

pytestmark = pytest.mark.notebook


@pytest.fixture
def workbook(tmp_path):
    return fixture_workbook(tmp_path / "notebooks")


def test_parameters_cell_is_read_with_types_and_help(workbook):
    folder, _ = workbook
    p = nbs.parameters(folder / "ok.ipynb")
    assert list(p) == ["N", "NAME", "SCALE", "FLAG"]
    assert (p["N"].default, p["N"].type, p["N"].help) == (3, "int", "an int")
    assert p["SCALE"].type == "float" and p["FLAG"].type == "bool" and p["NAME"].type == "str"


def test_untagged_parameters_cell_is_refused(tmp_path):
    path = make_notebook(tmp_path / "untagged.ipynb", "N = 1", tag_parameters=False)
    with pytest.raises(RunError, match="not tagged 'parameters'"):
        nbs.parameters(path)


def test_unknown_notebook_is_refused(workbook):
    folder, prof = workbook
    with pytest.raises(RunError, match="unknown notebook 'nope'; known: dies, fails, needs_4_gpus, ok, sleeps"):
        resolve_jobs(only=["nope"], profile="cpu", notebooks_dir=folder, profiles_file=prof)


def test_unknown_parameter_is_refused_naming_what_exists(workbook):
    folder, prof = workbook
    with pytest.raises(
        RunError, match=r"notebook ok has no parameter 'M'; its parameters cell defines: N, NAME, SCALE, FLAG"
    ):
        resolve_jobs(only=["ok"], profile="cpu", sets=["ok.M=1"], notebooks_dir=folder, profiles_file=prof)


@pytest.mark.parametrize(
    "assignment,expected",
    [
        ("ok.N=2.5", "parameter N expects int"),
        ("ok.N=true", "parameter N expects int"),
        ("ok.FLAG=1", "parameter FLAG expects bool"),
        ("ok.NAME=3", "parameter NAME expects str"),
    ],
)
def test_wrong_value_type_is_refused(workbook, assignment, expected):
    folder, prof = workbook
    with pytest.raises(RunError, match=expected):
        resolve_jobs(only=["ok"], profile="cpu", sets=[assignment], notebooks_dir=folder, profiles_file=prof)


def test_int_is_accepted_for_float(workbook):
    folder, prof = workbook
    _, jobs = resolve_jobs(only=["ok"], profile="cpu", sets=["ok.SCALE=2"], notebooks_dir=folder, profiles_file=prof)
    assert jobs[0][2] == {"N": 7, "SCALE": 2}


def test_params_file_for_unknown_notebook_is_refused(workbook, tmp_path):
    folder, prof = workbook
    f = tmp_path / "mine.yml"
    f.write_text("typo_notebook:\n  N: 1\n")
    with pytest.raises(RunError, match="unknown notebook 'typo_notebook'"):
        resolve_jobs(profile="cpu", params_file=f, notebooks_dir=folder, profiles_file=prof)


def test_profile_file_with_unknown_parameter_is_refused(workbook):
    folder, prof = workbook
    prof.write_text("cpu:\n  timeout_s: 10\n  notebooks:\n    ok:\n      parameters: {NOPE: 1}\n")
    with pytest.raises(RunError, match="has no parameter 'NOPE'"):
        resolve_jobs(only=["ok"], profile="cpu", notebooks_dir=folder, profiles_file=prof)


@pytest.mark.parametrize("item", ["N=1", "ok.N", "=1"])
def test_malformed_set_is_refused(item):
    with pytest.raises(RunError, match="expected NOTEBOOK.NAME=VALUE"):
        profiles.parse_set(item)


def test_unknown_profile_is_refused(workbook):
    folder, prof = workbook
    with pytest.raises(RunError, match="--profile 'fast'"):
        resolve_jobs(profile="fast", notebooks_dir=folder, profiles_file=prof)


def test_gpu_profile_refused_without_gpu(workbook):
    from labkit.workbench import hardware

    if hardware.snapshot().gpu_count:
        pytest.skip("this machine has a GPU, so --profile gpu is allowed here")
    folder, prof = workbook
    with pytest.raises(RunError, match="--profile gpu needs a CUDA GPU"):
        resolve_jobs(profile="gpu", notebooks_dir=folder, profiles_file=prof)


def test_run_executes_reports_and_never_overwrites(workbook, tmp_path):
    folder, prof = workbook
    runs = tmp_path / "runs"
    rep = run(
        only=["ok", "fails", "needs_4_gpus"],
        profile="cpu",
        sets=["ok.NAME=injected"],
        runs_dir=runs,
        notebooks_dir=folder,
        profiles_file=prof,
        progress=False,
    )
    by = {r.name: r for r in rep.results}
    # ok: ran, parameters from the profile (N=7) and from --set reached the kernel
    assert by["ok"].status == "ran", by["ok"].detail
    written = json.loads((rep.run_dir / "ok" / "params.json").read_text())
    assert written == {"N": 7, "NAME": "injected", "SCALE": 1.5}
    assert by["ok"].skipped_parts == [{"part": "the 64-GPU part", "reason": by["ok"].skipped_parts[0]["reason"]}]
    assert "needs 64 CUDA GPUs" in by["ok"].skipped_parts[0]["reason"]
    assert (rep.run_dir / "ok" / "ok.ipynb").exists()
    # fails: the failing cell and the error are named
    assert by["fails"].status == "failed"
    assert "RuntimeError: planted failure" in by["fails"].detail and "cell 3" in by["fails"].detail
    # needs_4_gpus: skipped with the reason, never executed
    assert by["needs_4_gpus"].status == "skipped"
    assert "needs 4096 CUDA GPUs" in by["needs_4_gpus"].detail
    assert rep.exit_code == 1
    summary = json.loads((rep.run_dir / "summary.json").read_text())
    assert [r["status"] for r in summary["results"]] == ["ran", "failed", "skipped"]
    index = (rep.run_dir / "index.md").read_text()
    assert "[ok](ok/ok.ipynb)" in index and "planted failure" in index
    assert "<a href='ok/ok.ipynb'>" in (rep.run_dir / "index.html").read_text()
    table = rep.table()
    assert "1 ran, 1 skipped, 1 failed" in table
    # a second run gets a new folder; the first is untouched
    rep2 = run(only=["ok"], profile="cpu", runs_dir=runs, notebooks_dir=folder, profiles_file=prof, progress=False)
    assert rep2.run_dir != rep.run_dir and rep.run_dir.exists()
    assert rep2.exit_code == 0
    assert len(list(runs.iterdir())) == 2


def test_notebook_timeout_is_a_failure_not_a_hang(workbook, tmp_path):
    folder, prof = workbook
    rep = run(
        only=["sleeps"],
        profile="cpu",
        runs_dir=tmp_path / "runs",
        notebooks_dir=folder,
        profiles_file=prof,
        timeout_s=3,
        progress=False,
    )
    (r,) = rep.results
    assert r.status == "failed"
    assert r.detail == "cell 2 timed out after 3 s", r.detail  # 0 markdown, 1 parameters, 2 sleep
    assert r.seconds < 120


def test_dead_kernel_is_reported_with_its_cell(workbook, tmp_path):
    folder, prof = workbook
    rep = run(
        only=["dies", "ok"],
        profile="cpu",
        runs_dir=tmp_path / "runs",
        notebooks_dir=folder,
        profiles_file=prof,
        progress=False,
    )
    dies, ok = rep.results
    assert dies.status == "failed" and dies.detail.startswith("cell 3 killed the notebook's kernel"), dies.detail
    assert ok.status == "ran"  # the next notebook is not affected
    assert rep.exit_code == 1


def test_new_run_dir_is_unique_for_the_same_second(tmp_path):
    import datetime as dt

    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    a = results.new_run_dir("cpu", tmp_path, now=now)
    b = results.new_run_dir("cpu", tmp_path, now=now)
    assert a.name == "2026-01-02T03-04-05Z_cpu" and b.name == "2026-01-02T03-04-05Z_cpu-1"


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "labkit", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "--only", "no_such_notebook"], "unknown notebook 'no_such_notebook'"),
        (["run", "--set", "start_here.NO_SUCH=1"], "has no parameter 'NO_SUCH'"),
        (["run", "--set", "start_here.REPS=fast"], "parameter REPS expects int"),
        (["run", "--profile", "fast"], "--profile 'fast'"),
        (["bench", "no_such_lab"], "no benchmark named 'no_such_lab'"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_params_file_errors_name_the_file(tmp_path, workbook):
    folder, prof = workbook
    with pytest.raises(RunError, match="--params: no file at"):
        resolve_jobs(profile="cpu", params_file=tmp_path / "missing.yml", notebooks_dir=folder, profiles_file=prof)
    bad = tmp_path / "bad.yml"
    bad.write_text("ok: [unclosed\n")
    with pytest.raises(RunError, match="--params: .*bad.yml is not valid YAML"):
        resolve_jobs(profile="cpu", params_file=bad, notebooks_dir=folder, profiles_file=prof)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(RunError, match="must map notebook names"):
        resolve_jobs(profile="cpu", params_file=bad, notebooks_dir=folder, profiles_file=prof)


def test_whole_notebook_limit_stops_many_short_cells(tmp_path, monkeypatch):
    """Each cell is short, together they exceed the limit: the notebook is stopped, not each cell."""
    import re

    from labkit.app.runner import execute

    folder = tmp_path / "nb"
    folder.mkdir()
    make_notebook(folder / "many.ipynb", "N = 60", *["import time\ntime.sleep(1)"] * 60)
    prof = folder / "profiles.yml"
    prof.write_text("cpu:\n  timeout_s: 300\n")
    monkeypatch.setattr(execute, "KERNEL_GRACE_S", 2)
    rep = run(
        profile="cpu",
        runs_dir=tmp_path / "runs",
        notebooks_dir=folder,
        profiles_file=prof,
        timeout_s=12,
        progress=False,
    )
    (r,) = rep.results
    # The cell is named when the kernel got as far as starting one (it may not on a slow start).
    assert r.status == "failed" and re.fullmatch(r"notebook stopped at its 12 s limit( in cell \d+)?", r.detail), (
        r.detail
    )
    assert r.seconds < 40


def test_bad_requires_metadata_is_refused(tmp_path):
    folder = tmp_path / "nb"
    folder.mkdir()
    make_notebook(folder / "odd.ipynb", "N = 1", requires={"gpu": 2})
    prof = folder / "profiles.yml"
    prof.write_text("cpu:\n  timeout_s: 300\n")
    with pytest.raises(RunError, match="notebook odd: metadata.labkit.requires must be a mapping with keys from gpus"):
        resolve_jobs(profile="cpu", notebooks_dir=folder, profiles_file=prof)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the sandbox's cleanup reads /proc (Linux)")
@pytest.mark.parametrize("signum,code,said", [(2, 130, "interrupted (SIGINT)"), (15, 143, "terminated (SIGTERM)")])
def test_a_signal_stops_the_run_cleanly(tmp_path, signum, code, said):
    """Ctrl+C or SIGTERM mid-notebook: one line and 130/143, no traceback; the summary says what
    stopped the run; no sandbox folder (the notebook's own neither) nor connection file is left."""
    import stopped_runs

    got = stopped_runs.stop_mid_notebook(tmp_path, signum)
    assert got["returncode"] == code, got["stderr"][-3000:]
    lines = got["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"labkit run: {said}; "), got["stderr"][-3000:]
    assert str(got["run_dir"]) in lines[0]
    assert got["summary"]["complete"] is False and got["summary"]["stopped_by"] == said
    assert got["left"] == []
    # the kernel's connection file was in the run folder, and went with the run
    assert Path(got["connection_file"]).parent == got["run_dir"] / ".jupyter-runtime"
    assert not (got["run_dir"] / ".jupyter-runtime").exists()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the sandbox's cleanup reads /proc (Linux)")
def test_the_next_run_removes_the_connection_file_a_killed_run_left(tmp_path):
    import signal

    import stopped_runs

    got = stopped_runs.stop_mid_notebook(tmp_path, signal.SIGKILL)
    assert got["returncode"] == -signal.SIGKILL and got["left"] == []
    stale = Path(got["connection_file"])
    assert stale.exists() and stale.parent == got["run_dir"] / ".jupyter-runtime"
    second = stopped_runs.run_skipped(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert not stale.parent.exists() and (got["run_dir"] / "running.json").exists()
