"""Lab 04's benchmarks: labkit's grouped GEMM against PyTorch's and against the story's loop.

``labkit bench grouped_gemm`` runs ``benchmark(profile)`` (the comparison: forward, then dgrad
and wgrad, ``compare_backward_case``) and ``labkit bench grouped_gemm_tune`` runs
``tune_benchmark(profile)`` (the sweep the per-GPU tables ``labkit.kernels.grouped_gemm.TABLES``
are chosen from, by ``table_winners``; ``python -m labkit.labs.grouped_gemm.bench --table FILE``
prints a recorded sweep's tables).

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

import contextlib
import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from labkit.kernels import grouped_gemm as gg
from labkit.labs.grouped_gemm import baselines, distributions
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


def _checked_experts(counts: list[int]) -> list[int]:
    """A few experts to check against float32: the largest, the smallest non-empty, the first
    and the last non-empty (duplicates dropped)."""
    busy = [e for e, c in enumerate(counts) if c]
    picks = [max(busy, key=lambda e: counts[e]), min(busy, key=lambda e: counts[e]), busy[0], busy[-1]]
    return sorted(set(picks))


def _reference(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> dict[int, tuple[int, torch.Tensor]]:
    """expert -> (first row, float32 product) for the checked experts."""
    starts = list(itertools.accumulate([0] + counts[:-1]))
    return {
        e: (starts[e], x[starts[e] : starts[e] + counts[e]].float() @ w[e].float()) for e in _checked_experts(counts)
    }


def _rel_err(out: torch.Tensor, ref: dict[int, tuple[int, torch.Tensor]]) -> float:
    worst, scale = 0.0, 0.0
    for _, (r0, r) in ref.items():
        got = out[r0 : r0 + r.shape[0]].float()
        worst = max(worst, float((got - r).abs().max()))
        scale = max(scale, float(r.abs().max()))
    return worst / scale if scale else worst


def _paired(cmp: bench.Comparison, name: str, base: str) -> tuple[float, float, float]:
    """Median and quartiles of the per-round ratios time(name) / time(base) of one comparison."""
    r = sorted(a / b for a, b in zip(cmp.timings[name].samples_us, cmp.timings[base].samples_us))
    q = lambda p: r[round(p * (len(r) - 1))]  # noqa: E731  (bench.Comparison.ratio_iqr's rule)
    return statistics.median(r), q(0.25), q(0.75)


def _host_us(fn: Callable[[], object], calls: int, rounds: int, cuda: bool) -> float:
    """Median over ``rounds`` of the host time of ``calls`` calls without a sync, per call (µs):
    a call's launch cost, or all of its time where it waits for the GPU (the loop's tolist)."""
    samples = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(samples)


def _capture_one(fn: Callable[[], object]):
    """One call of fn captured in a CUDA graph on the current device, after a warm-up call on a
    side stream (compilation, lazy allocations); returns (graph, what the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def _capture_error(fn: Callable[[], object], device: torch.device) -> str | None:
    """Capture one call of fn in a CUDA graph (after a warm-up on a side stream); None if that
    works, else the error in one line. For implementations expected to capture: the one that
    cannot (the loop) is tried in a child process instead (``capture_check``)."""
    try:
        with torch.cuda.device(device):
            graph, _ = _capture_one(fn)
            del graph
        return None
    except Exception as e:
        return _one_line(e)


def _one_line(e: BaseException) -> str:
    """The error in one line, its first cause first: a failed capture raises again when the
    capture ends ("operation failed due to a previous error during capture"), which would
    otherwise hide the call that broke it."""

    def line(x: BaseException) -> str:
        text = str(x).strip().splitlines()
        return f"{type(x).__name__}: {text[0][:300] if text else ''}"

    root, seen = e, {id(e)}
    while root.__context__ is not None and id(root.__context__) not in seen:
        root = root.__context__
        seen.add(id(root))
    return line(root) if root is e else f"{line(root)} (then {line(e)})"


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
#: likewise for tune records
_TUNE_FIELDS = dict.fromkeys(
    (
        "ms",
        "ms_p25",
        "ms_p75",
        "samples",
        "inner",
        "tflops",
        "ratio_vs_chosen",
        "ratio_vs_chosen_p25",
        "ratio_vs_chosen_p75",
        "best",
        "max_rel_err",
        "correct",
        "error",
    )
)


def _blank(row: dict) -> dict:
    for k in REQUIRED:
        row.setdefault(k, None)
    return row


def _config_fields(cfg: gg.GroupedConfig | None) -> dict:
    names = [f.name for f in dataclasses.fields(gg.GroupedConfig)]
    return dataclasses.asdict(cfg) if cfg is not None else dict.fromkeys(names)


def _tflops(E: int, M: int, K: int, N: int, ms: float | None) -> float | None:
    return gg.flops(M, N, K) / ms / 1e9 if ms else None


# ----------------------------------------------------------------------------------------------
# The comparison


def compare_case(
    E: int, M: int, K: int, N: int, skew: str, device: torch.device, timing: dict, seed: int = 0
) -> list[dict]:
    """Records of one shape and split: correctness, then eager (and on a GPU, graph) timings of
    every implementation in one comparison each, and the host cost per call."""
    cuda = device.type == "cuda"
    counts = distributions.token_counts(E, M, skew, seed=seed)
    desc = distributions.describe(counts)
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

    case = {
        "experts": E,
        "tokens": M,
        "K": K,
        "N": N,
        "skew": skew,
        "dtype": "bfloat16",
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
        "op": "forward",
        "config_source": gg.config_source(device, "forward"),
    }
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
    desc = distributions.describe(counts)
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

    case = {
        "experts": E,
        "tokens": M,
        "K": K,
        "N": N,
        "skew": skew,
        "dtype": "bfloat16",
        "op": op,
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
        "config_source": gg.config_source(device, op),
    }
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


# ----------------------------------------------------------------------------------------------
# The configuration sweep


#: candidate tile grids per profile (every combination, minus those over SMEM_LIMIT), for the
#: forward and dgrad (the same kernel; dgrad's w K-contiguous) and for wgrad
TUNE_GRID = {
    # 8 warps beat 4 at every shape in a probe on one H100 (not kept in reference/), so the GPU
    # grid keeps 4 warps only for 64-row tiles, where two programs per SM can fit; TMA on and off
    "gpu": {
        "block_m": (64, 128),
        "block_n": (128, 256),
        "block_k": (64,),
        "group_m": (8,),
        "num_warps": (8,),
        "num_stages": (3, 4),
        "programs_per_sm": (1,),
        "tma": (False, True),
    },
    "cpu": {
        "block_m": (16, 32),
        "block_n": (32,),
        "block_k": (32,),
        "group_m": (4,),
        "num_warps": (4,),
        "num_stages": (1,),
        "programs_per_sm": (1,),
        "tma": (False, True),
    },
}
_c = gg._cfg  # (block_m, block_n, block_k, group_m, num_warps, num_stages, programs_per_sm, tma)
#: configurations added to the grid, per profile and op: "any" at every shape, an int at that
#: number of experts only
TUNE_EXTRA: dict[str, dict[str, dict]] = {
    "gpu": {
        "forward": {
            # two programs per SM where two fit (64-row tiles, 4 warps)
            "any": [_c(64, 128, 64, 8, 4, 4, 2), _c(64, 128, 64, 8, 4, 4, 2, True)],
            # E=8 (2048 tokens per expert, K = N = 4096): the shape where torch's CUTLASS kernel
            # is hardest to beat. L2-grouped tile order (GROUP_M: tile-rows sharing w's column
            # blocks), a deeper reduction step (BLOCK_K 128, fewer stages to fit) and deeper
            # pipelines, around the recorded winner, pointer and TMA loads.
            8: [
                *(_c(64, 256, 64, g, 8, 4, 1, t) for g in (4, 16, 32) for t in (False, True)),
                *(_c(128, 256, 64, g, 8, 3, 1, True) for g in (4, 16)),
                *(_c(m, n, 128, 8, 8, s, 1, t) for m, n, s in ((64, 256, 2), (128, 128, 3)) for t in (False, True)),
                _c(128, 256, 128, 8, 8, 2, 1, True),
                *(_c(m, n, 64, 8, 8, 5, 1, t) for m, n in ((64, 256), (128, 128)) for t in (False, True)),
            ],
        },
        "dgrad": {"any": [_c(64, 128, 64, 8, 4, 4, 2), _c(64, 128, 64, 8, 4, 4, 2, True)]},
        "wgrad": {"any": []},
    },
    "cpu": {"forward": {"any": []}, "dgrad": {"any": []}, "wgrad": {"any": []}},
}
del _c
TUNE_TIMING = {"gpu": {"warmup": 3, "reps": 10, "inner": 10}, "cpu": {"warmup": 1, "reps": 2, "inner": 1}}
#: shared memory a config may ask for (H100/H200: 228 KiB per SM, 227 KiB per block at most)
SMEM_LIMIT = 200 * 1024


def smem_bytes(cfg: gg.GroupedConfig, itemsize: int = 2) -> int:
    """Approximate shared memory of a config: one x tile and one w tile per pipeline stage."""
    return (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n) * itemsize * cfg.num_stages


def candidate_configs(
    grid: dict, chosen: gg.GroupedConfig | None = None, extra: Sequence[gg.GroupedConfig] = ()
) -> list[gg.GroupedConfig]:
    """Every combination of ``grid`` whose ``smem_bytes`` fits SMEM_LIMIT, then ``extra`` (those
    that fit, not already there), plus ``chosen`` (what the kernel picks, measured whatever it
    asks for)."""
    keys = [f.name for f in dataclasses.fields(gg.GroupedConfig)]
    missing = [k for k in keys if k not in grid]
    if missing:
        raise ValueError(f"grid: lacks {missing}")
    configs = [gg.GroupedConfig(**dict(zip(keys, values))) for values in itertools.product(*(grid[k] for k in keys))]
    configs = [c for c in configs if smem_bytes(c) <= SMEM_LIMIT]
    configs += [c for c in dict.fromkeys(extra) if c not in configs and smem_bytes(c) <= SMEM_LIMIT]
    if chosen is not None and chosen not in configs:
        configs.insert(0, chosen)
    return configs


def _extra(profile: str, op: str, experts: int) -> list[gg.GroupedConfig]:
    table = TUNE_EXTRA[profile][op]
    return list(table.get("any", ())) + list(table.get(experts, ()))


@contextlib.contextmanager
def forced_config(cfg: gg.GroupedConfig) -> Iterator[None]:
    """Benchmark-only hook: while inside, ``grouped_mm`` and ``grouped_mm_wgrad`` launch with
    ``cfg`` whatever the shape. It swaps ``labkit.kernels.grouped_gemm.forward_config`` and
    ``wgrad_config`` (looked up on each call) and puts them back on exit; not thread-safe, not
    for use outside the sweep."""
    if not isinstance(cfg, gg.GroupedConfig):
        raise TypeError(f"cfg: expected a GroupedConfig, got {type(cfg).__name__}")
    originals = gg.forward_config, gg.wgrad_config
    gg.forward_config = lambda M, E, device, dtype=None, op="forward": cfg
    gg.wgrad_config = lambda M, E, device, dtype=None: cfg
    try:
        yield
    finally:
        gg.forward_config, gg.wgrad_config = originals


def _chosen(op: str, M: int, E: int, device: torch.device) -> gg.GroupedConfig:
    if op == "wgrad":
        return gg.wgrad_config(M, E, device)
    return gg.forward_config(M, E, device, op=op)


def config_name(cfg: gg.GroupedConfig) -> str:
    """A config in one short string, as tune records name it ("m64 n256 k64 g8 w8 s4 p1 tma")."""
    return (
        f"m{cfg.block_m} n{cfg.block_n} k{cfg.block_k} g{cfg.group_m} w{cfg.num_warps} s{cfg.num_stages}"
        f" p{cfg.programs_per_sm}" + (" tma" if cfg.tma else "")
    )


def tune_case(
    E: int,
    M: int,
    K: int,
    N: int,
    skew: str,
    device: torch.device,
    grid: dict,
    timing: dict,
    seed: int = 0,
    bar=None,
    op: str = "forward",
    extra: Sequence[gg.GroupedConfig] = (),
) -> list[dict]:
    """Records of one product (``op``: "forward", "dgrad" or "wgrad" of the forward x [M, K] @
    w[e] [K, N]) at one shape and split: each candidate config checked against float32, then all
    timed in one comparison (graph replays on a GPU), paired against the kernel's own choice."""
    if op not in gg.OPS:
        raise ValueError(f"op: {op!r} is not one of {gg.OPS}")
    cuda = device.type == "cuda"
    started = time.perf_counter()
    counts = distributions.token_counts(E, M, skew, seed=seed)
    desc = distributions.describe(counts)
    counts_dev = torch.tensor(counts, dtype=torch.int32, device=device)
    x, w = _operands(E, M, K, N, device, seed=1 + seed)
    if op == "forward":
        out = torch.empty(M, N, dtype=DTYPE, device=device)
        call = lambda: gg.grouped_mm(x, w, counts_dev, out=out)  # noqa: E731
        ref = _reference(x, w, counts)
        result = lambda y: y  # noqa: E731
    else:
        g = torch.Generator(device=device).manual_seed(2 + seed)
        dy = torch.randn(M, N, generator=g, device=device).to(DTYPE)
        if op == "dgrad":
            w_t = w.transpose(1, 2)
            out = torch.empty(M, K, dtype=DTYPE, device=device)
            call = lambda: gg.grouped_mm(dy, w_t, counts_dev, out=out)  # noqa: E731
            ref = _reference(dy, w_t, counts)
            result = lambda y: y  # noqa: E731
        else:  # wgrad, checked as rows of x^T: expert e's [K, N] block stacked at row e * K
            out = torch.empty(E, K, N, dtype=DTYPE, device=device)
            call = lambda: gg.grouped_mm_wgrad(x, dy, counts_dev, out=out)  # noqa: E731
            starts = list(itertools.accumulate([0] + counts[:-1]))
            ref = {
                e: (
                    e * K,
                    x[starts[e] : starts[e] + counts[e]].float().T @ dy[starts[e] : starts[e] + counts[e]].float(),
                )
                for e in _checked_experts(counts)
            }
            result = lambda y: y.reshape(E * K, N)  # noqa: E731
    chosen = _chosen(op, M, E, device)
    configs = candidate_configs(grid, chosen, extra)
    method = "graph" if cuda else "cpu_clock"
    base = {
        "kind": "tune",
        "impl": "labkit",
        "op": op,
        "experts": E,
        "tokens": M,
        "K": K,
        "N": N,
        "skew": skew,
        "dtype": "bfloat16",
        "method": method,
        "timing_method": "cuda_graph" if cuda else "cpu_clock",
        "max_over_mean": desc["max_over_mean"],
        "zero_experts": desc["zero_experts"],
        "gpu": _gpu_name(device),
        "tier": tier.TIER,
        "config_source": gg.config_source(device, op),
        **_TUNE_FIELDS,
    }

    def forced(cfg):
        with forced_config(cfg):
            return call()

    records, fns, errors = [], {}, {}
    for cfg in configs:
        name = config_name(cfg)
        fields = dict(base, config=name, **dataclasses.asdict(cfg), smem_bytes=smem_bytes(cfg), chosen=cfg == chosen)
        try:
            errors[name] = _rel_err(result(forced(cfg)), ref)
            err = _capture_error(lambda cfg=cfg: forced(cfg), device) if cuda else None
            if err:
                raise RuntimeError(f"capture failed: {err}")
            fns[name] = (cfg, fields)
        except Exception as e:
            records.append(_blank(dict(fields, error=_one_line(e), max_rel_err=errors.get(name))))
        if bar is not None:
            bar.update()
    if not fns:
        return records
    chosen_name = next((n for n, (cfg, _) in fns.items() if cfg == chosen), next(iter(fns)))
    try:
        cmp = bench.compare(
            {n: (lambda cfg=cfg: forced(cfg)) for n, (cfg, _) in fns.items()},
            baseline=chosen_name,
            device=device if cuda else None,
            warmup=timing["warmup"],
            reps=timing["reps"],
            inner=timing["inner"],
            method="cuda_graph" if cuda else "cpu_clock",
        )
    except Exception as e:
        return records + [
            _blank(dict(fields, max_rel_err=errors[n], error=f"timing failed: {_one_line(e)}"))
            for n, (_, fields) in fns.items()
        ]
    best = min(fns, key=lambda n: cmp.timings[n].median_us)
    case_s = time.perf_counter() - started
    for name, (_, fields) in fns.items():
        t = cmp.timings[name]
        ms = t.median_us / 1e3
        r = _paired(cmp, name, chosen_name)
        records.append(
            _blank(
                dict(
                    fields,
                    ms=ms,
                    ms_p25=t.p25_us / 1e3,
                    ms_p75=t.p75_us / 1e3,
                    samples=len(t.samples_us),
                    inner=t.inner,
                    tflops=_tflops(E, M, K, N, ms),
                    ratio_vs_chosen=r[0],
                    ratio_vs_chosen_p25=r[1],
                    ratio_vs_chosen_p75=r[2],
                    best=name == best,
                    max_rel_err=errors[name],
                    correct=errors[name] <= TOLERANCE,
                    case_s=case_s,
                )
            )
        )
    return records


def tune_benchmark(
    profile: str,
    shapes=None,
    skews=distributions.SKEWS,
    grid: dict | None = None,
    timing: dict | None = None,
    progress: bool = True,
    ops: Sequence[str] = gg.OPS,
) -> list[dict]:
    """Entry point of ``labkit bench grouped_gemm_tune``: ``tune_case`` for every op, shape and
    split of the profile, labkit only. ``chosen`` marks the kernel's pick, ``best`` the fastest,
    ``case_s`` the seconds a case took (compiles included: the sweep's budget is about 4 minutes
    on one H200). On an H100 ``--reference`` writes reference/h100x1/grouped_gemm_tune.json:
    the source of that GPU's tables (``labkit.kernels.grouped_gemm.TABLES``)."""
    from tqdm.auto import tqdm

    profile = _profile(profile)
    device = _bench_device()
    shapes = list(shapes or SHAPES[profile])
    grid = grid or TUNE_GRID[profile]
    timing = dict(TUNE_TIMING[profile], **(timing or {}))
    bad = [op for op in ops if op not in gg.OPS]
    if bad:
        raise ValueError(f"ops: {bad} not in {gg.OPS}")
    cases = [(op, shape, skew) for op in ops for shape in shapes for skew in skews]
    total = sum(
        len(candidate_configs(grid, _chosen(op, s[1], s[0], device), _extra(profile, op, s[0]))) for op, s, _ in cases
    )
    records = []
    with tqdm(total=total, desc="grouped GEMM configs", unit="config", disable=not progress) as bar:
        for op, (E, M, K, N), skew in cases:
            extra = _extra(profile, op, E)
            records += tune_case(E, M, K, N, skew, device, grid, timing, bar=bar, op=op, extra=extra)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return records


def best_configs(records: list[dict]) -> list[dict]:
    """Per (op, experts, tokens, K, N, skew) of ``tune`` records: the fastest correct config and
    the chosen one's TFLOP/s beside it (the evidence for the tables, or against them)."""
    groups: dict = {}
    for r in records:
        if r.get("kind") == "tune" and r.get("ms") and r.get("correct"):
            key = (r.get("op") or "forward", r["experts"], r["tokens"], r["K"], r["N"], r["skew"])
            groups.setdefault(key, []).append(r)
    rows = []
    for key, rs in sorted(groups.items()):
        top = min(rs, key=lambda r: r["ms"])
        chosen = next((r for r in rs if r.get("chosen")), None)
        rows.append(
            {
                "op": key[0],
                "experts": key[1],
                "tokens": key[2],
                "K": key[3],
                "N": key[4],
                "skew": key[5],
                "best": top["config"],
                "best_tflops": top["tflops"],
                "chosen": chosen["config"] if chosen else None,
                "chosen_tflops": chosen["tflops"] if chosen else None,
                "chosen_vs_best": (chosen["ms"] / top["ms"]) if chosen else None,
            }
        )
    return rows


def table_winners(records: list[dict], table: gg.ConfigTable) -> dict[int, gg.GroupedConfig]:
    """The winner of each row of ``table`` in a sweep's ``tune`` records of the table's op: among
    the configs measured (correct, timed) at every case that reaches the row (each shape whose
    tokens per expert pick it, each split), the least total median time. Rows no case reaches
    are left out. The rule the tables are written by, and checked against."""
    cases: dict[int, dict] = {}
    for r in records:
        if r.get("kind") != "tune" or (r.get("op") or "forward") != table.op or r.get("error"):
            continue
        if not (r.get("ms") and r.get("correct")):
            continue
        per_expert = r["tokens"] // max(r["experts"], 1)
        row = next(at for at, _ in table.rows if per_expert >= at)
        case = (r["experts"], r["tokens"], r["K"], r["N"], r["skew"])
        cfg = gg.GroupedConfig(**{f.name: r[f.name] for f in dataclasses.fields(gg.GroupedConfig)})
        cases.setdefault(row, {}).setdefault(cfg, {})[case] = r["ms"]
    winners = {}
    for row, by_cfg in cases.items():
        every = set().union(*(set(c) for c in by_cfg.values()))
        complete = {cfg: sum(t.values()) for cfg, t in by_cfg.items() if set(t) == every}
        if complete:
            winners[row] = min(complete, key=complete.get)
    return winners


def table_text(records: list[dict], op: str, device: str, source: str) -> str:
    """Python text of a ``ConfigTable`` of ``device``'s ``op`` from a sweep's records, rows at
    the thresholds of ``HOPPER_DEFAULTS[op]``: what to paste into ``TABLES`` after recording a
    sweep on a new GPU (``python -m labkit.labs.grouped_gemm.bench --table FILE``)."""
    rows = gg.HOPPER_DEFAULTS[op].rows
    probe = gg.ConfigTable(device=device, op=op, source=source, rows=rows)
    winners = table_winners(records, probe)
    lines = [f"    ({device!r}, {op!r}): ConfigTable(", f"        device={device!r},", f"        op={op!r},"]
    lines += [f"        source={source!r},", "        rows=("]
    for at, default in rows:
        c = winners.get(at, default)
        args = f"{c.block_m}, {c.block_n}, {c.block_k}, {c.group_m}, {c.num_warps}, {c.num_stages}"
        args += f", p={c.programs_per_sm}" if c.programs_per_sm != 1 else ""
        args += ", tma=True" if c.tma else ""
        note = "" if at in winners else "  # no case of the sweep reaches this row: the default"
        lines.append(f"            ({at}, _cfg({args})),{note}")
    lines += ["        ),", "    ),"]
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    """``python -m labkit.labs.grouped_gemm.bench --table reference/<machine>/grouped_gemm_tune.json``:
    print the ``TABLES`` entries that file's winners make, one per op it holds."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m labkit.labs.grouped_gemm.bench")
    parser.add_argument("--table", metavar="FILE", required=True, help="a recorded grouped_gemm_tune.json")
    args = parser.parse_args(argv)
    data = json.loads(open(args.table).read())
    records = data["records"]
    devices = {r["gpu"] for r in records if r.get("kind") == "tune"}
    if len(devices) != 1:
        parser.error(f"--table: expected the records of one GPU, found {sorted(devices)}")
    device = devices.pop()
    source = "reference/" + "/".join(args.table.replace("\\", "/").split("/")[-2:])
    for op in gg.OPS:
        if any((r.get("op") or "forward") == op for r in records if r.get("kind") == "tune"):
            print(table_text(records, op, device, source))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
