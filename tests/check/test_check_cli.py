"""``labkit check`` and the pytest plugin (``labkit_pytest``): exit statuses, and a plugin that
imports nothing from labkit until a test asks for the fixture, also after a plain pip install
into a fresh virtualenv."""

import os
import subprocess
import sys
from pathlib import Path

from helpers import pip_installed_copy

from labkit import check
from labkit.app import cli

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def _labkit(*args, cwd=TESTS):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "labkit", "check", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_cli_names_every_checker():
    assert set(cli.CHECKER_NAMES) == set(check.CHECKERS)


def test_labkit_check_exit_status_says_passed_found_or_bad_input():
    ok = _labkit("check_fns:torch_add", "--inputs", "check_fns:vec", "--checker", "no_host_sync")
    assert ok.returncode == 0 and "PASSED" in ok.stdout, ok.stderr
    bad = _labkit("check_fns:sync_item", "--inputs", "check_fns:vec", "--checker", "no_host_sync")
    assert bad.returncode == 1 and "FAILED: host sync" in bad.stdout and "check_fns.py" in bad.stdout
    wrong = _labkit("check_fns:torch_add", "--inputs", "check_fns:absent", "--checker", "graph_safe")
    assert wrong.returncode == 2 and wrong.stderr.startswith("labkit check: error: graph_safe: make_inputs=")
    skip = _labkit("check_fns:torch_add", "--inputs", "check_fns:vec", "--checker", "device_independence")
    assert skip.returncode in (0, 1) and "device_independence(check_fns:torch_add)" in skip.stdout


USER_TESTS = """
import sys

def test_loading_the_plugin_imported_nothing_from_labkit():
    assert not [m for m in sys.modules if m == "labkit" or m.startswith("labkit.")]

def test_a_passing_check(labkit_check):
    r = labkit_check.no_host_sync("user_fns:add", "user_fns:inputs")
    assert r.ok and "labkit" in sys.modules

def test_a_failing_check(labkit_check):
    labkit_check.no_host_sync("user_fns:syncs", "user_fns:inputs")

def test_a_check_this_machine_cannot_run(labkit_check):
    labkit_check.device_independence("user_fns:add", "user_fns:inputs")
"""
USER_FNS = """
import torch

def inputs(device):
    return (torch.randn(8, device=device),), {}

def add(x):
    return x + 1

def syncs(x):
    return x * x.sum().item()
"""


def _user_suite(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_user.py").write_text(USER_TESTS)
    (folder / "user_fns.py").write_text(USER_FNS)
    return folder


def _outcomes(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if "::" in ln and any(w in ln for w in ("PASSED", "FAILED", "SKIPPED"))]
    return {ln.split("::")[1].split()[0]: next(w for w in ("PASSED", "FAILED", "SKIPPED") if w in ln) for ln in lines}


def _expected_outcomes(gpus: bool):
    return {
        "test_loading_the_plugin_imported_nothing_from_labkit": "PASSED",
        "test_a_passing_check": "PASSED",
        "test_a_failing_check": "FAILED",
        "test_a_check_this_machine_cannot_run": "PASSED" if gpus else "SKIPPED",
    }


def _has_two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


def test_the_plugin_from_the_source_tree(tmp_path):
    suite = _user_suite(tmp_path / "suite")
    # Only the plugin named by -p: where labkit is also pip-installed, its pytest11 entry point
    # would register the same module a second time and pytest would stop before collecting.
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{suite}", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("TRITON_INTERPRET", None)  # as in a fresh shell: labkit must not have set it yet
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "labkit_pytest", "-p", "no:cacheprovider", "-v", "-rs", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert _outcomes(res.stdout) == _expected_outcomes(_has_two_gpus()), (res.stdout + res.stderr)[-3000:]
    assert "FAILED: host sync" in res.stdout and "user_fns.py" in res.stdout


def test_the_plugin_after_a_plain_pip_install_into_a_fresh_virtualenv(tmp_path):
    """The distribution as a user gets it: copied, pip-installed (no dependencies: torch and
    triton come from this environment through a .pth file), and found by pytest's entry points."""
    python, site, src = pip_installed_copy(tmp_path, timeout=300)
    suite = _user_suite(tmp_path / "suite")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(suite)
    res = subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-v", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert _outcomes(res.stdout) == _expected_outcomes(_has_two_gpus()), res.stdout[-3000:] + res.stderr[-2000:]
    where = subprocess.run(
        [str(python), "-c", "import labkit_pytest, labkit; print(labkit.__file__)"],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(site), where  # the installed copy, not the source tree
