"""Lab 04's claims about the MoE layer (``moe.MoELayer``) that need a GPU: its training step fits
in one CUDA graph when the counts stay on the device, and cannot be captured when they do not.

* ``CapturedStep``: forward + backward (``moe.forward_backward``) captured once; ``replay()``
  reruns it on whatever the static inputs and ``route_bias`` hold now.
* ``graph_equals_eager``: the proof that one graph serves any token distribution: new inputs and
  a new ``route_bias`` are written on the device, the graph replayed, and every output and
  gradient compared with an eager step on the same inputs; the counts are read back to show the
  distribution really moved.
* ``capture_fails_with_host_sync``: the baseline's ``counts.tolist()`` inside a capture raises.
  A failed capture can leave the CUDA context unusable, so callers run it in a child process
  (``capture_record`` does, through ``labkit.workbench.sandbox.run_isolated``).
* ``sync_debug_check``: torch's own detector of host syncs (``torch.cuda.set_sync_debug_mode``)
  finds none in the device path and finds the host path's.
"""

from __future__ import annotations

import inspect

import torch

from labkit.labs.grouped_gemm import moe
from labkit.workbench import sandbox
from labkit.workbench.checks import check_tensor
from labkit.workbench.errors import UsageError

#: Largest normwise relative error (max |graph - eager| / max |eager|) accepted per dtype. Graph
#: and eager run the same kernels on the same inputs; what differs is the order of the atomic
#: additions in index_add_ (the backward of index_select): about one rounding of the dtype.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}
#: route_bias < DEAD_LOGIT makes an expert's probability 0 (exp underflows): it gets no token
DEAD_LOGIT = -1e4


def cuda_device_of(layer, name: str = "layer", sync: str | None = None) -> torch.device:
    """The CUDA device of an MoELayer, or an error naming ``name`` (not a layer, wrong sync, CPU)."""
    if not isinstance(layer, moe.MoELayer):
        raise TypeError(f"{name}: expected an MoELayer, got {type(layer).__name__}")
    if sync is not None and layer.sync != sync:
        raise UsageError(f"{name}: has sync={layer.sync!r}; this needs sync={sync!r}")
    device = layer.router.weight.device
    if device.type != "cuda":
        raise UsageError(f"{name}: is on {device}; CUDA graphs and sync debug mode need a CUDA layer")
    return device


def check_step_inputs(layer: moe.MoELayer, x: torch.Tensor, grad_out: torch.Tensor) -> None:
    """x [tokens, H] and grad_out of x's shape, in the layer's dtype and on its device."""
    check_tensor("x", x, ndim=2, contiguous=False)
    check_tensor("grad_out", grad_out, contiguous=False)
    weight = layer.router.weight
    if tuple(x.shape[1:]) != (layer.hidden_size,) or x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(
            f"x: expected [tokens, {layer.hidden_size}] {weight.dtype} on {weight.device}, "
            f"got {tuple(x.shape)} {x.dtype} on {x.device}"
        )
    if grad_out.shape != x.shape or grad_out.dtype != x.dtype or grad_out.device != x.device:
        raise ValueError(
            f"grad_out: expected x's shape, dtype and device, got {tuple(grad_out.shape)} "
            f"{grad_out.dtype} on {grad_out.device}"
        )


class CapturedStep:
    """``moe.forward_backward(layer, x, grad_out)`` captured in one ``torch.cuda.CUDAGraph``.

    ``x`` and ``grad_out`` are copied into static tensors (``self.x``, ``self.grad_out``): write
    new values into them in place (``step.x.copy_(...)``), and into ``layer.route_bias``, then
    ``replay()``. ``out``, ``grads`` and ``counts`` are the static outputs every replay rewrites
    (read them after the replay, in stream order or after a synchronize).

    Warm-up runs on a side stream first, as torch's graph docs ask: the Triton kernels are
    compiled and loaded, and torch's one-time lazy set-up (cuBLAS handles, the allocator's first
    blocks) is done before the capture, where such work is either not allowed or would be baked
    into the graph. Only ``sync="device"``: the host path's ``.tolist()`` cannot be captured
    (``capture_fails_with_host_sync`` shows the error)."""

    def __init__(self, layer: moe.MoELayer, x: torch.Tensor, grad_out: torch.Tensor, *, warmup: int = 3):
        device = cuda_device_of(layer, sync="device")
        check_step_inputs(layer, x, grad_out)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise UsageError(f"warmup: expected a positive int (capture needs warmed-up kernels), got {warmup!r}")
        self.layer = layer
        with torch.cuda.device(device):
            self.x, self.grad_out = x.detach().clone(), grad_out.detach().clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    moe.forward_backward(layer, self.x, self.grad_out)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out, self.grads = moe.forward_backward(layer, self.x, self.grad_out)
                self.counts = layer.last_counts  # allocated in the graph's pool: rewritten per replay
            torch.cuda.synchronize()

    def replay(self) -> None:
        """Rerun the captured step on the current contents of x, grad_out and route_bias."""
        self.graph.replay()


def capture_fails_with_host_sync(
    tokens: int = 256,
    hidden_size: int = 256,
    ffn_size: int = 128,
    num_experts: int = 8,
    top_k: int = 2,
    dtype: str = "bfloat16",
    seed: int = 0,
) -> dict:
    """Try to capture the ``sync="host"`` layer's step; returns {"captured", "error", "error_type",
    "error_at_exit"}. Meant for a child process (``capture_record``): after a failed capture the
    CUDA context may refuse further work. Plain arguments in, a JSON-able dict out.

    ``error`` is the first line of the exception raised inside the capture (by ``.tolist()``:
    a device-to-host copy and a wait are not allowed on a capturing stream); ``error_at_exit``
    is what ending the invalidated capture raised on top of it, if anything."""
    torch.manual_seed(seed)
    layer = moe.MoELayer(
        hidden_size, ffn_size, num_experts, top_k, sync="host", dtype=getattr(torch, dtype), device="cuda"
    )
    x = torch.randn(tokens, hidden_size, dtype=layer.router.weight.dtype, device="cuda")
    grad_out = torch.randn_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moe.forward_backward(layer, x, grad_out)  # eager: the host path itself works
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            moe.forward_backward(layer, x, grad_out)
    except Exception as e:
        first = e
        while first.__context__ is not None:  # the capture's exit raises on top of the body's error
            first = first.__context__
        return {
            "captured": False,
            "error": _first_line(first),
            "error_type": type(first).__name__,
            "error_at_exit": _first_line(e) if e is not first else None,
        }
    return {"captured": True, "error": None, "error_type": None, "error_at_exit": None}


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else repr(e))[:300]


def capture_record(timeout: float = 180.0, **sizes) -> dict:
    """``capture_fails_with_host_sync(**sizes)`` in a child process, as one flat record
    (kind="capture"). A child that crashed or hung is recorded with its sandbox status."""
    res = sandbox.run_isolated(capture_fails_with_host_sync, timeout=timeout, **sizes)
    args = {name: p.default for name, p in inspect.signature(capture_fails_with_host_sync).parameters.items()}
    args.update(sizes)
    record = {
        "kind": "capture",
        "impl": "host_sync",
        "method": "graph",
        "status": res.status,
        "tokens": args["tokens"],
        "experts": args["num_experts"],
    }
    if res.ok:
        record.update(res.value)
    else:
        record.update(captured=None, error=res.summary(), error_type=res.error_type, error_at_exit=None)
    return record


def skewed_route_bias(num_experts: int, skew: float, *, dead: int = 0, seed: int = 0) -> torch.Tensor:
    """A route_bias [E] fp32 (CPU) that skews the routing: ``skew`` x N(0, 1) per expert, drawn
    from ``seed`` (0 keeps the router's own distribution), and the first ``dead`` experts given
    DEAD_LOGIT so that they get no token at all."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise UsageError(f"num_experts: expected a positive int, got {num_experts!r}")
    if not 0 <= dead < num_experts:
        raise UsageError(f"dead: expected 0 <= dead < num_experts={num_experts}, got {dead!r}")
    g = torch.Generator().manual_seed(seed)
    bias = float(skew) * torch.randn(num_experts, generator=g)
    bias[:dead] = DEAD_LOGIT
    return bias


def max_relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, in fp32 (normwise: no division by near-zero elements)."""
    got, want = got.detach().float(), want.detach().float()
    scale = want.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    return float(((got - want).abs().max() / scale).item())


#: (skew, dead experts) of each distribution ``graph_equals_eager`` writes before a replay
DISTRIBUTIONS = ((0.0, 0), (1.0, 0), (3.0, 0), (1.0, 2))


def graph_equals_eager(
    layer: moe.MoELayer, x: torch.Tensor, grad_out: torch.Tensor, *, distributions=DISTRIBUTIONS, seed: int = 0
) -> list[dict]:
    """Capture the step once, then for each (skew, dead) in ``distributions`` write a new x and a
    new route_bias on the device, replay, and compare with an eager step on the same inputs.

    One record per distribution (kind="graph_vs_eager"): the max relative error of the output
    and of each gradient (``moe.grad_names``), ``ok`` (all within TOLERANCE[dtype]), the counts
    the graph used (read after the replay) and whether they differ from the previous
    distribution's and from the eager step's. ``layer.route_bias`` is left as it was."""
    device = cuda_device_of(layer, sync="device")
    check_step_inputs(layer, x, grad_out)
    if layer.top_k > layer.num_experts - max((d for _, d in distributions), default=0):
        raise UsageError(f"distributions: kill so many experts that fewer than top_k={layer.top_k} stay alive")
    saved_bias = layer.route_bias.clone()
    step = CapturedStep(layer, x, grad_out)
    names = ("out",) + moe.grad_names(layer)
    tol = TOLERANCE[x.dtype]
    g = torch.Generator(device=device).manual_seed(seed)
    records, previous = [], None
    try:
        for i, (skew, dead) in enumerate(distributions):
            layer.route_bias.copy_(skewed_route_bias(layer.num_experts, skew, dead=dead, seed=seed + i))
            step.x.copy_(torch.randn(step.x.shape, generator=g, device=device, dtype=step.x.dtype))
            step.replay()
            graph_values = [t.clone() for t in (step.out, *step.grads)]
            graph_counts = step.counts.clone()
            eager_out, eager_grads = moe.forward_backward(layer, step.x, step.grad_out)
            errors = {
                f"err_{n}": max_relative_error(a, b) for n, a, b in zip(names, graph_values, (eager_out, *eager_grads))
            }
            counts = graph_counts.tolist()  # outside any timing: the check may sync
            records.append(
                {
                    "kind": "graph_vs_eager",
                    "impl": "device",
                    "method": "graph",
                    "distribution": i,
                    "skew": skew,
                    "dead_experts": dead,
                    "tokens": x.shape[0],
                    "experts": layer.num_experts,
                    "dtype": str(x.dtype).replace("torch.", ""),
                    "tolerance": tol,
                    "max_rel_err": max(errors.values()),
                    "ok": max(errors.values()) <= tol,
                    **errors,
                    "counts": counts,
                    "counts_equal_eager": counts == layer.last_counts.tolist(),
                    "counts_changed": previous is not None and counts != previous,
                    "zero_token_experts": sum(1 for c in counts if c == 0),
                }
            )
            previous = counts
    finally:
        layer.route_bias.copy_(saved_bias)
    return records


def sync_debug_check(layer: moe.MoELayer, x: torch.Tensor, grad_out: torch.Tensor) -> dict:
    """Run one ``forward_backward`` with ``torch.cuda.set_sync_debug_mode("error")``: any op that
    synchronises the host with the GPU raises. Returns a record (kind="sync_debug") with
    ``raised`` and the first line of the error. Expected: False for sync="device", True for
    sync="host" (its ``.tolist()``), which shows the check does see syncs.

    One eager step runs first, outside the check: the first launch of a Triton kernel compiles
    it, and loading a module is not the layer's behaviour. The previous mode is restored."""
    device = cuda_device_of(layer)
    check_step_inputs(layer, x, grad_out)
    with torch.cuda.device(device):
        moe.forward_backward(layer, x, grad_out)
        torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode()
        raised, error = False, None
        try:
            torch.cuda.set_sync_debug_mode("error")
            moe.forward_backward(layer, x, grad_out)
        except RuntimeError as e:
            raised, error = True, _first_line(e)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize()
    return {
        "kind": "sync_debug",
        "impl": "device" if layer.sync == "device" else "host_sync",
        "method": "eager",
        "raised": raised,
        "error": error,
    }


__all__ = [
    "CapturedStep",
    "DEAD_LOGIT",
    "DISTRIBUTIONS",
    "TOLERANCE",
    "capture_fails_with_host_sync",
    "capture_record",
    "check_step_inputs",
    "cuda_device_of",
    "graph_equals_eager",
    "max_relative_error",
    "skewed_route_bias",
    "sync_debug_check",
]
