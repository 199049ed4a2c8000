"""The pinned staging buffer of lab 04's story, as a small model that runs on every tier.

TransformerEngine PR #2360 lets a grouped GEMM read the per-expert token counts on the device, so
an MoE layer can live in a CUDA graph. The kernel still needs each expert's weight and scale-factor
addresses (2 words per GEMM): the PR writes them into a pinned host buffer and enqueues an async
host-to-device copy. A copy captured in a CUDA graph keeps the host ADDRESS, not the values: every
replay reads the slot again. So a slot must stay untouched as long as a graph that captured it may
replay, and the PR never reuses one: a process-global index advances by 2*num_gemms per call and
never goes back.

Three designs, each an operator with ``stage(addresses) -> (start, stop)``:

* ``GlobalIndexStaging``, the PR's: graph-safe, but (a) full after capacity // (2*num_gemms) calls,
  which stops eager training, and (b) the shared index is read, then written back, without a lock:
  two callers can read the same index and take the same slot; the later write wins.
* ``ResettingStaging``, the tempting fix for (a): every call starts again at 0. Never full, but a
  graph captured earlier now replays its copy from a slot that a later call rewrote.
* ``OwnedStaging``: each operator (one call site in a graph) owns its slot, allocated once. Never
  full, never shared between threads, and no other operator's call can rewrite it.

labkit's grouped GEMM stages nothing (``device_expert_addresses``): each address is a base pointer
(a kernel argument, copied into the graph by value at capture) plus an offset the kernel computes on
the device from ``m_splits``.
"""

from __future__ import annotations

import threading

import torch

from labkit.check.graphs import host_memory
from labkit.workbench.checks import check_device
from labkit.workbench.errors import UsageError

DESIGNS = ("global_index", "resetting", "owned")
ADDRESS_BASE = 0x7F00_0000_0000  # fake pointers that look like host/device addresses
CALL_STRIDE = 0x1_0000_0000  # call c's addresses start at ADDRESS_BASE + c * CALL_STRIDE


class StagingBufferFull(RuntimeError):
    """TE's ``NVTE_CHECK`` failing: the index has reached the end of the pinned buffer."""


def _check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise UsageError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def _check_design(design) -> str:
    if design not in DESIGNS:
        raise UsageError(f"design: {design!r} is not one of {DESIGNS}")
    return design


def _as_words(addresses) -> torch.Tensor:
    """``addresses`` (ints, or a 1-D int64 tensor) as a 1-D int64 CPU tensor."""
    if isinstance(addresses, torch.Tensor):
        if addresses.dtype != torch.int64 or addresses.dim() != 1:
            raise TypeError(
                f"addresses: expected a 1-D int64 tensor, got {addresses.dtype} of shape {tuple(addresses.shape)}"
            )
        words = addresses.detach().cpu()
    elif isinstance(addresses, (list, tuple)):
        if not all(isinstance(a, int) and not isinstance(a, bool) for a in addresses):
            raise TypeError(f"addresses: expected ints (one per weight or scale-factor pointer), got {addresses!r}")
        if not all(0 <= a < 2**63 for a in addresses):
            raise UsageError("addresses: every address must be in [0, 2**63)")
        words = torch.tensor(addresses, dtype=torch.int64)
    else:
        raise TypeError(f"addresses: expected a list of ints or an int64 tensor, got {type(addresses).__name__}")
    if words.numel() == 0:
        raise UsageError("addresses: expected at least one address, got none")
    return words


def host_buffer(words: int) -> torch.Tensor:
    """``words`` int64 words of host memory, pinned where CUDA exists: a graph can capture a copy
    only from pinned memory, and the CPU tier has no device to pin for (there it is marked as host
    memory for ``labkit.check.graph_safe``'s emulated graph instead)."""
    t = torch.zeros(_check_count("words", words), dtype=torch.int64, pin_memory=torch.cuda.is_available())
    return host_memory(t)


class SharedWorkspace:
    """The PR's process-wide pair: one pinned buffer (``workspace[1]``) and one write index (``int
    pinned_host_buffer_index``). Give the same object to every operator, as every TE layer shares
    the C++ global; a fresh object per scenario stands for a fresh process."""

    def __init__(self, capacity: int):
        self.capacity = _check_count("capacity", capacity)
        self.host = host_buffer(capacity)
        self.index = 0


class _Staging:
    """What the designs share: validate, claim a slot (``_claim``), write the addresses into it.

    between_read_and_write: called once per ``stage`` after the design has read where its slot is
    and before it records that the slot is taken. Tests put a ``threading.Barrier`` here to force
    the interleaving the GIL makes rare (both threads read the index before either writes it)."""

    design = ""

    def __init__(self, host: torch.Tensor, between_read_and_write=None):
        if between_read_and_write is not None and not callable(between_read_and_write):
            raise TypeError(
                f"between_read_and_write: expected a callable or None, got {type(between_read_and_write).__name__}"
            )
        self.host = host
        self._between = between_read_and_write or (lambda: None)

    def stage(self, addresses) -> tuple[int, int]:
        """Write ``addresses`` into this call's slot; return the slot as ``(start, stop)`` in ``host``."""
        words = _as_words(addresses)
        start = self._claim(words.numel())
        self.host[start : start + words.numel()].copy_(words)
        return start, start + words.numel()


class GlobalIndexStaging(_Staging):
    """The PR's design: slots taken in order from a shared index that never resets."""

    design = "global_index"

    def __init__(self, workspace: SharedWorkspace, between_read_and_write=None):
        if not isinstance(workspace, SharedWorkspace):
            raise TypeError(f"workspace: expected a SharedWorkspace, got {type(workspace).__name__}")
        super().__init__(workspace.host, between_read_and_write)
        self.workspace = workspace

    def _claim(self, n: int) -> int:
        ws = self.workspace
        start = ws.index  # read the shared index ...
        if start + n > ws.capacity:  # TE's NVTE_CHECK and its message
            raise StagingBufferFull(
                "Pinned host buffer out of bounds, please increase the capacity by setting "
                f"NVTE_CUTLASS_HOST_PINNED_U64_CAPACITY. Current buffer size: {ws.capacity} "
                f"(index {start} + {n} words)"
            )
        self._between()  # ... another thread may read the same value here ...
        ws.index = start + n  # ... and write it back: no lock, as in the PR
        return start


class ResettingStaging(GlobalIndexStaging):
    """The tempting fix for the overflow: every call starts again at slot 0."""

    design = "resetting"

    def _claim(self, n: int) -> int:
        self.workspace.index = 0  # the reset: overflow gone, and every call now shares slot 0
        return super()._claim(n)


class OwnedStaging(_Staging):
    """One operator's own slot of ``words`` words, allocated once and rewritten only by its owner.

    Safe for graphs because no other operator's call can touch it; safe for threads because it is
    not shared. The owner's own next call rewrites it with the same addresses as long as its weights
    stay where they are, which a graph that captured the owner already requires."""

    design = "owned"

    def __init__(self, words: int, between_read_and_write=None):
        super().__init__(host_buffer(words), between_read_and_write)

    def _claim(self, n: int) -> int:
        if n > self.host.numel():
            raise UsageError(f"addresses: {n} words do not fit this operator's {self.host.numel()}-word slot")
        self._between()
        return 0


def make_operators(design: str, count: int, words_per_call: int, capacity: int, between_read_and_write=None) -> list:
    """``count`` operators of ``design``: sharing one workspace of ``capacity`` words (the PR and its
    resetting fix), or each owning ``words_per_call`` words."""
    _check_design(design)
    _check_count("count", count)
    if design == "owned":
        return [OwnedStaging(words_per_call, between_read_and_write) for _ in range(count)]
    workspace = SharedWorkspace(capacity)
    cls = GlobalIndexStaging if design == "global_index" else ResettingStaging
    return [cls(workspace, between_read_and_write) for _ in range(count)]


# --- a captured copy reads the host slot when it replays ------------------------------------------


class CapturedCopy:
    """The CPU tier's model of a graph's host-to-device memcpy node: it keeps the slot (an address
    and a length), never its values, and reads it each time it replays."""

    def __init__(self, slot: torch.Tensor, dst: torch.Tensor):
        self.slot, self.dst = slot, dst

    def replay(self) -> None:
        self.dst.copy_(self.slot)


class CudaGraphCopy:
    """The real thing: ``dst.copy_(slot, non_blocking=True)`` captured in a ``torch.cuda.CUDAGraph``.
    Capturing moves nothing; each ``replay`` runs the copy and reads the pinned slot as it is then.
    Holds ``slot``: its memory must outlive the graph."""

    def __init__(self, slot: torch.Tensor, dst: torch.Tensor):
        self.slot, self.dst = slot, dst
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(dst.device), torch.cuda.graph(self.graph):
            dst.copy_(slot, non_blocking=True)

    def replay(self) -> None:
        with torch.cuda.device(self.dst.device):
            self.graph.replay()
            torch.cuda.current_stream().synchronize()  # the reader looks at dst next


def capture_copy(slot: torch.Tensor, dst: torch.Tensor):
    """A captured copy of host ``slot`` into ``dst``: a real CUDA graph when ``dst`` is on a GPU,
    ``CapturedCopy`` on the CPU. Call ``.replay()`` to run it."""
    for name, t in (("slot", slot), ("dst", dst)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 1:
            raise TypeError(f"{name}: expected a 1-D int64 tensor, got {t!r:.80}")
    if slot.device.type != "cpu":
        raise UsageError(f"slot: expected host memory, got a tensor on {slot.device}")
    if slot.numel() != dst.numel():
        raise UsageError(f"dst: has {dst.numel()} words, slot has {slot.numel()}")
    if dst.device.type != "cuda":
        return CapturedCopy(slot, dst)
    if not slot.is_pinned():
        raise UsageError("slot: a CUDA graph can capture a copy only from pinned host memory")
    return CudaGraphCopy(slot, dst)


def device_expert_addresses(weights: torch.Tensor, m_splits: torch.Tensor) -> torch.Tensor:
    """The design labkit's grouped GEMM uses: nothing staged on the host per call.

    weights:  [experts, N, K], every expert's weight in one tensor
    m_splits: [experts] token counts, on the weights' device
    Returns [experts, 2] int64 on that device: each expert's weight address and first token row.
    The one host value is the base pointer, a kernel argument that a graph copies by value at
    capture; the rest is arithmetic on the device, redone from ``m_splits`` at every replay."""
    if not isinstance(weights, torch.Tensor) or weights.dim() != 3:
        raise TypeError(
            f"weights: expected a 3-D tensor [experts, N, K], got {type(weights).__name__}"
            f"{tuple(weights.shape) if isinstance(weights, torch.Tensor) else ''}"
        )
    if not isinstance(m_splits, torch.Tensor) or m_splits.dim() != 1 or m_splits.is_floating_point():
        raise TypeError("m_splits: expected a 1-D integer tensor of token counts")
    if m_splits.numel() != weights.shape[0] or m_splits.device != weights.device:
        raise UsageError(
            f"m_splits: expected {weights.shape[0]} counts on {weights.device}, "
            f"got {m_splits.numel()} on {m_splits.device}"
        )
    experts = torch.arange(weights.shape[0], device=weights.device, dtype=torch.int64)
    weight_addr = weights.data_ptr() + experts * (weights.stride(0) * weights.element_size())
    counts = m_splits.to(torch.int64)
    first_row = torch.cumsum(counts, 0) - counts
    return torch.stack([weight_addr, first_row], dim=1)


# --- scenarios: plain dict records for the notebook, the plot and the benchmark -------------------


def call_addresses(call: int, words: int) -> list[int]:
    """Distinct fake addresses for call number ``call``: which call wrote a slot can be read back."""
    return [ADDRESS_BASE + call * CALL_STRIDE + 0x1000 * i for i in range(words)]


def _record(design, scenario, calls, corrupted=0, refused=0, detail="", **extra) -> dict:
    return {
        "kind": "staging",
        "design": design,
        "scenario": scenario,
        "calls": calls,
        "corrupted_calls": corrupted,
        "refused_calls": refused,
        "detail": detail,
        **extra,
    }


def overflow_scenario(design: str, capacity: int = 64, num_gemms: int = 4, calls: int = 16) -> dict:
    """One operator called ``calls`` times, 2*num_gemms words each: how many calls the buffer takes.
    The PR's design refuses every call from capacity // (2*num_gemms) on, with TE's message."""
    _check_design(design)
    for name, value in (("capacity", capacity), ("num_gemms", num_gemms), ("calls", calls)):
        _check_count(name, value)
    words = 2 * num_gemms
    (op,) = make_operators(design, 1, words, capacity)
    refused, error = 0, None
    for call in range(calls):
        try:
            op.stage(call_addresses(call, words))
        except StagingBufferFull as e:
            refused, error = refused + 1, error or str(e)
    detail = (
        f"{calls - refused} of {calls} calls staged, then every call refused: the index never resets"
        if refused
        else f"all {calls} calls staged"
    )
    return _record(
        design,
        "overflow",
        calls,
        refused=refused,
        detail=detail,
        capacity=capacity,
        num_gemms=num_gemms,
        succeeded_calls=calls - refused,
        error=error,
    )


def _run_two_callers(ops: list, words: int) -> list[tuple[int, int]]:
    """Two threads, one operator each, stage calls 0 and 1 at once; returns their slots."""
    slots: list = [None, None]
    errors: list = []
    start_together = threading.Barrier(2, timeout=10.0)

    def caller(i: int) -> None:
        try:
            start_together.wait()
            slots[i] = ops[i].stage(call_addresses(i, words))
        except BaseException as e:  # handed to the main thread below, not lost in this one
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return slots


def thread_race_scenario(design: str, trials: int = 20, forced: bool = True, num_gemms: int = 4) -> dict:
    """Two threads, each with its own operator, stage distinct addresses at once; then each call's
    copy reads its slot (after both calls returned, as the async copies run later on the stream).
    A call is corrupted if its slot holds the other call's addresses.

    forced=True: a barrier between reading and writing the index makes both threads read it before
    either writes it: the unlucky interleaving, every trial. forced=False: the threads run free and
    the record says what was observed; under the GIL the window is a few bytecodes wide."""
    _check_design(design)
    _check_count("trials", trials)
    _check_count("num_gemms", num_gemms)
    if not isinstance(forced, bool):
        raise TypeError(f"forced: expected a bool, got {type(forced).__name__}")
    words = 2 * num_gemms
    corrupted = same_slot = 0
    for _ in range(trials):
        hook = threading.Barrier(2, timeout=10.0).wait if forced else None
        ops = make_operators(design, 2, words, capacity=4 * words, between_read_and_write=hook)
        slots = _run_two_callers(ops, words)
        same_slot += int(ops[0].host is ops[1].host and slots[0] == slots[1])
        for i, (start, stop) in enumerate(slots):
            own = torch.tensor(call_addresses(i, words))
            corrupted += int(not torch.equal(ops[i].host[start:stop], own))
    how = (
        "forced interleaving (both threads found their slot before either recorded it taken)"
        if forced
        else "free-running threads (the scheduler picks the interleaving)"
    )
    detail = (
        f"{how}: {same_slot} of {trials} trials gave both calls one slot; "
        f"{corrupted} of {2 * trials} calls read the other call's addresses"
    )
    if design == "resetting":
        detail += "; no unlucky timing needed: every call of this design takes slot 0"
    elif design == "global_index" and not forced:
        detail += (
            "; under the GIL the window between reading and writing the index is a few "
            "bytecodes, so a collision is rare here: forced=True shows the race is there"
        )
    return _record(
        design,
        "thread_race",
        2 * trials,
        corrupted=corrupted,
        detail=detail,
        trials=trials,
        forced=forced,
        same_slot_trials=same_slot,
        num_gemms=num_gemms,
    )


def graph_replay_scenario(design: str, device="cpu", num_gemms: int = 4) -> dict:
    """Layer A stages its addresses and a graph captures A's copy; layer B (another layer, or the
    next step) stages its own; the graph replays. Did A's copy deliver A's addresses? The record
    counts one call, A's: the one a graph replays after another call.

    device: "cpu" replays ``CapturedCopy``; "cuda" captures and replays a real CUDA graph."""
    _check_design(design)
    device = check_device("device", device)
    words = 2 * _check_count("num_gemms", num_gemms)
    layer_a, layer_b = make_operators(design, 2, words, capacity=4 * words)
    start, stop = layer_a.stage(call_addresses(0, words))
    dst = torch.full((words,), -1, dtype=torch.int64, device=device)
    copy = capture_copy(layer_a.host[start:stop], dst)
    layer_b.stage(call_addresses(1, words))
    copy.replay()
    delivered = dst.cpu()
    wrong = not torch.equal(delivered, torch.tensor(call_addresses(0, words)))
    if not wrong:
        detail = "the replay delivered A's addresses: B's call did not touch A's slot"
    elif torch.equal(delivered, torch.tensor(call_addresses(1, words))):
        detail = "the replay delivered B's addresses, not A's: B's call rewrote A's slot"
    else:
        detail = f"the replay delivered neither A's nor B's addresses (first word {int(delivered[0]):#x})"
    if design == "global_index":
        detail += " (until the buffer is full: see the overflow scenario)"
    mode = "CUDA graph" if device.type == "cuda" else "CPU model of a graph's copy"
    return _record(
        design,
        "graph_replay",
        1,
        corrupted=int(wrong),
        detail=f"{mode}: {detail}",
        device=str(device),
        num_gemms=num_gemms,
        delivered=[int(v) for v in delivered],
    )


def all_scenarios(device="cpu", trials: int = 20, free_trials: int = 200) -> list[dict]:
    """Every design through overflow, forced and free thread races, and graph replay on ``device``."""
    records = [overflow_scenario(d) for d in DESIGNS]
    records += [thread_race_scenario(d, trials, forced=True) for d in DESIGNS]
    records += [thread_race_scenario(d, free_trials, forced=False) for d in DESIGNS]
    records += [graph_replay_scenario(d, device) for d in DESIGNS]
    return records
