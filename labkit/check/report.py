"""What every checker shares: the report it returns, and the one convention for a user's inputs.

Inputs: the user gives ``make_inputs(device) -> (args, kwargs)``, a function (or its name,
``"module:function"``) that builds the inputs of ``fn`` on ``device``; a child process or another
GPU builds its own from it. Outputs: the tensors ``fn`` returns (a tensor, or tuples, lists and
dicts of them) and, after the call, every tensor among its arguments (a function that writes in
place returns None; its arguments are its outputs).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable

import torch

from labkit.workbench import tier
from labkit.workbench.errors import UsageError

#: every status a report can have; only "passed" is ``ok``
STATUSES = ("passed", "failed", "skipped", "error", "inconclusive")


class CheckFailed(AssertionError):
    """A checker found the bug it looks for (or could not run ``fn``); ``.report`` says what."""

    def __init__(self, report: Report):
        super().__init__(report.text())
        self.report = report


@dataclasses.dataclass
class Report:
    """What one checker saw on one function.

    status:  "passed" (looked and found nothing), "failed" (found the bug), "skipped" (this
             machine cannot look: ``message`` says what is missing), "error" (``fn`` or
             ``make_inputs`` itself failed where nothing was provoked), "inconclusive" (``fn``
             gives different results on identical inputs: no comparison can tell a bug).
    outcome: a short key, e.g. "independent", "launches on the current device", "host sync".
    message: one line.
    details: further lines (which outputs differ, which kernel and argument, which line).
    """

    checker: str
    target: str
    status: str
    outcome: str
    message: str
    details: list[str] = dataclasses.field(default_factory=list)
    tier: str = dataclasses.field(default_factory=lambda: tier.TIER)

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    def summary(self) -> str:
        """One line: checker, function, status, outcome and message."""
        return f"{self.checker}({self.target}): {self.status.upper()}: {self.outcome}: {self.message}"

    def text(self) -> str:
        return "\n".join([self.summary()] + [f"  {d}" for d in self.details])

    def __str__(self) -> str:
        return self.text()

    def raise_for_status(self) -> Report:
        """Raise :class:`CheckFailed` unless passed or skipped; returns the report."""
        if self.status not in ("passed", "skipped"):
            raise CheckFailed(self)
        return self


def name_of(fn) -> str:
    if isinstance(fn, str):
        return fn
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}:{qual}" if module and qual else repr(fn)[:60]


def resolve(checker: str, argname: str, obj) -> Callable:
    """``obj`` as a callable: a callable, or ``"module:function"`` imported; UsageError naming the
    checker and the argument otherwise."""
    if isinstance(obj, str):
        module, sep, qual = obj.partition(":")
        if not sep or not module or not qual:
            raise UsageError(f"{checker}: {argname}={obj!r}: expected a callable or 'module:function'")
        try:
            found = importlib.import_module(module)
            for part in qual.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"{checker}: {argname}={obj!r}: cannot be imported ({type(e).__name__}: {e})") from None
        obj = found
    if not callable(obj):
        raise UsageError(f"{checker}: {argname}: expected a callable or 'module:function', got {type(obj).__name__}")
    return obj


def importable(checker: str, argname: str, obj) -> str:
    """``"module:function"`` for ``obj``, which a child process can import; UsageError otherwise."""
    if isinstance(obj, str):
        resolve(checker, argname, obj)
        return obj
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qual or module == "__main__" or "<" in qual:
        raise UsageError(
            f"{checker}: {argname}={name_of(obj)}: a child process must import it by name, but it is a "
            "lambda, a nested function or defined in __main__ (a notebook); put it in a module, or pass "
            "'module:function'"
        )
    return f"{module}:{qual}"


def build_inputs(checker: str, make_inputs: Callable, device) -> tuple[tuple, dict]:
    """``make_inputs(device)`` checked: a pair (args, kwargs) holding at least one tensor."""
    try:
        got = make_inputs(device)
    except Exception as e:
        raise UsageError(f"{checker}: make_inputs({str(device)!r}) raised {type(e).__name__}: {first_line(e)}") from e
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise UsageError(
            f"{checker}: make_inputs({str(device)!r}) must return (args, kwargs): a tuple of the positional "
            f"arguments and a dict of the keyword arguments; got {type(got).__name__} {got!r:.80}"
        )
    args, kwargs = got
    if isinstance(args, torch.Tensor) or not isinstance(args, (tuple, list)):
        raise UsageError(f"{checker}: make_inputs: args must be a tuple or list, got {type(args).__name__}")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise UsageError(f"{checker}: make_inputs: kwargs must be a dict of names, got {type(kwargs).__name__}")
    if not tensors_in((tuple(args), kwargs)):
        raise UsageError(
            f"{checker}: make_inputs({str(device)!r}) gave no tensor: fn takes no tensor, so there is no data "
            "whose device, stream or values the checker could vary"
        )
    return tuple(args), dict(kwargs)


def tensors_in(obj, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` (tuples, lists, dicts), with a path naming it."""
    if isinstance(obj, torch.Tensor):
        return [(path or "output", obj)]
    if isinstance(obj, (tuple, list)):
        return [item for i, v in enumerate(obj) for item in tensors_in(v, f"{path}[{i}]")]
    if isinstance(obj, dict):
        return [item for k, v in obj.items() for item in tensors_in(v, f"{path}[{k!r}]")]
    return []


def outputs(checker: str, result, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """What a call produced: the returned tensors, then every tensor argument (written in place or
    not). A result that is neither None nor holds a tensor is a UsageError naming ``fn``."""
    got = tensors_in(result, "output")
    if result is not None and not got:
        raise UsageError(
            f"{checker}: fn returned {type(result).__name__} {result!r:.60}, which holds no tensor: return the "
            "output tensor(s), or None for a function that writes into its tensor arguments"
        )
    inputs = [(f"args{p}", t) for p, t in tensors_in(tuple(args))] + [(f"kwargs{p}", t) for p, t in tensors_in(kwargs)]
    return got + inputs


def clone_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A copy of the inputs with every tensor cloned (on its own device); other values shared."""

    def copy(v):
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
        if isinstance(v, (tuple, list)):
            return type(v)(copy(x) for x in v)
        if isinstance(v, dict):
            return {k: copy(x) for k, x in v.items()}
        return v

    return copy(tuple(args)), copy(dict(kwargs))


def snapshot(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Detached CPU copies of named tensors (what a comparison keeps)."""
    return [(n, t.detach().to("cpu", copy=True)) for n, t in named]


def differences(want, got, *, rtol: float = 0.0, atol: float = 0.0) -> list[str]:
    """One line per named tensor that differs (bit for bit when rtol = atol = 0)."""
    lines = []
    if [n for n, _ in want] != [n for n, _ in got]:
        return [f"different outputs: {[n for n, _ in want]} against {[n for n, _ in got]}"]
    for (name, a), (_, b) in zip(want, got):
        if a.shape != b.shape or a.dtype != b.dtype:
            lines.append(f"{name}: {a.dtype}{tuple(a.shape)} against {b.dtype}{tuple(b.shape)}")
            continue
        if rtol == 0 and atol == 0:
            same = torch.equal(a, b) or (
                a.is_floating_point()
                and torch.equal(a.isnan(), b.isnan())
                and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
            )
            bad = None if same else (a != b) & ~(a.isnan() & b.isnan()) if a.is_floating_point() else a != b
        else:
            close = torch.isclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)
            bad = None if bool(close.all()) else ~close
        if bad is not None:
            count = int(bad.sum())
            if a.is_floating_point() or a.is_complex():
                worst = float((a.double() - b.double()).abs().nan_to_num(float("inf")).max())
                lines.append(f"{name}: {count} of {a.numel()} elements differ (max |difference| {worst:.3g})")
            else:
                lines.append(f"{name}: {count} of {a.numel()} elements differ")
    return lines


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


#: modules whose frames are not the user's line: torch, triton, and the checkers themselves
_NOT_USER = ("torch", "triton", "labkit.check", "contextlib", "importlib")


def user_line(frame=None, tb=None) -> str:
    """``file:line (function)`` of the innermost frame outside torch, triton and the checkers:
    from a traceback (innermost last) or from the calling stack."""
    frames = []
    if tb is not None:
        while tb is not None:
            frames.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        frames.reverse()
    else:
        f = frame or sys._getframe(1)
        while f is not None:
            frames.append((f, f.f_lineno))
            f = f.f_back
    for f, line in frames:
        name = f.f_globals.get("__name__", "")
        if not any(name == m or name.startswith(m + ".") for m in _NOT_USER):
            return f"{f.f_code.co_filename}:{line} ({f.f_code.co_name})"
    return "?"


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(checker: str, target: str, n: int, what: str) -> Report | None:
    """A "skipped" report when this machine lacks ``n`` GPUs running compiled kernels, else None."""
    have = cuda_count()
    if have < n:
        return Report(
            checker,
            target,
            "skipped",
            f"needs {n} GPU{'s' if n > 1 else ''}",
            f"needs {n} GPU{'s' if n > 1 else ''}, found {have}: {what}",
        )
    if tier.interpreted():
        return Report(
            checker,
            target,
            "skipped",
            "needs compiled kernels",
            f"TRITON_INTERPRET=1 is set: kernels run on the CPU, {what}",
        )
    return None


def check_number(checker: str, name: str, value, *, minimum: float = 0, integer: bool = False) -> None:
    """UsageError naming ``checker`` and ``name`` unless ``value`` is a number above ``minimum``
    (an int at least ``minimum`` when ``integer``); a bool is never a number here."""
    if integer:
        good = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        want = f"an int >= {minimum}"
    else:
        good = isinstance(value, (int, float)) and not isinstance(value, bool) and minimum < value < float("inf")
        want = f"a number > {minimum}"
    if not good:
        raise UsageError(f"{checker}: {name}={value!r}: expected {want}")
