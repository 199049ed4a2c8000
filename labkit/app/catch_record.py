"""Every lab's "catch it in your code" cases run through their checkers, and the verdicts recorded.

Each lab's catch module (its manifest's ``catch``) lists its cases in ``CASES``: ``(checker, fn, make_inputs, kwargs)``,
the seed's buggy version (``*_seed``) and its fix (``*_fixed``). ``labkit bench checkers
--reference`` runs them all on this machine and writes ``reference/<machine>/checkers.json``; a
notebook's "Catch it in your code" cell then shows, on a machine that cannot run a check in full
(the CPU tier, too few GPUs), the verdict recorded where it could, labelled with that machine.

A record: lab, checker, target (``module:function``), role ("seed" or "fix"), status, outcome,
message and the tier it ran on, with the seconds the check took.
"""

from __future__ import annotations

import time

from labkit.app import catalogue
from labkit.workbench import results
from labkit.workbench.errors import UsageError

#: the labs with catch cases, by name (lab 06 has none: its cell runs the litmus model on your choice)
CATCH_LABS = {lab.name: lab for lab in catalogue.LABS if lab.catch is not None}
REQUIRED = ("lab", "checker", "target", "role", "status", "outcome", "message", "tier", "seconds")
RESULTS_NAME = "checkers"


def cases(lab: str) -> list[tuple]:
    """The lab's ``CASES``: ``(checker, fn, make_inputs, kwargs)``."""
    if lab not in CATCH_LABS:
        raise ValueError(f"catch_record.cases: lab={lab!r}: known labs: {', '.join(CATCH_LABS)}")
    manifest = CATCH_LABS[lab]
    return list(manifest.load(manifest.catch))


def role(fn) -> str:
    """ "seed" or "fix", from the function's name (``*_seed`` / ``*_fixed``)."""
    name = fn.__name__
    if name.endswith("_seed"):
        return "seed"
    if name.endswith("_fixed"):
        return "fix"
    raise ValueError(f"catch_record.role: fn={name!r}: a catch case is named *_seed or *_fixed")


def run_case(lab: str, case: tuple) -> dict:
    """Run one case through its checker; the record ``benchmark`` writes."""
    from labkit import check  # the checkers import torch's CUDA tooling: only when a case runs

    checker, fn, make_inputs, kwargs = case
    start = time.perf_counter()
    try:
        report = getattr(check, checker)(fn, make_inputs=make_inputs, **kwargs)
    except UsageError as e:  # e.g. a world larger than this machine's GPUs: recorded as not looked at
        report = check.Report(checker, f"{fn.__module__}:{fn.__name__}", "skipped", "cannot run here", str(e))
    return {
        "lab": lab,
        "checker": checker,
        "target": report.target,
        "role": role(fn),
        "status": report.status,
        "outcome": report.outcome,
        "message": report.message,
        "tier": report.tier,
        "seconds": round(time.perf_counter() - start, 2),
    }


def benchmark(profile: str) -> list[dict]:
    """Every lab's cases on this machine (``labkit bench checkers``); ``profile`` is not used: a
    check's size is the case's own."""
    del profile
    return [run_case(lab, case) for lab in CATCH_LABS for case in cases(lab)]


def recorded_lines(lab: str, reference_dir=None) -> list[str]:
    """The lab's recorded verdicts, one line each, labelled with the machine and the file; where
    no machine recorded the lab, one line that says so."""
    lines = []
    for machine, rs in sorted(results.load_references(RESULTS_NAME, reference_dir).items()):
        for r in rs.select(lab=lab):
            if r["status"] == "skipped":  # that machine could not look either
                continue
            lines.append(
                f"RECORDED on {machine} (reference/{machine}/{RESULTS_NAME}.json, not this machine): "
                f"{r['checker']}({r['target']}) [{r['role']}]: {r['status'].upper()}: {r['outcome']}: {r['message']}"
            )
    return lines or [
        f"(no machine has recorded a verdict on lab {lab}'s checks: `labkit bench {RESULTS_NAME} --reference` "
        "on GPUs enough for them)"
    ]


def needs_recording(reports) -> bool:
    """Whether any live report could not look in full here (skipped, or run on the CPU tier): then
    ``show`` prints the recorded GPU verdicts after them."""
    return any(r.skipped or r.tier != "gpu" for r in reports)


def show(lab: str, reports, reference_dir=None) -> None:
    """Print each live report's summary; if ``needs_recording(reports)``, the recorded GPU
    verdicts after them, labelled."""
    reports = list(reports)
    for r in reports:
        print(r.summary())
    if needs_recording(reports):
        print()
        print("\n".join(recorded_lines(lab, reference_dir)))


#: the recorded files the docs' verdict table reads (labkit report), in column order
DOCS_REFERENCES = ("h200x1/checkers.json", "h200x2/checkers.json")


def verdicts_table(reference) -> str:
    """docs block ``checker-verdicts``: per lab and checker, what each recorded machine's run said of
    the seed and of its fix (``failed``: the checker flagged it; ``skipped``: the machine had too few
    GPUs for it)."""
    machines = [name.split("/")[0] for name in DOCS_REFERENCES]
    out = ["| lab | checker | " + " | ".join(f"seed, {m} | fix, {m}" for m in machines) + " |"]
    out.append("|---|---" + "|---|---" * len(machines) + "|")
    rows: dict[tuple, dict] = {}
    for name, machine in zip(DOCS_REFERENCES, machines):
        for r in reference.records(name):
            rows.setdefault((r["lab"], r["checker"]), {})[(machine, r["role"])] = r["status"]
    for (lab, checker), got in rows.items():
        cells = [got.get((m, role), "–") for m in machines for role in ("seed", "fix")]
        out.append(f"| {lab} | `{checker}` | " + " | ".join(cells) + " |")
    out.append("")
    files = " and ".join(f"`reference/{n}`" for n in DOCS_REFERENCES)
    out.append(
        f"{files} (`labkit bench checkers --reference`; fields `lab`, `checker`, `role`, `status`). "
        "Rendered by `labkit report`."
    )
    return "\n".join(out)
