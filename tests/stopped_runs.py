"""``labkit run`` stopped by a signal, as a real process, and what it leaves behind.

The run executes a fixture notebook whose kernel records its connection file and then waits in a
``run_isolated`` call of its own (the case that matters: the notebook's sandbox folder and the
kernel's connection file must not stay in TMPDIR). The run gets a private TMPDIR, so whatever is left
there is the run's. Used by tests/app/runner/test_runner.py and the bad-input rows of
tests/bad_inputs.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import make_notebook

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: the notebook that holds: its kernel's connection file named in its output folder, then a wait
#: inside a sandbox call of its own
HOLDS = (
    "import ipykernel.connect\nfrom labkit.workbench import results\n"
    "(results.output_dir() / 'connection.txt').write_text(ipykernel.connect.get_connection_file())",
    "from labkit.workbench import sandbox\nsandbox.run_isolated('time:sleep', 300, timeout=400)",
)

#: `labkit run` on a fixture folder: argv[1] is the folder, the rest are the command's arguments
_CLI = """
import sys
from pathlib import Path
from labkit.app.runner import notebooks, profiles
notebooks.NOTEBOOKS_DIR = Path(sys.argv[1])
profiles.PROFILES_FILE = notebooks.NOTEBOOKS_DIR / "profiles.yml"
from labkit.app import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def workbook(folder: Path) -> Path:
    """``holds`` (above) and ``skipped`` (needs 4096 GPUs: no kernel starts), with a profiles file."""
    folder.mkdir(parents=True, exist_ok=True)
    make_notebook(folder / "holds.ipynb", "N = 1", *HOLDS)
    make_notebook(folder / "skipped.ipynb", "N = 1", "print('not here')", requires={"gpus": 4096})
    (folder / "profiles.yml").write_text("cpu:\n  timeout_s: 300\ngpu:\n  timeout_s: 300\n")
    return folder


def _start(base: Path, *args: str) -> subprocess.Popen:
    paths = [str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TMPDIR": str(base / "tmp"), "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    (base / "tmp").mkdir(exist_ok=True)
    argv = [sys.executable, "-c", _CLI, str(base / "notebooks"), "run", "--profile", "cpu"]
    argv += ["--runs-dir", str(base / "runs"), "--no-progress", *args]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def leftovers(base: Path) -> list[str]:
    """What the run left in its TMPDIR that is labkit's or Jupyter's: sandbox folders, rank
    folders, connection files."""
    return sorted(n for n in os.listdir(base / "tmp") if n.startswith("labkit-") or n.endswith(".json"))


def stop_mid_notebook(base: Path, signum: int, timeout: float = 60) -> dict:
    """Start ``labkit run --only holds`` in ``base`` (its notebooks, runs and tmp folders), send
    ``signum`` once the notebook waits in its own sandbox call, and say what came of it."""
    workbook(base / "notebooks")
    proc = _start(base, "--only", "holds")
    tmp, deadline = base / "tmp", time.monotonic() + timeout
    try:
        while True:  # the connection file recorded, the notebook's own sandbox folder made
            named = list((base / "runs").glob("*/holds/connection.txt"))
            if named and len([n for n in os.listdir(tmp) if n.startswith("labkit-sandbox-")]) >= 2:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the notebook never got to its wait:\n{proc.communicate()[1][-3000:]}")
            time.sleep(0.1)
        time.sleep(0.5)  # its child started
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run_dir = named[0].parent.parent
    if signum == signal.SIGKILL:  # the watchdogs clean up after a parent that ran no handler
        while leftovers(base) and time.monotonic() < deadline:
            time.sleep(0.1)
    summary = run_dir / "summary.json"
    return {
        "returncode": proc.returncode,
        "stderr": stderr,
        "run_dir": run_dir,
        "connection_file": named[0].read_text(),
        "summary": json.loads(summary.read_text()) if summary.exists() else None,
        "left": leftovers(base),
    }


def run_skipped(base: Path) -> subprocess.CompletedProcess:
    """A second, quick ``labkit run`` in the same runs folder (its one notebook is skipped)."""
    proc = _start(base, "--only", "skipped")
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
