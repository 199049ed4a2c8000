"""Run a ``@triton.jit`` signalling function's Python body with a ``tl`` that records its atomics.

What a barrier's atomics are built with (``sem``, ``scope``) decides whether it orders memory
between GPUs, yet no CPU run can show the difference: the emulated world's ranks are x86
processes, where every atomic read-modify-write is a full barrier. So the check of exercise
02.barrier does not wait for a race; it runs the learner's function body once, on the host, with
``tl`` replaced by :class:`RecordingTL`: pointers are named slots of a small memory, and every
atomic, load and store is applied to that memory and recorded with the ``sem`` and ``scope`` it
was called with (Triton's defaults where none is given). On a GPU the same arguments are what
the compiler turns into ``atom.<sem>.<scope>`` (``labkit.labs.collectives.ptx``).
"""

from __future__ import annotations

import dataclasses
import types

import triton.language as tl

#: what ``tl.atomic_*`` take when ``sem`` / ``scope`` is not given (triton.language.semantic)
DEFAULT_SEM = "acq_rel"
DEFAULT_SCOPE = "gpu"
#: atomics one run may issue before the probe calls it a hang (a spin loop that never succeeds)
MAX_OPS = 1000


@dataclasses.dataclass(frozen=True)
class Op:
    """One memory operation the body issued: what, on which slot, with which ordering."""

    what: str  # "atomic_cas", "atomic_xchg", "atomic_add", "load" or "store"
    slot: str
    old: int  # the slot's value before the operation
    new: int  # after it
    sem: str  # "plain" for loads and stores
    scope: str | None


class Hang(Exception):
    """The body issued more than MAX_OPS operations: a spin loop that cannot succeed."""


class Slot:
    """A pointer to one int slot of the probe's memory."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<slot {self.name}>"


class RecordingTL:
    """``triton.language`` with its memory operations applied to named slots and recorded;
    every other name (dtypes, ``constexpr``, ``static_range``) is the real module's."""

    def __init__(self, memory: dict[str, int]):
        self.memory = dict(memory)
        self.ops: list[Op] = []

    def __getattr__(self, name):
        return getattr(tl, name)

    def _apply(self, what, ptr, new_of, sem, scope) -> int:
        if not isinstance(ptr, Slot):
            raise TypeError(f"{what}: the probe's pointers are the slots it passed in; got {ptr!r}")
        if len(self.ops) >= MAX_OPS:
            raise Hang(f"more than {MAX_OPS} memory operations: a loop that never ends")
        old = self.memory[ptr.name]
        self.memory[ptr.name] = new_of(old)
        self.ops.append(Op(what, ptr.name, old, self.memory[ptr.name], sem, scope))
        return old

    def atomic_cas(self, pointer, cmp, val, sem=None, scope=None, **_):
        return self._apply(
            "atomic_cas", pointer, lambda old: val if old == cmp else old, sem or DEFAULT_SEM, scope or DEFAULT_SCOPE
        )

    def atomic_xchg(self, pointer, val, mask=None, sem=None, scope=None, **_):
        return self._apply("atomic_xchg", pointer, lambda old: val, sem or DEFAULT_SEM, scope or DEFAULT_SCOPE)

    def atomic_add(self, pointer, val, mask=None, sem=None, scope=None, **_):
        return self._apply("atomic_add", pointer, lambda old: old + val, sem or DEFAULT_SEM, scope or DEFAULT_SCOPE)

    def load(self, pointer, *args, **kwargs):
        return self._apply("load", pointer, lambda old: old, "plain", None)

    def store(self, pointer, value, *args, **kwargs):
        return self._apply("store", pointer, lambda old: value, "plain", None)

    def debug_barrier(self):
        pass  # one program: a CTA barrier has nothing to wait for, and orders nothing across GPUs


def run_recorded(jitted, memory: dict[str, int], *slots: str, **constexprs) -> RecordingTL:
    """Call ``jitted``'s Python body once with ``Slot(name)`` for each of ``slots`` as its
    arguments (then ``constexprs`` by name, e.g. ``SEM=0``) and ``tl`` recording; returns the
    recorder (its ``memory`` after, its ``ops``).

    Names in the body's module bound to ``triton.language`` or to one of its memory operations
    are replaced for this call only; the function itself is not changed."""
    fn = getattr(jitted, "fn", None)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"run_recorded: jitted must be a @triton.jit function, got {type(jitted).__name__}")
    missing = [s for s in slots if s not in memory]
    if missing:
        raise ValueError(f"run_recorded: slots {missing} are not in memory {sorted(memory)}")
    rec = RecordingTL(memory)
    swapped = {}
    for name, value in fn.__globals__.items():
        if value is tl:
            swapped[name] = rec
        elif callable(value) and getattr(tl, getattr(value, "__name__", ""), None) is value:
            swapped[name] = getattr(rec, value.__name__)
    body = types.FunctionType(fn.__code__, {**fn.__globals__, **swapped}, fn.__name__, fn.__defaults__, fn.__closure__)
    body(*(Slot(s) for s in slots), **constexprs)
    return rec
