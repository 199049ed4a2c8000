"""``stream_safety``: are ``fn``'s outputs, and its own side-stream work, safe across CUDA streams?

The caching allocator ties a block to the stream that allocated it: freed, it is handed out again
to that stream at once. Work still queued on another stream is covered only if
``t.record_stream(other)`` reached the allocator, and it reaches it only for memory the allocator
owns: a tensor made from a raw pointer, ``from_blob`` or DLPack has a storage the allocator does
not know (lab 03). The check, on a GPU, against a synchronised run of ``fn``:

* ``fn`` itself: every stream ``fn`` enters (``with torch.cuda.stream(s)``) starts with a delay,
  so work it queued there runs late; after ``fn`` returns, the main stream takes every free cached
  block (zero-filled "canaries"). Outputs that differ mean missing ``wait_stream``; a canary
  written means memory freed while a side stream still used it;
* the producer direction (lab 03's shape): a side stream, after a delay, writes into ``fn``'s
  outputs; the caller calls ``record_stream`` and drops them; canaries must stay zero;
* the consumer direction: a side stream, after a delay, reads the outputs; the caller calls
  ``record_stream`` and drops them; the main stream fills canaries; what the side stream read
  must equal the synchronised run's outputs.

Every output whose storage the allocator does not own is named. On the CPU tier (no streams) only
that last part runs, labelled.
"""

from __future__ import annotations

import contextlib

import torch

from labkit.check import report as R
from labkit.workbench import tier

NAME = "stream_safety"
SENTINEL = 7  # what the side stream writes; zero-filled canaries never hold it


def not_owned(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """The named tensors whose storage torch's allocator does not own (it cannot resize them:
    memory that came in as a raw pointer, ``from_blob``, ``frombuffer`` or DLPack)."""
    return [
        f"{n}: its storage is not owned by torch's caching allocator (a raw pointer, from_blob or DLPack): "
        "record_stream on it does nothing"
        for n, t in named
        if not t.untyped_storage().resizable()
    ]


@contextlib.contextmanager
def _delayed_streams(device: torch.device, cycles: int):
    """Every ``with torch.cuda.stream(s)`` on a stream other than the main one starts with a GPU sleep."""
    main = torch.cuda.current_stream(device)
    original = torch.cuda.StreamContext.__enter__

    def enter(self):
        out = original(self)
        s = torch.cuda.current_stream(device)
        if s != main:
            torch.cuda._sleep(cycles)
        return out

    torch.cuda.StreamContext.__enter__ = enter
    try:
        yield
    finally:
        torch.cuda.StreamContext.__enter__ = original


def _canaries(device: torch.device, stream, fill: int) -> list[torch.Tensor]:
    """One tensor, filled on the main stream, in every free cached block of ``stream``."""
    sizes = []
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device") == device.index and seg.get("stream") == stream.cuda_stream:
            sizes += [b["size"] for b in seg.get("blocks", []) if b.get("state") == "inactive"]
    out = []
    for size in sorted(sizes, reverse=True):
        if size <= (1 << 30):
            out.append(torch.full((size,), fill, dtype=torch.uint8, device=device))
    return out


def _returned(named):
    return [(n, t) for n, t in named if n.startswith("output")]


def _gpu(fn, make_inputs, target: str, delay_ms: float) -> R.Report:
    """The GPU check (module docstring): a synchronised reference, then the three directions."""
    from labkit.workbench.bench import sleep_cycles_per_ms

    device = torch.device("cuda", torch.cuda.current_device())
    cycles = int(delay_ms * sleep_cycles_per_ms(device.index))
    pristine = R.build_inputs(NAME, make_inputs, device)
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    a, k = R.clone_inputs(*pristine)
    try:
        ref = R.snapshot(R.outputs(NAME, fn(*a, **k), a, k))
        torch.cuda.synchronize(device)
        again = R.clone_inputs(*pristine)
        if R.differences(ref, R.snapshot(R.outputs(NAME, fn(*again[0], **again[1]), *again))):
            return R.Report(
                NAME,
                target,
                "inconclusive",
                "non-deterministic",
                "two synchronised runs on identical inputs differ: no race can be told from that",
            )
    except R.UsageError:
        raise
    except Exception as e:
        return R.Report(NAME, target, "error", "exception", f"fn raised {type(e).__name__}: {R.first_line(e)}")
    torch.cuda.synchronize(device)
    # Each step's inputs are cloned here and held until the next step's replace them: which
    # cached blocks are free, and so become canaries, depends on it.
    a, k = R.clone_inputs(*pristine)
    findings, owned_lines = _own_side_streams(fn, a, k, ref, device, main, cycles)
    for direction in ("writes into", "reads"):
        a, k = R.clone_inputs(*pristine)
        findings += _handed_to_side(fn, a, k, direction, ref, device, main, side, cycles)
    if findings or owned_lines:
        outcome = "race" if findings else "record_stream cannot protect"
        message = findings[0] if findings else owned_lines[0]
        return R.Report(NAME, target, "failed", outcome, message, findings[1:] + owned_lines)
    return R.Report(
        NAME,
        target,
        "passed",
        "stream-safe",
        f"side streams delayed {delay_ms:g} ms in three directions: outputs and fresh memory intact",
    )


def _own_side_streams(fn, a, k, ref, device: torch.device, main, cycles: int) -> tuple[list[str], list[str]]:
    """1. ``fn`` itself, its side streams delayed: (what went wrong, the outputs whose memory the
    allocator does not own)."""
    findings = []
    with _delayed_streams(device, cycles):
        result = fn(*a, **k)
    named = R.outputs(NAME, result, a, k)
    owned_lines = not_owned(_returned(named))
    del result
    canaries = _canaries(device, main, 0)
    torch.cuda.synchronize(device)
    diffs = R.differences(ref, R.snapshot(named))
    if diffs:
        findings.append("fn's own side-stream work was not waited for (a missing wait_stream): " + "; ".join(diffs[:3]))
    if any(bool((c != 0).any()) for c in canaries):
        findings.append(
            "fn freed memory its own side stream still used (a missing record_stream): fresh memory changed"
        )
    del named, canaries
    return findings, owned_lines


def _handed_to_side(fn, a, k, direction: str, ref, device: torch.device, main, side, cycles: int) -> list[str]:
    """2. producer ("writes into") or 3. consumer ("reads"): the caller hands ``fn``'s outputs to
    a delayed side stream, calls ``record_stream`` and drops them. Returns what went wrong."""
    findings = []
    result = fn(*a, **k)
    # only device memory has a stream to race on (and record_stream refuses a host tensor)
    outs = [(n, t) for n, t in _returned(R.outputs(NAME, result, a, k)) if t.is_cuda]
    del result
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        if direction == "writes into":
            for _, t in outs:
                t.fill_(SENTINEL)
            copies = []
        else:
            copies = [(n, t.clone()) for n, t in outs]
    for _, t in outs:
        t.record_stream(side)
    del outs
    canaries = _canaries(device, main, 0 if direction == "writes into" else 0xA5)
    main.wait_stream(side)
    torch.cuda.synchronize(device)
    if direction == "writes into" and any(bool((c != 0).any()) for c in canaries):
        findings.append(
            "a side stream that writes into the outputs after a delay (record_stream called, "
            "outputs dropped) corrupted memory the main stream allocated next"
        )
    if direction == "reads":
        read = {n for n, _ in copies}
        diffs = R.differences([(n, t) for n, t in _returned(ref) if n in read], R.snapshot(copies))
        if diffs:
            findings.append(
                "a side stream that reads the outputs after a delay (record_stream called, outputs "
                "dropped) read memory the main stream had reused: " + "; ".join(diffs[:3])
            )
    del copies, canaries
    return findings


def _cpu(fn, make_inputs, target: str) -> R.Report:
    args, kwargs = R.build_inputs(NAME, make_inputs, tier.kernel_device())
    try:
        result = fn(*args, **kwargs)
    except Exception as e:
        return R.Report(NAME, target, "error", "exception", f"fn raised {type(e).__name__}: {R.first_line(e)}")
    lines = not_owned(_returned(R.outputs(NAME, result, args, kwargs)))
    label = "CPU tier: no streams to race; checked only that record_stream could protect every output"
    if lines:
        return R.Report(NAME, target, "failed", "record_stream cannot protect", f"{lines[0]} ({label})", lines[1:])
    return R.Report(
        NAME, target, "passed", "owned outputs", f"every output's memory is owned by torch's allocator ({label})"
    )


def stream_safety(fn, make_inputs, *, delay_ms: float = 20.0) -> R.Report:
    """Check ``fn`` and its outputs for cross-stream use-after-free races (lab 03's bug).

    Args:
        fn: the function, or ``"module:function"``. It runs on the current stream; it may use
            side streams of its own (``with torch.cuda.stream(s)``).
        make_inputs: ``make_inputs(device) -> (args, kwargs)``, or ``"module:function"``.
        delay_ms: how long every side stream waits before its work: the race window.

    Returns:
        a :class:`Report`: "stream-safe"; "race" (what changed, in which direction); "record_stream
        cannot protect" (outputs whose memory torch's allocator does not own, named);
        "non-deterministic" (inconclusive).

    Note:
        Only streams entered with ``torch.cuda.stream(...)`` are delayed; work queued on a stream
        by a library through its own handle is not. The canaries take the free blocks of the main
        stream's pool: a block freed into another pool, or memory ``fn`` caches for itself, is not
        watched. On the CPU tier there are no streams: only the ownership of the outputs is checked.

    Example::

        >>> r = labkit.check.stream_safety(wgrad_buffers, wgrad_inputs)  # doctest: +SKIP
        >>> print(r.summary())  # doctest: +SKIP
        stream_safety(...): FAILED: race: a side stream that writes into the outputs ...
    """
    target = R.name_of(fn)
    fn, make_inputs = R.resolve(NAME, "fn", fn), R.resolve(NAME, "make_inputs", make_inputs)
    R.check_number(NAME, "delay_ms", delay_ms)
    if tier.TIER == "gpu" and torch.cuda.is_available():
        return _gpu(fn, make_inputs, target, delay_ms)
    return _cpu(fn, make_inputs, target)
