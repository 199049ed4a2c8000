"""Lab 04, token counts that stay on the device: the grouped GEMM's host-sync cost, the MoE layer in a
CUDA graph, and the pinned staging buffer's race."""

from labkit.workbench.lab import Lab, Part

LAB = Lab(
    name="grouped_gemm",
    number="04",
    package=__name__,
    title="Token counts that stay on the device",
    bug="a grouped GEMM that reads per-expert counts on the device (no host sync, graph-safe), "
    "and a race on a global pinned-buffer index",
    short="expert counts read by the host; a race on a pinned buffer's index",
    story="TransformerEngine pull request #2360: device-initiated grouped GEMM, m_splits on the device",
    gpus="1",
    gpu_count="1",
    cpu_tier="the grouped GEMM, its backward and the MoE layer against float64 loops; the drawn schedule; "
    "the staging-buffer race and its fixes; the recorded timings, sync check, capture and timeline",
    status="ready",
    parts=(
        Part(name="grouped GEMM timings, the sync check and graph capture", needs={"gpus": 1, "compiled": True}),
        Part(
            name="PyTorch's grouped GEMM as the baseline (sm_90+)",
            needs={"gpus": 1, "capability": (9, 0), "compiled": True},
        ),
        Part(name="the MoE layer in one CUDA graph, and its timeline", needs={"gpus": 1, "compiled": True}),
    ),
    benchmarks={"grouped_gemm": "bench:benchmark", "grouped_gemm_tune": "tune:tune_benchmark"},
    exercises="exercises",
    catch="catch:CASES",
    report={
        "vs-torch": "findings:versus_torch_table",
        "backward": "findings:backward_table",
        "tile-loops": "findings:tile_loops_table",
    },
    parameters="parameters:PARAMETERS",
)
