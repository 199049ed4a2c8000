"""Lab 05's benchmark (``labkit bench fp8_dispatch``): the story's matrix, the debugging lesson, and what
FP8 costs or saves against bf16 at the story's MLP shapes.

Records, each with ``kind`` and the ``REQUIRED`` fields (None where they do not apply):

* ``kind="matrix"``: one cell of {placement} x {mode} (``model.run_case``'s record without its
  per-step list, plus ``sandbox``: how the child process ended, and ``reported_at``: the labkit
  line the first error surfaced at). Profile "gpu": the story's shapes at full size, placements
  one_gpu and two_gpus (and other_gpu: the whole stack on cuda:1 while cuda:0 is current, for
  the naive and device-aware modes), every mode (bf16, fp8_naive, fp8_device_aware, and each of
  the story's mechanisms alone), each cell in its own child process with a time limit: an illegal
  memory access, a crash or a hang becomes a record with the sandbox's status, never an exception
  here. A cell this machine cannot run (two GPUs needed) is a record whose outcome says why.
  Profile "cpu": placement ``model.local_placement()`` ("cpu" under the interpreter, "one_gpu" on
  a GPU machine's compiled tier) at ``size=1/256``, in this process (seconds).
* ``kind="launch_blocking"``: the naive cells on two GPUs again with ``CUDA_LAUNCH_BLOCKING=1``:
  the debugging lesson, where the error is reported when every launch waits for its kernel.
* ``kind="meta"``: one per (cell, step, module, tensor) of the forward state, flattened from the
  cells: ``step, module, tensor, device`` (where the state lives), ``weight_device``, ``amax``
  (measured in that step) and ``scale`` (after that step's update). Backward state is left out:
  the story's run is forward only, its amax stays 0 and its scale 1.
* ``kind="speed"`` (profile "gpu", one GPU with FP8 tensor cores): at the MLP's shapes, gate/up
  (x 12000 x 8192 @ W.T, W 28672 x 8192) and down (12000 x 28672 @ W.T, W 8192 x 28672), in one
  comparison each (``labkit.workbench.bench.compare``, CUDA events, candidates interleaved, ratios
  paired per round): ``bf16`` (``F.linear``, what the layer runs outside FP8), ``fp8_gemm`` (the
  FP8 GEMM alone, operands cast beforehand), ``fp8_quantize_gemm`` (the input's one-pass
  quantise, ``labkit.kernels.fp8.cast.quantize``, then the GEMM: what a forward pays per call)
  and ``fp8_weight_cast`` (the weight's quantise, paid once per optimizer step, reported apart).
* ``kind="tool"``: whether ``compute-sanitizer`` is on this machine's PATH (not run here).
"""

from __future__ import annotations

import collections
import shutil

import torch

from labkit.labs.fp8_dispatch import model
from labkit.labs.fp8_dispatch.naive import MECHANISMS, mechanism_label
from labkit.workbench import bench, gates, sandbox, tier
from labkit.workbench.gates import HardwareUnavailable

REQUIRED = ("placement", "mode", "mechanism", "outcome", "rel_err_vs_bf16", "forward_ms")
KINDS = ("matrix", "launch_blocking", "meta", "speed", "tool")
PROFILES = ("gpu", "cpu")
#: the story's sizes per profile (fraction of its dimensions) and steps per FP8 cell
SIZE = {"gpu": 1.0, "cpu": 1 / 256}
STEPS = {"gpu": 3, "cpu": 3}
#: seconds a GPU cell may take in its child process (start, build at full size, run) before it
#: counts as a hang
CELL_TIMEOUT_S = 180.0
NAIVE_MODES = ("fp8_naive",) + MECHANISMS
#: placement -> GPUs it needs, and the modes it runs (profile "gpu")
GPU_PLACEMENTS = {
    "one_gpu": (1, model.MODES),
    "two_gpus": (2, model.MODES),
    "other_gpu": (2, ("fp8_naive", "fp8_device_aware")),
}
#: the MLP's GEMMs: name -> (M tokens, K in, N out); y = x [M, K] @ W.T, W [N, K]
SPEED_SHAPES = {
    "gpu": {"gate/up": (12000, 8192, 28672), "down": (12000, 28672, 8192)},
    "cpu": {"gate/up": (48, 32, 112), "down": (48, 112, 32)},
}
SPEED_IMPLS = ("bf16", "fp8_gemm", "fp8_quantize_gemm", "fp8_weight_cast")
SPEED_TIMING = {"gpu": {"warmup": 5, "reps": 25, "inner": 3}, "cpu": {"warmup": 1, "reps": 3, "inner": 1}}
#: what the speed comparison needs: FP8 tensor cores (sm_89 or newer) and compiled kernels
SPEED_GATE = {"gpus": 1, "capability": (8, 9), "compiled": True}
_PER_STEP = ("records",)


def _blank(row: dict) -> dict:
    for k in REQUIRED:
        row.setdefault(k, None)
    return row


def _profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"profile: {profile!r} is not one of {', '.join(map(repr, PROFILES))}")
    return profile


def reported_at(rec: dict | None = None, traceback: str | None = None) -> str | None:
    """Where the first error surfaced, as "file:line (source)": from a record's error chain
    (``run_case`` caught it; the chain's last entry is the error raised first), else the innermost
    labkit frame of a child's traceback (the child died with it); None if there was no error."""
    if rec is not None:
        errors = rec.get("errors") or []
        return errors[-1].get("at") if errors else None
    lines = (traceback or "").splitlines()
    site = None
    for i, line in enumerate(lines):
        if line.strip().startswith('File "') and "labkit" in line and i + 1 < len(lines):
            path = line.strip().split('"')[1].split("labkit/")[-1]
            lineno = line.split(", line ")[-1].split(",")[0]
            site = f"{path}:{lineno} ({lines[i + 1].strip()})"
    return site


def matrix_cells(profile: str, gpu_count: int) -> list[dict]:
    """The cells a profile runs on a machine with ``gpu_count`` GPUs: dicts with kind,
    placement, mode, env and ``skip`` (None, or the one-line reason the cell cannot run here)."""
    _profile(profile)
    if profile == "cpu":
        here = model.local_placement()
        return [{"kind": "matrix", "placement": here, "mode": m, "env": None, "skip": None} for m in model.MODES]
    cells = []
    for placement, (need, modes) in GPU_PLACEMENTS.items():
        why = (
            None
            if gpu_count >= need
            else f"needs {need} CUDA GPU{'s' if need > 1 else ''}; this machine has {gpu_count}"
        )
        cells += [{"kind": "matrix", "placement": placement, "mode": m, "env": None, "skip": why} for m in modes]
    why = None if gpu_count >= 2 else f"needs 2 CUDA GPUs; this machine has {gpu_count}"
    cells += [
        {
            "kind": "launch_blocking",
            "placement": "two_gpus",
            "mode": m,
            "env": {"CUDA_LAUNCH_BLOCKING": "1"},
            "skip": why,
        }
        for m in NAIVE_MODES
    ]
    return cells


def _skipped(cell: dict, size: float, steps: int) -> dict:
    return _blank(
        {
            "kind": cell["kind"],
            "placement": cell["placement"],
            "mode": cell["mode"],
            "mechanism": mechanism_label(cell["mode"]),
            "outcome": f"skipped: {cell['skip']}",
            "size": size,
            "steps": steps,
            "sandbox": None,
            "reported_at": None,
            "launch_blocking": cell["kind"] == "launch_blocking",
        }
    )


def run_cell(cell: dict, size: float, steps: int, isolated: bool, timeout: float = CELL_TIMEOUT_S) -> dict:
    """One cell as a record. isolated: in a child process (GPU), where a crash or a hang is the
    sandbox's status; otherwise in this process (CPU tier, where nothing can crash the device)."""
    base = {"kind": cell["kind"], "launch_blocking": cell["kind"] == "launch_blocking"}
    if not isolated:
        rec = model.run_case(cell["placement"], cell["mode"], size=size, steps=steps)
        return dict(rec, **base, sandbox=None, reported_at=reported_at(rec))
    res = sandbox.run_isolated(
        model.run_case, cell["placement"], cell["mode"], size, steps, timeout=timeout, env=cell["env"]
    )
    if res.ok:
        rec = res.value
        return dict(rec, **base, sandbox="ok", sandbox_summary=res.summary(), reported_at=reported_at(rec))
    # the child died (or hung) before it could return its record: the sandbox's status is the outcome
    return _blank(
        dict(
            base,
            placement=cell["placement"],
            mode=cell["mode"],
            mechanism=mechanism_label(cell["mode"]),
            outcome=res.status,
            size=size,
            steps=steps,
            sandbox=res.status,
            sandbox_summary=res.summary(),
            reported_at=reported_at(traceback=res.traceback),
            errors=[{"type": res.error_type, "message": (res.message or "")[:500], "at": None}],
            stderr_tail="\n".join(res.stderr.strip().splitlines()[-8:]),
        )
    )


def meta_records(cell: dict) -> list[dict]:
    """The per-step forward amax/scale records of a cell, flattened (kind "meta")."""
    out = []
    for r in cell.get("records") or []:
        if r.get("direction") != "forward":
            continue
        out.append(
            _blank(
                {
                    "kind": "meta",
                    "placement": cell["placement"],
                    "mode": cell["mode"],
                    "mechanism": cell.get("mechanism"),
                    "step": r["step"],
                    "module": r["module"],
                    "tensor": r["tensor"],
                    "device": r["device"],
                    "weight_device": r["weight_device"],
                    "amax": r["amax"],
                    "scale": r["scale"],
                }
            )
        )
    return out


def _flatten(cell: dict) -> list[dict]:
    """The cell's record without its per-step list, then its meta records."""
    row = {k: v for k, v in cell.items() if k not in _PER_STEP}
    return [_blank(row)] + (meta_records(cell) if cell["kind"] == "matrix" else [])


# ----------------------------------------------------------------------------------------------
# FP8 vs bf16 speed


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def speed_case(name: str, M: int, K: int, N: int, device, timing: dict, seed: int = 0) -> list[dict]:
    """One MLP GEMM: correctness of the FP8 path against bf16 first, then every candidate timed in
    the same interleaved rounds, ratios paired against bf16 (CUDA events on a GPU; the CPU clock
    under the interpreter, where the numbers say nothing about a GPU)."""
    import torch.nn.functional as F

    from labkit.kernels.fp8 import fp8_gemm, quantize
    from labkit.kernels.fp8.gemm import choose_backend
    from labkit.kernels.fp8.recipe import FP8_MAX

    device = torch.device(device)
    cuda = device.type == "cuda"
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=g, device=device) * K**-0.5).to(torch.bfloat16)
    e4m3 = torch.float8_e4m3fn

    def delayed_scale(t):  # a scale as delayed scaling would have it: from an earlier amax of t
        return (FP8_MAX[e4m3] / t.float().abs().amax()).reshape(1)

    sx, sw = delayed_scale(x), delayed_scale(w)
    ax, aw = torch.zeros(1, device=device), torch.zeros(1, device=device)
    w8 = quantize(w, sw, aw, e4m3)
    backend = choose_backend(device)
    x8 = quantize(x, sx, ax, e4m3)  # quantised once, here: "fp8_gemm" times the GEMM alone
    fns = {
        "bf16": lambda: F.linear(x, w),
        "fp8_gemm": lambda: fp8_gemm(x8, w8),
        "fp8_quantize_gemm": lambda: fp8_gemm(quantize(x, sx, ax, e4m3), w8),
        "fp8_weight_cast": lambda: quantize(w, sw, aw, e4m3),
    }
    ref = fns["bf16"]()
    err = {
        "bf16": 0.0,
        "fp8_gemm": _rel(fns["fp8_gemm"](), ref),
        "fp8_quantize_gemm": _rel(fns["fp8_quantize_gemm"](), ref),
        "fp8_weight_cast": None,
    }
    gpu = torch.cuda.get_device_name(device) if cuda else "cpu (Triton interpreter)"
    base = {
        "kind": "speed",
        "shape": name,
        "M": M,
        "K": K,
        "N": N,
        "placement": "one_gpu" if cuda else "cpu",
        "mechanism": None,
        "forward_ms": None,
        "gpu": gpu,
        "tier": tier.TIER,
        "backend": backend,
        "timing_method": "cuda_events" if cuda else "cpu_clock",
        "flops": 2 * M * N * K,
    }
    cmp = bench.compare(
        fns,
        baseline="bf16",
        device=device if cuda else None,
        warmup=timing["warmup"],
        reps=timing["reps"],
        inner=timing["inner"],
        method="cuda_events" if cuda else "cpu_clock",
    )
    return _speed_rows(cmp, base, err, M, K, N)


def _speed_rows(cmp: bench.Comparison, base: dict, err: dict, M: int, K: int, N: int) -> list[dict]:
    """One ``speed`` record per candidate of ``speed_case``'s comparison: times, ratios paired
    against bf16, TFLOP/s for the GEMMs and GB/s for the weight cast."""
    out = []
    for impl in SPEED_IMPLS:
        t = cmp.timings[impl]
        ms = t.median_us / 1e3
        lo, hi = cmp.ratio_iqr(impl)
        gemm = impl != "fp8_weight_cast"
        out.append(
            _blank(
                dict(
                    base,
                    mode=impl,
                    impl=impl,
                    outcome="ok",
                    rel_err_vs_bf16=err[impl],
                    ms=ms,
                    ms_p25=t.p25_us / 1e3,
                    ms_p75=t.p75_us / 1e3,
                    samples=len(t.samples_us),
                    inner=t.inner,
                    ratio_vs_bf16=cmp.ratio(impl),
                    ratio_vs_bf16_p25=lo,
                    ratio_vs_bf16_p75=hi,
                    tflops=(2 * M * N * K / ms / 1e9) if gemm else None,
                    gbps=None if gemm else bench.gbps(N * K * 3, t.median_us),
                )
            )
        )
    return out


def speed_records(profile: str, device=None, shapes: dict | None = None, timing: dict | None = None) -> list[dict]:
    """``speed_case`` for each MLP shape of the profile; on profile "gpu" without FP8 tensor cores,
    one record saying why (the emulated GEMM has no speed to show)."""
    _profile(profile)
    if profile == "gpu":
        gate = gates.requires(**SPEED_GATE)
        if not gate.ok:
            return [
                _blank({"kind": "speed", "placement": "one_gpu", "mode": None, "outcome": f"skipped: {gate.reason}"})
            ]
        device = device or torch.device("cuda", torch.cuda.current_device())
    device = device or tier.kernel_device()
    timing = dict(SPEED_TIMING[profile], **(timing or {}))
    out = []
    for name, (M, K, N) in (shapes or SPEED_SHAPES[profile]).items():
        out += speed_case(name, M, K, N, device, timing)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------------------------
# The entry point


def tool_record() -> dict:
    path = shutil.which("compute-sanitizer")
    return _blank(
        {
            "kind": "tool",
            "tool": "compute-sanitizer",
            "path": path,
            "outcome": "present, not run by this benchmark" if path else "not on PATH",
        }
    )


def benchmark(
    profile: str,
    size: float | None = None,
    steps: int | None = None,
    progress: bool = True,
    speed: bool = True,
    timeout: float = CELL_TIMEOUT_S,
) -> list[dict]:
    """Entry point of ``labkit bench fp8_dispatch``: every cell of the profile's matrix, its meta records,
    and (profile "gpu", ``speed``) the FP8 vs bf16 GEMM comparison. size, steps: override the
    profile's (the notebook's parameters)."""
    from tqdm.auto import tqdm

    profile = _profile(profile)
    size = SIZE[profile] if size is None else size
    steps = STEPS[profile] if steps is None else steps
    gpus = 0
    if profile == "gpu":
        gate = gates.requires(gpus=1, compiled=True)
        if not gate.ok:
            raise HardwareUnavailable(
                f"labkit bench fp8_dispatch --profile gpu: {gate.reason} (the cpu profile runs anywhere)"
            )
        gpus = torch.cuda.device_count()
    cells = matrix_cells(profile, gpus)
    records = [tool_record()] if profile == "gpu" else []
    for cell in tqdm(cells, desc="FP8 matrix", unit="cell", disable=not progress):
        if cell["skip"]:
            records.append(_skipped(cell, size, steps))
            continue
        records += _flatten(run_cell(cell, size, steps, isolated=profile == "gpu", timeout=timeout))
    if progress:
        print(summary(records))
    if profile == "gpu" and speed:
        records += speed_records(profile)
    return records


def summary(records: list[dict]) -> str:
    """One line under the progress bar: how many matrix cells ended in each outcome class
    ("exception: RuntimeError: ..." counts as "exception", "skipped: ..." as "skipped")."""
    counts = collections.Counter(
        str(r.get("outcome")).split(":", 1)[0] for r in records if r.get("kind") in ("matrix", "launch_blocking")
    )
    return f"FP8 matrix: {sum(counts.values())} cells: " + ", ".join(
        f"{n} {outcome}" for outcome, n in counts.most_common()
    )


__all__ = [
    "REQUIRED",
    "KINDS",
    "matrix_cells",
    "run_cell",
    "meta_records",
    "speed_case",
    "speed_records",
    "benchmark",
    "summary",
    "reported_at",
    "SPEED_SHAPES",
    "SPEED_IMPLS",
    "NAIVE_MODES",
]
