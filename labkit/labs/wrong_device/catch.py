"""Lab 01's "catch it in your code": the seed's launcher and its fix, for ``labkit.check``.

``launch_seed`` is the story's raw launcher (no guard: it launches on whatever device is current);
``launch_fixed`` runs under labkit's device guard. ``scratch_seed`` / ``scratch_fixed`` and
``stream_seed`` / ``stream_fixed`` are the matrix's other two patterns. ``inputs`` and
``x_inputs`` build their inputs (``make_inputs(device) -> (args, kwargs)``).
"""

from __future__ import annotations

import torch

from labkit.labs.wrong_device import experiments
from labkit.workbench import results

NUMEL = 1 << 12


def inputs(device) -> tuple[tuple, dict]:
    """(x, out) on ``device``: for the launchers that write into ``out``."""
    x = torch.randn(NUMEL, device=device)
    return (x, torch.empty_like(x)), {}


def x_inputs(device) -> tuple[tuple, dict]:
    """(x,) on ``device``: for the launchers that return their output."""
    return (torch.randn(NUMEL, device=device),), {}


def launch_seed(x, out) -> None:
    """The seed: the kernel launched with no guard, on the current device."""
    experiments._raw_launch(x, out)


def launch_fixed(x, out) -> None:
    """The fix: the same kernel under ``on_device_of`` (``add_one``)."""
    experiments.add_one(x, out)


def scratch_seed(x):
    return experiments._scratch_launcher(x, guarded=False)


def scratch_fixed(x):
    return experiments._scratch_launcher(x, guarded=True)


def stream_seed(x):
    return experiments._stream_launcher(x, guarded=False)


def stream_fixed(x):
    return experiments._stream_launcher(x, guarded=True)


def recorded(machine: str = "h200x2") -> list[str]:
    """The recorded outcome of the unguarded and the guarded Triton launch (data on cuda:1, cuda:0
    current), from ``reference/<machine>/wrong_device.json``: what ``device_independence`` sees on
    two GPUs, labelled as recorded."""
    refs = results.load_references("wrong_device")
    if machine not in refs:
        return [f"(no recording: reference/{machine}/wrong_device.json is missing)"]
    lines = []
    for r in refs[machine].records:
        if r.get("pattern") == "triton_launch":
            lines.append(
                f"RECORDED on {machine} (not this machine): {'guarded' if r['guarded'] else 'unguarded'}, peer access "
                f"{'on' if r['peer_access'] else 'off'}: {r['outcome']}"
            )
    return lines


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("device_independence", fn, inputs, {}) for fn in (launch_seed, launch_fixed)]
