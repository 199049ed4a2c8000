"""Lab 06: the GPU memory model, seen: litmus tests swept over semantics, scope, placement and
stress (``sweep``), lab 02's broken barriers made to break (``broken_barriers``), their plots and
panels."""

from labkit.workbench.lab import Lab, Part

LAB = Lab(
    name="memory_model",
    number="06",
    package=__name__,
    title="The GPU memory model, seen",
    bug="litmus tests of the PTX memory model (scopes, relaxed/acquire/release, fences) within one GPU "
    "and across two; lab 02's broken barriers (relaxed, no end barrier, gpu scope) made to break",
    short="the PTX memory model in litmus tests; lab 02's barriers broken",
    story="CUDA MODE IRL talk: Triton collectives over symmetric memory (Zhang, Moore, Chan)",
    gpus="1 for the litmus tests in one GPU, 2 with peer access across GPUs",
    gpu_count="1-2",
    cpu_tier="the model's allowed/forbidden table for every test and variant, plain/volatile litmus runs under the "
    "interpreter (SC outcomes only), the PTX each semantics compiles to, the broken barriers in the emulated world",
    status="ready",
    parts=(
        Part(name="litmus tests within one GPU (every semantics and scope)", needs={"gpus": 1, "compiled": True}),
        Part(
            name="litmus tests across two GPUs over symmetric memory",
            needs={"gpus": 2, "peer_access": True, "compiled": True},
        ),
        Part(
            name="broken barriers under a delay on two GPUs", needs={"gpus": 2, "peer_access": True, "compiled": True}
        ),
    ),
    benchmarks={
        "memory_model_litmus": "sweep:benchmark",
        "memory_model_litmus_two_gpus": "sweep:benchmark_two_gpus",
        "memory_model_broken_barriers": "broken_barriers:benchmark",
    },
    exercises="exercises",
    report={"litmus-rows": "findings:rows_table", "broken-barriers": "findings:broken_barriers_table"},
    parameters="parameters:PARAMETERS",
)
