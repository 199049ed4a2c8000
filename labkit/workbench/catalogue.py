"""The map of the workbook: every lab, the bug it teaches, the seed story, and what it needs.

This catalogue is the single source for the README's lab table (``labkit labs --markdown``) and
the wide one in docs/labs.md (``labkit labs --markdown --wide``), both checked by a test, for
``labkit doctor``'s "what can each lab do here", and for the start-here notebook. A lab whose
notebook is not written yet is listed with ``status="planned"``; one whose notebook runs but
whose issue is still open (parts or reference data missing) is ``"draft"``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

from labkit.workbench import gates, hardware
from labkit.workbench.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    needs: dict  # keyword arguments of labkit.workbench.gates.requires


@dataclasses.dataclass(frozen=True)
class Lab:
    id: str  # notebook stem, e.g. "01_wrong_device"
    title: str
    bug: str
    seed: str  # file name in shared/seeds/
    gpus: str  # what the full lab needs, in words
    cpu_tier: str  # what the CPU tier shows
    status: str  # "ready", "draft" (notebook runs, issue open) or "planned"
    issue: int
    benchmarks: tuple[str, ...]  # its ``labkit bench`` entries (labkit.workbench.benchmarks)
    parts: tuple[Part, ...] = ()
    short: str = ""  # the bug in a few words: the README's narrow table
    gpu_count: str = ""  # the GPUs the full lab needs, as a number or range: the README's narrow table

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.id}.ipynb"

    @property
    def package(self) -> str:
        """The lab's story code: ``labkit.labs.<package>`` (the id without its number)."""
        return "labkit.labs." + self.id.split("_", 1)[1]


LABS: tuple[Lab, ...] = (
    Lab(
        "00_start_here",
        "Start here: the workbench",
        "none: a tour of the tools every lab uses (doctor, gates, crash sandbox, timing, plots)",
        "(all five)",
        "none; uses 1 if present",
        "everything: the doctor, a real crash contained in a child process, the copy kernel "
        "timed under the interpreter beside the GPU reference",
        "ready",
        2,
        ("doctor", "workbench", "checkers"),
        (Part("GPU copy bandwidth at full size", {"gpus": 1, "compiled": True}),),
        short="none: a tour of the tools every lab uses",
        gpu_count="0 (1 if present)",
    ),
    Lab(
        "01_wrong_device",
        "The wrong current device",
        "Triton launches on the current device, not the tensors' device: illegal memory access "
        "or a silent cross-GPU run under device_map='auto'",
        "sc-matmul-multi-gpu-device-guard-pr.txt",
        "2 (peer access for half the matrix)",
        "the SC matmul bit-exact against its literal bitstream reference, the tiny model's "
        "agreement; the recorded matrix, timings and model table",
        "ready",
        3,
        ("device_guard", "sc_kernel", "sc_launch", "sc_model"),
        (
            Part("the live device-confusion matrix", {"gpus": 2, "compiled": True}),
            Part("CUDA_LAUNCH_BLOCKING demonstration", {"gpus": 1, "compiled": True}),
            Part("the unguarded SC kernel inside a sharded model", {"gpus": 2, "compiled": True}),
            Part("the seed's regression test on 2 GPUs", {"gpus": 2, "compiled": True}),
            Part("decode benchmark at Llama-3.1-8B layer shapes", {"gpus": 2, "compiled": True}),
        ),
        short="a Triton kernel launched on the current device, not its tensors'",
        gpu_count="2",
    ),
    Lab(
        "02_collectives",
        "Collectives are kernels",
        "memory ordering in hand-written all-reduce / reduce-scatter / all-gather over "
        "symmetric memory; a barrier without acquire/release",
        "nccl-mode-triton-collectives-talk.txt",
        "2 to 8 with peer access",
        "every algorithm on an emulated world of 2-4 ranks (processes over shared memory) against an "
        "fp64 sum; the broken variants, the crash and the hang; the recorded sweeps",
        "ready",
        4,
        ("collectives", "collectives_tune", "links"),
        (
            Part("symmetric-memory collectives on GPUs", {"gpus": 2, "peer_access": True, "compiled": True}),
            Part("the sweep against NCCL and torch symm_mem", {"gpus": 2, "peer_access": True, "compiled": True}),
        ),
        short="hand-written collectives whose barriers lack acquire/release",
        gpu_count="2-8",
    ),
    Lab(
        "03_stream_races",
        "Buffers that escape the allocator",
        "raw-pointer tensors skip the caching allocator's stream tracking: a side stream writes "
        "into memory that was freed and reused",
        "te-grouped-wgrad-tensor-views-pr.txt",
        "1",
        "the allocation helpers, the alignment arithmetic and report, the Triton GEMM at "
        "misaligned offsets; the recorded race, sanitizer, timeline and timings",
        "ready",
        5,
        ("streams",),
        (
            Part("the live race, sanitizer and allocator timeline", {"gpus": 1, "compiled": True}),
            Part("allocation and misaligned-GEMM timings", {"gpus": 1, "compiled": True}),
        ),
        short="raw-pointer tensors escape the allocator's stream tracking",
        gpu_count="1",
    ),
    Lab(
        "04_grouped_gemm",
        "Token counts that stay on the device",
        "a grouped GEMM that reads per-expert counts on the device (no host sync, graph-safe), "
        "and a race on a global pinned-buffer index",
        "te-device-initiated-grouped-gemm-pr.txt",
        "1",
        "the grouped GEMM, its backward and the MoE layer against float64 loops; the drawn schedule; "
        "the staging-buffer race and its fixes; the recorded timings, sync check, capture and timeline",
        "ready",
        15,
        ("grouped_gemm", "grouped_gemm_tune"),
        (
            Part("grouped GEMM timings, the sync check and graph capture", {"gpus": 1, "compiled": True}),
            Part(
                "PyTorch's grouped GEMM as the baseline (sm_90+)", {"gpus": 1, "capability": (9, 0), "compiled": True}
            ),
            Part("the MoE layer in one CUDA graph, and its timeline", {"gpus": 1, "compiled": True}),
        ),
        short="expert counts read by the host; a race on a pinned buffer's index",
        gpu_count="1",
    ),
    Lab(
        "05_fp8_dispatch",
        "FP8 scaling across GPUs",
        "delayed-scaling state made on the current device under accelerate.dispatch_model: an "
        "illegal memory access reported at a later sync point",
        "te-multi-gpu-fp8-dispatch-model-issue.txt",
        "2",
        "the FP8 numerics (one-pass quantise, delayed scaling, the FP8 GEMM emulated) against references; "
        "the story's stack at 1/256 size in every mode on the CPU, each mechanism on one device; "
        "recorded matrix and timings where a GPU run has recorded them",
        "ready",
        16,
        ("fp8",),
        (
            Part("the story's matrix on two GPUs, each cell in a child process", {"gpus": 2, "compiled": True}),
            Part("CUDA_LAUNCH_BLOCKING: where the error is reported", {"gpus": 2, "compiled": True}),
            Part("FP8 vs bf16 GEMM speed at the MLP shapes", {"gpus": 1, "capability": (8, 9), "compiled": True}),
        ),
        short="FP8 scaling state made on the wrong GPU under dispatch_model",
        gpu_count="2",
    ),
    Lab(
        "06_memory_model",
        "The GPU memory model, seen",
        "litmus tests of the PTX memory model (scopes, relaxed/acquire/release, fences) within one GPU "
        "and across two; lab 02's broken barriers (relaxed, no end barrier, gpu scope) made to break",
        "nccl-mode-triton-collectives-talk.txt",
        "1 for the litmus tests in one GPU, 2 with peer access across GPUs",
        "the model's allowed/forbidden table for every test and variant, plain/volatile litmus runs under the "
        "interpreter (SC outcomes only), the PTX each semantics compiles to, the broken barriers in the emulated world",
        "ready",
        17,
        ("litmus", "litmus_two_gpus", "broken_barriers"),
        (
            Part("litmus tests within one GPU (every semantics and scope)", {"gpus": 1, "compiled": True}),
            Part(
                "litmus tests across two GPUs over symmetric memory", {"gpus": 2, "peer_access": True, "compiled": True}
            ),
            Part("broken barriers under a delay on two GPUs", {"gpus": 2, "peer_access": True, "compiled": True}),
        ),
        short="the PTX memory model in litmus tests; lab 02's barriers broken",
        gpu_count="1-2",
    ),
)


def get(lab_id: str) -> Lab:
    for lab in LABS:
        if lab.id == lab_id:
            return lab
    raise UsageError(f"no lab named {lab_id!r}; known: {', '.join(lab.id for lab in LABS)}")


def capability(lab: Lab, hw: hardware.Hardware | None = None) -> dict:
    """What the lab can do on this machine: 'full', 'partial' (with the parts skipped), 'planned'."""
    if lab.status not in ("ready", "draft"):
        return {"lab": lab.id, "can": "planned", "detail": "not written yet", "skipped": []}
    skipped = []
    for part in lab.parts:
        g = gates.requires(hw=hw, **part.needs)
        if not g.ok:
            skipped.append({"part": part.name, "reason": g.reason})
    can = "full" if not skipped else "partial"
    detail = (
        "every part runs here" if not skipped else "; ".join(f"{s['part']} skipped: {s['reason']}" for s in skipped)
    )
    return {"lab": lab.id, "can": can, "detail": detail, "skipped": skipped}


#: a code cell that draws a figure calls one of these (labkit's plotting helpers, or matplotlib's)
FIGURE_CALL = re.compile(r"\bbeside\(|\bplt\.subplots\(|\bnew_figure\(|\bplot_\w+\(")


def _text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


#: reading speed for the minutes column: words of Markdown a minute, plus a minute per figure
WORDS_PER_MINUTE = 150


def _cells(lab: Lab, root: str | Path | None, caller: str) -> list[dict]:
    if not isinstance(lab, Lab):
        raise UsageError(f"{caller}: lab must be a catalogue Lab, got {lab!r}")
    path = (Path(root) if root is not None else Path(__file__).resolve().parents[2]) / lab.notebook
    try:
        return json.loads(path.read_text())["cells"]
    except FileNotFoundError:
        raise UsageError(f"{caller}: {lab.id}'s notebook {path} is missing") from None


def _minutes(cells: list[dict]) -> int:
    words = sum(len(_text(c).split()) for c in cells if c["cell_type"] == "markdown")
    figures = sum(1 for c in cells if c["cell_type"] == "code" and FIGURE_CALL.search(_text(c)))
    return math.ceil(words / WORDS_PER_MINUTE + figures)


def reading_minutes(lab: Lab, root: str | Path | None = None) -> int:
    """Minutes to read a lab's notebook: its Markdown cells' words / WORDS_PER_MINUTE, plus one per
    code cell that draws a figure (FIGURE_CALL), rounded up."""
    return _minutes(_cells(lab, root, "reading_minutes"))


#: a Markdown cell that opens with this marks a section a first read skips (docs/workshop.md)
SKIP_MARK = "*Skip on first read"


def skipped_spans(cells: list[dict]) -> list[tuple[int, int]]:
    """(first, end) cell ranges a first read skips: each runs from a Markdown cell that opens with
    SKIP_MARK (placed just before a section's heading) to the next level-2 heading (``## ``), the
    next marker, or the end."""

    def opens(c: dict, prefix: str) -> bool:
        return c["cell_type"] == "markdown" and _text(c).lstrip().startswith(prefix)

    starts = [i for i, c in enumerate(cells) if opens(c, SKIP_MARK)]
    spans = []
    for i in starts:
        heading = i + 1 if i + 1 < len(cells) and opens(cells[i + 1], "#") else i
        end = next(
            (j for j in range(heading + 1, len(cells)) if opens(cells[j], "## ") or opens(cells[j], SKIP_MARK)),
            len(cells),
        )
        spans.append((i, end))
    return spans


def first_read_minutes(lab: Lab, root: str | Path | None = None) -> int:
    """reading_minutes of the notebook without the sections marked SKIP_MARK (skipped_spans)."""
    cells = _cells(lab, root, "first_read_minutes")
    skipped = {j for a, b in skipped_spans(cells) for j in range(a, b)}
    return _minutes([c for j, c in enumerate(cells) if j not in skipped])


def markdown_table(wide: bool = False, notebooks_at: str = "notebooks/") -> str:
    """The README's narrow lab table: the lab (linked to its notebook), the bug in a few words, GPUs,
    minutes to read, status. ``wide``: the notebook, the bug in full, the seed story, GPUs, what the
    CPU tier shows, status (the table in docs/labs.md). ``notebooks_at``: the notebooks' folder as a
    link from where the table is shown ("notebooks/" from the repository root, "" from a notebook)."""
    if not isinstance(notebooks_at, str) or (notebooks_at and not notebooks_at.endswith("/")):
        raise UsageError(f"markdown_table: notebooks_at must be '' or a folder ending in '/', got {notebooks_at!r}")
    columns = ("notebook", "the bug", "seed story", "GPUs", "CPU tier shows", "status")
    if not wide:
        columns = ("lab", "the bug", "GPUs", "minutes", "status")
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for lab in LABS:
        cell = {
            "lab": f"[{lab.id}]({notebooks_at}{lab.id}.ipynb)",
            "minutes": str(reading_minutes(lab)) if not wide else "",
            "notebook": f"`{lab.notebook}`",
            "the bug": lab.bug if wide else lab.short,
            "seed story": f"`{lab.seed}`" if lab.seed.endswith(".txt") else lab.seed,
            "GPUs": lab.gpus if wide else lab.gpu_count,
            "CPU tier shows": lab.cpu_tier,
            "status": lab.status,  # a status word only: issue numbers stay in the catalogue
        }
        rows.append("| " + " | ".join(cell[c] for c in columns) + " |")
    return "\n".join(rows)
