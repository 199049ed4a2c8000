"""Lab 04's MoE-layer measurements: what the host sync costs a training step, on the GPU's clock
and on the host's, and the records ``moe_records(profile)`` gathers for the lab's benchmark.

Three ways to run one step (forward + backward, ``moe.forward_backward``), timed in the same
interleaved rounds (``labkit.workbench.bench.compare``, CUDA events around each call):

* host_sync / eager: ``sync="host"``: ``counts.tolist()``, then a loop of per-expert matmuls;
* device / eager: ``sync="device"``: the grouped GEMMs read the counts on the GPU;
* device / graph: the same step captured once (``moe_graph.CapturedStep``) and replayed.

The CUDA-event time of a call spans from its first kernel's queueing to its last kernel's end,
so it includes the GPU's idle gaps: the wait for ``.tolist()`` and the launches after it. The
host time (``cpu_us``) is ``time.perf_counter`` around one Python call with the queue drained
before it and no synchronize after: for the device path the cost of queueing the kernels, for
the host path that plus its wait inside ``.tolist()`` (the host cannot run ahead of the GPU,
which is the point). ``tflops`` counts the expert GEMMs only (the router's [T, H] x [H, E] is
left out): 3 x the forward's 2·T·k·(H·2F + F·H).
"""

from __future__ import annotations

import statistics
import time

import torch

from labkit.kernels.grouped_gemm import flops
from labkit.labs.grouped_gemm import moe, moe_graph, moe_timeline
from labkit.workbench import bench, tier
from labkit.workbench.errors import UsageError

#: Fields every record of ``moe_records`` carries (None where a field does not apply).
REQUIRED = ("kind", "impl", "method", "tokens", "experts", "skew", "ms_fwd_bwd", "gpu")

#: Sizes per profile. "gpu": the experts of a mid-size MoE (Qwen1.5-MoE-A2.7B: hidden 2048,
#: expert FFN 1408, 60 experts, top-4), rounded to 64 experts, at 4096 tokens: 16384 expert rows
#: per step (256 per expert on average), 1.1 GB of bf16 expert weights; fits one H200 many times
#: over, including the captured graph's pool. "cpu": the Triton interpreter, tiny, no timings.
PROFILES = {
    "gpu": {
        "tokens": 4096,
        "hidden_size": 2048,
        "ffn_size": 1408,
        "num_experts": 64,
        "top_k": 4,
        "dtype": "bfloat16",
        "skews": (0.0, 2.0),
        "reps": 20,
        "cpu_reps": 10,
        "seed": 0,
    },
    "cpu": {
        "tokens": 24,
        "hidden_size": 32,
        "ffn_size": 16,
        "num_experts": 4,
        "top_k": 2,
        "dtype": "float32",
        "skews": (0.0, 3.0),
        "seed": 0,
    },
}
#: device vs host path, per dtype: different kernels and summation orders, rounded to the dtype
PATHS_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def step_flops(tokens: int, hidden_size: int, ffn_size: int, top_k: int) -> int:
    """FLOPs of the expert GEMMs of one forward + backward (dgrad and wgrad each cost a forward)."""
    rows = tokens * top_k
    return 3 * (flops(rows, 2 * ffn_size, hidden_size) + flops(rows, hidden_size, ffn_size))


def cpu_time_us(fn, *, reps: int = 10, device=None) -> tuple[float, float, float]:
    """(median, p25, p75) µs of host time of one ``fn()`` call, the GPU queue drained before each
    call and not waited for after it (outside the measurement)."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise UsageError(f"reps: expected a positive int, got {reps!r}")
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize(device)
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
    return statistics.median(samples), q[0], q[-1]


def _sizes(layer: moe.MoELayer) -> tuple:
    return layer.hidden_size, layer.ffn_size, layer.num_experts, layer.top_k, layer.router.weight.dtype


def time_layer(
    layer_device: moe.MoELayer,
    layer_host: moe.MoELayer,
    x: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    skew: float = 0.0,
    warmup: int = 3,
    reps: int = 20,
    cpu_reps: int = 10,
) -> list[dict]:
    """Three records (kind="moe_layer"): host_sync/eager, device/eager, device/graph; see the
    module docstring. The two layers must have the same sizes (``moe.with_sync`` makes one from
    the other); ``skew`` is a label for the records (the route_bias already in the layers)."""
    device = moe_graph.cuda_device_of(layer_device, "layer_device", sync="device")
    moe_graph.cuda_device_of(layer_host, "layer_host", sync="host")
    if _sizes(layer_device) != _sizes(layer_host):
        raise UsageError("layer_host: its sizes or dtype differ from layer_device's (use moe.with_sync)")
    moe_graph.check_step_inputs(layer_device, x, grad_out)
    step = moe_graph.CapturedStep(layer_device, x, grad_out)
    candidates = {
        ("host_sync", "eager"): lambda: moe.forward_backward(layer_host, x, grad_out),
        ("device", "eager"): lambda: moe.forward_backward(layer_device, x, grad_out),
        ("device", "graph"): step.replay,
    }
    named = {f"{impl}/{method}": fn for (impl, method), fn in candidates.items()}
    cmp = bench.compare(
        named, baseline="host_sync/eager", device=device, warmup=warmup, reps=reps, method="cuda_events"
    )
    cpu = {name: cpu_time_us(fn, reps=cpu_reps, device=device) for name, fn in named.items()}
    step.replay()
    counts = step.counts.tolist()  # after the timing: reading them syncs
    T, E, k = x.shape[0], layer_device.num_experts, layer_device.top_k
    work = step_flops(T, layer_device.hidden_size, layer_device.ffn_size, k)
    records = []
    for (impl, method), name in zip(candidates, named):
        t = cmp.timings[name]
        lo, hi = cmp.ratio_iqr(name)
        records.append(
            {
                "kind": "moe_layer",
                "impl": impl,
                "method": method,
                "experts": E,
                "tokens": T,
                "top_k": k,
                "K": layer_device.hidden_size,
                "N": layer_device.ffn_size,
                "skew": skew,
                "imbalance": max(counts) / (T * k / E),
                "ms": t.median_us / 1e3,
                "ms_fwd_bwd": t.median_us / 1e3,
                "us_p25": t.p25_us,
                "us_p75": t.p75_us,
                "cpu_us": cpu[name][0],
                "cpu_us_p25": cpu[name][1],
                "cpu_us_p75": cpu[name][2],
                "tflops": work / (t.median_us * 1e-6) / 1e12,
                "ratio_vs_host_sync": cmp.ratio(name),
                "ratio_p25": lo,
                "ratio_p75": hi,
                "dtype": str(x.dtype).replace("torch.", ""),
                "gpu": torch.cuda.get_device_name(device),
            }
        )
    return records


def paths_agree(layer: moe.MoELayer, x: torch.Tensor, grad_out: torch.Tensor, *, skew: float = 0.0) -> dict:
    """One record (kind="paths_equal"): the max relative error between the device path's and the
    host path's output and gradients, for ``layer`` and its ``with_sync`` twin on the same inputs."""
    other = moe.with_sync(layer, "host" if layer.sync == "device" else "device")
    device_layer, host_layer = (layer, other) if layer.sync == "device" else (other, layer)
    moe_graph.check_step_inputs(layer, x, grad_out)
    out_d, grads_d = moe.forward_backward(device_layer, x, grad_out)
    out_h, grads_h = moe.forward_backward(host_layer, x, grad_out)
    names = ("out",) + moe.grad_names(layer)
    errors = {
        f"err_{n}": moe_graph.max_relative_error(a, b) for n, a, b in zip(names, (out_d, *grads_d), (out_h, *grads_h))
    }
    tol = PATHS_TOLERANCE[x.dtype]
    counts = device_layer.last_counts.tolist()
    return {
        "kind": "paths_equal",
        "impl": "device vs host_sync",
        "method": "eager",
        "tokens": x.shape[0],
        "experts": layer.num_experts,
        "skew": skew,
        "counts": counts,
        "dtype": str(x.dtype).replace("torch.", ""),
        "tolerance": tol,
        "max_rel_err": max(errors.values()),
        "ok": max(errors.values()) <= tol,
        **errors,
    }


def _inputs(p: dict, device) -> tuple[moe.MoELayer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(p["seed"])
    dtype = getattr(torch, p["dtype"])
    layer = moe.MoELayer(
        p["hidden_size"], p["ffn_size"], p["num_experts"], p["top_k"], sync="device", dtype=dtype, device=device
    )
    x = torch.randn(p["tokens"], p["hidden_size"], dtype=dtype, device=device)
    return layer, x, torch.randn_like(x)


def _set_bias(layers, p: dict, skew: float) -> None:
    bias = moe_graph.skewed_route_bias(p["num_experts"], skew, seed=p["seed"])
    for layer in layers:
        layer.route_bias.copy_(bias)


def moe_records(profile: str) -> list[dict]:
    """Every MoE-layer record of lab 04 for ``profile`` ("gpu" or "cpu"; sizes in PROFILES).

    gpu (one GPU, compiled kernels): per skew, the device/host paths' agreement and the three
    timings; graph replay vs eager under changed distributions; the host path's capture failure
    (in a child process); torch's sync detector on both paths; one timeline per way of running.
    cpu (Triton interpreter; tiny sizes on the GPU of a GPU tier): only the agreement of the two
    paths, each record marked with its ``tier``."""
    if profile not in PROFILES:
        raise UsageError(f"profile: {profile!r} is not one of {tuple(PROFILES)}")
    p = PROFILES[profile]
    if profile == "cpu":  # where the kernels run: the CPU under the interpreter, else the GPU
        layer, x, grad_out = _inputs(p, tier.kernel_device())
        records = []
        for skew in p["skews"]:
            _set_bias([layer], p, skew)
            records.append(paths_agree(layer, x, grad_out, skew=skew))
        where = "cpu (interpreter)" if tier.interpreted() else "gpu (the cpu profile's tiny sizes)"
        return _complete(records, tier=where, gpu=None if tier.interpreted() else torch.cuda.get_device_name())
    from labkit.workbench import gates

    gates.requires(gpus=1, compiled=True).check()
    device = torch.device("cuda", torch.cuda.current_device())
    layer, x, grad_out = _inputs(p, device)
    host = moe.with_sync(layer, "host")
    records = []
    for skew in p["skews"]:
        _set_bias([layer, host], p, skew)
        records.append(paths_agree(layer, x, grad_out, skew=skew))
        records += time_layer(layer, host, x, grad_out, skew=skew, reps=p["reps"], cpu_reps=p["cpu_reps"])
    _set_bias([layer, host], p, 0.0)
    records += moe_graph.graph_equals_eager(layer, x, grad_out)
    records.append(moe_graph.capture_record())
    records += [moe_graph.sync_debug_check(layer, x, grad_out), moe_graph.sync_debug_check(host, x, grad_out)]
    records += [
        moe_timeline.timeline(host, x, grad_out),
        moe_timeline.timeline(layer, x, grad_out),
        moe_timeline.timeline(layer, x, grad_out, graph=True),
    ]
    return _complete(records, tier="gpu", gpu=torch.cuda.get_device_name(device))


def _complete(records: list[dict], *, tier: str, gpu) -> list[dict]:
    for r in records:
        r.setdefault("tier", tier)
        r.setdefault("gpu", gpu)
        for k in REQUIRED:
            r.setdefault(k, None)
    return records


__all__ = [
    "PATHS_TOLERANCE",
    "PROFILES",
    "REQUIRED",
    "cpu_time_us",
    "moe_records",
    "paths_agree",
    "step_flops",
    "time_layer",
]
