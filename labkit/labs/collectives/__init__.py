"""Lab 02, collectives are kernels: correctness experiments, broken variants, sweeps against NCCL
and torch symm_mem, the link probe, the PTX proof and plots."""

from labkit.workbench.lab import Lab, Part

LAB = Lab(
    name="collectives",
    number="02",
    package=__name__,
    title="Collectives are kernels",
    bug="memory ordering in hand-written all-reduce / reduce-scatter / all-gather over "
    "symmetric memory; a barrier without acquire/release",
    short="hand-written collectives whose barriers lack acquire/release",
    story="CUDA MODE IRL talk: Triton collectives over symmetric memory (Zhang, Moore, Chan)",
    gpus="2 to 8 with peer access",
    gpu_count="2-8",
    cpu_tier="every algorithm on an emulated world of 2-4 ranks (processes over shared memory) against an "
    "fp64 sum; the broken variants, the crash and the hang; the recorded sweeps",
    status="ready",
    parts=(
        Part(name="symmetric-memory collectives on GPUs", needs={"gpus": 2, "peer_access": True, "compiled": True}),
        Part(
            name="the sweep against NCCL and torch symm_mem", needs={"gpus": 2, "peer_access": True, "compiled": True}
        ),
    ),
    benchmarks={
        "collectives": "bench:benchmark",
        "collectives_tune": "bench:tune_benchmark",
        "collectives_links": "links:benchmark",
    },
    exercises="exercises",
    catch="catch:CASES",
    report={
        "small-messages": "findings:small_messages_table",
        "large-messages": "findings:large_messages_table",
        "eager-calls": "findings:eager_calls_table",
        "headline": "findings:headline",
    },
    parameters="parameters:PARAMETERS",
)
