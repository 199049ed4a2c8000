"""Lab 03's exercises, registered with :mod:`labkit.workbench.exercises`; solutions in ``solutions/``.

* ``03.record`` (fix): the learner's ``wgrad_buffers`` runs with a stand-in side stream and a
  recording ``Tensor.record_stream``; the check applies the caching allocator's rule to what it
  saw (a block is held back for a stream only if ``record_stream`` reached a storage the allocator
  owns: a view's, never a raw pointer's) and says whether the block would be handed out again while
  the side stream still writes. On a GPU it also runs ``labkit.check.stream_safety`` on a backward
  step whose side stream, started late, writes into the learner's pieces after they are dropped
  (``catch.backward_with``): memory the main stream takes next must stay untouched.
* ``03.delay`` (predict): judged by the recorded race (``reference/h200x1/stream_races.json``).
* ``03.pad`` (write): the learner's ``padded_numel`` cuts views from a 256-byte aligned block and
  the check reads each piece's pointer.
"""

from __future__ import annotations

import contextlib
import math

import torch

from labkit.labs.stream_races import catch
from labkit.workbench import results, tier
from labkit.workbench.exercises import Wrong, exercise, expect_choices


class _Stream:
    """A stand-in stream: only its name, for the CPU tier (streams do not exist there)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name} stream>"


@contextlib.contextmanager
def _recording_streams(main: _Stream):
    """``Tensor.record_stream`` records (storage, owned by the allocator, stream) instead of
    acting; ``torch.cuda.current_stream()`` is ``main``."""
    calls: list[tuple[int, bool, object]] = []

    def record_stream(self, stream):
        storage = self.untyped_storage()
        # torch's allocator owns (and can resize) the memory of what it allocated; memory that
        # came in as a raw pointer it neither owns nor tracks: record_stream on it is a no-op
        calls.append((storage._cdata, storage.resizable(), stream))

    saved = torch.Tensor.record_stream, torch.cuda.current_stream
    torch.Tensor.record_stream, torch.cuda.current_stream = record_stream, lambda device=None: main
    try:
        yield calls
    finally:
        torch.Tensor.record_stream, torch.cuda.current_stream = saved


#: the pieces 03.record hands out: one block, cut into these float32 shapes
RECORD_SHAPES = [(64, 48)] * 4


def _stream_safety_on_gpu(wgrad_buffers) -> str:
    """On a GPU, ``labkit.check.stream_safety`` on a backward step whose side stream writes into
    the learner's pieces (``catch.backward_with``); '' elsewhere."""
    if tier.interpreted() or not torch.cuda.is_available():
        return ""
    from labkit.check import stream_safety

    r = stream_safety(catch.backward_with(wgrad_buffers), catch.inputs)
    if not r.ok:
        raise Wrong(f"on this GPU, labkit.check.stream_safety says: {r.outcome}: {r.message[:200]}.")
    return (
        " On this GPU labkit.check.stream_safety also passes: the side stream, started late, wrote into your "
        "pieces after they were dropped, and fresh memory stayed untouched."
    )


@exercise(
    "03.record",
    kind="fix",
    question="Hand out the weight-gradient buffers, one block cut into pieces, so that the allocator "
    "keeps the block from other streams until the side stream's writes are done",
    answer="wgrad_buffers",
    hint="Two things must both be true: the allocator must know the pieces live in its block, and it "
    "must be told which other stream uses them. Section 1 says which way of cutting keeps the first.",
)
def judge_record(wgrad_buffers) -> str:
    if not callable(wgrad_buffers):
        raise Wrong(f"`wgrad_buffers` must be a function (shapes, device, side) -> pieces; got {wgrad_buffers!r:.60}.")
    main, side = _Stream("main"), _Stream("side")
    with _recording_streams(main) as calls:
        pieces = list(wgrad_buffers(RECORD_SHAPES, tier.kernel_device(), side))
    shapes = [tuple(p.shape) for p in pieces if isinstance(p, torch.Tensor)]
    if shapes != RECORD_SHAPES or any(p.dtype != torch.float32 for p in pieces):
        raise Wrong(f"expected {len(RECORD_SHAPES)} float32 pieces of shapes {RECORD_SHAPES[0]}; got {pieces!r:.80}.")
    storages = {p.untyped_storage()._cdata for p in pieces}
    owned = all(p.untyped_storage().resizable() for p in pieces)
    if owned and len(storages) != 1:
        raise Wrong(f"the pieces come from {len(storages)} allocations; the story cuts one block (one allocation).")
    heard = {key for key, is_owned, stream in calls if is_owned and stream is side}
    said = (
        f"record_stream was called {len(calls)} time(s)"
        + (f" (on {sorted({repr(s) for _, _, s in calls})})" if calls else "")
        + ("; the pieces are views of one allocation" if owned else "; the pieces are made from raw pointers")
    )
    if not storages <= heard:
        why = (
            "torch's allocator does not own raw-pointer memory, so it heard nothing"
            if calls and not owned
            else "the allocator was not told about the side stream"
        )
        raise Wrong(
            f"{said}: {why}. Freed, the block goes back to the main stream at once, and a fresh tensor of the "
            f"same size gets it while the side stream still writes into it."
        )
    held = f"{said}: the allocator holds the block back until the side stream's writes are done."
    return held + _stream_safety_on_gpu(wgrad_buffers)


#: the recorded race 03.delay is judged by, and the cases it asks about
DELAY_MACHINE = "h200x1"
DELAY_CASES = {
    "raw, 0 ms": ("raw", 0.0),
    "raw, 5 ms": ("raw", 5.0),
    "views, 5 ms": ("views", 5.0),
    "views+record_stream, 5 ms": ("views+record_stream", 5.0),
}
OUTCOMES = ("all", "some", "none")


def recorded_outcomes(records: list[dict]) -> dict[str, str]:
    """For each of DELAY_CASES: in how many recorded trials the fresh tensor was corrupted ("all",
    "some" or "none" of them)."""
    found = {}
    for key, (allocator, sleep_ms) in DELAY_CASES.items():
        trials = [
            r for r in records if r.get("kind") == "race" and (r["allocator"], r["sleep_ms"]) == (allocator, sleep_ms)
        ]
        if not trials:
            raise ValueError(f"recorded_outcomes: records: no race trial of {allocator} at {sleep_ms} ms")
        hit = sum(1 for r in trials if r["corrupted_elems"] > 0)
        found[key] = "all" if hit == len(trials) else "none" if hit == 0 else "some"
    return found


@exercise(
    "03.delay",
    kind="predict",
    question="For each allocator and side-stream delay, predict in how many recorded trials the fresh "
    "tensor was corrupted: all, some or none",
    answer="prediction",
    hint="At 0 ms the side stream's write was queued before the main stream's zeros. With a delay, ask "
    "whether anything tells the allocator that the side stream still uses the block.",
)
def judge_delay(prediction) -> str:
    expect_choices("prediction", prediction, DELAY_CASES, OUTCOMES)
    refs = results.load_references("stream_races")
    if DELAY_MACHINE not in refs:
        raise Wrong(f"the recorded race (reference/{DELAY_MACHINE}/stream_races.json) is missing from this checkout.")
    recorded = recorded_outcomes(refs[DELAY_MACHINE].records)
    wrong = [k for k in DELAY_CASES if prediction[k] != recorded[k]]
    if wrong:
        raise Wrong(
            f"{len(wrong)} of {len(DELAY_CASES)} differ from the race recorded on {DELAY_MACHINE} "
            f"(wrong: {', '.join(wrong)})."
        )
    return f"all {len(DELAY_CASES)} agree with the race recorded on {DELAY_MACHINE}: " + ", ".join(
        f"{k}: {v}" for k, v in recorded.items()
    )


#: shapes and dtypes 03.pad cuts into one block: odd sizes, aligned sizes, each dtype size
PAD_CASES = [
    ((4095, 3), torch.bfloat16),
    ((129, 7), torch.float32),
    ((4096, 4096), torch.bfloat16),
    ((1000, 1000), torch.float32),
    ((33,), torch.float64),
    ((5, 5), torch.uint8),
]


@exercise(
    "03.pad",
    kind="write",
    question="Write padded_numel(shape, dtype): the fewest elements to reserve per piece so that every "
    "piece of a packed block starts on a 256-byte boundary",
    answer="padded_numel",
    hint="The next piece starts where this one's reserved bytes end: think in bytes, not elements, and a "
    "piece that already ends on a 256-byte boundary needs no padding.",
)
def judge_pad(padded_numel) -> str:
    if not callable(padded_numel):
        raise Wrong(f"`padded_numel` must be a function (shape, dtype) -> int; got {padded_numel!r:.60}.")
    sizes = []
    for shape, dtype in PAD_CASES:
        n = padded_numel(shape, dtype)
        if not isinstance(n, int) or isinstance(n, bool):
            raise Wrong(f"padded_numel({shape}, {dtype}) returned {n!r}, not an int.")
        if n < math.prod(shape):
            raise Wrong(f"padded_numel({shape}, {dtype}) = {n}: fewer than the piece's {math.prod(shape)} elements.")
        sizes.append(n)
    # one block from a 256-byte boundary, cut at the reserved sizes: read where each next piece starts
    ends = [0]
    for n, (_, dtype) in zip(sizes, PAD_CASES):
        ends.append(ends[-1] + n * dtype.itemsize)
    block = torch.empty(ends[-1] + 256, dtype=torch.uint8, device=tier.kernel_device())
    start = (-block.data_ptr()) % 256
    for (shape, dtype), end in zip(PAD_CASES, ends[1:]):
        rem = block[start + end :].data_ptr() % 256
        if rem:
            raise Wrong(
                f"after a piece of {shape} {dtype}, the next piece starts {rem} bytes past a 256-byte boundary."
            )
    wasted = [
        (shape, dtype, (n - math.prod(shape)) * dtype.itemsize)
        for n, (shape, dtype) in zip(sizes, PAD_CASES)
        if (n - math.prod(shape)) * dtype.itemsize >= 256
    ]
    if wasted:
        shape, dtype, extra = wasted[0]
        raise Wrong(f"every piece starts aligned, but {shape} {dtype} reserves {extra} bytes of padding: 256 or more.")
    return (
        f"{len(PAD_CASES)} pieces cut from one block at your sizes: each starts on a 256-byte boundary, "
        "padded by fewer than 256 bytes."
    )
