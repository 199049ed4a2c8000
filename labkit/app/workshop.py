"""The workshop path's numbers (docs/workshop.md, each notebook's first screen), as ``labkit report`` blocks.

Reading minutes come from the notebooks (``catalogue.reading_minutes`` and ``first_read_minutes``);
run minutes from one recorded CPU-tier run, ``docs/data/cpu-tier-run.json``: the seconds of each
notebook in a ``labkit run --profile cpu`` summary, with the machine and its load while it ran.
``python -m labkit.app.workshop RUN_DIR [--load-log FILE] [--command CMD]`` adds a run folder
to that file; ``labkit report --write`` then re-renders every block that shows it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
from pathlib import Path

from labkit.app import catalogue
from labkit.workbench import env, results
from labkit.workbench.errors import UsageError

RUN_FILE = "docs/data/cpu-tier-run.json"

#: minutes of discussion the agendas give each lab (a plan, not a measurement)
DISCUSSION_MIN = 10


def _root(root: str | Path | None) -> Path:
    return Path(root) if root is not None else results.REPO_ROOT


def load_run(root: str | Path | None = None) -> dict:
    path = _root(root) / RUN_FILE
    if not path.is_file():
        raise UsageError(f"workshop: {RUN_FILE} is missing (python -m labkit.app.workshop RUN_DIR writes it)")
    return json.loads(path.read_text())


def run_minutes(name: str, run: dict) -> int:
    """Whole minutes (rounded up) the last recorded CPU-tier run that completed the notebook took."""
    for r in reversed(run["runs"]):
        nb = r["notebooks"].get(name)
        if nb is not None and nb.get("status") == "ran":
            return max(1, math.ceil(nb["seconds"] / 60))
    raise UsageError(f"workshop: {RUN_FILE} holds no completed run of {name}")


def machine_words(run: dict) -> str:
    m = run["machine"]
    loads = [x for r in run["runs"] for x in r.get("load_1min") or []]
    loaded = (
        f"; its 1-minute load average was {min(loads):.1f} to {max(loads):.1f} while they ran (shared with other jobs)"
        if loads
        else ""
    )
    return f"{m['cores']} cores of an {m['cpu']}, {m['memory_gib']} GiB{loaded}"


# --- renderers (labkit.app.report.RENDERERS) ---------------------------------------------


def minutes_line(reference, name: str) -> str:
    """One notebook's first-screen minutes: to read (whole and first read), to run on the CPU tier."""
    lab = catalogue.get(name)
    run = load_run()
    full, first = catalogue.reading_minutes(lab), catalogue.first_read_minutes(lab)
    short = f" ({first} on a first read, skipping the marked sections)" if first < full else ""
    return (
        f"**Minutes:** {full} to read{short}; {run_minutes(name, run)} to run on the CPU tier "
        f"(a recorded run on {run['machine']['cores']} shared cores: "
        "[the workshop path](../docs/workshop.md#minutes))."
    )


def minutes_table(reference) -> str:
    run = load_run()
    rows = [
        "| lab | read (minutes) | first read (minutes) | CPU-tier run (minutes) | GPUs for the full lab |",
        "|---|---|---|---|---|",
    ]
    for lab in catalogue.LABS:
        rows.append(
            f"| {lab.name} | {catalogue.reading_minutes(lab)} | {catalogue.first_read_minutes(lab)} | "
            f"{run_minutes(lab.name, run)} | {lab.gpu_count} |"
        )
    rows += [
        "",
        f"*read*: the notebook's prose at {catalogue.WORDS_PER_MINUTE} words a minute plus a minute per figure; "
        "*first read*: the same without the sections marked *Skip on first read*; *CPU-tier run*: "
        f"{' and '.join(sorted({'`' + r['command'] + '`' for r in run['runs']}))} on {machine_words(run)} "
        f"(`{RUN_FILE}`: `runs[].notebooks.<lab>.seconds`, the last run that completed the notebook). "
        "A quieter or faster machine takes less.",
    ]
    return "\n".join(rows)


#: the agendas: (lab, read it whole or on a first read)
AGENDA_3H = (
    ("start_here", "first"),
    ("wrong_device", "first"),
    ("stream_races", "first"),
    ("collectives", "first"),
    ("memory_model", "first"),
)
AGENDA_DAY = tuple((lab.name, "whole") for lab in catalogue.LABS)


def _agenda(plan) -> str:
    run = load_run()
    rows = [
        "| lab | read | minutes to read | to run (CPU tier) | discussion | slot (longer of read, run; + discussion) |",
        "|---|---|---|---|---|---|",
    ]
    total = 0
    for name, how in plan:
        lab = catalogue.get(name)
        read = catalogue.first_read_minutes(lab) if how == "first" else catalogue.reading_minutes(lab)
        ran = run_minutes(name, run)
        slot = max(read, ran) + DISCUSSION_MIN  # the run goes on while the learner reads
        total += slot
        rows.append(f"| {name} | {how} | {read} | {ran} | {DISCUSSION_MIN} | {slot} |")
    rows.append(f"| **total** | | | | | **{total}** ({total / 60:.1f} h) |")
    return "\n".join(rows)


def agenda_3h(reference) -> str:
    return _agenda(AGENDA_3H)


def agenda_day(reference) -> str:
    return _agenda(AGENDA_DAY)


def objectives(lab: catalogue.Lab, root: str | Path | None = None) -> list[str]:
    """The bullets under "**You will be able to:**" in a lab notebook's first cell."""
    cells = json.loads((_root(root) / lab.notebook).read_text())["cells"]
    first = "".join(cells[0]["source"])
    _, found, rest = first.partition("**You will be able to:**\n")
    bullets = [line[2:] for line in rest.split("\n\n", 1)[0].splitlines() if line.startswith("* ")]
    if not found or not bullets:
        raise UsageError(f"workshop: {lab.notebook}'s first cell lists no '**You will be able to:**' bullets")
    return bullets


def objectives_list(reference) -> str:
    out = []
    for lab in catalogue.LABS:
        out.append(f"**{lab.name}** ([notebook](../{lab.notebook})):")
        out += [f"- {b}" for b in objectives(lab)]
        out.append("")
    out.append("(From each notebook's first cell; rendered by `labkit report`.)")
    return "\n".join(out)


# --- recording a run ---------------------------------------------------------------------------


def record(
    run_dir: str | Path,
    load_log: str | Path | None = None,
    command: str = "labkit run --profile cpu",
    root: str | Path | None = None,
) -> Path:
    """Add a ``labkit run`` folder's summary.json to RUN_FILE (a new file holds this machine's
    description); ``load_log``: lines ``<unix time> <1-min> <5-min> <15-min>`` sampled from
    ``/proc/loadavg`` while it ran. A run's notebooks that failed are kept with their status."""
    summary_path = Path(run_dir) / "summary.json"
    if not summary_path.is_file():
        raise UsageError(f"workshop: {summary_path} is missing: has the run ended?")
    summary = json.loads(summary_path.read_text())
    if summary.get("profile") != "cpu" or not summary.get("complete"):
        raise UsageError(f"workshop: {summary_path} is not a complete CPU-profile run")
    loads = []
    if load_log is not None:
        loads = [float(line.split()[1]) for line in Path(load_log).read_text().splitlines() if line.strip()]
    out = _root(root) / RUN_FILE
    doc = json.loads(out.read_text()) if out.is_file() else None
    if doc is None:
        mem_kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or "unknown CPU",
        )
        doc = {
            "what": "seconds each notebook took in `labkit run --profile cpu` runs (summary.json), on one machine",
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20)},
            "versions": env.versions(),
            "runs": [],
        }
    doc["runs"].append(
        {
            "command": command,
            "load_1min": loads,
            "notebooks": {
                r["name"]: {"seconds": round(r["seconds"], 1), "status": r["status"], "detail": r.get("detail")}
                for r in summary["results"]
            },
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    results.atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.app.workshop", description=record.__doc__)
    p.add_argument("run_dir")
    p.add_argument("--load-log")
    p.add_argument("--command", default="labkit run --profile cpu", help="the command that made the run")
    args = p.parse_args(argv)
    print(record(args.run_dir, args.load_log, args.command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
