"""The race of lab 03: a side stream writes into a block the caching allocator already handed out
again, because the tensor it writes through was made from a raw pointer.

How the caching allocator keeps multi-stream code safe: a block is tied to the stream it was
allocated on. When its tensor dies, the block is free for that stream at once, in stream order:
later work on the same stream runs after everything already queued there. Work queued on ANOTHER
stream is not covered; ``t.record_stream(side)`` tells the allocator about it, and the block is
then held back until the side stream passes an event recorded at free time.

One trial (``race_trial``), all on one GPU:

    main:  allocate owner ─────────── free owner ── fresh = torch.zeros(same size) ── sync, count
    side:       wait(main) ── sleep (slow work) ─────────────── write SENTINEL into owner ──

* ``views+record_stream``: the allocator holds the block back; ``fresh`` gets another block; 0
  elements corrupted.
* ``raw``: ``record_stream`` is called exactly as on the views, but on a tensor made from a raw
  pointer it is a silent no-op; ``fresh`` gets the same block and the side write lands in it.
* ``views`` (no ``record_stream``): the same race, showing that ``record_stream`` is the whole fix.

``wgrad_trial`` is the story's own shape: grouped weight-gradient GEMMs on a side stream into
bulk-allocated buffers. ``sanitizer_trials`` runs the race under ``TORCH_CUDA_SANITIZER=1`` in a
child process; ``timeline_trial`` records the allocator's own trace of one trial.
"""

from __future__ import annotations

import time

import torch

from labkit.kernels import alloc
from labkit.workbench import bench
from labkit.workbench.errors import UsageError

ALLOCATORS = ("raw", "views", "views+record_stream")
SENTINEL = 7.0  # what the side stream writes; torch.zeros never contains it


def _check_allocator(allocator: str) -> str:
    if allocator not in ALLOCATORS:
        raise UsageError(f"allocator: {allocator!r} is not one of {ALLOCATORS}")
    return allocator


def _cuda_device(device) -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError("the stream race needs a CUDA GPU (streams do not exist on the CPU tier)")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _check_positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def _sleep_ms(ms: float, device: torch.device) -> None:
    if ms < 0:
        raise ValueError(f"sleep_ms: must be >= 0, got {ms}")
    if ms > 0:
        torch.cuda._sleep(int(ms * bench.sleep_cycles_per_ms(device.index)))


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device, kept for the process: libraries set up per-stream state on
    first use (cuBLAS allocates a workspace per stream), which must not land inside a trial."""
    if device.index not in _SIDE_STREAMS:
        _SIDE_STREAMS[device.index] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device.index]


def load_trial_kernels(device: torch.device, dtype: torch.dtype, numel: int, side_work=None) -> None:
    """Launch once, outside the race window, every kernel a trial launches inside it.

    Why: CUDA loads a kernel on its first launch (lazy loading, the default since CUDA 12.2), and
    loading may synchronize the device (the CUDA programming guide's lazy-loading hazards). In a
    fresh process the main stream's first ``torch.zeros`` of a dtype is such a first launch: the
    host then waits until the side stream's sleep and writes are done, and the race window closes
    before the fresh tensor is even made. The race is still there; the first trial just cannot
    show it. ``sleep_cycles_per_ms`` is measured here too, since it synchronizes.

    numel, dtype: the fresh tensor's (a kernel is chosen by size and alignment too: same size, same kernel).
    side_work: what the trial's side stream runs after its sleep (a fill, the wgrad GEMMs)."""
    bench.sleep_cycles_per_ms(device.index)
    side = side_stream(device)
    torch.zeros(numel, device=device, dtype=dtype)  # main stream: the kernel the fresh tensor runs
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        _sleep_ms(0.001, device)
        if side_work is not None:
            side_work()
    torch.cuda.synchronize(device)


def _release(allocator: str, tensors: list[torch.Tensor], side: torch.cuda.Stream) -> None:
    """What the owner does before dropping its buffers: correct code calls record_stream."""
    if allocator in ("raw", "views+record_stream"):
        for t in tensors:
            t.record_stream(side)  # reaches the allocator for views; a no-op on raw-pointer tensors


def _style(allocator: str) -> str:
    return "raw" if allocator == "raw" else "views"


def race_trial(allocator: str, *, numel: int = 1 << 22, sleep_ms: float = 25.0, device=None, trial: int = 0) -> dict:
    """One run of the race (module docstring); returns what happened.

    numel:    float32 elements in the buffer (and in the fresh tensor that may reuse its block)
    sleep_ms: how long the side stream is busy before it writes: the race window
    """
    _check_allocator(allocator)
    _check_positive_int("numel", numel)
    device = _cuda_device(device)
    with torch.cuda.device(device):
        main = torch.cuda.current_stream()
        side = side_stream(device)
        load_trial_kernels(device, torch.float32, numel, lambda: torch.empty(numel, device=device).fill_(SENTINEL))
        bulk = alloc.allocate(_style(allocator), [(numel,)], torch.float32, device)
        buf = bulk.tensors[0]
        addr = buf.data_ptr()
        side.wait_stream(main)  # the side work starts after the allocation, as real code does
        with torch.cuda.stream(side):
            _sleep_ms(sleep_ms, device)  # e.g. a long wgrad GEMM ahead of this write
            buf.fill_(SENTINEL)
        _release(allocator, [buf], side)
        del buf, bulk  # the owner is gone; its block returns to the allocator (main stream)
        fresh = torch.zeros(numel, device=device)  # main stream, same size: a cached block
        reused = fresh.data_ptr() == addr
        torch.cuda.synchronize()
        corrupted = int((fresh != 0).sum().item())
    return {
        "kind": "race",
        "allocator": allocator,
        "trial": trial,
        "sleep_ms": sleep_ms,
        "numel": numel,
        "block_reused": reused,
        "corrupted_elems": corrupted,
        "corrupted_fraction": corrupted / numel,
    }


def wgrad_trial(
    allocator: str,
    *,
    groups: int = 8,
    tokens: int = 2048,
    in_features: int = 2048,
    out_features: int = 2048,
    sleep_ms: float = 5.0,
    device=None,
    trial: int = 0,
) -> dict:
    """The story's pattern: ``groups`` weight gradients dW_g = dY_gᵀ X_g (bf16 GEMMs) computed on a
    side stream into one bulk allocation; the owner drops the buffers on the main stream, which
    then allocates a same-sized zero tensor. Counts elements of that tensor the GEMMs overwrote."""
    _check_allocator(allocator)
    for name in ("groups", "tokens", "in_features", "out_features"):
        _check_positive_int(name, locals()[name])
    device = _cuda_device(device)
    with torch.cuda.device(device):
        main = torch.cuda.current_stream()
        side = side_stream(device)
        g = torch.Generator(device=device).manual_seed(trial)
        x = torch.randn(groups, tokens, in_features, device=device, dtype=torch.bfloat16, generator=g)
        dy = torch.randn(groups, tokens, out_features, device=device, dtype=torch.bfloat16, generator=g)
        # outside the race window: cuBLAS's per-stream setup, and every kernel's first launch
        side.wait_stream(main)
        scratch = torch.empty(out_features, in_features, device=device, dtype=torch.bfloat16)
        load_trial_kernels(
            device,
            torch.bfloat16,
            groups * out_features * in_features,
            lambda scratch=scratch: torch.matmul(dy[0].t(), x[0], out=scratch),
        )
        del scratch
        bulk = alloc.allocate(_style(allocator), [(out_features, in_features)] * groups, torch.bfloat16, device)
        nbytes, addr = bulk.nbytes, bulk.tensors[0].data_ptr()
        wgrads = bulk.tensors
        side.wait_stream(main)
        with torch.cuda.stream(side):
            _sleep_ms(sleep_ms, device)  # the side stream is still busy with earlier backward work
            for i in range(groups):
                torch.matmul(dy[i].t(), x[i], out=wgrads[i])
        _release(allocator, wgrads, side)
        del wgrads, bulk  # (no other name may hold a piece: one live piece keeps the whole block)
        fresh = torch.zeros(nbytes // 2, device=device, dtype=torch.bfloat16)
        reused = fresh.data_ptr() == addr
        torch.cuda.synchronize()
        corrupted = int((fresh != 0).sum().item())
    return {
        "kind": "wgrad",
        "allocator": allocator,
        "trial": trial,
        "sleep_ms": sleep_ms,
        "numel": fresh.numel(),
        "groups": groups,
        "block_reused": reused,
        "corrupted_elems": corrupted,
        "corrupted_fraction": corrupted / fresh.numel(),
    }


def race_sweep(
    sleeps_ms=(0.0, 0.05, 0.5, 5.0, 25.0),
    trials: int = 10,
    numel: int = 1 << 22,
    allocators=ALLOCATORS,
    device=None,
    progress: bool = True,
) -> list[dict]:
    """``race_trial`` for every allocator and delay, ``trials`` times each, in one process."""
    from tqdm.auto import tqdm

    _check_positive_int("trials", trials)
    cases = [(a, s, t) for a in allocators for s in sleeps_ms for t in range(trials)]
    return [
        race_trial(a, numel=numel, sleep_ms=s, device=device, trial=t)
        for a, s, t in tqdm(cases, desc="race trials", disable=not progress)
    ]


# --- detection -------------------------------------------------------------------------------


def missing_wait_trial(numel: int = 1 << 20, sleep_ms: float = 5.0, device=None) -> dict:
    """The race the CUDA sanitizer is built for (a control): the main stream reads a buffer the side
    stream is still writing, with no ``wait_stream``. Both accesses use the same pointer."""
    device = _cuda_device(device)
    with torch.cuda.device(device):
        main = torch.cuda.current_stream()
        side = side_stream(device)
        buf = torch.zeros(numel, device=device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            _sleep_ms(sleep_ms, device)
            buf.fill_(SENTINEL)
        total = buf.sum()  # main stream: not ordered after the fill (the bug)
        torch.cuda.synchronize()
        wrong = float(total.item()) != SENTINEL * numel
    return {"kind": "missing_wait", "wrong_sum": wrong}


def sanitizer_trials(trials: int = 5, sleep_ms: float = 25.0, numel: int = 1 << 22) -> list[dict]:
    """Run in a child with TORCH_CUDA_SANITIZER=1 (``labkit.workbench.sandbox.run_isolated``): every
    allocator's race, then the missing-wait control. A report is the sanitizer's
    ``CUDASanitizerErrors``; a trial it reports is counted, not hidden, and its message kept."""
    import os

    from torch.cuda._sanitizer import CUDASanitizerErrors

    enabled = os.environ.get("TORCH_CUDA_SANITIZER") == "1"
    rows = []
    for allocator in ALLOCATORS:
        for t in range(trials):
            try:
                row = race_trial(allocator, numel=numel, sleep_ms=sleep_ms, trial=t)
                row.update(reported=False, report=None)
            except CUDASanitizerErrors as e:
                torch.cuda.synchronize()
                row = {
                    "kind": "race",
                    "allocator": allocator,
                    "trial": t,
                    "sleep_ms": sleep_ms,
                    "numel": numel,
                    "block_reused": None,
                    "corrupted_elems": None,
                    "reported": True,
                    "report": str(e).splitlines()[0][:300],
                }
            row.update(kind="sanitizer", sanitizer=enabled)
            rows.append(row)
    for t in range(trials):
        try:
            row = missing_wait_trial()
            row.update(reported=False, report=None)
        except CUDASanitizerErrors as e:
            torch.cuda.synchronize()
            row = {"wrong_sum": None, "reported": True, "report": str(e).splitlines()[0][:300]}
        row.update(
            kind="sanitizer",
            allocator="missing wait_stream (control)",
            trial=t,
            corrupted_elems=None,
            sanitizer=enabled,
        )
        rows.append(row)
    return rows


def _host_us() -> float:
    return time.time_ns() / 1e3


def timeline_trial(allocator: str, *, numel: int = 1 << 22, sleep_ms: float = 5.0, device=None) -> dict:
    """One ``race_trial`` with the caching allocator's history recorded
    (``torch.cuda.memory._record_memory_history``), plus when the side write really ran on the GPU
    (CUDA events, placed on the host clock through an event recorded while the GPU was idle).

    Returns ``events`` (the allocator's trace for blocks of this size: action, addr, stream,
    time_us) and ``marks`` (host/GPU times in µs since the trial began)."""
    _check_allocator(allocator)
    device = _cuda_device(device)
    nbytes = numel * 4
    with torch.cuda.device(device):
        # before recording: the first launches (and the sleep's calibration) stay out of the trace
        load_trial_kernels(device, torch.float32, numel, lambda: torch.empty(numel, device=device).fill_(SENTINEL))
        main = torch.cuda.current_stream()
        side = side_stream(device)
        ev0, w0, w1 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        _record_history(True)
        try:
            t0 = _host_us()
            ev0.record()  # the GPU is idle: this event's time is (nearly) t0 on the host clock
            marks = {}
            bulk = alloc.allocate(_style(allocator), [(numel,)], torch.float32, device)
            buf = bulk.tensors[0]
            addr = buf.data_ptr()
            marks["owner allocated (host)"] = _host_us()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                _sleep_ms(sleep_ms, device)
                w0.record()
                buf.fill_(SENTINEL)
                w1.record()
            _release(allocator, [buf], side)
            del buf, bulk
            marks["owner freed (host)"] = _host_us()
            fresh = torch.zeros(numel, device=device)
            marks["fresh allocated (host)"] = _host_us()
            reused = fresh.data_ptr() == addr
            torch.cuda.synchronize()
            marks["synchronized (host)"] = _host_us()
            corrupted = int((fresh != 0).sum().item())
            snapshot = torch.cuda.memory._snapshot()
        finally:
            _record_history(False)
    marks = {k: v - t0 for k, v in marks.items()}
    marks["side write starts (GPU)"] = ev0.elapsed_time(w0) * 1e3
    marks["side write ends (GPU)"] = ev0.elapsed_time(w1) * 1e3
    events = trace_events(snapshot, device.index, nbytes, t0)
    return {
        "kind": "timeline",
        "allocator": allocator,
        "sleep_ms": sleep_ms,
        "numel": numel,
        "owner_addr": addr,
        "fresh_addr": fresh.data_ptr(),
        "block_reused": reused,
        "corrupted_elems": corrupted,
        "marks_us": marks,
        "events": events,
        "streams": {"main": main.cuda_stream, "side": side.cuda_stream},
    }


def _record_history(on: bool) -> None:
    record = torch.cuda.memory._record_memory_history
    if not on:
        record(enabled=None)
        return
    try:  # no stack traces: they cost host time inside the race window
        record(enabled="all", context=None, stacks="python", max_entries=100_000)
    except TypeError:  # older signatures
        record(enabled="all", max_entries=100_000)


def trace_events(snapshot: dict, device_index: int, nbytes: int, t0_us: float) -> list[dict]:
    """The allocator trace entries of one device for blocks of ``nbytes`` (the buffer's block and
    its reuse), as {action, addr, size, stream, t_us}; t_us is relative to ``t0_us`` when the
    trace carries host times (``time_us``), else None and the order is all there is."""
    traces = snapshot.get("device_traces") or []
    if device_index >= len(traces):
        return []
    rows = []
    for e in traces[device_index]:
        if e.get("action") not in ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"):
            continue
        if e.get("size") != nbytes:
            continue
        t = e.get("time_us")
        rows.append(
            {
                "action": e["action"],
                "addr": e.get("addr"),
                "size": e.get("size"),
                "stream": e.get("stream"),
                "t_us": (t - t0_us) if isinstance(t, (int, float)) else None,
            }
        )
    return rows


# --- the lab's benchmark ---------------------------------------------------------------------

#: Fields every record of ``labkit bench stream_races`` carries (None where a field does not apply).
REQUIRED = ("kind", "allocator", "trial", "corrupted_elems", "offset_bytes", "tflops")

#: Sizes per profile: the race is cheap, the GEMMs are what take time.
PROFILES = {
    "gpu": {
        "trials": 20,
        "sleeps_ms": (0.0, 0.05, 0.5, 5.0, 25.0),
        "numel": 1 << 22,
        "wgrad_trials": 10,
        "sanitizer_trials": 5,
        "probe_trials": 5,
        "gemm": (8192, 8192, 8192),
    },
    "quick": {
        "trials": 3,
        "sleeps_ms": (0.0, 5.0),
        "numel": 1 << 20,
        "wgrad_trials": 2,
        "sanitizer_trials": 2,
        "probe_trials": 2,
        "gemm": (2048, 2048, 2048),
    },
}


def sanitizer_run(trials: int, sleep_ms: float = 25.0, numel: int = 1 << 22, timeout: float = 300.0) -> list[dict]:
    """``sanitizer_trials`` in a child process with TORCH_CUDA_SANITIZER=1; a child that fails is
    returned as one record saying how, never raised."""
    from labkit.workbench import sandbox

    res = sandbox.run_isolated(
        sanitizer_trials, trials, sleep_ms, numel, timeout=timeout, env={"TORCH_CUDA_SANITIZER": "1"}
    )
    if res.ok:
        return res.value
    return [
        {
            "kind": "sanitizer",
            "allocator": None,
            "trial": None,
            "corrupted_elems": None,
            "reported": None,
            "report": res.summary(),
            "sanitizer": True,
        }
    ]


def _blank(row: dict) -> dict:
    for k in REQUIRED:
        row.setdefault(k, None)
    return row
