"""The story's metadata handling, rebuilt as three switches that a GPU run can test one at a time.

The community fix for the story (TransformerEngine issue #3124: FP8 under
``accelerate.dispatch_model`` dies with an illegal memory access on two H200s) names three
things TransformerEngine takes from the CURRENT device instead of from the tensors' device. Each
is a mechanism here, switchable on its own (``Mechanisms``), applied to labkit's ``FP8Linear``
through ``fp8_autocast(mode=StoryPolicy(...))``:

(a) ``lazy_meta_on_current_device``: the scale / scale_inv / amax history are made at the first
    FP8 forward on ``torch.cuda.current_device()`` (TransformerEngine: ``torch.ones(...,
    device="cuda")``), and kept in a plain attribute, not a buffer, so neither ``.to()`` nor
    accelerate ever moves them. Under ``dispatch_model`` the current device stays cuda:0, so the
    MLP on cuda:1 gets its state on cuda:0.
(b) ``global_reduction``: on exit, the newest amax of EVERY module is concatenated on the
    current device and one kernel on the current stream updates every module's state through raw
    addresses (``bulk_update``). ``torch.cat`` itself refuses tensors on two devices, so each row
    is copied to the current device first (a correct, guarded copy); what is modelled is the one
    unguarded update kernel writing into every device's state.
(c) ``unguarded_launch``: the one-pass cast kernel is launched without ``on_device_of``, on the
    current device, whatever device its input lives on (lab 01's bug).

With (a) on and (c) off the cast still runs on its input's device, but reads its scale and
writes its amax on the state's device. The GEMM receives ``scale_inv`` where the state lives, as
TransformerEngine's cuBLAS call gets a raw pointer to it; torch's ``_scaled_mm`` may check
devices where cuBLAS does not: what it does is part of what the GPU run records.

``NAIVE`` (all three on) is the story; ``DEVICE_AWARE`` (all off) behaves as the product's
policy. On the CPU tier every "device" is the CPU: the mechanisms run and must not crash; what
they do on two GPUs is for the GPU tier to show (``labkit.labs.fp8_dispatch.model.run_case``).
"""

from __future__ import annotations

import dataclasses

import torch

from labkit.kernels.fp8.autocast import DeviceAware, Entry
from labkit.kernels.fp8.cast import Quantized, empty_output, finish, launch_quantize
from labkit.kernels.fp8.recipe import DelayedScaling, FP8Meta
from labkit.labs.fp8_dispatch.bulk_update import bulk_update
from labkit.workbench.guard import on_device_of

MECHANISMS = ("lazy_meta_on_current_device", "global_reduction", "unguarded_launch")
_TENSORS = {"forward": 2, "backward": 1}


@dataclasses.dataclass(frozen=True)
class Mechanisms:
    """Which of the story's three mechanisms are switched on."""

    lazy_meta_on_current_device: bool = False
    global_reduction: bool = False
    unguarded_launch: bool = False

    def __post_init__(self):
        for name in MECHANISMS:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool, got {getattr(self, name)!r}")

    @classmethod
    def only(cls, name: str) -> Mechanisms:
        """One mechanism on, the other two off."""
        if name not in MECHANISMS:
            raise ValueError(f"name: {name!r} is not one of {', '.join(map(repr, MECHANISMS))}")
        return cls(**{name: True})

    @property
    def on(self) -> tuple[str, ...]:
        return tuple(n for n in MECHANISMS if getattr(self, n))

    @property
    def label(self) -> str:
        on = self.on
        return "all three" if len(on) == len(MECHANISMS) else "none" if not on else "+".join(on)


NAIVE = Mechanisms(True, True, True)
DEVICE_AWARE = Mechanisms()


def current_device() -> torch.device:
    """The device TransformerEngine's lazy allocation lands on. Tests replace this function to
    give the CPU tier a "current device" different from the weights'."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class StoryPolicy(DeviceAware):
    """``fp8_autocast`` policy with the story's mechanisms switched on as ``mechanisms`` says;
    every mechanism left off behaves as the product's ``DeviceAware``."""

    def __init__(self, mechanisms: Mechanisms = NAIVE):
        if not isinstance(mechanisms, Mechanisms):
            raise TypeError(f"mechanisms: expected a Mechanisms, got {type(mechanisms).__name__}")
        self.mechanisms = mechanisms
        self.name = f"story[{mechanisms.label}]"

    def meta(self, module, direction: str) -> FP8Meta:
        if not self.mechanisms.lazy_meta_on_current_device:
            return super().meta(module, direction)
        # (a): a plain dict attribute, as TransformerEngine's fp8_meta: invisible to .to() and accelerate
        store = module.__dict__.setdefault("_story_meta", {})
        if direction not in store:
            length = module.fp8_meta(direction).history_len
            store[direction] = FP8Meta.create(_TENSORS[direction], length, current_device())
        return store[direction]

    def quantize(self, x: torch.Tensor, meta: FP8Meta, index: int, fp8_dtype: torch.dtype) -> Quantized:
        m = self.mechanisms
        if not (m.lazy_meta_on_current_device or m.unguarded_launch):
            return super().quantize(x, meta, index, fp8_dtype)
        out = empty_output(x, fp8_dtype)  # on x's device
        scale_inv = torch.empty((), dtype=torch.float32, device=meta.device)  # beside the state
        args = (x, out, meta.scale[index : index + 1], meta.amax_history[0, index : index + 1], scale_inv, fp8_dtype)
        if m.unguarded_launch:
            launch_quantize(*args)  # (c): on the current device
        else:
            with on_device_of(x=x, out=out):  # the data's device; the state may be elsewhere
                launch_quantize(*args)
        return Quantized(finish(out, fp8_dtype), scale_inv)

    def reduce_and_update(self, entries: list[Entry], recipe: DelayedScaling) -> None:
        if not self.mechanisms.global_reduction:
            return super().reduce_and_update(entries, recipe)
        dev = current_device()
        for direction in ("forward", "backward"):
            metas = [e.meta for e in entries if e.direction == direction]
            if not metas:
                continue
            amax = torch.cat([m.amax_history[0].to(dev) for m in metas])  # (b): on the current device
            bulk_update(amax, metas, recipe.fp8_max(direction), recipe.margin, recipe.amax_compute_algo)


def policy_for(mode: str):
    """The ``fp8_autocast`` mode of a ``run_case`` mode: "fp8_device_aware" -> the product's
    "device_aware"; "fp8_naive" -> all three mechanisms; a mechanism's name -> that one alone."""
    if mode == "fp8_device_aware":
        return "device_aware"
    if mode == "fp8_naive":
        return StoryPolicy(NAIVE)
    if mode in MECHANISMS:
        return StoryPolicy(Mechanisms.only(mode))
    raise ValueError(f"mode: {mode!r} is not 'fp8_device_aware', 'fp8_naive' or one of {', '.join(MECHANISMS)}")


def mechanism_label(mode: str) -> str | None:
    """What a run_case mode switches on: None (bf16), "none", "all three" or one name."""
    if mode == "bf16":
        return None
    policy = policy_for(mode)
    return "none" if isinstance(policy, str) else policy.mechanisms.label


__all__ = [
    "Mechanisms",
    "MECHANISMS",
    "NAIVE",
    "DEVICE_AWARE",
    "StoryPolicy",
    "current_device",
    "policy_for",
    "mechanism_label",
]
