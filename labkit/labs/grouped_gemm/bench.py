"""Lab 04's benchmarks: labkit's grouped GEMM against PyTorch's and against the story's loop.

``labkit bench grouped_gemm`` runs ``benchmark(profile)`` (the comparison: forward, then dgrad
and wgrad, ``compare_backward_case``). The configuration sweep the per-GPU tables
``labkit.kernels.grouped_gemm.TABLES`` are chosen from (``labkit bench grouped_gemm_tune``) lives
in ``labkit.labs.grouped_gemm.tune`` and shares this module's pieces (shapes, operands, record
fields) and ``labkit.labs.grouped_gemm.measure``'s (float32 reference, capture, paired ratios).

The comparison, for each shape (E experts, M tokens, K, N; bf16) and each split of the tokens
(``distributions.token_counts``: "uniform" or Zipf-"skewed" with empty experts):

1. **Correctness first**: every implementation runs once on fresh inputs and is compared with
   a float32 product on a few experts (the largest, the smallest non-empty, the first and the
   last non-empty), and labkit with torch over all rows. ``max_rel_err`` is the largest
   |out - ref| over those rows divided by the largest |ref|; ``correct`` is it <= 1e-2.
2. **Eager** (``method="eager"``): back-to-back calls between CUDA events, the implementations
   interleaved in the same rounds (``labkit.workbench.bench.compare``): labkit (counts as a CUDA
   tensor), torch's grouped GEMM (where it has its device-side path) and the host-sync loop.
   This is what a Python caller pays, launches and the loop's host stall included.
3. **Graph** (``method="graph"``): labkit and torch, each as ``inner`` calls captured in one CUDA
   graph and replayed (the GPU's own time). The host-sync loop cannot be captured: a child
   process tries (``capture_check`` under ``run_isolated``, as a failed capture can leave the
   CUDA context unusable) and its error becomes a ``kind="capture"`` record, beside labkit and
   torch captured once and replayed after the counts were overwritten on the device.
4. **Host cost** (``cpu_us``): ``time.perf_counter`` around ``inner`` calls without a sync,
   divided by ``inner``: the launch cost of a call, or for the loop the time the CPU is held.

Ratios are paired per round (time of one implementation / time of the other in the same round,
median and quartiles over rounds): ``ratio_vs_torch`` < 1 means faster than torch. torch is
timed with w in both layouts its op takes (N-contiguous as labkit gets it, and a K-contiguous
copy made once before timing, ``w_layout``); ``ratio_vs_torch`` is against the faster of the two
in that comparison (``torch_layout_best`` marks it). torch's op allocates its output on every
call (it has no ``out=``); labkit and the loop write into a preallocated ``out``.

On the CPU tier (Triton interpreter) the same code runs at tiny shapes with ``method="cpu_clock"``:
labkit and the loop only (torch's fast path needs sm_90); its numbers are interpreter times,
never GPU performance (records say ``tier``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import torch

from labkit.kernels import grouped_gemm as gg
from labkit.labs.grouped_gemm import baselines, distributions
from labkit.labs.grouped_gemm.measure import (
    _capture_error,
    _capture_one,
    _checked_experts,
    _host_us,
    _one_line,
    _paired,
    _reference,
    _rel_err,
)
from labkit.workbench import bench, tier

REQUIRED = ("kind", "impl", "experts", "tokens", "K", "N", "skew", "method", "ms", "tflops")

#: (experts E, tokens M, K, N) per profile. GPU: a Mixtral-like layer (8 experts, 4096 wide), a
#: DeepSeek-MoE-like one (64 experts, expert width 1408) and a fine-grained one (128 experts).
#: CPU: tiny, under the interpreter; the second has K and N off the tile sizes (masked edges).
SHAPES = {
    "gpu": ((8, 16384, 4096, 4096), (64, 16384, 2048, 1408), (128, 8192, 2048, 768)),
    "cpu": ((4, 96, 32, 32), (8, 128, 48, 40)),
}
#: timing parameters per profile: warm-up calls, rounds, calls per sample, host-cost rounds
TIMING = {
    "gpu": {"warmup": 5, "reps": 20, "inner": 10, "host_rounds": 5},
    "cpu": {"warmup": 1, "reps": 3, "inner": 1, "host_rounds": 2},
}
#: the shape the capture check runs at (index into SHAPES[profile])
CAPTURE_SHAPE = 1
DTYPE = torch.bfloat16
#: relative error (to the largest |reference|) under which an implementation counts as correct:
#: bf16 output rounding is 2**-8 relative; accumulation order differences stay far below 1e-2
TOLERANCE = 1e-2
IMPLS = ("labkit", "torch_grouped_mm", "host_sync_loop")
#: the candidates' names inside one comparison -> (impl, layout of w)
_CANDIDATES = {
    "labkit": ("labkit", "N-contiguous"),
    "host_sync_loop": ("host_sync_loop", "N-contiguous"),
    "torch_grouped_mm": ("torch_grouped_mm", "N-contiguous"),
    "torch_grouped_mm[K]": ("torch_grouped_mm", "K-contiguous"),
    "torch_autograd": ("torch_grouped_mm", "autograd"),  # backward: torch.autograd.grad of the op
}
_TORCH_NAMES = ("torch_grouped_mm", "torch_grouped_mm[K]", "torch_autograd")
#: the backward products timed beside the forward (kind "gemm_backward", field ``op``)
BACKWARD_OPS = ("dgrad", "wgrad")


# ----------------------------------------------------------------------------------------------
# Shared pieces


def _profile(profile: str) -> str:
    if profile not in SHAPES:
        raise ValueError(f"profile: {profile!r} is not one of {tuple(SHAPES)}")
    return profile


def _bench_device() -> torch.device:
    """Where a benchmark runs: the current GPU (checked: one GPU, compiled kernels), else the CPU
    under the interpreter."""
    device = tier.kernel_device()
    if device.type == "cuda":
        from labkit.workbench import gates

        gates.requires(gpus=1, compiled=True).check()
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"


def _operands(E: int, M: int, K: int, N: int, device: torch.device, seed: int):
    """x [M, K] and w [E, K, N] in bf16, N(0, 1) and N(0, 1/K): outputs of order 1."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device).to(DTYPE)
    w = (torch.randn(E, K, N, generator=g, device=device) / math.sqrt(K)).to(DTYPE)
    return x, w


#: fields every gemm record carries (None where they do not apply), so tables line up
_GEMM_FIELDS = dict.fromkeys(
    (
        "timing_method",
        "ms",
        "ms_p25",
        "ms_p75",
        "ms_min",
        "samples",
        "inner",
        "tflops",
        "ratio_vs_torch",
        "ratio_vs_torch_p25",
        "ratio_vs_torch_p75",
        "ratio_vs_loop",
        "ratio_vs_loop_p25",
        "ratio_vs_loop_p75",
        "cpu_us",
        "torch_layout_best",
        "error",
    )
)


def _shape_fields(E: int, M: int, K: int, N: int, skew: str) -> dict:
    """The fields naming one case of a comparison or a sweep: shape, split and dtype."""
    return {"experts": E, "tokens": M, "K": K, "N": N, "skew": skew, "dtype": "bfloat16"}


def _case_fields(
    E: int,
    M: int,
    K: int,
    N: int,
    skew: str,
    op: str,
    counts: list[int],
    device: torch.device,
    torch_ok: bool,
    torch_why: str,
) -> dict:
    """The fields every ``gemm`` and ``gemm_backward`` record of one case carries: the case, its
    token split, the GPU, whether torch's grouped GEMM runs there, the FLOPs and the config source."""
    desc = distributions.describe(counts)
    return {
        **_shape_fields(E, M, K, N, skew),
        "counts": counts,
        "max_over_mean": desc["max_over_mean"],
        "zero_experts": desc["zero_experts"],
        "counts_text": desc["text"],
        "gpu": _gpu_name(device),
        "tier": tier.TIER,
        "torch_available": torch_ok,
        "torch_reason": torch_why,
        "torch_op": baselines.op_name(),
        "flops": gg.flops(M, N, K),
        "op": op,
        "config_source": gg.config_source(device, op),
    }


def _blank(row: dict) -> dict:
    for k in REQUIRED:
        row.setdefault(k, None)
    return row


def _config_fields(cfg: gg.GroupedConfig | None) -> dict:
    names = [f.name for f in dataclasses.fields(gg.GroupedConfig)]
    return dataclasses.asdict(cfg) if cfg is not None else dict.fromkeys(names)


# ----------------------------------------------------------------------------------------------
# The comparison


def compare_case(
    E: int, M: int, K: int, N: int, skew: str, device: torch.device, timing: dict, seed: int = 0
) -> list[dict]:
    """Records of one shape and split: correctness, then eager (and on a GPU, graph) timings of
    every implementation in one comparison each, and the host cost per call."""
    cuda = device.type == "cuda"
    counts = distributions.token_counts(E, M, skew, seed=seed)
    counts_dev = torch.tensor(counts, dtype=torch.int32, device=device)
    x, w = _operands(E, M, K, N, device, seed=1 + seed)
    torch_ok, torch_why = baselines.torch_grouped_mm_available(device)
    out_lk = torch.empty(M, N, dtype=DTYPE, device=device)
    out_loop = torch.empty(M, N, dtype=DTYPE, device=device)
    fns: dict[str, Callable[[], object]] = {
        "labkit": lambda: gg.grouped_mm(x, w, counts_dev, out=out_lk),
        "host_sync_loop": lambda: baselines.host_sync_loop(x, w, counts_dev, out=out_loop),
    }
    w_k = None
    # torch's op also runs on the CPU (a per-group loop): there it is checked, never timed
    if torch_ok or (baselines.op_name() is not None and not cuda):
        w_k = baselines.k_major(w)
        fns["torch_grouped_mm"] = lambda: baselines.torch_grouped_mm(x, w, counts_dev)
        fns["torch_grouped_mm[K]"] = lambda: baselines.torch_grouped_mm(x, w_k, counts_dev)

    case = _case_fields(E, M, K, N, skew, "forward", counts, device, torch_ok, torch_why)
    chosen = gg.forward_config(M, E, device)
    records: list[dict] = []

    # 1. correctness, before any timing
    ref = _reference(x, w, counts)
    errors, outputs, failed = {}, {}, {}
    for name, fn in fns.items():
        try:
            y = fn()
            outputs[name] = y
            errors[name] = _rel_err(y, ref)
        except Exception as e:
            failed[name] = _one_line(e)
    vs_torch = None
    if "labkit" in outputs and "torch_grouped_mm" in outputs:
        t = outputs["torch_grouped_mm"].float()
        vs_torch = float((outputs["labkit"].float() - t).abs().max() / t.abs().max().clamp_min(1e-30))
    del outputs
    timed = [
        n for n in fns if n not in failed and (cuda or n not in _TORCH_NAMES) and (torch_ok or n not in _TORCH_NAMES)
    ]

    def record(name: str, method: str, **fields) -> dict:
        impl, layout = _CANDIDATES[name]
        return _blank(
            {
                "kind": "gemm",
                **case,
                **_GEMM_FIELDS,
                "impl": impl,
                "w_layout": layout,
                "method": method,
                "max_rel_err": errors.get(name),
                "correct": (errors[name] <= TOLERANCE) if name in errors else None,
                "labkit_vs_torch_max_rel": vs_torch if impl == "labkit" else None,
                **_config_fields(chosen if impl == "labkit" else None),
                **fields,
            }
        )

    for name, why in failed.items():
        records.append(record(name, "eager" if cuda else "cpu_clock", error=why))
    if not cuda:
        for name in _TORCH_NAMES:
            if name in errors:  # checked on the CPU, not timed: the reason says why
                records.append(record(name, "cpu_clock", error=f"not timed: {torch_why}"))

    records += _timed_records(fns, timed, record, device, timing, gg.flops(M, N, K))
    return records


def _timed_records(
    fns: dict[str, Callable[[], object]],
    timed: list[str],
    record: Callable[..., dict],
    device: torch.device,
    timing: dict,
    flop_count: int,
) -> list[dict]:
    """Steps 2-4 of a comparison: the ``timed`` candidates of ``fns`` eager (CUDA events) and, on
    a GPU, as graph replays (each captured first: one that cannot is recorded with its error),
    interleaved in one ``bench.compare`` per method; paired ratios against the fastest torch
    candidate (``_TORCH_NAMES``) and the host-sync loop where timed; host cost per call (eager)."""
    cuda = device.type == "cuda"
    records: list[dict] = []
    # 2. eager, interleaved
    methods = [("eager", "cuda_events")] if cuda else [("cpu_clock", "cpu_clock")]
    # 3. graph replays (the loop cannot be captured: see capture_check)
    if cuda:
        methods.append(("graph", "cuda_graph"))
    for method, how in methods:
        names = [n for n in timed if not (method == "graph" and n == "host_sync_loop")]
        if method == "graph":
            for n in list(names):
                err = _capture_error(fns[n], device)
                if err:
                    names.remove(n)
                    records.append(record(n, method, error=f"capture failed: {err}"))
        if not names:
            continue
        try:
            cmp = bench.compare(
                {n: fns[n] for n in names},
                baseline=names[0],
                device=device if cuda else None,
                warmup=timing["warmup"],
                reps=timing["reps"],
                inner=timing["inner"],
                method=how,
            )
        except Exception as e:
            records += [record(n, method, error=f"timing failed: {_one_line(e)}") for n in names]
            continue
        torch_names = [n for n in names if n in _TORCH_NAMES]
        best = min(torch_names, key=lambda n: cmp.timings[n].median_us) if torch_names else None
        for n in names:
            t = cmp.timings[n]
            ms = t.median_us / 1e3
            fields = {
                "timing_method": how,
                "ms": ms,
                "ms_p25": t.p25_us / 1e3,
                "ms_p75": t.p75_us / 1e3,
                "ms_min": t.min_us / 1e3,
                "samples": len(t.samples_us),
                "inner": t.inner,
                "tflops": flop_count / ms / 1e9,
                "torch_layout_best": (n == best) if n in _TORCH_NAMES else None,
            }
            for key, base in (
                ("ratio_vs_torch", best),
                ("ratio_vs_loop", "host_sync_loop" if "host_sync_loop" in names else None),
            ):
                r = _paired(cmp, n, base) if base else (None, None, None)
                fields.update({key: r[0], f"{key}_p25": r[1], f"{key}_p75": r[2]})
            if method != "graph":
                fields["cpu_us"] = _host_us(fns[n], timing["inner"], timing["host_rounds"], cuda)
            records.append(record(n, method, **fields))
    return records


def compare_backward_case(
    E: int, M: int, K: int, N: int, skew: str, op: str, device: torch.device, timing: dict, seed: int = 0
) -> list[dict]:
    """Records (kind ``gemm_backward``) of one backward product of the forward x [M, K] @ w[e]
    [K, N], at one shape and split: ``op`` "dgrad" (dx = dy_e @ w[e]^T, [M, K]) or "wgrad"
    (dW_e = x_e^T @ dy_e, [E, K, N], written in bf16 as torch's is).

    labkit runs its kernels as ``GroupedLinear``'s backward calls them (``grouped_mm`` on
    ``w.transpose(1, 2)``; ``grouped_mm_wgrad``), into preallocated outputs. "What PyTorch gives
    you" is autograd of ``torch._grouped_mm``: timed as ``torch.autograd.grad`` on a kept forward
    graph (``torch_autograd``), and as the op called directly for the same products
    (``baselines.torch_grouped_mm_dgrad`` with w in both layouts, ``torch_grouped_mm_wgrad``),
    which is autograd without its bookkeeping. ``ratio_vs_torch`` is against the fastest of them
    in the same rounds (``torch_layout_best`` marks it; ``w_layout`` "autograd" is the autograd
    call). Correctness first (float32 on the checked experts), then eager and graph timings as in
    ``compare_case``; no host-sync loop here (its backward is the story's, not a baseline)."""
    if op not in BACKWARD_OPS:
        raise ValueError(f"op: {op!r} is not one of {BACKWARD_OPS}")
    cuda = device.type == "cuda"
    counts = distributions.token_counts(E, M, skew, seed=seed)
    counts_dev = torch.tensor(counts, dtype=torch.int32, device=device)
    x, w = _operands(E, M, K, N, device, seed=1 + seed)
    g = torch.Generator(device=device).manual_seed(2 + seed)
    dy = torch.randn(M, N, generator=g, device=device).to(DTYPE)
    torch_ok, torch_why = baselines.torch_grouped_mm_available(device)
    runs_torch = torch_ok or (baselines.op_name() is not None and not cuda)
    fns: dict[str, Callable[[], object]] = {}
    if op == "dgrad":
        out = torch.empty(M, K, dtype=DTYPE, device=device)
        w_t = w.transpose(1, 2)
        fns["labkit"] = lambda: gg.grouped_mm(dy, w_t, counts_dev, out=out)
        if runs_torch:
            w_k = baselines.k_major(w)
            fns["torch_grouped_mm"] = lambda: baselines.torch_grouped_mm_dgrad(dy, w, counts_dev)
            fns["torch_grouped_mm[K]"] = lambda: baselines.torch_grouped_mm_dgrad(dy, w_k, counts_dev)
    else:
        out = torch.empty(E, K, N, dtype=DTYPE, device=device)
        fns["labkit"] = lambda: gg.grouped_mm_wgrad(x, dy, counts_dev, out=out)
        if runs_torch:
            fns["torch_grouped_mm"] = lambda: baselines.torch_grouped_mm_wgrad(x, dy, counts_dev)
    if runs_torch:
        try:
            fns["torch_autograd"] = baselines.torch_autograd_backward(
                x, w, counts_dev, dy, "x" if op == "dgrad" else "w"
            )
        except Exception as e:  # recorded below as the candidate's error
            fns["torch_autograd"] = _raiser(e)
    checked = _checked_experts(counts)
    starts = list(itertools.accumulate([0] + counts[:-1]))

    def rel_err(y: torch.Tensor) -> float:
        worst, scale = 0.0, 0.0
        for e in checked:
            rows = slice(starts[e], starts[e] + counts[e])
            if op == "dgrad":
                ref, got = dy[rows].float() @ w[e].float().T, y[rows].float()
            else:
                ref, got = x[rows].float().T @ dy[rows].float(), y[e].float()
            worst = max(worst, float((got - ref).abs().max()))
            scale = max(scale, float(ref.abs().max()))
        return worst / scale if scale else worst

    case = _case_fields(E, M, K, N, skew, op, counts, device, torch_ok, torch_why)
    chosen = gg.forward_config(M, E, device, op="dgrad") if op == "dgrad" else gg.wgrad_config(M, E, device)
    errors, failed = {}, {}
    for name, fn in fns.items():
        try:
            errors[name] = rel_err(fn())
        except Exception as e:
            failed[name] = _one_line(e)

    def record(name: str, method: str, **fields) -> dict:
        impl, layout = _CANDIDATES[name]
        return _blank(
            {
                "kind": "gemm_backward",
                **case,
                **_GEMM_FIELDS,
                "impl": impl,
                "w_layout": layout if (op == "dgrad" or layout == "autograd") else None,
                "method": method,
                "max_rel_err": errors.get(name),
                "correct": (errors[name] <= TOLERANCE) if name in errors else None,
                **_config_fields(chosen if impl == "labkit" else None),
                **fields,
            }
        )

    records = [record(name, "eager" if cuda else "cpu_clock", error=why) for name, why in failed.items()]
    if not cuda:
        records += [
            record(name, "cpu_clock", error=f"not timed: {torch_why}") for name in _TORCH_NAMES if name in errors
        ]
    timed = [n for n in fns if n not in failed and (cuda and torch_ok or n not in _TORCH_NAMES)]
    return records + _timed_records(fns, timed, record, device, timing, gg.flops(M, N, K))


def _raiser(error: Exception) -> Callable[[], object]:
    def call():
        raise error

    return call


def capture_check(E: int, M: int, K: int, N: int, seed: int = 0) -> list[dict]:
    """Run in a child process (``run_isolated``): capture one call of each implementation in a
    CUDA graph, with uniform counts in a device buffer. For those that capture, overwrite the
    buffer with the skewed split and replay: the graph must compute the new split's product
    (the counts are read on the device at replay time). The host-sync loop goes last: its failed
    capture may leave this process's CUDA context unusable."""
    device = torch.device("cuda", torch.cuda.current_device())
    uniform = distributions.token_counts(E, M, "uniform", seed=seed)
    skewed = distributions.token_counts(E, M, "skewed", seed=seed)
    counts_dev = torch.tensor(uniform, dtype=torch.int32, device=device)
    x, w = _operands(E, M, K, N, device, seed=1 + seed)
    ref = _reference(x, w, skewed)
    out = torch.empty(M, N, dtype=DTYPE, device=device)
    fns = {"labkit": lambda: gg.grouped_mm(x, w, counts_dev, out=out)}
    if baselines.torch_grouped_mm_available(device)[0]:
        fns["torch_grouped_mm"] = lambda: baselines.torch_grouped_mm(x, w, counts_dev)
    fns["host_sync_loop"] = lambda: baselines.host_sync_loop(x, w, counts_dev, out=out)
    rows = []
    for name, fn in fns.items():
        row = {"impl": name, "captured": False, "error": None, "recount_max_rel_err": None, "recount_correct": None}
        counts_dev.copy_(torch.tensor(uniform, dtype=torch.int32))
        try:
            graph, y = _capture_one(fn)
            row["captured"] = True
            counts_dev.copy_(torch.tensor(skewed, dtype=torch.int32))  # new counts, same graph
            graph.replay()
            torch.cuda.synchronize()
            err = _rel_err(y, ref)
            row.update(recount_max_rel_err=err, recount_correct=err <= TOLERANCE)
        except Exception as e:
            row["error"] = _one_line(e)
        rows.append(row)
    return rows


def _capture_records(E: int, M: int, K: int, N: int, device: torch.device, timeout: float = 300.0) -> list[dict]:
    base = {
        "kind": "capture",
        "experts": E,
        "tokens": M,
        "K": K,
        "N": N,
        "skew": "uniform, then skewed",
        "method": "graph",
        "ms": None,
        "tflops": None,
        "gpu": _gpu_name(device),
        "tier": tier.TIER,
        "captured": None,
        "error": None,
        "recount_max_rel_err": None,
        "recount_correct": None,
    }
    if device.type != "cuda":
        return [
            _blank(dict(base, impl=impl, captured=None, error="not run: CUDA graphs need a CUDA GPU")) for impl in IMPLS
        ]
    from labkit.workbench import sandbox

    res = sandbox.run_isolated(capture_check, E, M, K, N, timeout=timeout)
    if res.ok:
        return [_blank(dict(base, **row)) for row in res.value]
    return [
        _blank(dict(base, impl=impl, captured=None, error=f"the capture experiment failed: {res.summary()}"))
        for impl in IMPLS
    ]


def benchmark(
    profile: str,
    shapes=None,
    skews=distributions.SKEWS,
    timing: dict | None = None,
    capture: bool = True,
    progress: bool = True,
    moe: bool = True,
    staging: bool = True,
    backward: tuple[str, ...] = BACKWARD_OPS,
) -> list[dict]:
    """Entry point of ``labkit bench grouped_gemm``: every shape of ``SHAPES[profile]`` (or
    ``shapes``: (E, M, K, N) tuples) and split, compared forward (``compare_case``) and for each
    of ``backward`` (``compare_backward_case``: dgrad, wgrad), then the capture
    check; then the MoE layer's records (``moe_bench.moe_records``: timings, graph vs eager, the
    sync check, timelines) and the staging-buffer scenarios (``staging.all_scenarios``), each
    with the fields of REQUIRED that do not apply to it set to None. ``timing`` overrides
    ``TIMING[profile]``."""
    from tqdm.auto import tqdm

    profile = _profile(profile)
    device = _bench_device()
    shapes = list(shapes or SHAPES[profile])
    timing = dict(TIMING[profile], **(timing or {}))
    cases = [(shape, skew) for shape in shapes for skew in skews]
    records = []
    for (E, M, K, N), skew in tqdm(cases, desc="grouped GEMM", unit="case", disable=not progress):
        records += compare_case(E, M, K, N, skew, device, timing)
        for op in backward:
            records += compare_backward_case(E, M, K, N, skew, op, device, timing)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if capture:
        records += _capture_records(*shapes[min(CAPTURE_SHAPE, len(shapes) - 1)], device)
    if moe:
        from labkit.labs.grouped_gemm import moe_bench

        records += [_with_required(r) for r in moe_bench.moe_records(profile)]
    if staging:
        from labkit.labs.grouped_gemm import staging as staging_model

        records += [
            _with_required(dict(r, impl=r["design"], method=r["scenario"]))
            for r in staging_model.all_scenarios(str(device))
        ]
    return records


def _with_required(record: dict) -> dict:
    """A record of another kind (moe_layer, timeline, staging, ...) given every REQUIRED field."""
    return {**{k: None for k in REQUIRED}, **record}
