"""Lab 00, start here: the workbench toured (crash sandbox experiments, the copy kernel timed)."""

from labkit.workbench.lab import Lab, Part

LAB = Lab(
    name="start_here",
    number="00",
    package=__name__,
    title="Start here: the workbench",
    bug="none: a tour of the tools every lab uses (doctor, gates, crash sandbox, timing, plots)",
    short="none: a tour of the tools every lab uses",
    story="(all five)",
    gpus="none; uses 1 if present",
    gpu_count="0 (1 if present)",
    cpu_tier="everything: the doctor, a real crash contained in a child process, the copy kernel "
    "timed under the interpreter beside the GPU reference",
    status="ready",
    parts=(Part(name="GPU copy bandwidth at full size", needs={"gpus": 1, "compiled": True}),),
    benchmarks={"start_here": "copy_bandwidth:benchmark"},
    report={"l2-recorded": "findings:recorded_l2"},
    parameters="parameters:PARAMETERS",
)
