"""The environment stamp that every result carries: machine, GPUs, versions, command, time."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import torch

from labkit.workbench import hardware, tier

#: Packages whose versions a result depends on. Missing ones are reported as None.
TRACKED_PACKAGES = (
    "torch",
    "triton",
    "accelerate",
    "numpy",
    "papermill",
    "nbclient",
    "ipywidgets",
    "matplotlib",
    "labkit",
)


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """Versions of Python, the tracked packages, and CUDA / NCCL as torch was built with them."""
    v = {"python": platform.python_version()}
    v.update({name: package_version(name) for name in TRACKED_PACKAGES})
    if v["labkit"] is None:  # run from a checkout on PYTHONPATH, not installed
        import labkit

        v["labkit"] = labkit.__version__
    v["cuda"] = torch.version.cuda
    v["nccl"] = None
    if torch.cuda.is_available():
        try:
            n = torch.cuda.nccl.version()
            v["nccl"] = ".".join(map(str, n)) if isinstance(n, tuple) else str(n)
        except Exception:  # NCCL not built in: report None rather than fail the stamp
            pass
    return v


def git_commit() -> str | None:
    """The checkout's commit. LABKIT_GIT_COMMIT wins when set: a copied tree may carry a .git
    that is not the commit it was copied from (seen on the device machines)."""
    if os.environ.get("LABKIT_GIT_COMMIT"):
        return os.environ["LABKIT_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]  # the repository
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None


def command_as_run(argv: list[str]) -> str:
    """``argv`` as a command relative to the package: ``python -m labkit ...`` for labkit's own
    command, the script's file name otherwise; never a path of the machine it ran on."""
    first = Path(argv[0]) if argv else Path("python")
    if first.name == "labkit" or first.parts[-2:] == ("labkit", "__main__.py"):
        head = ["python", "-m", "labkit"]
    else:
        head = ["python", first.name]
    return shlex.join(head + [a if not Path(a).is_absolute() else Path(a).name for a in argv[1:]])


def stamp(command: str | None = None) -> dict:
    """Everything a reader needs to know where and how a number was made (no absolute path of the
    machine: the command is :func:`command_as_run`'s)."""
    hw = hardware.snapshot()
    return {
        "machine": hardware.machine_tag(hw),
        "hostname": socket.gethostname(),
        "tier": tier.TIER,
        "interpreter": tier.interpreted(),
        "gpus": [
            {
                "name": g.name,
                "capability": list(g.capability),
                "memory_gib": g.memory_gib,
                "multiprocessors": g.multiprocessors,
                "l2_mb": g.l2_mb,
            }
            for g in hw.gpus
        ],
        "versions": versions(),
        "command": command if command is not None else command_as_run(sys.argv),
        "git_commit": git_commit(),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def short_description(st: dict) -> str:
    """One line for plot captions: machine, GPU, versions."""
    v = st["versions"]
    gpu = st["gpus"][0]["name"] if st["gpus"] else "no GPU"
    n = len(st["gpus"])
    where = f"{n}x {gpu}" if n else ("CPU, Triton interpreter" if st["interpreter"] else "CPU")
    return f"{st['machine']} ({where}); torch {v['torch']}, triton {v['triton']}" + (
        f", CUDA {v['cuda']}" if v.get("cuda") else ""
    )
