"""Builders for small notebooks and profiles used by the runner tests."""

from __future__ import annotations

from pathlib import Path

import nbformat


def make_notebook(
    path: Path, params: str, *cells: str, requires: dict | None = None, tag_parameters: bool = True
) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# fixture\n\n**Hardware:** none."))
    p = nbformat.v4.new_code_cell(params)
    if tag_parameters:
        p.metadata["tags"] = ["parameters"]
    nb.cells.append(p)
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    if requires is not None:
        nb.metadata["labkit"] = {"requires": requires}
    nbformat.write(nb, str(path))
    return path


WRITE_PARAMS = """
import json, os
from labkit.workbench import results
(results.output_dir() / "params.json").write_text(json.dumps({"N": N, "NAME": NAME, "SCALE": SCALE}))
"""


def fixture_workbook(folder: Path) -> tuple[Path, Path]:
    """A notebooks folder (ok, fails, needs_4_gpus, sleeps) and its profiles file."""
    folder.mkdir(parents=True, exist_ok=True)
    make_notebook(
        folder / "ok.ipynb",
        'N = 3  # an int\nNAME = "x"  # a str\nSCALE = 1.5  # a float\nFLAG = True  # a bool',
        WRITE_PARAMS,
        "from labkit.workbench import gates\ngates.requires(gpus=64).announce('the 64-GPU part')",
    )
    make_notebook(folder / "fails.ipynb", "N = 1", "x = 1", "raise RuntimeError('planted failure')")
    make_notebook(folder / "needs_4_gpus.ipynb", "N = 1", "print('should not run here')", requires={"gpus": 4096})
    make_notebook(folder / "sleeps.ipynb", "SECONDS = 600.0", "import time\ntime.sleep(SECONDS)")
    make_notebook(folder / "dies.ipynb", "N = 1", "x = 1", "import os\nos.abort()")
    profiles = folder / "profiles.yml"
    profiles.write_text(
        "cpu:\n  timeout_s: 300\n  notebooks:\n    ok:\n      parameters:\n        N: 7\n"
        "gpu:\n  timeout_s: 300\n  notebooks: {}\n"
    )
    return folder, profiles


def pip_installed_copy(tmp_path: Path, timeout: float = 300) -> tuple[Path, str, Path]:
    """labkit as a user gets it: the distribution copied to ``tmp_path/src`` and pip-installed into a
    fresh virtualenv (no dependencies: torch, triton, pip and pytest come from this environment
    through a .pth file). Returns (the venv's python, its site-packages, the copied source); the
    test is skipped, with the reason, where no virtualenv or install can be made here."""
    import shutil
    import subprocess
    import sys
    import sysconfig

    import pytest

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    for pkg in ("labkit", "labkit_pytest"):
        shutil.copytree(root / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a virtualenv here: {made.stderr.strip()[:200]}")
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    (Path(site) / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(src)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if pip.returncode != 0:
        pytest.skip(f"pip could not install the package here: {pip.stderr.strip()[-300:]}")
    return python, site, src
