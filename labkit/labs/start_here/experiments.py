"""Small experiments that fail on purpose, one of each kind the sandbox tells apart. The
start-here notebook runs them all in child processes to show that the notebook survives."""

from __future__ import annotations

import os
import time


def returns_normally() -> str:
    return "finished normally"


def raises_python_error() -> None:
    raise ValueError("a plain Python exception, raised on purpose")


def spin_forever(seconds: float = 1e9) -> None:
    """Busy-wait on a flag nobody sets: how a spin barrier hangs when a peer never arrives."""
    flag = {"arrived": False}
    deadline = time.monotonic() + seconds
    while not flag["arrived"] and time.monotonic() < deadline:
        pass


#: name -> "module:function" for labkit.workbench.sandbox.run_isolated
CRASH_EXPERIMENTS = {
    "returns normally": "labkit.labs.start_here.experiments:returns_normally",
    "Python exception": "labkit.labs.start_here.experiments:raises_python_error",
    "out-of-bounds store in a Triton kernel": "labkit.kernels.fault:write_out_of_bounds",
    "abort()": f"{os.abort.__module__}:abort",
    "hang (spin on a flag nobody sets)": "labkit.labs.start_here.experiments:spin_forever",
}
