"""``labkit run`` refuses bad files and folders in one line with exit status 2, before any
notebook runs (labkit/app/cli.py's promise). No notebook is executed here: every case
fails while the run is being planned or its folder made."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def _one_line(p, message):
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr


def test_params_that_is_a_folder(tmp_path):
    _one_line(_cli("run", "--only", "start_here", "--params", str(tmp_path)), f"--params: cannot read {tmp_path}")


def test_runs_dir_that_is_a_file(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    _one_line(_cli("run", "--only", "start_here", "--runs-dir", str(f)), f"--runs-dir {f}: is a file, not a folder")
    assert f.read_text() == "x"


def test_runs_dir_that_cannot_be_made(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    where = f / "under" / "a file"
    _one_line(_cli("run", "--only", "start_here", "--runs-dir", str(where)), f"--runs-dir {where}: cannot make it")


@pytest.mark.skipif(
    not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0, reason="root writes anywhere"
)
def test_runs_dir_without_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    _one_line(_cli("run", "--only", "start_here", "--runs-dir", str(locked / "runs")), "--runs-dir")


def test_yaml_errors_are_one_line(tmp_path):
    """PyYAML's messages span several lines (a caret under the spot); the CLI promises one."""
    from labkit.app.runner import RunError, profiles

    with pytest.raises(RunError) as e:
        profiles.parse_set("start_here.REPS=[1")
    assert "\n" not in str(e.value) and "line 1, column" in str(e.value)
    bad = tmp_path / "p.yml"
    bad.write_text("x: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(RunError) as e:
        profiles.read_params_file(bad)
    assert "\n" not in str(e.value) and "could not determine a constructor" in str(e.value)


def test_run_only_given_twice_runs_both():
    """``--only A --only B`` adds B to A (argparse's default would keep B alone, silently)."""
    from labkit.app import cli

    args = cli._parser().parse_args(["run", "--only", "collectives", "--only", "memory_model", "start_here"])
    assert args.only == ["collectives", "memory_model", "start_here"]


def test_run_prints_its_table_and_index(tmp_path, monkeypatch, capsys):
    """What `make workbook` ends with: the table and the line naming the run's index.html."""
    from labkit.app import cli, runner
    from labkit.app.runner.execute import NotebookResult, RunReport

    report = RunReport(tmp_path / "run", "cpu", [NotebookResult("start_here", "ran", seconds=1.5)])
    monkeypatch.setattr(runner, "run", lambda **kwargs: report)
    assert cli.main(["run", "--only", "start_here", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "start_here" in out and "1 ran, 0 skipped, 0 failed" in out
    assert out.rstrip().splitlines()[-1] == f"index: {tmp_path / 'run' / 'index.html'}"


def test_params_alias_bomb_and_octal_are_one_line(tmp_path):
    """257 bytes of YAML aliases expand to 43 million items; ``010`` is YAML 1.1's octal 8."""
    text = "[1,1,1,1,1,1,1,1,1]"
    for name in "abcdefg":
        text = f"[&{name} {text}," + ",".join([f"*{name}"] * 8) + "]"
    bomb = tmp_path / "bomb.yml"
    bomb.write_text(f"collectives:\n  SWEEP_SIZES: &h {text}\n")
    _one_line(_cli("run", "--params", str(bomb)), "anchors and aliases are not accepted here (write the value out)")
    _one_line(_cli("run", "--only", "start_here", "--set", "start_here.REPS=010"), "010: a leading zero: write 10 or 8")
