"""Lab 03, buffers that escape the allocator: the stream race, the wgrad pattern, the sanitizer,
the allocator timeline, allocation and misaligned-GEMM costs, and plots."""

from labkit.workbench.lab import Lab, Part

LAB = Lab(
    name="stream_races",
    number="03",
    package=__name__,
    title="Buffers that escape the allocator",
    bug="raw-pointer tensors skip the caching allocator's stream tracking: a side stream writes "
    "into memory that was freed and reused",
    short="raw-pointer tensors escape the allocator's stream tracking",
    story="TransformerEngine pull request #3049: grouped linear wgrads as tensor views",
    gpus="1",
    gpu_count="1",
    cpu_tier="the allocation helpers, the alignment arithmetic and report, the Triton GEMM at "
    "misaligned offsets; the recorded race, sanitizer, timeline and timings",
    status="ready",
    parts=(
        Part(name="the live race, sanitizer and allocator timeline", needs={"gpus": 1, "compiled": True}),
        Part(name="allocation and misaligned-GEMM timings", needs={"gpus": 1, "compiled": True}),
    ),
    benchmarks={"stream_races": "bench:benchmark"},
    exercises="exercises",
    catch="catch:CASES",
    report={"race": "findings:race_table", "headline": "findings:headline"},
    figures={"race": "findings:race_figure"},
    parameters="parameters:PARAMETERS",
)
