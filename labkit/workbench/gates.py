"""Hardware gates: can this machine run a part of a lab, and if not, why, in one line.

    gate = requires(gpus=2, capability=(9, 0), peer_access=True)
    gate.ok        # False on a laptop
    gate.reason    # "needs 2 CUDA GPUs; this machine has 0"

The same gate serves three callers:

* tests: ``@requires(gpus=2).mark`` skips with the reason (pytest prints it with ``-rs``);
* notebooks: ``if gate.announce("the live matrix"):`` prints one clear line when it cannot
  run and records the skip, so ``labkit run`` lists it in its summary;
* code: ``gate.check()`` raises :class:`HardwareUnavailable` with the reason.

The skips go to ``skips.jsonl`` in the notebook's output folder. That file and the run's other
JSON-lines records (``exercises.jsonl``, a bench's progress file) are appended with
:func:`append_line`, which refuses a symbolic link at the name, and read with :func:`read_jsonl`,
which leaves out (and names) each line that is not a record.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat

from labkit.workbench import hardware, tier
from labkit.workbench.errors import UsageError


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


class UnsafeFile(UsageError):
    """A run's record file that labkit refuses to write or read: a symbolic link at its name
    (a planted one would send the record into another file)."""


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` to the file ``path`` (created 0666 less the umask), never through a
    symbolic link at that name: one there is :class:`UnsafeFile`, naming the path.

    The records a notebook writes into a run (``skips.jsonl``, ``exercises.jsonl``, a bench's
    progress file) go through here: an output folder can persist between sessions
    (``runs/interactive/``), and a link planted in it would append to whatever it points to."""
    refused = f"{path}: is {{}}; labkit appends only to a plain file there"
    try:  # O_NONBLOCK: a FIFO at the name is refused below rather than waited on
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            raise UnsafeFile(refused.format("a symbolic link" if e.errno == errno.ELOOP else "a FIFO")) from None
        raise
    with os.fdopen(fd, "a") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(refused.format("not a plain file"))
        f.write(line)


def read_jsonl(path: str | os.PathLike, valid, what: str, bad_lines: list | None = None) -> list:
    """The records of a JSON-lines file that ``valid(record)`` accepts (empty if there is none).

    Each line that is not JSON, or not ``what`` (a record ``valid`` refuses), is left out, and
    ``bad_lines`` (if given) gets one entry naming the file, the line's number and the fault; a
    symbolic link at ``path`` is not read, and gets one entry too."""
    name = os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return []
    except OSError as e:
        if bad_lines is not None:
            bad_lines.append(f"{name}: not read ({'a symbolic link' if e.errno == errno.ELOOP else e.strerror})")
        return []
    with os.fdopen(fd, errors="replace") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            if bad_lines is not None:
                bad_lines.append(f"{name}: not read (not a plain file)")
            return []
        text = f.read()
    records, bad = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            bad.append(f"{name} line {number}: not JSON ({e.msg})")
            continue
        if valid(record):
            records.append(record)
        else:
            bad.append(f"{name} line {number}: not {what}")
    if bad_lines is not None:
        bad_lines.extend(bad)
    return records


def record_skip(part: str, reason: str) -> None:
    """Append a skipped part to the notebook's output folder, where ``labkit run`` collects it
    (:func:`append_line`: never through a symbolic link)."""
    from labkit.workbench import results

    append_line(results.output_dir() / SKIPS_FILE, json.dumps({"part": part, "reason": reason}) + "\n")


def _is_skip(record) -> bool:
    return isinstance(record, dict) and isinstance(record.get("part"), str) and isinstance(record.get("reason"), str)


def read_skips(folder: str | os.PathLike, bad_lines: list | None = None) -> list[dict]:
    """The skipped parts a notebook recorded in ``folder``; lines that are not ``{"part": str,
    "reason": str}`` are left out and named in ``bad_lines`` (see :func:`read_jsonl`)."""
    return read_jsonl(os.path.join(folder, SKIPS_FILE), _is_skip, "a skipped part", bad_lines)
