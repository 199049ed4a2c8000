"""Lab 01, the wrong current device: the device-confusion matrix, the SC matmul benchmarks and
plots, and a Llama-shaped model sharded across GPUs."""

from labkit.workbench.lab import Benchmark, Lab, Part

LAB = Lab(
    name="wrong_device",
    number="01",
    package=__name__,
    title="The wrong current device",
    bug="Triton launches on the current device, not the tensors' device: illegal memory access "
    "or a silent cross-GPU run under device_map='auto'",
    short="a Triton kernel launched on the current device, not its tensors'",
    story="sc/matmul pull request #17: guard Triton launches with the input's CUDA device",
    gpus="2 (peer access for half the matrix)",
    gpu_count="2",
    cpu_tier="the SC matmul bit-exact against its literal bitstream reference, the tiny model's "
    "agreement; the recorded matrix, timings and model table",
    status="ready",
    parts=(
        Part(name="the live device-confusion matrix", needs={"gpus": 2, "compiled": True}),
        Part(name="CUDA_LAUNCH_BLOCKING demonstration", needs={"gpus": 1, "compiled": True}),
        Part(name="the unguarded SC kernel inside a sharded model", needs={"gpus": 2, "compiled": True}),
        Part(name="the seed's regression test on 2 GPUs", needs={"gpus": 2, "compiled": True}),
        Part(name="decode benchmark at Llama-3.1-8B layer shapes", needs={"gpus": 2, "compiled": True}),
    ),
    benchmarks={
        "wrong_device": "bench:benchmark",
        "wrong_device_sc_kernel": "sc_bench:benchmark",
        "wrong_device_sc_launch": Benchmark(run="sc_bench:launch_sweep", required="SWEEP_REQUIRED"),
        "wrong_device_sc_model": "model:benchmark",
    },
    exercises="exercises",
    catch="catch:CASES",
    parameters="parameters:PARAMETERS",
)
