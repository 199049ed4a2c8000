"""``graph_safe``: does a CUDA graph of ``fn``, replayed on new inputs, compute what ``fn`` computes?

A graph keeps what the host computed at capture: Python numbers (a count read with ``.item()``,
an epoch kept on the host) become kernel arguments for good, and a copy from host memory keeps the
host ADDRESS, reading whatever is there at each replay (lab 04's staging buffer). The check:

1. ``fn`` runs twice eagerly on identical inputs with the same random seed: results that differ
   mean state kept on the host between calls, which a graph freezes ("host state"). A third run
   without re-seeding tells a function that draws random numbers apart ("non-deterministic":
   a replay cannot be compared with an eager call, inconclusive);
2. ``fn`` is captured once on static inputs;
3. ``replays`` times: new input values are written into the static inputs on the device
   (``vary``), the graph replays, and its outputs are compared with an eager call on the same
   values.

On a GPU the graph is a real ``torch.cuda.CUDAGraph`` (warmed up on a side stream first, as torch
asks), and the whole check runs in a child process (``labkit.workbench.sandbox``): a capture that
fails can leave the process that made it unable to use CUDA's random numbers or streams again
("Offset increment outside graph capture encountered unexpectedly" on every later
``torch.randn(device="cuda")``), so the caller's process never captures. On the CPU tier, where
CUDA graphs do not exist, :class:`EmulatedGraph` stands in with the same semantics: capture
records every ATen operation (a ``TorchDispatchMode``) and every Triton launch with the very
tensors and the Python values it was given; replay runs them again on the same memory, values
baked in. A host read of a tensor's values during capture, which makes a
real capture fail, fails the emulated one too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from labkit.check import report as R
from labkit.check.syncs import HostReads
from labkit.workbench import tier

NAME = "graph_safe"


class NotCapturable(RuntimeError):
    """The emulated capture met what a real capture refuses (a host read of a tensor's values)."""


class EmulatedGraph:
    """The CPU tier's CUDA graph: ``with g.capture(): out = fn(...)``, then ``g.replay()``.

    Replay repeats every recorded ATen operation on the tensors it was given at capture (an
    in-place or ``out=`` operation writes where it wrote; a functional one writes its result into
    the tensor it returned at capture; a view does nothing) and every Triton launch with its
    captured arguments. Python values stay as captured: exactly what a CUDA graph keeps."""

    def __init__(self):
        self.steps: list[tuple] = []
        self.host_reads: list[str] = []

    @contextlib.contextmanager
    def capture(self):
        graph = self
        recorder = _Recorder(graph)
        reads = HostReads()
        from triton.runtime import interpreter, jit

        patched = []
        for cls in (interpreter.InterpretedFunction, jit.JITFunction):
            original = cls.__dict__["run"]

            def run(kernel, *args, grid, warmup, _original=original, **kwargs):
                if warmup or recorder.paused:
                    return _original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
                graph.steps.append(("launch", _original, kernel, grid, args, kwargs))
                recorder.paused += 1  # the interpreter's own copies are not steps of the graph
                try:
                    return _original(kernel, *args, grid=grid, warmup=False, **kwargs)
                finally:
                    recorder.paused -= 1

            patched.append((cls, original))
            cls.run = run
        try:
            with reads, recorder:
                yield self
        finally:
            for cls, original in patched:
                cls.run = original
            self.host_reads = reads.reads
        if self.host_reads:
            raise NotCapturable(f"a host read of a tensor's values during capture: {self.host_reads[0]}")

    def replay(self) -> None:
        with torch.no_grad():
            for step in self.steps:
                if step[0] == "launch":
                    _, original, kernel, grid, args, kwargs = step
                    original(kernel, *args, grid=grid, warmup=False, **kwargs)
                    continue
                _, func, args, kwargs, out = step
                schema = func._schema
                if schema.is_mutable:
                    func(*args, **kwargs)
                elif any(r.alias_info is not None for r in schema.returns) or func in _SKIP:
                    continue
                else:
                    new = func(*args, **kwargs)
                    for o, n in zip(_tensors(out), _tensors(new)):
                        o.copy_(n)


_SKIP = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default, torch.ops.aten.empty_like.default}


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


#: storages (by address) marked as host memory for the emulated graph, each with its finaliser
_HOST: dict[int, weakref.finalize] = {}


def host_memory(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t``'s memory as host memory, what pinned memory is on a GPU; returns ``t``.

    On the CPU tier every tensor lives on the host, so :class:`EmulatedGraph` cannot tell a
    staging buffer from device memory by itself: work that writes only marked memory runs at
    capture and is not replayed (a CUDA graph captures device work only), while a copy FROM
    marked memory is replayed and reads it again, as a captured host-to-device copy does. On a
    GPU the mark changes nothing."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"host_memory: t: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type == "cpu":
        ptr = t.untyped_storage().data_ptr()
        _HOST[ptr] = weakref.finalize(t, _HOST.pop, ptr, None)
    return t


def _is_host(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.untyped_storage().data_ptr() in _HOST


def _written(func, args, kwargs) -> list:
    """The arguments an operation writes (in place or ``out=``), from its schema."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            out.append(args[i] if i < len(args) else kwargs.get(a.name))
    return out


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: EmulatedGraph):
        super().__init__()
        self.graph, self.paused = graph, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused:
            written = _written(func, args, kwargs) if func._schema.is_mutable else []
            if not (written and all(_is_host(t) for t in written)):  # host work is not captured
                self.graph.steps.append(("op", func, args, kwargs, out))
        return out


def _refill(make_inputs, device):
    """The default ``vary``: new values from ``make_inputs(device)``, copied into the inputs."""

    def vary(args, kwargs, step):
        new = R.build_inputs(NAME, make_inputs, device)
        old = R.tensors_in((tuple(args), kwargs))
        fresh = R.tensors_in(new)
        if [t.shape for _, t in old] != [t.shape for _, t in fresh]:
            raise R.UsageError(
                f"{NAME}: make_inputs gave tensors of other shapes on a second call; a graph "
                "replays on fixed shapes: give make_inputs fixed shapes, or pass vary="
            )
        for (_, o), (_, n) in zip(old, fresh):
            o.copy_(n)

    return vary


def _restore(args, kwargs, saved) -> None:
    """Write the saved values back into the inputs (the same tensors: the same addresses)."""
    for (_, t), (_, v) in zip(R.tensors_in((args, kwargs)), saved):
        t.copy_(v)


def _eager(fn, args, kwargs, saved, seed):
    """``fn`` on the given tensors themselves, their values first restored from ``saved``: a
    function whose outputs hold addresses sees the same addresses as the graph."""
    _restore(args, kwargs, saved)
    devices = sorted({t.device.index for _, t in R.tensors_in((args, kwargs)) if t.is_cuda})
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        result = fn(*args, **kwargs)
    return R.snapshot(R.outputs(NAME, result, args, kwargs))


class _CudaGraph:
    def __init__(self, device):
        self.device, self.graph = device, torch.cuda.CUDAGraph()

    @contextlib.contextmanager
    def capture(self):
        """``torch.cuda.graph`` with what it leaves behind when the capture fails put right: its
        exit ends the capture first and restores the stream after, so a capture that raises on
        its end (an operation the capture refused) leaves the capture stream current; here the
        capture is always ended and the caller's device and stream always restored."""
        before = torch.cuda.current_stream(self.device)
        with torch.cuda.device(self.device):
            try:
                with torch.cuda.graph(self.graph):
                    yield self
            finally:
                if torch.cuda.is_current_stream_capturing():
                    with contextlib.suppress(Exception):
                        self.graph.capture_end()
                torch.cuda.set_stream(before)

    def replay(self):
        self.graph.replay()
        torch.cuda.synchronize(self.device)


class CaptureFailed(RuntimeError):
    """:func:`replay_with_fresh_inputs`: the warm-up or the capture of ``fn`` raised (the cause is
    chained). ``graph`` is the graph it was captured into: on the CPU tier its ``host_reads`` name
    any host read of a tensor's values during the capture."""

    def __init__(self, message: str, graph):
        super().__init__(message)
        self.graph = graph


@dataclasses.dataclass
class Replays:
    """What :func:`replay_with_fresh_inputs` saw."""

    outputs: object  # what fn returned at capture: the graph's outputs, rewritten by every replay
    wrong: list[tuple[int, object]]  # (replay, what check returned) for each replay check found wrong
    replays: int  # how many replays ran (fewer than asked when stop_at_first stopped early)
    kind: str  # "CUDA graph" or "emulated graph"

    @property
    def ok(self) -> bool:
        return not self.wrong


def replay_with_fresh_inputs(
    fn,
    refill,
    check,
    *,
    replays: int = 2,
    warmup: int = 2,
    before_capture=None,
    stop_at_first: bool = False,
) -> Replays:
    """Capture ``fn()`` once in a graph, then replay it on new inputs written on the device, and
    check every replay: the loop ``graph_safe``, ``collective`` and the collectives' graph tests
    share.

    On a GPU the graph is a ``torch.cuda.CUDAGraph`` on the current device, after ``warmup`` eager
    calls of ``fn`` on a side stream (lazy initialisation and autotuning must not happen inside
    the capture, as ``torch.cuda.graphs`` asks); the caller's device and stream are restored even
    when the capture fails. On the CPU tier it is an :class:`EmulatedGraph` (no warm-up needed).
    Then, for each replay ``step``: ``filled = refill(step)``, the graph replays (and the device
    synchronises), and ``check(step, outputs, filled)`` says what is wrong.

    Args:
        fn: a callable of no arguments: the work to capture. It reads its inputs from tensors that
            stay put (the graph's static inputs); what it returns is ``outputs``.
        refill: ``refill(step)`` writes replay ``step``'s input values into those tensors, in
            place, on the device (a host tensor's address is baked into a graph; its values are
            not), and returns whatever ``check`` needs to know about them (e.g. the reference).
        check: ``check(step, outputs, filled)``: None (or anything false) when the replay's
            outputs are right, else what is wrong (kept as it is in :attr:`Replays.wrong`).
        replays: how many times to refill, replay and check.
        warmup: eager calls before the capture, on a GPU (0 when the caller warmed ``fn`` up).
        before_capture: called after the warm-up, right before the capture (restore the inputs
            the warm-up changed; a barrier between ranks).
        stop_at_first: stop at the first wrong replay (default: run them all and list them).

    Returns:
        a :class:`Replays`: ``outputs``, ``wrong``, ``replays`` (how many ran), ``kind``; ``.ok``.

    Raises:
        CaptureFailed: the warm-up or the capture raised (the cause chained, the graph attached).
        ValueError: a bad argument, naming it.

    Note:
        ``refill``'s and ``check``'s own errors propagate unchanged. A rank of a multi-rank world
        calls it on every rank with the same ``replays``: each replay of a collective meets its
        peers' replays.

    Example::

        >>> x, out = torch.randn(1024, device="cuda"), torch.empty(1024, device="cuda")  # doctest: +SKIP
        >>> def refill(step):  # doctest: +SKIP
        ...     x.copy_(torch.randn_like(x))
        ...     return x * 2
        >>> r = replay_with_fresh_inputs(lambda: torch.mul(x, 2, out=out), refill,  # doctest: +SKIP
        ...                              lambda step, y, want: None if torch.equal(y, want) else "differs")
        >>> r.ok, r.replays  # doctest: +SKIP
        (True, 2)
    """
    for name, value in (("fn", fn), ("refill", refill), ("check", check)):
        if not callable(value):
            raise ValueError(f"replay_with_fresh_inputs: {name}: expected a callable, got {type(value).__name__}")
    if before_capture is not None and not callable(before_capture):
        raise ValueError(
            f"replay_with_fresh_inputs: before_capture: expected a callable or None, got {before_capture!r:.60}"
        )
    for name, value, least in (("replays", replays, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"replay_with_fresh_inputs: {name}={value!r}: expected an int >= {least}")
    on_gpu = _on_gpu()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
    graph = _CudaGraph(device) if on_gpu else EmulatedGraph()
    kind = "CUDA graph" if on_gpu else "emulated graph"
    try:
        if on_gpu and warmup:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    fn()
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
        if before_capture is not None:
            before_capture()
        with graph.capture():
            outputs = fn()
    except Exception as e:
        raise CaptureFailed(
            f"the {kind}'s warm-up or capture raised {type(e).__name__}: {R.first_line(e)}", graph
        ) from e
    wrong: list[tuple[int, object]] = []
    ran = 0
    for step in range(replays):
        filled = refill(step)
        graph.replay()
        ran += 1
        verdict = check(step, outputs, filled)
        if verdict:
            wrong.append((step, verdict))
            if stop_at_first:
                break
    return Replays(outputs, wrong, ran, kind)


def _on_gpu() -> bool:
    return tier.TIER == "gpu" and torch.cuda.is_available()


def _spec(obj) -> str | None:
    """``"module:function"`` naming ``obj`` that a child process imports back to ``obj`` itself;
    None when there is none (a lambda, a nested function, one defined in ``__main__``)."""
    if obj is None:
        return None
    try:
        spec = R.importable(NAME, "fn", obj)
        return spec if isinstance(obj, str) or R.resolve(NAME, "fn", spec) is obj else None
    except R.UsageError:
        return None


def _child(fn_spec: str, inputs_spec: str, vary_spec: str | None, target: str, replays: int, rtol, atol, device=None):
    """In the child process: the whole check, its capture included, on the caller's current GPU;
    returns the :class:`Report`."""
    if device is not None:
        torch.cuda.set_device(device)
    fn, make_inputs = R.resolve(NAME, "fn", fn_spec), R.resolve(NAME, "make_inputs", inputs_spec)
    vary = R.resolve(NAME, "vary", vary_spec) if vary_spec else None
    return _check(fn, make_inputs, vary, target, replays, rtol, atol)


def _isolated(fn, make_inputs, vary, target: str, replays: int, rtol, atol, timeout: float) -> R.Report:
    """The check in a child process (``run_isolated``); a "skipped" report when one of the
    callables cannot be imported there."""
    from labkit.workbench import sandbox

    specs = {"fn": _spec(fn), "make_inputs": _spec(make_inputs), "vary": _spec(vary)}
    missing = [name for name, spec in specs.items() if spec is None and (name != "vary" or vary is not None)]
    if missing:
        return R.Report(
            NAME,
            target,
            "skipped",
            "not importable",
            f"{' and '.join(missing)} cannot be imported by a child process (a lambda, a nested function or "
            "defined in __main__): the CUDA capture runs in a child because a failed capture can leave "
            "this process's CUDA state unusable; put them in a module, pass 'module:function', or pass "
            "isolate=False to capture in this process",
        )
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    res = sandbox.run_isolated(_child, *specs.values(), target, replays, rtol, atol, device, timeout=timeout)
    if res.ok:
        return res.value
    if res.status == "exception" and (res.error_type or "").endswith("UsageError"):
        raise R.UsageError(res.message or "")
    if res.status == "timeout":
        return R.Report(NAME, target, "error", "hang", f"no result within {timeout:g} s: {res.summary()}")
    return R.Report(NAME, target, "error", "child process ended", f"the check's child process ended: {res.summary()}")


def graph_safe(
    fn,
    make_inputs,
    vary=None,
    *,
    replays: int = 2,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    isolate: bool = True,
    timeout: float = 300.0,
) -> R.Report:
    """Check that a graph of ``fn`` captured once computes, replayed on new inputs, what ``fn``
    computes on them (lab 04's bug: host values and host memory baked into a graph).

    Args:
        fn: the function, or ``"module:function"``.
        make_inputs: ``make_inputs(device) -> (args, kwargs)``, or ``"module:function"``.
        vary: ``vary(args, kwargs, step)`` writes new values into the captured inputs, in place,
            on their device (and may run other code that shares state with ``fn``: another
            layer's call). Default: new values from ``make_inputs`` copied in (it must then draw
            fresh random values on each call).
        replays: how many times to vary, replay and compare.
        rtol, atol: the comparison's tolerance (a graph runs the same kernels; a baked value is
            far outside it).
        isolate: on a GPU, run the check in a child process (default): a capture that fails (a
            host sync, an error inside the capture) can leave the CUDA state of the process that
            made it unusable (every later ``torch.randn(device="cuda")`` raises). ``fn``,
            ``make_inputs`` and ``vary`` must then be importable by name; when one is not (a lambda,
            a nested function, a notebook's), the report is "skipped" and says so. ``False``
            captures in this process: a notebook's function can be checked, at that risk. On the
            CPU tier the emulated graph always runs in this process (it cannot break it).
        timeout: seconds for the child process; a check still running then is a "hang" error.

    Returns:
        a :class:`Report`: "graph-safe"; "replay differs from eager" (which outputs, which
        replay); "host state" (two eager calls on identical inputs differ); "not capturable" (a
        host sync or another capture error, with the line); "non-deterministic" (random numbers:
        inconclusive); "skipped" (isolate and a callable a child cannot import); an "error" report
        "hang" or "child process ended" when the child did not return.

    Note:
        On the CPU tier the graph is :class:`EmulatedGraph` (module docstring): it records ATen
        operations and Triton launches; work outside both (a C++ extension's own kernel) is not
        replayed and reads as a mismatch. Inputs that ``vary`` leaves unchanged prove nothing:
        reported as inconclusive.

    Example::

        >>> r = labkit.check.graph_safe(moe_forward, moe_inputs)  # doctest: +SKIP
        >>> r.ok  # doctest: +SKIP
        True
    """
    target = R.name_of(fn)
    fn, make_inputs = R.resolve(NAME, "fn", fn), R.resolve(NAME, "make_inputs", make_inputs)
    if vary is not None and not callable(vary):
        raise R.UsageError(f"{NAME}: vary: expected a callable (args, kwargs, step) or None, got {type(vary).__name__}")
    R.check_number(NAME, "replays", replays, minimum=1, integer=True)
    R.check_number(NAME, "rtol", rtol, minimum=-1e-300)
    R.check_number(NAME, "atol", atol, minimum=-1e-300)
    R.check_number(NAME, "timeout", timeout)
    if not isinstance(isolate, bool):
        raise R.UsageError(f"{NAME}: isolate={isolate!r}: expected a bool")
    if isolate and _on_gpu():
        return _isolated(fn, make_inputs, vary, target, replays, rtol, atol, timeout)
    return _check(fn, make_inputs, vary, target, replays, rtol, atol)


def _check(fn, make_inputs, vary, target: str, replays: int, rtol, atol) -> R.Report:
    """The check itself (module docstring), in whichever process runs it."""
    on_gpu = _on_gpu()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else tier.kernel_device()
    args, kwargs = R.build_inputs(NAME, make_inputs, device)
    vary = vary or _refill(make_inputs, device)
    kind = "CUDA graph" if on_gpu else "emulated graph (CPU tier: ATen operations and Triton launches recorded)"

    def fail(outcome, message, details=(), status="failed"):
        return R.Report(NAME, target, status, outcome, message, list(details))

    saved = R.snapshot(R.tensors_in((args, kwargs)))
    eager_failed = _eager_verdict(fn, args, kwargs, saved, fail, rtol, atol)
    if eager_failed is not None:
        return eager_failed
    _restore(args, kwargs, saved)
    try:
        ran, changed = _replay_varied(fn, vary, args, kwargs, saved, replays, rtol, atol)
    except CaptureFailed as failed:
        e = failed.__cause__
        reads = getattr(failed.graph, "host_reads", [])
        at = "" if reads else f"; at {R.user_line(tb=e.__traceback__)}"
        return fail("not capturable", f"capture failed ({kind}): {type(e).__name__}: {R.first_line(e)}{at}", reads[:5])
    if ran.wrong:
        step, diffs = ran.wrong[0]
        return fail(
            "replay differs from eager",
            f"replay {step + 1} of the {kind} on new inputs differs from an "
            "eager call on them: a host value or host memory was baked in at capture",
            diffs[:5],
        )
    if not changed:
        return fail(
            "inputs never changed",
            "vary left every input as it was: the replays prove nothing (draw "
            "fresh random values in make_inputs, or pass vary=)",
            status="inconclusive",
        )
    return R.Report(
        NAME, target, "passed", "graph-safe", f"{replays} replays of the {kind} on new inputs matched eager calls"
    )


def _eager_verdict(fn, args, kwargs, saved, fail, rtol, atol) -> R.Report | None:
    """Step 1: two eager calls with the same seed that differ ("host state"), a third unseeded one
    that differs ("non-deterministic"), or fn raising; None when eager calls agree."""
    try:
        first, second = _eager(fn, args, kwargs, saved, 0), _eager(fn, args, kwargs, saved, 0)
    except R.UsageError:
        raise
    except Exception as e:
        return fail("exception", f"fn raised {type(e).__name__}: {R.first_line(e)} (on its own inputs)", status="error")
    diffs = R.differences(first, second, rtol=rtol, atol=atol)
    if diffs:
        return fail(
            "host state",
            "two eager calls on identical inputs (same random seed) differ: fn keeps state "
            "on the host between calls (a counter, an epoch), which a graph freezes at its capture value",
            diffs[:5],
        )
    if R.differences(first, _eager(fn, args, kwargs, saved, None), rtol=rtol, atol=atol):
        return fail(
            "non-deterministic",
            "fn draws random numbers: a replay cannot be compared with an eager call "
            "(make the randomness an input to check it)",
            status="inconclusive",
        )
    return None


def _replay_varied(fn, vary, static_args, static_kwargs, saved, replays: int, rtol, atol):
    """Steps 2-3: capture on the static inputs, then ``replays`` times vary, replay and compare
    with an eager call (``replay_with_fresh_inputs``, stopping at the first mismatch). Returns
    (what it ran, whether ``vary`` changed any input); raises ``CaptureFailed``."""
    changed = False

    def refill(step):
        nonlocal changed
        before = R.snapshot(R.tensors_in((static_args, static_kwargs)))
        try:
            vary(static_args, static_kwargs, step)
        except R.UsageError:
            raise
        except Exception as e:
            raise R.UsageError(f"{NAME}: vary raised {type(e).__name__}: {R.first_line(e)}") from e
        varied = R.snapshot(R.tensors_in((static_args, static_kwargs)))
        changed |= bool(R.differences(before, varied))
        return varied

    def check(step, result, varied):
        replayed = R.snapshot(R.outputs(NAME, result, static_args, static_kwargs))
        eager = _eager(fn, static_args, static_kwargs, varied, 0)
        _restore(static_args, static_kwargs, varied)  # the graph's next replay starts from the varied values
        return R.differences(eager, replayed, rtol=rtol, atol=atol)

    ran = replay_with_fresh_inputs(
        lambda: fn(*static_args, **static_kwargs),
        refill,
        check,
        replays=replays,
        before_capture=lambda: _restore(static_args, static_kwargs, saved),
        stop_at_first=True,
    )
    return ran, changed
