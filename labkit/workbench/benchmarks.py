"""The registry behind ``labkit bench LAB``: each lab's benchmark function and the fields its
records must carry. Reference files in ``reference/<machine>/<lab>.json`` are written only here.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path

from labkit.workbench import hardware, results
from labkit.workbench.errors import UsageError

#: lab -> (module, function(profile) -> records, required record fields attribute)
BENCHMARKS = {
    "doctor": ("labkit.workbench.doctor", "benchmark", "REQUIRED"),
    "workbench": ("labkit.labs.start_here.copy_bandwidth", "benchmark", "REQUIRED"),
    "sc_kernel": ("labkit.labs.wrong_device.sc_bench", "benchmark", "REQUIRED"),
    "sc_launch": ("labkit.labs.wrong_device.sc_bench", "launch_sweep", "SWEEP_REQUIRED"),
    "device_guard": ("labkit.labs.wrong_device.bench", "benchmark", "REQUIRED"),
    "sc_model": ("labkit.labs.wrong_device.model", "benchmark", "REQUIRED"),
    "streams": ("labkit.labs.stream_races.bench", "benchmark", "REQUIRED"),
    "collectives": ("labkit.labs.collectives.bench", "benchmark", "REQUIRED"),
    "collectives_tune": ("labkit.labs.collectives.bench", "tune_benchmark", "REQUIRED"),
    "links": ("labkit.labs.collectives.links", "benchmark", "REQUIRED"),
    "grouped_gemm": ("labkit.labs.grouped_gemm.bench", "benchmark", "REQUIRED"),
    "grouped_gemm_tune": ("labkit.labs.grouped_gemm.tune", "tune_benchmark", "REQUIRED"),
    "fp8": ("labkit.labs.fp8_dispatch.bench", "benchmark", "REQUIRED"),
    "litmus": ("labkit.labs.memory_model.sweep", "benchmark", "REQUIRED"),
    "litmus_two_gpus": ("labkit.labs.memory_model.sweep", "benchmark_two_gpus", "REQUIRED"),
    "broken_barriers": ("labkit.labs.memory_model.broken_barriers", "benchmark", "REQUIRED"),
    "checkers": ("labkit.workbench.catch_record", "benchmark", "REQUIRED"),
}


def run(lab: str, profile: str, out_dir: str | Path | None = None, reference: bool = False) -> Path:
    """Run a lab's benchmark and write its results file; returns the path written.

    reference=True writes ``<out_dir or reference/>/<machine>/<lab>.json``: what the GPU tier
    commits as reference data. Otherwise the file goes to ``<out_dir or the run folder>/<lab>.json``.
    """
    if lab not in BENCHMARKS:
        raise UsageError(f"no benchmark for lab {lab!r}; known: {', '.join(BENCHMARKS)}")
    module_name, fn_name, required_name = BENCHMARKS[lab]
    module = importlib.import_module(module_name)
    records = getattr(module, fn_name)(profile)
    if reference:
        root = Path(out_dir) if out_dir else results.REFERENCE_DIR
        path = root / hardware.machine_tag() / f"{lab}.json"
    else:
        path = Path(out_dir or results.output_dir(f"bench-{lab}")) / f"{lab}.json"
    command = shlex.join(["labkit", "bench", lab, "--profile", profile] + (["--reference"] if reference else []))
    return results.write_results(
        path,
        lab,
        records,
        generator=f"{module_name}.{fn_name}",
        required=getattr(module, required_name),
        command=f"{command}  # argv: {shlex.join(sys.argv)}",
    )
