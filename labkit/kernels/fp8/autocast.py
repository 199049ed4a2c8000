"""``fp8_autocast``: the context FP8 layers run in, and where their scaling state is handled.

Like TransformerEngine's ``fp8_autocast``: inside the context every ``FP8Linear`` computes in FP8
with the context's recipe; each cast folds its tensor's amax into the module's history; on exit
the context updates every scale that ran inside it (the amax "reduction"). Outside, the layers
run in their parameters' dtype.

WHERE that state lives and WHERE its kernels run is delegated to a *policy*, because that is
what goes wrong in lab 05's story (TransformerEngine under ``accelerate.dispatch_model``). The
product's policy, ``DeviceAware`` (``mode="device_aware"``, the default):

* the state is made on the weight's device when the module is built (registered buffers, so it
  moves with ``.to()`` and with accelerate's hooks), never lazily on the current device;
* the exit update is grouped PER DEVICE: each device's histories are stacked and updated by torch
  ops on that device, under that device's guard, then copied back;
* every cast kernel is launched under the guard of its tensors' device (``on_device_of``);
* an input on another device than the module's weight is refused, naming both.

A policy is any object with the four methods of ``DeviceAware`` and a ``name``; lab 05 passes its
story's mechanisms (``labkit.labs.fp8_dispatch.naive``) as ``mode=`` to test them one at a time.
Backward amaxes (output gradients) are folded in at the NEXT context exit (TransformerEngine does
it at the end of backward); every exit updates both directions of the modules that ran inside it.
"""

from __future__ import annotations

import dataclasses

import torch

from labkit.kernels.fp8.cast import Quantized, quantize
from labkit.kernels.fp8.recipe import DelayedScaling, FP8Meta, updated
from labkit.workbench.guard import on_device_of

MODES = ("device_aware",)
TENSOR_NAMES = {"forward": ("input", "weight"), "backward": ("grad_output",)}
_ACTIVE: list[fp8_autocast] = []


@dataclasses.dataclass
class Entry:
    """One module's state of one direction, registered with the context that ran it."""

    module: torch.nn.Module
    direction: str
    meta: FP8Meta


def module_name(module) -> str:
    return getattr(module, "fp8_name", None) or f"{type(module).__name__}@{id(module):x}"


class DeviceAware:
    """The product's policy: state on the weight's device, per-device updates, guarded launches."""

    name = "device_aware"

    def check_input(self, module, x: torch.Tensor) -> None:
        w = module.weight
        if x.device != w.device:
            raise ValueError(
                f"x: is on {x.device} but the weight of {module_name(module)} is on {w.device}; "
                f"move the input to {w.device} (accelerate's hooks do) or the module to {x.device}"
            )

    def meta(self, module, direction: str) -> FP8Meta:
        meta = module.fp8_meta(direction)
        if meta.device != module.weight.device:
            raise RuntimeError(
                f"{module_name(module)}: its FP8 state is on {meta.device} but its weight on "
                f"{module.weight.device}; move the module (.to()), not the weight alone"
            )
        return meta

    def quantize(self, x: torch.Tensor, meta: FP8Meta, index: int, fp8_dtype: torch.dtype) -> Quantized:
        return quantize(x, meta.scale[index : index + 1], meta.amax_history[0, index : index + 1], fp8_dtype)

    def reduce_and_update(self, entries: list[Entry], recipe: DelayedScaling) -> None:
        groups: dict[tuple, list[FP8Meta]] = {}
        for e in entries:
            groups.setdefault((e.meta.device, e.direction, e.meta.amax_history.shape), []).append(e.meta)
        for (_device, direction, _), metas in groups.items():
            with on_device_of(state=metas[0].scale):
                update_stacked(metas, recipe.fp8_max(direction), recipe)


def update_stacked(metas: list[FP8Meta], fp8_max: float, recipe: DelayedScaling) -> None:
    """Update states of one device and shape together: stack, one update, copy back."""
    history, scale, scale_inv = updated(
        torch.stack([m.amax_history for m in metas]),
        torch.stack([m.scale for m in metas]),
        fp8_max,
        recipe.margin,
        recipe.amax_compute_algo,
    )
    torch._foreach_copy_([m.amax_history for m in metas], list(history.unbind(0)))
    torch._foreach_copy_([m.scale for m in metas], list(scale.unbind(0)))
    torch._foreach_copy_([m.scale_inv for m in metas], list(scale_inv.unbind(0)))


_POLICY_METHODS = ("check_input", "meta", "quantize", "reduce_and_update")


def _policy(mode):
    if mode == "device_aware":
        return DeviceAware()
    if (
        isinstance(mode, str)
        or not all(callable(getattr(mode, m, None)) for m in _POLICY_METHODS)
        or not isinstance(getattr(mode, "name", None), str)
    ):
        raise ValueError(
            f"mode: expected one of {', '.join(map(repr, MODES))} or a policy object with a name "
            f"and the methods {', '.join(_POLICY_METHODS)}; got {mode!r}"
        )
    return mode


class fp8_autocast:
    """``with fp8_autocast(recipe=DelayedScaling(...)):`` runs FP8Linear layers in FP8.

    enabled: False runs the layers in their own dtype (and updates nothing). recipe: a
    ``DelayedScaling`` (default: ``DelayedScaling()``). mode: "device_aware" or a policy object.
    record: on exit, read every updated state back (a host sync) into ``records``: one dict per
    module and tensor with the amax measured in this context and the new scale."""

    def __init__(
        self, enabled: bool = True, recipe: DelayedScaling | None = None, mode="device_aware", record: bool = False
    ):
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled: expected a bool, got {type(enabled).__name__}")
        if recipe is None:
            recipe = DelayedScaling()
        if not isinstance(recipe, DelayedScaling):
            raise TypeError(f"recipe: expected a labkit.kernels.fp8.DelayedScaling, got {type(recipe).__name__}")
        self.enabled, self.recipe, self.policy, self.record = enabled, recipe, _policy(mode), bool(record)
        self.entries: list[Entry] = []
        self.records: list[dict] = []
        self._seen: set[tuple[int, str]] = set()

    def register(self, module, direction: str, meta: FP8Meta) -> None:
        """A module ran inside this context: its state of ``direction`` is updated on exit."""
        key = (id(module), direction)
        if key not in self._seen:
            self._seen.add(key)
            self.entries.append(Entry(module, direction, meta))

    def __enter__(self) -> fp8_autocast:
        if self in _ACTIVE:
            raise RuntimeError("fp8_autocast: this context is already entered; make a new one per region")
        self.entries, self.records, self._seen = [], [], set()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        # Like TransformerEngine's, the update runs even when the body raised (a second error,
        # if any, is chained to the first): the story's "raises a second time" on exit.
        _ACTIVE.remove(self)
        if not self.enabled or not self.entries:
            return
        measured = [e.meta.amax_history[0].clone() for e in self.entries] if self.record else None
        self.policy.reduce_and_update(self.entries, self.recipe)
        for e in self.entries:
            counts = getattr(e.module, "fp8_updates", None)
            if isinstance(counts, dict):
                counts[e.direction] = counts.get(e.direction, 0) + 1
        if self.record:
            self.records = _read_records(self.entries, measured)


def _read_records(entries: list[Entry], measured: list[torch.Tensor]) -> list[dict]:
    out = []
    for e, amax in zip(entries, measured):
        for i, (a, s) in enumerate(zip(amax.tolist(), e.meta.scale.tolist())):
            out.append(
                {
                    "module": module_name(e.module),
                    "direction": e.direction,
                    "tensor": TENSOR_NAMES[e.direction][i],
                    "device": str(e.meta.device),
                    "weight_device": str(e.module.weight.device),
                    "amax": a,
                    "scale": s,
                }
            )
    return out


def active() -> fp8_autocast | None:
    """The innermost entered context, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


__all__ = ["fp8_autocast", "DeviceAware", "Entry", "active", "update_stacked", "module_name", "MODES"]
