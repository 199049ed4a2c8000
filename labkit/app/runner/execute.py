"""Execute notebooks into a fresh run folder, one child process each, and report.

Every notebook runs through :func:`labkit.workbench.sandbox.run_isolated` (papermill inside a child
process, the notebook's own kernel below that), so a notebook that hangs is stopped at its
timeout and one that kills its kernel is reported; neither stops the others. Nor does a notebook
that writes a bad line into its ``exercises.jsonl`` or ``skips.jsonl``: the line is left out and
named in the notebook's outcome (``bad_lines``).

A run stopped by SIGINT (Ctrl+C) or SIGTERM writes its summary, ``stopped_by`` saying which
("interrupted (SIGINT)", "terminated (SIGTERM)"), after the notebook's processes and temporary
folders are gone; the kernels' connection files live in the run folder (``.jupyter-runtime/``,
removed when the run ends, and by the next run in the same runs folder if a killed run left it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import html
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from tqdm.auto import tqdm

from labkit.app import exercises
from labkit.app.runner import child, profiles, schema
from labkit.app.runner import notebooks as nbs
from labkit.app.runner.notebooks import RunError
from labkit.workbench import gates, hardware, results, sandbox

#: Seconds beyond a notebook's timeout for its kernel to start and shut down.
KERNEL_GRACE_S = 30

#: matplotlib backend of every notebook's kernel: figures appear in the executed notebook as
#: image/png outputs. ipykernel picks it only when MPLBACKEND is unset, and the kernel inherits
#: the caller's environment, so an exported MPLBACKEND=Agg (common on headless GPU nodes) would
#: leave every figure out of the notebook; the runner sets it for the kernel whatever the caller has.
KERNEL_MPLBACKEND = "module://matplotlib_inline.backend_inline"


@dataclasses.dataclass
class NotebookResult:
    name: str
    status: str  # "ran", "skipped" or "failed"
    detail: str = ""  # skip reason, or the failing cell and error
    seconds: float = 0.0
    parameters: dict = dataclasses.field(default_factory=dict)
    skipped_parts: list = dataclasses.field(default_factory=list)
    output: str | None = None  # executed notebook, relative to the run folder
    figures: list = dataclasses.field(default_factory=list)
    exercises: list = dataclasses.field(default_factory=list)  # the checks' verdicts (exercises.jsonl)
    bad_lines: list = dataclasses.field(default_factory=list)  # lines of those files left out, and why

    def line(self) -> str:
        checks = ""
        if self.exercises:
            passed = sum(v["passed"] for v in self.exercises)
            checks = f"; exercises {passed} of {len(self.exercises)} passed"
        if self.bad_lines:
            checks += f"; {len(self.bad_lines)} bad line(s) left out ({'; '.join(self.bad_lines[:3])})"
        if self.status == "ran" and self.skipped_parts:
            parts = "; ".join(f"{p['part']}: {p['reason']}" for p in self.skipped_parts)
            return f"ran, {len(self.skipped_parts)} part(s) skipped ({parts}){checks}"
        return self.status + (f": {self.detail}" if self.detail else "") + checks


@dataclasses.dataclass
class RunReport:
    run_dir: Path
    profile: str
    results: list[NotebookResult]
    solutions: bool = False  # the exercises' solutions were put in place of the starters
    exercises_only: bool = False  # only the exercise cells ran

    @property
    def failed(self) -> list[NotebookResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def failed_checks(self) -> list[dict]:
        return [v for r in self.results for v in r.exercises if not v["passed"]]

    @property
    def exit_code(self) -> int:
        """1 if a notebook failed, or, in a run with the solutions in place, if a check failed."""
        return 1 if self.failed or (self.solutions and self.failed_checks) else 0

    def table(self) -> str:
        w = max([8] + [len(r.name) for r in self.results])
        rows = [f"{'notebook':<{w}}  {'seconds':>7}  outcome", f"{'-' * w}  {'-' * 7}  {'-' * 7}"]
        rows += [f"{r.name:<{w}}  {r.seconds:>7.1f}  {r.line()}" for r in self.results]
        counts = {s: sum(r.status == s for r in self.results) for s in ("ran", "skipped", "failed")}
        rows.append(
            f"{counts['ran']} ran, {counts['skipped']} skipped, {counts['failed']} failed"
            f" (profile {self.profile}); run folder: {self.run_dir}"
        )
        return "\n".join(rows)


def kernel_env(profile: str) -> dict[str, str]:
    """Environment a notebook's kernel gets under ``profile``, whatever this process chose.

    The tier each profile means (the Triton interpreter for cpu) and matplotlib's inline backend.
    ``labkit run`` gives it to papermill's child (the kernel inherits it); the browser test gives
    it to the JupyterLab server, whose kernels inherit it the same way."""
    return {"TRITON_INTERPRET": "1" if profile == "cpu" else "0", "MPLBACKEND": KERNEL_MPLBACKEND}


def prepare(input_path: str | os.PathLike, output_path: str | os.PathLike, parameters: dict) -> None:
    """Write a copy of a notebook with ``parameters`` injected, as ``labkit run`` does before it
    executes one (papermill's own injection: an ``injected-parameters`` cell after the
    ``parameters`` cell), without starting a kernel. Validate the names first (:func:`resolve_jobs`)."""
    input_path = Path(input_path)
    outcome = child.execute(str(input_path), str(output_path), parameters, str(input_path.parent), 1, prepare_only=True)
    if outcome["status"] != "ran":
        raise RunError(f"notebook {input_path.stem}: could not inject parameters: {outcome.get('detail')}")


def choose_profile(profile: str) -> str:
    has_gpu = hardware.snapshot().gpu_count > 0
    if profile == "auto":
        return "gpu" if has_gpu else "cpu"
    if profile not in profiles.PROFILES:
        raise RunError(f"--profile {profile!r}: expected one of auto, {', '.join(profiles.PROFILES)}")
    if profile == "gpu" and not has_gpu:
        raise RunError("--profile gpu needs a CUDA GPU and this machine has none; use --profile cpu")
    return profile


def resolve_jobs(
    only=None, profile="auto", params_file=None, sets=(), notebooks_dir=None, profiles_file=None, timeout_s=None
) -> tuple[str, list[tuple[str, Path, dict, float, dict]]]:
    """Resolve and validate everything before running anything.

    Returns (profile, [(name, path, parameters, timeout_s, hardware needs)]).
    """
    profile = choose_profile(profile)
    found = nbs.discover(notebooks_dir)
    if not found:
        raise RunError(f"no notebooks found in {notebooks_dir or nbs.NOTEBOOKS_DIR}")
    wanted = list(only) if only else list(found)
    unknown = [n for n in wanted if n not in found]
    if unknown:
        raise RunError(f"unknown notebook {', '.join(map(repr, unknown))}; known: {', '.join(found)}")
    prof = profiles.load(profiles_file)[profile]
    overrides: dict[str, dict] = {}
    for name, entry in (prof.get("notebooks") or {}).items():
        overrides.setdefault(name, {}).update(entry.get("parameters") or {})
    if params_file:
        for name, params in profiles.read_params_file(params_file).items():
            overrides.setdefault(name, {}).update(params)
    for item in sets:
        name, key, value = profiles.parse_set(item)
        overrides.setdefault(name, {})[key] = value
    stray = [n for n in overrides if n not in found]
    if stray:
        raise RunError(
            f"parameters given for unknown notebook {', '.join(map(repr, stray))}; known: {', '.join(found)}"
        )
    if timeout_s is not None and not timeout_s > 0:
        raise RunError(f"--timeout {timeout_s!r}: expected a positive number of seconds")
    # parameters given for a notebook this run leaves out are checked too: a typo there is
    # still a typo, and the next run that selects the notebook would fail on it
    for name in sorted(set(overrides) - set(wanted)):
        nb = nbs.read(found[name])
        nbs.validate(name, overrides[name], nbs.parameters(nb))
        schema.check(name, overrides[name])
    jobs = []
    for name in wanted:
        nb = nbs.read(found[name])
        try:
            declared = nbs.parameters(nb)
        except RunError as e:
            raise RunError(f"notebook {name}: {e}") from None
        params = overrides.get(name, {})
        nbs.validate(name, params, declared)  # names and types, from the parameters cell
        schema.check(name, params)  # values, from the notebook's schema
        entry = (prof.get("notebooks") or {}).get(name, {})
        t = timeout_s or entry.get("timeout_s") or prof["timeout_s"]
        jobs.append((name, found[name], params, float(t), nbs.requirements(nb, name)))
    return profile, jobs


def run(
    only=None,
    profile="auto",
    params_file=None,
    sets=(),
    runs_dir=None,
    notebooks_dir=None,
    profiles_file=None,
    timeout_s=None,
    progress=True,
    solutions=False,
    exercises_only=False,
) -> RunReport:
    """Validate, then execute the selected notebooks into a new run folder; see ``labkit run -h``.

    solutions: put each exercise's solution in place of its starter before the notebook runs
    (:func:`labkit.app.exercises.inject_solutions`); the notebooks on disk are not changed.
    exercises_only: run only each notebook's exercises (``exercises.exercise_cells``: its
    parameters, ``import labkit``, every "Your turn" statement, answer and check cell); answer
    cells import what they use, so they run without the story around them.

    An exception that stops the run (KeyboardInterrupt, SIGTERM's SystemExit) is raised on once
    the summary is written, carrying the run folder as its ``run_dir`` attribute."""
    profile, jobs = resolve_jobs(only, profile, params_file, sets, notebooks_dir, profiles_file, timeout_s)
    try:
        run_dir = results.new_run_dir(profile, runs_dir)
    except results.ResultsError as e:
        raise RunError(f"--runs-dir {e}") from None
    remove_stale_runtime(run_dir.parent)
    tier_env = {**kernel_env(profile), "JUPYTER_RUNTIME_DIR": str(run_dir / RUNTIME_DIR)}
    report = RunReport(run_dir, profile, [], solutions=bool(solutions), exercises_only=bool(exercises_only))
    # Until the summary is written the folder says it is incomplete: a run killed outright
    # (SIGKILL runs no handler) leaves running.json and an index marked INCOMPLETE behind.
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    marker = {"pid": os.getpid(), "started": started, "profile": profile, "notebooks": [j[0] for j in jobs]}
    if solutions or exercises_only:
        jobs = _rewritten(jobs, run_dir, solutions, exercises_only)
    results.atomic_write_json(run_dir / RUNNING, {**marker, "argv": sys.argv})
    write_index(report, RUNNING_NOTE.format(**marker))
    (run_dir / RUNTIME_DIR).mkdir(mode=0o700)  # after the marker: a run's folder, not a stale one
    try:
        _run_jobs(report, jobs, tier_env, progress, RUNNING_NOTE.format(**marker))
    except BaseException as e:  # KeyboardInterrupt, SIGTERM's SystemExit, a bug: say so, then go on
        write_summary(report, stopped_by=stopped_by(e))
        with contextlib.suppress(AttributeError):
            e.run_dir = run_dir
        raise
    write_summary(report)
    return report


def _rewritten(jobs: list, run_dir: Path, solutions: bool, exercises_only: bool) -> list:
    """The jobs with each notebook replaced by a copy: its answer cells holding the solutions,
    and/or its exercise cells alone.

    The copies go in ``run_dir/.solved/`` (removed when the run ends); papermill's working folder
    stays the notebook's own, so relative paths in the notebook resolve as in the notebook."""
    import nbformat

    solved_dir = run_dir / SOLVED_DIR
    solved_dir.mkdir()
    out = []
    for name, path, params, timeout, needs in jobs:
        nb = nbformat.read(path, as_version=4)
        if exercises_only:
            nb.cells = exercises.exercise_cells(nb)
        if solutions:
            exercises.inject_solutions(nb)
        copy = solved_dir / path.name
        nbformat.write(nb, copy)
        out.append((name, copy, params, timeout, needs, path.parent))
    return out


def stopped_by(e: BaseException) -> str:
    """What an exception that stopped a run says in its summary: the signal behind it, if any."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (SIGINT)"
    if isinstance(e, SystemExit) and isinstance(e.code, int) and e.code > 128:
        try:
            return f"terminated ({signal.Signals(e.code - 128).name})"
        except ValueError:
            pass
    return f"{type(e).__name__}: {e}"


def remove_stale_runtime(runs_dir: Path) -> list[Path]:
    """Remove the kernels' runtime folders (connection files) that killed runs left in the run
    folders of ``runs_dir``: those of a run whose process is gone. Returns the folders removed."""
    removed = []
    for folder in sorted(Path(runs_dir).glob(f"*/{RUNTIME_DIR}")):
        if folder.is_symlink() or not folder.is_dir() or _still_running(folder.parent):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _still_running(run_dir: Path) -> bool:
    """Whether the run of ``run_dir`` may still be running: its marker names a live process."""
    try:
        pid = int(json.loads((run_dir / RUNNING).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no marker (the run ended) or one that names no process
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


#: where --solutions puts the solved copies of the notebooks while the run lasts
SOLVED_DIR = ".solved"
#: the kernels' runtime folder (JUPYTER_RUNTIME_DIR: their connection files) while the run lasts
RUNTIME_DIR = ".jupyter-runtime"

#: the marker a run folder holds while its run has not ended (removed with the summary)
RUNNING = "running.json"
RUNNING_NOTE = (
    "INCOMPLETE: this run (pid {pid}, started {started}) has not written its summary: it is still "
    "running, or it was stopped before its end"
)


def _run_jobs(report: RunReport, jobs: list, tier_env: dict, progress: bool, note: str) -> None:
    run_dir = report.run_dir
    bar = tqdm(jobs, desc="notebooks", unit="nb", disable=not progress)
    for job in bar:
        name, path, params, timeout, needs = job[:5]
        cwd = job[5] if len(job) > 5 else path.parent  # a solved copy runs in its notebook's folder
        bar.set_postfix_str(name)
        out_dir = run_dir / name
        out_dir.mkdir()
        gate = gates.requires(**needs)
        if not gate.ok:
            report.results.append(NotebookResult(name, "skipped", gate.reason, parameters=params))
            write_index(report, note)
            continue
        output = out_dir / f"{name}.ipynb"
        # timeout bounds the whole notebook; papermill gets it per cell too, so a single hung
        # cell is reported by name. KERNEL_GRACE_S covers the kernel's start and shutdown.
        res = sandbox.run_isolated(
            child.execute,
            str(path),
            str(output),
            params,
            str(cwd),
            timeout,
            timeout=timeout + KERNEL_GRACE_S,
            env={**tier_env, results.OUTPUT_ENV: str(out_dir)},
        )
        if res.ok:
            outcome = res.value
        elif res.status == "timeout":
            cell = child.running_cell(str(output))
            where = f" in cell {cell}" if cell is not None else ""
            outcome = {"status": "failed", "detail": f"notebook stopped at its {timeout:.0f} s limit{where}"}
        else:
            outcome = {"status": "failed", "detail": f"runner {res.summary()}"}
        bad_lines: list[str] = []
        report.results.append(
            NotebookResult(
                name,
                outcome["status"],
                outcome.get("detail", ""),
                res.seconds,
                params,
                gates.read_skips(out_dir, bad_lines),
                str(output.relative_to(run_dir)) if output.exists() else None,
                sorted(str(p.relative_to(run_dir)) for p in out_dir.glob("*.png")),
                exercises.read_verdicts(out_dir, bad_lines),
                bad_lines,
            )
        )
        write_index(report, note)


def write_summary(report: RunReport, stopped_by: str | None = None) -> None:
    """summary.json, index.md and index.html in the run folder; then running.json goes.

    stopped_by: the run ended early (what stopped it): the summary says ``complete: false``
    and the index is marked INCOMPLETE."""
    doc = {
        "profile": report.profile,
        "run_dir": str(report.run_dir),
        "complete": stopped_by is None,
        "solutions": report.solutions,
        "exercises_only": report.exercises_only,
        "stopped_by": stopped_by,
        "results": [dataclasses.asdict(r) for r in report.results],
    }
    results.atomic_write_json(report.run_dir / "summary.json", doc)
    shutil.rmtree(report.run_dir / SOLVED_DIR, ignore_errors=True)
    shutil.rmtree(report.run_dir / RUNTIME_DIR, ignore_errors=True)
    write_index(report, None if stopped_by is None else f"INCOMPLETE: the run was stopped ({stopped_by})")
    (report.run_dir / RUNNING).unlink(missing_ok=True)


def write_index(report: RunReport, incomplete: str | None = None) -> None:
    """index.md and index.html: the results so far; ``incomplete`` is a banner saying why the
    list may be partial (None once the run has ended normally)."""
    banner = [f"**{incomplete}**", ""] if incomplete else []
    md = [
        f"# labkit run: {report.run_dir.name}",
        "",
        *banner,
        f"Profile `{report.profile}`.",
        "",
        "| notebook | outcome | seconds | figures |",
        "|---|---|---|---|",
    ]
    for r in report.results:
        link = f"[{r.name}]({r.output})" if r.output else r.name
        figs = " ".join(f"[{Path(f).name}]({f})" for f in r.figures) or "-"
        md.append(f"| {link} | {r.line()} | {r.seconds:.1f} | {figs} |")
    results.atomic_write_text(report.run_dir / "index.md", "\n".join(md) + "\n")
    rows = []
    for r in report.results:
        link = f"<a href='{html.escape(r.output)}'>{html.escape(r.name)}</a>" if r.output else html.escape(r.name)
        figs = "".join(f"<a href='{html.escape(f)}'><img src='{html.escape(f)}' height='140'></a> " for f in r.figures)
        color = {"ran": "#e8f5e9", "skipped": "#fff8e1", "failed": "#ffebee"}[r.status]
        rows.append(
            f"<tr style='background:{color}'><td>{link}</td><td>{html.escape(r.line())}</td>"
            f"<td>{r.seconds:.1f}</td><td>{figs}</td></tr>"
        )
    page = (
        f"<!doctype html><meta charset='utf-8'><title>labkit run {report.run_dir.name}</title>"
        f"<h1>labkit run {html.escape(report.run_dir.name)}</h1>"
        + (f"<p style='background:#ffebee'><b>{html.escape(incomplete)}</b></p>" if incomplete else "")
        + f"<p>Profile <code>{report.profile}</code>.</p>"
        "<table border='1' cellpadding='4' style='border-collapse:collapse'>"
        "<tr><th>notebook</th><th>outcome</th><th>seconds</th><th>figures</th></tr>" + "".join(rows) + "</table>\n"
    )
    results.atomic_write_text(report.run_dir / "index.html", page)
