"""Hardware gates: can this machine run a part of a lab, and if not, why, in one line.

    gate = requires(gpus=2, capability=(9, 0), peer_access=True)
    gate.ok        # False on a laptop
    gate.reason    # "needs 2 CUDA GPUs; this machine has 0"

The same gate serves three callers:

* tests: ``@requires(gpus=2).mark`` skips with the reason (pytest prints it with ``-rs``);
* notebooks: ``if gate.announce("the live matrix"):`` prints one clear line when it cannot
  run and records the skip, so ``labkit run`` lists it in its summary;
* code: ``gate.check()`` raises :class:`HardwareUnavailable` with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import os

from labkit.workbench import hardware, tier


class HardwareUnavailable(RuntimeError):
    """This machine lacks what the operation needs; the message says what and why."""


@dataclasses.dataclass(frozen=True)
class Gate:
    ok: bool
    reason: str = ""  # empty when ok; otherwise one line naming what is missing

    def __bool__(self) -> bool:
        return self.ok

    @property
    def mark(self):
        """A pytest mark that skips the test with this gate's reason."""
        import pytest

        return pytest.mark.skipif(not self.ok, reason=self.reason or "ok")

    def check(self) -> None:
        if not self.ok:
            raise HardwareUnavailable(self.reason)

    def announce(self, part: str) -> bool:
        """For notebooks: True if the part can run; else print one line, record it, return False."""
        if self.ok:
            return True
        line = f"SKIPPED {part}: {self.reason}"
        print(line)
        record_skip(part, self.reason)
        return False


def requires(
    gpus: int = 0,
    capability: tuple[int, int] | None = None,
    peer_access: bool = False,
    memory_gib: float | None = None,
    compiled: bool = False,
    hw: hardware.Hardware | None = None,
) -> Gate:
    """Check this machine (or ``hw``) against a part's needs; the first unmet need is the reason.

    gpus:        at least this many CUDA GPUs.
    capability:  every one of those GPUs at least this compute capability, e.g. (9, 0) for Hopper.
    peer_access: every pair among those GPUs can access each other's memory (NVLink or PCIe P2P).
    memory_gib:  each of those GPUs has at least this much memory.
    compiled:    kernels must be compiled for a GPU (not the Triton interpreter): timings.
    """
    hw = hardware.snapshot() if hw is None else hw
    have = hw.gpu_count
    # A capability, memory or compiled-kernel need implies at least one GPU.
    n = max(gpus, 1 if (capability or memory_gib or compiled) else 0)
    if have < n:
        noun = "GPU" if n == 1 else "GPUs"
        return Gate(False, f"needs {n} CUDA {noun}; this machine has {have}")
    if compiled and tier.interpreted():
        return Gate(False, "needs kernels compiled for a GPU; TRITON_INTERPRET=1 is set")
    if capability:
        for g in hw.gpus[:n]:
            if tuple(g.capability) < tuple(capability):
                return Gate(
                    False,
                    f"needs compute capability >= {capability[0]}.{capability[1]};"
                    f" GPU {g.index} ({g.name}) is {g.capability[0]}.{g.capability[1]}",
                )
    if memory_gib:
        for g in hw.gpus[:n]:
            if g.memory_gib < memory_gib:
                return Gate(False, f"needs {memory_gib:g} GiB per GPU; GPU {g.index} has {g.memory_gib:g} GiB")
    if peer_access and gpus >= 2 and not hw.all_peers(gpus):
        pairs = [f"{i}->{j}" for i in range(gpus) for j in range(gpus) if i != j and not hw.peer[i][j]]
        return Gate(False, f"needs peer access between GPUs; missing for {', '.join(pairs)}")
    return Gate(True)


#: The keyword arguments requires() takes from data (notebook metadata, the lab catalogue).
REQUIRES_KEYS = ("gpus", "capability", "peer_access", "memory_gib", "compiled")

SKIPS_FILE = "skips.jsonl"


def record_skip(part: str, reason: str) -> None:
    """Append a skipped part to the notebook's output folder, where ``labkit run`` collects it."""
    from labkit.workbench import results

    path = results.output_dir() / SKIPS_FILE
    with open(path, "a") as f:
        f.write(json.dumps({"part": part, "reason": reason}) + "\n")


def read_skips(folder: str | os.PathLike) -> list[dict]:
    path = os.path.join(folder, SKIPS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
