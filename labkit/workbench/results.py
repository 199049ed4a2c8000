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

Reading checks a file before anything uses it (``load_results``): the document is an object with
the keys above, ``records`` a list of objects, each holding the ``required`` fields, and each
field named in ``FIELD_RULES`` (``LAB_FIELD_RULES`` for a lab whose field means something else) of
its kind (``FIELD_KINDS``): counts are whole numbers >= 0, fractions lie in [0, 1], times, rates
and ratios are finite and >= 0, names are strings, flags booleans. A measured error
(``rel_err_vs_bf16``) may be NaN or inf: the output it measures was. Any other number is finite.
``null`` passes everywhere (a field that does not apply to a record's kind); a renderer that needs
the value refuses it (:mod:`labkit.workbench.findings`). A bad file is a :class:`ResultsError`
naming the file (relative to the repository), the record's index and the field.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
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
    """A results file is missing or malformed, or a record lacks a required field or holds a bad value."""


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


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: kind -> (test of a value that is not null, what the message says is expected)
FIELD_KINDS = {
    "count": (lambda v: _whole(v) and v >= 0, "a count (a whole number >= 0)"),
    "positive count": (lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    "fraction": (lambda v: _real(v) and 0 <= v <= 1, "a fraction in [0, 1]"),
    "amount": (lambda v: _real(v) and math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "real": (lambda v: _real(v) and math.isfinite(v), "a finite number"),
    "error": (lambda v: _real(v) and not v < 0, "a number >= 0 (NaN or inf where the output was)"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "an object"),
}


def _rules(kind: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), kind)


#: field name -> kind (a key of FIELD_KINDS), in every lab's records; a field named here is checked
#: wherever it appears, required or not
FIELD_RULES = {
    **_rules(
        "count",
        "corrupted_elems trial trials wrong_results weak_outcomes runs timeouts unwritten classified "
        "not_possible launches timed_launches bytes shard_bytes copy_bytes nbytes numel offset_bytes "
        "released_bytes smem_bytes flops delay calls iters reps samples rounds count experts tokens "
        "zero_experts dead_experts zero_token_experts top_k capacity groups num_gemms M K N m n k chunk_d "
        "block_m block_n block_k group_m num_stages num_warps splits gather programs programs_per_sm "
        "vectors inner step steps new_tokens corrupted_calls refused_calls same_slot_trials "
        "succeeded_calls sync_calls gpu_events ranks_x_trials rank gpu_count multiprocessors batch_rows "
        "new_segments_during_timing",
    ),
    **_rules("positive count", "world_size"),
    **_rules("fraction", "corrupted_fraction rate lower upper top1_agreement gpu_idle_share"),
    **_rules(
        "amount",
        "us us_p25 us_p75 us_min us_max graph_us cpu_us cpu_us_p25 cpu_us_p75 host_us span_us sync_us "
        "gpu_busy_us gpu_idle_us us_per_launch ms ms_p25 ms_p75 ms_min ms_fwd_bwd forward_ms "
        "bf16_forward_ms ms_per_token ms_per_token_p25 ms_per_token_p75 first_pass_ms_per_token sleep_ms "
        "seconds wall_s setup_s check_s compare_s pads_s warmup_s case_s part_s GBps gbps busbw_GBps "
        "busbw_p25 busbw_p75 graph_busbw_GBps tflops ratio_vs_torch ratio_vs_torch_p25 ratio_vs_torch_p75 "
        "ratio_vs_bf16 ratio_vs_bf16_p25 ratio_vs_bf16_p75 ratio_to_baseline ratio_to_torch_best "
        "ratio_to_rotated ratio_vs_loop ratio_vs_loop_p25 ratio_vs_loop_p75 ratio_vs_chosen "
        "ratio_vs_chosen_p25 ratio_vs_chosen_p75 ratio_vs_host_sync ratio_p25 ratio_p75 time_vs_aligned "
        "time_vs_aligned_p25 time_vs_aligned_p75 count_check_ratio count_check_p25 count_check_p75 vs_raw "
        "max_over_mean imbalance tolerance amax scale",
    ),
    **_rules("real", "cosine"),
    **_rules(
        "error",
        "rel_err_vs_bf16 norm_rel_err_vs_bf16 rel_err_vs_fp32 max_rel_err max_abs_logit_diff "
        "labkit_vs_torch_max_rel recount_max_rel_err err_x err_out",
    ),
    **_rules(
        "text",
        "kind impl op dtype allocator method algorithm variant test semantics verdict ptx_verdict outcome "
        "status machine lab checker target role message tier direction timing pattern config layer "
        "placement mode mechanism stress_name world detail module tensor weight_device baseline "
        "config_source launch_path part design scenario torch_op weak_outcome timing_method stage order "
        "what name activity",
    ),
    **_rules(
        "flag",
        "correct correct_after block_reused in_place best chosen default guarded peer_enabled reported "
        "sanitizer interpreted captured ok finite pads_zero flat tma warp_specialize copy_kernel "
        "record_stream_called isolated fresh_before_write_ends launch_blocking torch_available "
        "tokens_match bit_identical raised forced merged counts_changed counts_equal_eager device_events "
        "recount_correct",
    ),
    **_rules("list", "gpus labs layers_on wrong_per_rank spread_us observed model_outcomes sc_outcomes statuses"),
    **_rules("object", "versions"),
}

#: lab -> the fields whose kind differs there (wrong_device's ``tokens`` are the decoded token ids)
LAB_FIELD_RULES = {"wrong_device": {"tokens": "list"}}


def _shown(path: Path) -> str:
    """A results file as messages name it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except (ValueError, OSError):
        return str(path)


def _read_doc(path: Path, shown: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"no results file at {shown}") from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{shown} is not valid JSON: {e}") from None
    except UnicodeDecodeError:
        raise ResultsError(f"{shown} is not valid JSON: not UTF-8 text") from None
    except RecursionError:
        raise ResultsError(f"{shown} is not valid JSON: nested too deeply") from None
    except OSError as e:
        raise ResultsError(f"{shown}: cannot read it: {e.strerror or e}") from None


def _check_doc(doc, shown: str) -> None:
    """The document's own shape: an object with the schema and keys, records a list of objects."""
    if not isinstance(doc, dict):
        raise ResultsError(f"{shown}: expected a JSON object at the top, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise ResultsError(f"{shown}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("lab", "generator", "env", "records"):
        if key not in doc:
            raise ResultsError(f"{shown}: missing {key!r}")
    for key, kind, test in (("lab", "a string", str), ("generator", "a string", str), ("env", "an object", dict)):
        if not isinstance(doc[key], test):
            raise ResultsError(f"{shown}: {key!r} must be {kind}, got {type(doc[key]).__name__}")
    required = doc.get("required", [])
    if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
        raise ResultsError(f"{shown}: 'required' must be a list of field names, got {required!r:.80}")
    if not isinstance(doc["records"], list):
        raise ResultsError(f"{shown}: 'records' must be a list of objects, got {type(doc['records']).__name__}")


def _which(record: dict) -> str:
    """' (kind='race')': what tells a reader which record it is, beside its index."""
    named = [f"{k}={record[k]!r}" for k in ("kind", "impl") if isinstance(record.get(k), str)]
    return f" ({', '.join(named)})" if named else ""


def _check_record(record, i: int, required: list[str], rules: dict[str, str], shown: str) -> None:
    if not isinstance(record, dict):
        raise ResultsError(f"{shown}: record {i} must be an object, got {type(record).__name__} {record!r:.60}")
    missing = [k for k in required if k not in record]
    if missing:
        raise ResultsError(f"{shown}: record {i} lacks required fields {missing}")
    for field, value in record.items():
        if value is None:
            continue
        kind = rules.get(field, "error" if field.startswith("err_") else None)
        if kind is not None:
            holds, expected = FIELD_KINDS[kind]
        else:  # a field without a rule: only a non-finite number is refused
            holds, expected = (lambda v: not isinstance(v, float) or math.isfinite(v)), "a finite number"
        if not holds(value):
            raise ResultsError(
                f"{shown}: record {i}{_which(record)}: field {field!r} is {value!r:.60}; expected {expected}"
            )


def load_results(path: str | os.PathLike, *, name: str | None = None) -> ResultSet:
    """A results file, checked (the module docstring says what): a ResultsError names what is wrong.

    name: how messages name the file (default: its path relative to the repository, or as given)."""
    path = Path(path)
    shown = name or _shown(path)
    doc = _read_doc(path, shown)
    _check_doc(doc, shown)
    rules = {**FIELD_RULES, **LAB_FIELD_RULES.get(doc["lab"], {})}
    for i, r in enumerate(doc["records"]):
        _check_record(r, i, doc.get("required", []), rules, shown)
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
