"""Where results go and how they are read back.

* A reader's run writes under ``runs/``: ``labkit run`` makes ``runs/<timestamp>_<profile>/`` and
  gives each notebook its own folder through ``LABKIT_OUTPUT_DIR``; interactive sessions write
  to ``runs/interactive/<notebook>/``. Nothing there is ever overwritten by a later run.
* Reference results measured on the GPU machines live in ``reference/<machine>/<lab>.json``
  (e.g. ``reference/h200x2/collectives.json``). They are written by labkit's benchmark code
  (``labkit bench LAB --reference``), never by hand: each file names the function and the
  command that made it, and the environment it ran in.

Every results file has the same shape (``SCHEMA``)::

    {"schema": "labkit.results/1", "lab": ..., "generator": "labkit.labs.start_here.copy_bandwidth.benchmark",
     "env": {stamp: machine, GPUs, versions, command, git commit, time}, "records": [{...}, ...]}

Writes are atomic (temporary file + rename), so a crash never leaves half a file.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from labkit.workbench import env as _env
from labkit.workbench.errors import UsageError

REPO_ROOT = Path(__file__).resolve().parents[2]  # labkit/workbench/results.py -> the repository
REFERENCE_DIR = REPO_ROOT / "reference"
RUNS_DIR = REPO_ROOT / "runs"
SCHEMA = "labkit.results/1"
OUTPUT_ENV = "LABKIT_OUTPUT_DIR"


class ResultsError(UsageError):
    """A results file is missing, malformed, or a record lacks a required field."""


def _umask() -> int:
    """This process's umask, read without changing it where /proc says it (Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and put back (not thread-safe, but brief)
    os.umask(old)
    return old


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write text so that readers see the old file or the whole new one, never a part.

    The file gets the mode a plain ``open(path, "w")`` gives it: an existing file keeps its
    mode, a new one gets 0666 & ~umask (mkstemp's temporary file is 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            if hasattr(os, "fchmod"):  # POSIX
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


@dataclasses.dataclass
class ResultSet:
    lab: str
    generator: str
    env: dict
    records: list[dict]
    path: Path | None = None

    @property
    def machine(self) -> str:
        return self.env.get("machine", "?")

    def select(self, **where) -> list[dict]:
        """Records whose fields equal every given value: ``rs.select(impl="triton")``."""
        return [r for r in self.records if all(r.get(k) == v for k, v in where.items())]


def write_results(
    path: str | os.PathLike,
    lab: str,
    records: Iterable[dict],
    *,
    generator: str,
    required: Iterable[str] = (),
    command: str | None = None,
) -> Path:
    """Write a results file; every record must carry the ``required`` fields."""
    records = [dict(r) for r in records]
    if not records:
        raise ResultsError(f"write_results({lab!r}): no records to write")
    need = list(required)
    for i, r in enumerate(records):
        missing = [k for k in need if k not in r]
        if missing:
            raise ResultsError(f"record {i} of lab {lab!r} lacks required fields {missing}")
    doc = {
        "schema": SCHEMA,
        "lab": lab,
        "generator": generator,
        "env": _env.stamp(command),
        "required": need,
        "records": records,
    }
    return atomic_write_json(path, doc)


def load_results(path: str | os.PathLike) -> ResultSet:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"no results file at {path}") from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path} is not valid JSON: {e}") from None
    if doc.get("schema") != SCHEMA:
        raise ResultsError(f"{path}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("lab", "generator", "env", "records"):
        if key not in doc:
            raise ResultsError(f"{path}: missing {key!r}")
    for i, r in enumerate(doc["records"]):
        missing = [k for k in doc.get("required", []) if k not in r]
        if missing:
            raise ResultsError(f"{path}: record {i} lacks required fields {missing}")
    return ResultSet(doc["lab"], doc["generator"], doc["env"], doc["records"], path)


def resumable(path: str | os.PathLike | None) -> list[dict]:
    """The records of an earlier results file that ran (not skipped), for a resumed call to keep:
    each marked ``resumed_from`` with the commit that measured it (its own mark when it was
    resumed before, else the file's ``git_commit``), so a file finished over several calls says
    which rows which commit measured. [] for no path or a missing file."""
    if not path or not Path(path).exists():
        return []
    earlier = load_results(path)
    commit = earlier.env.get("git_commit") or "unknown"
    return [dict(r, resumed_from=r.get("resumed_from") or commit) for r in earlier.records if not r.get("skipped")]


def reference_path(lab: str, machine: str) -> Path:
    return REFERENCE_DIR / machine / f"{lab}.json"


def load_references(lab: str, reference_dir: str | os.PathLike | None = None) -> dict[str, ResultSet]:
    """Every machine's reference results for a lab, by machine tag (empty if none yet)."""
    root = Path(reference_dir) if reference_dir else REFERENCE_DIR
    found = {}
    for path in sorted(root.glob(f"*/{lab}.json")):
        found[path.parent.name] = load_results(path)
    return found


@dataclasses.dataclass
class Panel:
    """One source of records for a figure or table: the reader's run, or a reference machine."""

    title: str  # "your run (live)" or "reference h200x2 (RECORDED, not this machine)"
    records: list[dict]
    machine: str | None  # None for the reader's run
    result_set: ResultSet | None = None  # the reference file, for captions (None for the live run)

    @property
    def live(self) -> bool:
        return self.machine is None


def panels(
    lab: str,
    live_records: list[dict] | None = None,
    machines: Iterable[str] = (),
    reference_dir: str | os.PathLike | None = None,
) -> list[Panel]:
    """The reader's run (when there is one), then each reference machine's records for ``lab``,
    titled so that a recorded result is never mistaken for this machine's.

    machines: reference machines to keep (empty: all); a notebook's REFERENCE_MACHINES."""
    keep = set(machines)
    out = [Panel("your run (live)", list(live_records), None)] if live_records is not None else []
    for machine, rs in load_references(lab, reference_dir).items():
        if not keep or machine in keep:
            out.append(Panel(f"reference {machine} (RECORDED, not this machine)", rs.records, machine, rs))
    return out


def output_dir(name: str | None = None) -> Path:
    """The folder this notebook or script writes figures and results to (created if needed).

    Under ``labkit run`` this is the notebook's folder in the run (``LABKIT_OUTPUT_DIR``).
    Interactively it is ``runs/interactive/<name>/`` (name defaults to "session").
    """
    given = os.environ.get(OUTPUT_ENV)
    path = Path(given) if given else RUNS_DIR / "interactive" / (name or "session")
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_dir(profile: str, base: str | os.PathLike | None = None, now: _dt.datetime | None = None) -> Path:
    """A fresh ``<base>/<UTC timestamp>_<profile>/`` folder; never one that exists already.

    A base that is a file, or that cannot be made or written, is a ResultsError whose message
    starts with the base (``{base}: is a file, not a folder``)."""
    base = Path(base) if base else RUNS_DIR
    if base.exists() and not base.is_dir():
        raise ResultsError(f"{base}: is a file, not a folder")
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResultsError(f"{base}: cannot make it: {e.strerror or e}") from None
    now = now or _dt.datetime.now(_dt.UTC)
    stem = f"{now:%Y-%m-%dT%H-%M-%SZ}_{profile}"
    for n in range(1000):
        path = base / (stem if n == 0 else f"{stem}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise ResultsError(f"{base}: cannot make a run folder in it: {e.strerror or e}") from None
    raise ResultsError(f"{base}: could not make a new run folder in it (1000 names taken)")
