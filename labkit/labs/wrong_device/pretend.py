"""Two pretend GPUs on any machine: where lab 01's exercises watch which device a launch runs on.

The bug of lab 01 needs tensors on cuda:1 while cuda:0 is current; the CPU tier has neither. Inside
``pretend_gpus(current=0)``:

* ``on(t, index)`` is a CPU tensor that reports ``device`` cuda:``index``;
* the current device is pretend state: ``torch.cuda.current_device``, ``set_device``,
  ``torch.cuda.device(...)`` and labkit's guard (which both go through ``torch.cuda._exchange_device``)
  read and change it;
* factory calls given a CUDA device (``torch.empty(..., device="cuda")``, ``torch.empty_like(x)`` of a
  pretend tensor) make a pretend tensor on the device they name (``"cuda"``: the current one);
* ``kernel[grid](...)`` of the kernel given runs no kernel: it records the current device and every
  tensor argument's device (a :class:`Launch`), then computes the kernel's result with ``compute``.

Everything is restored on exit. Nothing here touches a real GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.overrides import TorchFunctionMode

_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.arange, torch.tensor}
_LIKE = {torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.rand_like, torch.randn_like}


class PretendTensor(torch.Tensor):
    """A CPU tensor that reports a pretend CUDA device. Its operations return plain CPU tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:
        return self._pretend_device


def on(t: torch.Tensor, index: int) -> PretendTensor:
    """``t``'s data as a tensor that says it lives on cuda:``index``."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        raise TypeError(f"pretend.on: t: expected a CPU tensor, got {t!r:.60}")
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"pretend.on: index: expected a device index >= 0, got {index!r}")
    p = t.as_subclass(PretendTensor)
    p._pretend_device = torch.device("cuda", index)
    return p


def plain(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor under a pretend one (the same memory)."""
    return t.as_subclass(torch.Tensor) if isinstance(t, PretendTensor) else t


@dataclasses.dataclass
class Launch:
    current: int  # the (pretend) current device when the kernel was launched
    devices: list[str]  # each tensor argument's device, in order


class _Factories(TorchFunctionMode):
    """Factory calls that name a CUDA device make pretend tensors (module docstring)."""

    def __init__(self, world: World):
        super().__init__()
        self.world = world

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        target = None
        if func in _FACTORIES and kwargs.get("device") is not None:
            target = torch.device(kwargs["device"])
        elif func in _LIKE and args and isinstance(args[0], torch.Tensor):
            target = torch.device(kwargs["device"]) if kwargs.get("device") is not None else args[0].device
            args = (plain(args[0]),) + tuple(args[1:])
        if target is None or target.type != "cuda":
            return func(*args, **kwargs)
        kwargs["device"] = "cpu"
        index = self.world.current if target.index is None else target.index
        return on(func(*args, **kwargs), index)


class World:
    """The pretend state: how many GPUs, which is current, and the launches seen."""

    def __init__(self, gpus: int, current: int):
        self.gpus, self.current = gpus, current
        self.launches: list[Launch] = []

    def exchange(self, index: int | None) -> int:
        """Make cuda:``index`` current, returning the previous one; None or -1 change nothing
        (``torch.cuda.device("cuda")`` resolves to no index without a real GPU: the current one)."""
        previous = self.current
        if index is not None and index >= 0:
            if index >= self.gpus:
                raise RuntimeError(f"pretend_gpus: no device cuda:{index} among {self.gpus}")
            self.current = index
        return previous


@contextlib.contextmanager
def pretend_gpus(kernel, compute, *, gpus: int = 2, current: int = 0):
    """Run the body in a world of ``gpus`` pretend GPUs, cuda:``current`` current; launches of
    ``kernel`` are recorded and ``compute(*plain_args)`` stands in for the kernel. Yields the World."""
    world = World(gpus, current)

    def run(*args, grid=None, warmup=False, **kwargs):
        world.launches.append(
            Launch(
                world.current,
                [str(a.device) for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)],
            )
        )
        compute(*[plain(a) for a in args])

    def set_device(device) -> None:
        world.exchange(torch.cuda._utils._get_device_index(device))

    saved = {
        name: getattr(torch.cuda, name)
        for name in ("_exchange_device", "_maybe_exchange_device", "current_device", "set_device", "device_count")
    }
    torch.cuda._exchange_device = world.exchange
    torch.cuda._maybe_exchange_device = world.exchange
    torch.cuda.current_device = lambda: world.current
    torch.cuda.set_device = set_device
    torch.cuda.device_count = lambda: world.gpus
    kernel.run = run
    try:
        with _Factories(world):
            yield world
    finally:
        del kernel.run
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
