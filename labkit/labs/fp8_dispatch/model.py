"""The story's model and its matrix: seven linear layers at Llama-3.3-70B shapes, split over two
GPUs by ``accelerate.dispatch_model``, run in bf16 and under FP8 delayed scaling.

The story's reproduction (TransformerEngine issue #3124) builds q/k/v/o_proj (8192 x {8192,
1024}), gate/up_proj (8192 x 28672) and down_proj (28672 x 8192), bias-free with bf16 parameters,
puts the attention projections on cuda:0 and the MLP on cuda:1 with ``dispatch_model``, and runs
a 12000 x 8192 input through them inside ``fp8_autocast``: the forward dies at the element-wise
``gate * up`` on cuda:1. Here the layers are labkit's ``FP8Linear`` (TransformerEngine is not on
the GPU machines): the same shapes, the same placement, the same recipe. There is no attention,
as in the story: ``o_proj(q_proj(x))`` feeds the MLP, k and v are computed and returned. (The
story also wraps the forward in ``torch.autocast(bf16)``; with bf16 parameters and input that
changes no dtype here, so it is left out.)

``size`` shrinks every dimension (to a multiple of 16, at least 16) for the CPU tier.
``run_case`` runs one cell of the matrix and returns a flat JSON-able record; it takes plain
arguments so that ``labkit.workbench.sandbox.run_isolated`` can run it in a child process, where
an illegal memory access cannot take the notebook down.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import statistics
import time

import torch
from torch import nn

from labkit.kernels.fp8 import DelayedScaling, FP8Linear, fp8_autocast
from labkit.labs.fp8_dispatch.measure import digest, errors_of, fp8_steps
from labkit.labs.fp8_dispatch.naive import MECHANISMS, mechanism_label, policy_for
from labkit.workbench.checks import check_device

FULL = {"hidden": 8192, "kv": 1024, "intermediate": 28672, "tokens": 12000}
#: placement -> (device of the attention block, device of the MLP block). The current device stays
#: cuda:0 throughout (dispatch_model never changes it): "other_gpu" puts the whole stack on cuda:1
#: while cuda:0 is current, the community fix's 11-line reduction of the story.
PLACEMENTS = {
    "cpu": ("cpu", "cpu"),
    "one_gpu": ("cuda:0", "cuda:0"),
    "two_gpus": ("cuda:0", "cuda:1"),
    "other_gpu": ("cuda:1", "cuda:1"),
}


def local_placement() -> str:
    """Where the small (CPU-profile) runs go on this machine: "cpu" under the Triton interpreter,
    "one_gpu" on a compiled tier, where labkit's kernels take CUDA tensors only."""
    from labkit.workbench import tier

    return "cpu" if tier.interpreted() else "one_gpu"


#: input drifts for showing delayed scaling (the story's run keeps its input constant: "constant")
DRIFTS = ("constant", "spike", "growing")
MODES = ("bf16", "fp8_naive", "fp8_device_aware") + MECHANISMS
#: above this norm-wise relative error vs bf16 (last step) a run that raised nothing is "wrong_output".
#: Expected about 0.1: each E4M3 rounding adds ~0.027 rms relative error (3 mantissa bits), and the
#: path to the output crosses about a dozen (inputs and weights of q, o, gate, up, down; h twice
#: through gate * up), sqrt(12) x 0.027 = 0.094 (0.12 measured at size 1/256).
WRONG_OUTPUT = 0.25
_ILLEGAL = re.compile(r"illegal memory access|illegal address", re.I)


def dims(size: float = 1.0) -> dict:
    """The story's dimensions times ``size``, each rounded to a multiple of 16 (at least 16)."""
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size <= 1:
        raise ValueError(f"size: expected a number in (0, 1], got {size!r}")
    return {k: max(16, round(v * size / 16) * 16) for k, v in FULL.items()}


class Attention(nn.Module):
    def __init__(self, d: dict, **kw):
        super().__init__()
        h, kv = d["hidden"], d["kv"]
        self.q_proj, self.k_proj = FP8Linear(h, h, **kw), FP8Linear(h, kv, **kw)
        self.v_proj, self.o_proj = FP8Linear(h, kv, **kw), FP8Linear(h, h, **kw)

    def forward(self, x):
        return self.o_proj(self.q_proj(x)), self.k_proj(x), self.v_proj(x)


class MLP(nn.Module):
    def __init__(self, d: dict, **kw):
        super().__init__()
        h, i = d["hidden"], d["intermediate"]
        self.gate_proj, self.up_proj = FP8Linear(h, i, **kw), FP8Linear(h, i, **kw)
        self.down_proj = FP8Linear(i, h, **kw)

    def forward(self, h):
        gate, up = self.gate_proj(h), self.up_proj(h)
        return self.down_proj(gate * up)  # the story's element-wise product, on the MLP's GPU


class Stack(nn.Module):
    def __init__(self, d: dict, attn_device="cpu", mlp_device="cpu", **kw):
        super().__init__()
        self.attn, self.mlp = Attention(d, device=attn_device, **kw), MLP(d, device=mlp_device, **kw)

    def forward(self, x):
        h, k, v = self.attn(x)
        return self.mlp(h), k, v


def build(
    size: float = 1.0,
    seed: int = 0,
    devices=("cpu", "cpu"),
    recipe: DelayedScaling | None = None,
    backend: str = "auto",
) -> Stack:
    """The stack with each block made on its device (no copy of full-size weights through the CPU).
    Weights ~ N(0, 1/fan_in) in bf16, from one generator per layer seeded from ``seed``: the same
    values on every CUDA device, so one- and two-GPU runs compare bit for bit."""
    model = Stack(dims(size), devices[0], devices[1], recipe=recipe, backend=backend, dtype=torch.bfloat16)
    with torch.no_grad():
        for i, (name, m) in enumerate((n, m) for n, m in model.named_modules() if isinstance(m, FP8Linear)):
            m.fp8_name = name
            g = torch.Generator(device=m.weight.device).manual_seed(seed * 1000 + i)
            w = torch.randn(m.weight.shape, generator=g, device=m.weight.device, dtype=torch.float32)
            m.weight.copy_(w.mul_(m.in_features**-0.5))
    return model.eval()


def dispatch(model: Stack, devices) -> Stack:
    """accelerate's ``dispatch_model`` with the story's map {attn: first device, mlp: second}.
    Its hooks move activations between the blocks and never change the current device."""
    from accelerate import dispatch_model

    def as_map(d):
        return "cpu" if d == "cpu" else torch.device(d).index

    quiet = logging.getLogger("accelerate.big_modeling")  # on the CPU it "offloads to the cpu": nothing moves
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return dispatch_model(
            model, device_map={"attn": as_map(devices[0]), "mlp": as_map(devices[1])}, force_hooks=True
        )
    finally:
        quiet.setLevel(level)


def make_input(size: float, seed: int, device) -> torch.Tensor:
    d = dims(size)
    g = torch.Generator(device=device).manual_seed(seed + 12345)
    return torch.randn((d["tokens"], d["hidden"]), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)


def drift_scales(drift: str, steps: int) -> list[float] | None:
    """Per-step input factors: "constant" (None: the same input every step), "spike" (x16 at step
    ``steps // 2``, else x1) or "growing" (x2 per step: 1, 2, 4, ...). Powers of two, so the scaled
    bf16 input is exact."""
    if drift not in DRIFTS:
        raise ValueError(f"drift: {drift!r} is not one of {', '.join(map(repr, DRIFTS))}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
    if drift == "constant":
        return None
    if drift == "spike":
        return [16.0 if s == steps // 2 else 1.0 for s in range(steps)]
    return [2.0**s for s in range(steps)]


def _sync(devices) -> None:
    for d in {torch.device(d) for d in devices if d != "cpu"}:
        torch.cuda.synchronize(d)


def _time_ms(fn, devices, reps: int) -> float | None:
    """Median wall time of ``fn`` between syncs of every GPU used (None on the CPU: not a speed)."""
    if all(d == "cpu" for d in devices):
        return None
    fn()
    times = []
    for _ in range(reps):
        _sync(devices)
        t0 = time.perf_counter()
        fn()
        _sync(devices)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _outcome(rec: dict) -> str:
    if rec["errors"]:
        if any(_ILLEGAL.search(err["message"]) for err in rec["errors"]):
            return "illegal_memory_access"
        first = rec["errors"][0]
        return f"exception: {first['type']}: {(first['message'].strip().splitlines() or [''])[0]}"
    if rec["mismatches"]:
        return "wrong_scale"
    return "ok" if rec["norm_rel_err_vs_bf16"] <= WRONG_OUTPUT else "wrong_output"


def run_case(
    placement: str = "cpu",
    mode: str = "fp8_device_aware",
    size: float = 1 / 256,
    steps: int = 3,
    seed: int = 0,
    recipe: dict | None = None,
    reps: int = 5,
    backend: str = "auto",
    input_scales: list | None = None,
) -> dict:
    """One cell of the story's matrix: build, dispatch, run ``steps`` forwards, compare with bf16.

    placement: "cpu", "one_gpu", "two_gpus" or "other_gpu" (``PLACEMENTS``). mode: "bf16",
    "fp8_naive", "fp8_device_aware" or one mechanism's name (``naive.MECHANISMS``).
    recipe: ``DelayedScaling`` keyword arguments.
    rel_err_vs_bf16: max |out - ref| / max |ref| at the last step (norm_rel_err_vs_bf16: the
    Frobenius ratio), the worst of out, k and v. forward_ms: median of ``reps`` timed steps (forward
    and scale update; the weights stay cast), None on the CPU. outcome: "ok", "wrong_scale" (an
    amax or scale differs from the independent model), "wrong_output" (norm error above
    WRONG_OUTPUT), "illegal_memory_access" or "exception: Type: message". A failure of the run is
    the result (``errors``: the chain, with where each surfaced); only bad arguments raise.
    input_scales: None (the story: one input, every step) or a factor per step (``drift_scales``);
    the bf16 reference is then the bf16 forward of each step's input, and forward_ms is timed on
    the unscaled input."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: {placement!r} is not one of {', '.join(map(repr, PLACEMENTS))}")
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(map(repr, MODES))}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
    if input_scales is not None:
        if (
            not isinstance(input_scales, (list, tuple))
            or len(input_scales) < steps
            or not all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < float("inf")
                for f in input_scales[:steps]
            )
        ):
            raise ValueError(
                f"input_scales: expected None or at least {steps} positive finite numbers, got {input_scales!r}"
            )
        input_scales = [float(f) for f in input_scales[:steps]]
    r = DelayedScaling(**(recipe or {}))
    devices = PLACEMENTS[placement]
    for d in devices:
        check_device("placement", d)
    rec = dict(
        placement=placement,
        mode=mode,
        mechanism=mechanism_label(mode),
        outcome=None,
        rel_err_vs_bf16=None,
        norm_rel_err_vs_bf16=None,
        forward_ms=None,
        bf16_forward_ms=None,
        size=size,
        steps=steps,
        seed=seed,
        recipe=dataclasses.asdict(r),
        dims=dims(size),
        devices=list(devices),
        input_scales=input_scales,
        output_digest=None,
        rel_err_per_step=[],
        norm_rel_err_per_step=[],
        mismatches=[],
        errors=[],
        records=[],
    )
    try:
        model = dispatch(build(size, seed, devices, r, backend), devices)
        x = make_input(size, seed, devices[0])
        with torch.no_grad():
            ref = model(x)
            rec["bf16_forward_ms"] = _time_ms(lambda: model(x), devices, reps)
            if mode == "bf16":
                out, rec["forward_ms"] = ref, rec["bf16_forward_ms"]
                rec["rel_err_per_step"], rec["norm_rel_err_per_step"] = [0.0], [0.0]
            else:
                policy = policy_for(mode)
                out = fp8_steps(model, x, ref, r, policy, steps, rec, input_scales)

                def step():
                    with fp8_autocast(recipe=r, mode=policy):
                        model(x)

                rec["forward_ms"] = _time_ms(step, devices, reps)
        rec["rel_err_vs_bf16"] = rec["rel_err_per_step"][-1]
        rec["norm_rel_err_vs_bf16"] = rec["norm_rel_err_per_step"][-1]
        rec["output_digest"] = digest(out)
    except Exception as e:  # the run's failure is the result
        rec["errors"] = errors_of(e)
    rec["outcome"] = _outcome(rec)
    return rec


__all__ = [
    "FULL",
    "PLACEMENTS",
    "local_placement",
    "MODES",
    "DRIFTS",
    "WRONG_OUTPUT",
    "dims",
    "build",
    "dispatch",
    "make_input",
    "drift_scales",
    "run_case",
    "Stack",
]
