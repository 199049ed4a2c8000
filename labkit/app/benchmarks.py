"""The registry behind ``labkit bench NAME``: each benchmark's function and the fields its records
must carry. Reference files in ``reference/<machine>/<NAME>.json`` are written only here.

A lab's benchmarks come from its manifest (``Lab.benchmarks``: ``<lab>`` or ``<lab>_<part>``); the
application's own are the doctor's machine report and the checkers' recorded verdicts.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from labkit.app import catalogue, catch_record, doctor
from labkit.workbench import hardware, results
from labkit.workbench.errors import UsageError


def _resolved(lab, bench) -> tuple[str, Callable, Callable]:
    """(generator name, run, required fields) of a lab's benchmark, imported when it runs."""
    module, _, fn = bench.run.partition(":")
    return (
        f"{lab.package}.{module}.{fn}",
        lambda profile: lab.load(bench.run)(profile),
        lambda: lab.load(f"{module}:{bench.required}"),
    )


#: benchmark name -> (generator, function(profile) -> records, function() -> required record fields)
BENCHMARKS: dict[str, tuple[str, Callable, Callable]] = {
    "doctor": ("labkit.app.doctor.benchmark", doctor.benchmark, lambda: doctor.REQUIRED),
    "checkers": ("labkit.app.catch_record.benchmark", catch_record.benchmark, lambda: catch_record.REQUIRED),
    **{name: _resolved(lab, bench) for lab in catalogue.LABS for name, bench in lab.benchmarks.items()},
}


def run(lab: str, profile: str, out_dir: str | Path | None = None, reference: bool = False) -> Path:
    """Run a lab's benchmark and write its results file; returns the path written.

    reference=True writes ``<out_dir or reference/>/<machine>/<lab>.json``: what the GPU tier
    commits as reference data. Otherwise the file goes to ``<out_dir or the run folder>/<lab>.json``.
    """
    if lab not in BENCHMARKS:
        raise UsageError(f"no benchmark named {lab!r}; known: {', '.join(BENCHMARKS)}")
    generator, bench, required = BENCHMARKS[lab]
    records = bench(profile)
    if reference:
        root = Path(out_dir) if out_dir else results.REFERENCE_DIR
        path = root / hardware.machine_tag() / f"{lab}.json"
    else:
        path = Path(out_dir or results.output_dir(f"bench-{lab}")) / f"{lab}.json"
    return results.write_results(
        path, lab, records, generator=generator, required=required(), command=command_line(lab, profile, reference)
    )


def command_line(name: str, profile: str, reference: bool) -> str:
    """The command that runs this benchmark, relative to the package (``python -m labkit bench ...``),
    whatever path the interpreter, the ``labkit`` script or the output folder had: no machine's
    path goes into a record."""
    return shlex.join(["python", "-m", "labkit", "bench", name, "--profile", profile] + ["--reference"] * reference)
