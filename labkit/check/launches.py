"""``watch_launches``: flag every Triton launch whose tensors live on another GPU than the current one.

Triton launches a kernel on ``torch.cuda.current_device()`` and never looks at its tensors'
devices (lab 01). Triton's own launch hook (``triton.knobs.runtime.launch_enter_hook``) is called
with the launch's metadata only, never its arguments, so it cannot see the mismatch. Inside
``watch_launches`` the launch paths themselves are wrapped, for the length of the block:

* ``JITFunction.run``: every ``kernel[grid](...)`` and every autotuned launch (Triton 3.4 to the
  newest: the method has taken ``*args, grid, warmup, **kwargs`` throughout);
* ``InterpretedFunction.run``: the same under ``TRITON_INTERPRET=1``;
* ``labkit.kernels.comm.plan.KernelLaunch.__call__``: labkit's compiled-launcher path, which calls
  ``CompiledKernel.run`` directly after the first launch and so skips ``JITFunction.run``.

Each launch's tensor arguments (and the ``base`` of a tensor descriptor) are compared with the
current device before the launch; a mismatch is a :class:`Finding` naming the kernel, the
argument, its device and the current device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import torch

from labkit.workbench.errors import UsageError

_lock = threading.Lock()


class WrongDeviceLaunch(RuntimeError):
    """A launch ``watch_launches(on_mismatch="raise")`` stopped before it ran."""


@dataclasses.dataclass(frozen=True)
class Finding:
    kernel: str
    argument: str
    device: str  # the tensor's
    current: str  # the device current at the launch

    def __str__(self) -> str:
        return (
            f"kernel {self.kernel}: argument {self.argument} is on {self.device} but {self.current} is current "
            "(Triton launches on the current device)"
        )


class Watch:
    """What ``watch_launches`` yields: ``findings`` (one per mismatched argument) and ``launches``
    (how many launches it saw)."""

    def __init__(self):
        self.findings: list[Finding] = []
        self.launches = 0

    @property
    def ok(self) -> bool:
        return not self.findings


def _current() -> int | None:
    try:
        return torch.cuda.current_device() if torch.cuda.device_count() > 0 else None
    except (RuntimeError, AssertionError):
        return None


def _tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    base = getattr(value, "base", None)  # a TMA tensor descriptor holds its tensor as .base
    return base if isinstance(base, torch.Tensor) else None


def _check(watch: Watch, mode: str, echo: bool, kernel: str, names, args, kwargs) -> None:
    watch.launches += 1
    current = _current()
    if current is None:
        return  # no CUDA device: nothing can be on the wrong one
    named = list(zip(names, args)) if names else [(f"#{i}", a) for i, a in enumerate(args)]
    named += list(kwargs.items())
    found = []
    for name, value in named:
        t = _tensor(value)
        if t is not None and t.device.type == "cuda" and t.device.index != current:
            found.append(Finding(kernel, name, str(t.device), f"cuda:{current}"))
    for f in found:
        watch.findings.append(f)
        if echo:
            print(f"labkit.check.watch_launches: {f}", flush=True)
    if found and mode == "raise":
        raise WrongDeviceLaunch(str(found[0]))


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", None)
    return getattr(fn, "__qualname__", None) or getattr(kernel, "__name__", None) or repr(kernel)[:60]


def _arg_names(kernel) -> list[str]:
    names = getattr(kernel, "arg_names", None)
    if names:
        return list(names)
    return [p.name for p in getattr(kernel, "params", [])]


@contextlib.contextmanager
def watch_launches(on_mismatch: str = "record", echo: bool = False):
    """Flag every Triton launch in the block whose tensor arguments live on another GPU than the
    current one.

    Args:
        on_mismatch: "record" (the launch runs; the finding is kept) or "raise" (a
            :class:`WrongDeviceLaunch` naming kernel and argument, before the launch runs: on a
            GPU, the illegal memory access never happens).
        echo: also print each finding as it is made (a child process's stdout keeps it even when
            the launch then crashes the process).

    Yields:
        a :class:`Watch`: ``findings`` and ``launches``.

    Note:
        Launches from other threads are seen too (the wrap is process-wide for the block); the
        wraps nest. Within the block labkit's collectives launch their kernels one by one instead
        of replaying the CUDA graph a repeated call would (``labkit.kernels.comm.graph_launch``),
        so those launches are seen too. A kernel launched by a library that does not go through Triton's Python launch
        path (a precompiled AOT kernel, a CUDA extension) is not seen: torch's own ops guard
        their devices themselves.

    Example::

        >>> with labkit.check.watch_launches() as w:  # doctest: +SKIP
        ...     my_launcher(x_on_cuda1, out_on_cuda1)  # while cuda:0 is current
        >>> print(w.findings[0])  # doctest: +SKIP
        kernel _add_one_kernel: argument x_ptr is on cuda:1 but cuda:0 is current ...
    """
    if on_mismatch not in ("record", "raise"):
        raise UsageError(f"watch_launches: on_mismatch={on_mismatch!r}: expected 'record' or 'raise'")
    if not isinstance(echo, bool):
        raise UsageError(f"watch_launches: echo={echo!r}: expected a bool")
    watch = Watch()
    patched = []

    def wrap_run(cls):
        original = cls.__dict__.get("run")
        if original is None:
            return

        def run(self, *args, grid, warmup, **kwargs):
            if not warmup:
                _check(watch, on_mismatch, echo, _kernel_name(self), _arg_names(self), args, kwargs)
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        patched.append((cls, "run", original))
        cls.run = run

    def wrap_plan(cls):
        original = cls.__dict__["__call__"]

        def __call__(self, out):
            if self.compiled is None:  # not armed: it goes through JITFunction.run, seen there
                return original(self, out)
            full = self.args if self.out_pos < 0 else self.args[: self.out_pos] + (out,) + self.args[self.out_pos + 1 :]
            _check(watch, on_mismatch, echo, _kernel_name(self.kernel), _arg_names(self.kernel), full, self.kwargs)
            return original(self, out)

        patched.append((cls, "__call__", original))
        cls.__call__ = __call__

    with _lock:
        from triton.runtime import jit

        wrap_run(jit.JITFunction)
        try:
            from triton.runtime import interpreter

            wrap_run(interpreter.InterpretedFunction)
        except ImportError:  # a Triton without the interpreter module
            pass
        from labkit.kernels.comm import plan

        wrap_plan(plan.KernelLaunch)
    from labkit.kernels.comm.graph_launch import launches_watched

    try:
        with launches_watched():  # a repeated collective call launches, not replays a graph
            yield watch
    finally:
        with _lock:
            for cls, attr, original in reversed(patched):
                setattr(cls, attr, original)
