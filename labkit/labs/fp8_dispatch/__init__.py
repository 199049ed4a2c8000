"""Lab 05, FP8 scaling across GPUs: delayed-scaling state made on the current device under accelerate.dispatch_model."""

from labkit.workbench.lab import Lab, Part

LAB = Lab(
    name="fp8_dispatch",
    number="05",
    package=__name__,
    title="FP8 scaling across GPUs",
    bug="delayed-scaling state made on the current device under accelerate.dispatch_model: an "
    "illegal memory access reported at a later sync point",
    short="FP8 scaling state made on the wrong GPU under dispatch_model",
    story="TransformerEngine issue #3124: multi-GPU FP8 under accelerate.dispatch_model",
    gpus="2",
    gpu_count="2",
    cpu_tier="the FP8 numerics (one-pass quantise, delayed scaling, the FP8 GEMM emulated) against references; "
    "the story's stack at 1/256 size in every mode on the CPU, each mechanism on one device; "
    "recorded matrix and timings where a GPU run has recorded them",
    status="ready",
    parts=(
        Part(name="the story's matrix on two GPUs, each cell in a child process", needs={"gpus": 2, "compiled": True}),
        Part(name="CUDA_LAUNCH_BLOCKING: where the error is reported", needs={"gpus": 2, "compiled": True}),
        Part(
            name="FP8 vs bf16 GEMM speed at the MLP shapes", needs={"gpus": 1, "capability": (8, 9), "compiled": True}
        ),
    ),
    benchmarks={"fp8_dispatch": "bench:benchmark"},
    exercises="exercises",
    catch="catch:CASES",
    report={"speed": "findings:speed_table"},
    parameters="parameters:PARAMETERS",
)
