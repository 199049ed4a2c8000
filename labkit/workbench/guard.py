"""The device guard every labkit kernel launch runs under.

Triton launches a kernel on ``torch.cuda.current_device()`` and its current stream; it reads
only the tensors' raw pointers and never looks at their device (triton/runtime/jit.py,
``JITFunction.run``). With data on cuda:1 and the current device cuda:0 (what
``device_map="auto"`` produces) an unguarded launch dereferences cuda:1 pointers from a cuda:0
context: an illegal memory access in the seed story's pull request ("sc/matmul: guard Triton
launches with the input's CUDA device", 2x RTX Pro 6000), a misleading ValueError with peer access
off, or a silent, slow, unordered cross-GPU run with peer access on (the last two:
reference/h200x2/wrong_device.json, pattern 'triton_launch'). Plain torch ops never do this: they
guard themselves. So do labkit's kernels:

    with on_device_of(x=x, out=out):   # checks x and out share one device, enters it
        _kernel[grid](x, out, ...)

The guard restores the previous current device on exit, and does nothing for CPU tensors.
"""

from __future__ import annotations

import torch


def common_device(**tensors) -> torch.device:
    """The one device all given tensors live on; a ValueError naming each one otherwise.

    ``None`` values are ignored (optional outputs). At least one tensor must be given; anything
    else than a tensor or None is a TypeError naming it (one isinstance per argument: this runs on
    every launch).
    """
    given = {name: t for name, t in tensors.items() if t is not None}
    if not given:
        raise ValueError("common_device: no tensors given")
    for name, t in given.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"common_device: {name}: expected a torch.Tensor or None, got {type(t).__name__} {t!r:.60}")
    devices = {name: t.device for name, t in given.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"tensors must share one device: {listing}")
    return next(iter(devices.values()))


class on_device:
    """Enter a device already known to be the one every tensor of a launch lives on: the cheap
    half of ``on_device_of``, for callers that checked the devices once (a launch plan,
    ``labkit.kernels.comm.plan``) and launch many times. Does nothing for a CPU device."""

    __slots__ = ("device", "_previous")

    def __init__(self, device: torch.device):
        self.device = device
        self._previous = -1

    def __enter__(self) -> torch.device:
        if self.device.type == "cuda":
            self._previous = torch.cuda._exchange_device(self.device.index)
        return self.device

    def __exit__(self, *exc) -> None:
        if self._previous >= 0:
            torch.cuda._maybe_exchange_device(self._previous)


class on_device_of(on_device):
    """Enter the (single) CUDA device of the given tensors for the duration of a launch.

    A small class rather than a generator context manager, and one exchange of the current
    device each way (what ``torch.cuda.device`` does too): this sits on every launch, so its
    cost is measured (``labkit.labs.wrong_device.experiments.guard_overhead``)."""

    __slots__ = ()

    def __init__(self, **tensors):
        super().__init__(common_device(**tensors))
