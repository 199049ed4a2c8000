"""The wrong current device, as a matrix of experiments (seed: sc-matmul-multi-gpu-device-guard-pr).

Every cell: data on cuda:1, current device cuda:0 (what accelerate's ``device_map="auto"``
leaves behind: its hooks move tensors but never call ``torch.cuda.set_device``), peer access off
(a fresh process) or on (PyTorch enables it lazily after any cross-device copy), and one launch
pattern, unguarded or run under labkit's guard. The input is written by cuda:1's stream *behind
a sleep*, so a launch that is not ordered after cuda:1's stream reads memory not yet written.

Patterns:

* ``triton_launch``: a Triton kernel launched on the current device and its stream.
* ``scratch_current_device``: a launcher that makes its output with ``device="cuda"``: the
  *current* device, not the data's.
* ``stream_current_device``: a stream made with ``torch.cuda.Stream()`` on the current device;
  the fix needs both the guard and ``wait_stream`` on the producer's stream.
* ``graph_wrong_device``: a CUDA graph captured while the current device is cuda:0.

Each cell runs in a child process (labkit.workbench.sandbox), since some cells can fault or hang.
A cell's ``us`` and ``GBps`` are its kernel's time from CUDA events on the stream the kernel ran
on (``timing.py`` says why and how; such records carry ``timing="cuda_events"``, older files
timed Python calls on the host clock). A cell that raised records the first error of the chain
(``first_error``): a failed graph capture raises a follow-on error when the capture ends, and the
error that broke it is that one's context.
"""

from __future__ import annotations

import contextlib
import inspect
import time

import torch
import triton
import triton.language as tl
from tqdm.auto import tqdm

from labkit.labs.wrong_device import timing
from labkit.workbench import sandbox, tier
from labkit.workbench.checks import check_tensor
from labkit.workbench.guard import common_device, on_device_of

PATTERNS = timing.PATTERNS  # the four ways a launch lands on the wrong device (where each launches: timing)
OUTCOMES = ("correct", "wrong result", "wrong device", "exception", "illegal memory access", "hang")
REQUIRED = ("pattern", "peer_access", "guarded", "outcome", "GBps", "detail", "peer_enabled")
_PEER_LINE = "labkit: peer access cuda:0 -> cuda:1 enabled: "
_CAPTURE_LINE = "labkit: graph capture_error_mode: "
#: "thread_local": only this thread's unsafe calls can break the capture, not another thread's
CAPTURE_ERROR_MODE = "thread_local"


@triton.jit
def _add_one_kernel(
    x_ptr,  # *fp32: input
    out_ptr,  # *fp32: output, x + 1
    numel,  # int: elements; the last block is masked
    BLOCK: tl.constexpr,  # elements per program
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def add_one(x: torch.Tensor, out: torch.Tensor | None = None, *, guarded: bool = True) -> torch.Tensor:
    """out = x + 1 with a Triton kernel. ``guarded=False`` launches without the device guard, on
    whatever device is current: the bug, kept only for the experiments of this module."""
    check_tensor("x", x, dtypes=(torch.float32,))
    if out is None:
        out = torch.empty_like(x)  # on x's device, whatever the current device is
    elif isinstance(out, torch.Tensor):
        common_device(x=x, out=out)  # mixed devices first: the most telling message
    check_tensor("out", out, dtypes=(torch.float32,))
    if out.shape != x.shape:
        raise ValueError(f"out: shape {tuple(out.shape)} differs from x shape {tuple(x.shape)}")
    if x.numel() == 0:
        return out
    ctx = on_device_of(x=x, out=out) if guarded else contextlib.nullcontext()
    with ctx:
        _raw_launch(x, out)
    return out


def _raw_launch(x: torch.Tensor, out: torch.Tensor) -> None:
    """The kernel launched with no checks and no guard, as the story's launcher did."""
    n = x.numel()
    block = 1 << 16 if tier.interpreted() else 4096  # the interpreter pays per program
    with timing.around_launch():  # nothing unless run_cell is timing: then events on this stream
        _add_one_kernel[(triton.cdiv(n, block),)](x, out, n, BLOCK=block, num_warps=8)


def _scratch_launcher(x: torch.Tensor, guarded: bool) -> torch.Tensor:
    """A launcher that allocates its output with device="cuda", as much real code does."""
    ctx = on_device_of(x=x) if guarded else contextlib.nullcontext()
    with ctx:
        out = torch.empty(x.shape, dtype=x.dtype, device="cuda")  # the *current* device
        _raw_launch(x, out)  # on the current device too
        return out


def _stream_launcher(x: torch.Tensor, guarded: bool) -> torch.Tensor:
    if guarded:
        with on_device_of(x=x):
            s = torch.cuda.Stream()  # on x's device
            s.wait_stream(torch.cuda.current_stream(x.device))  # ordered after x's producer
            with torch.cuda.stream(s):
                out = add_one(x)
            torch.cuda.current_stream(x.device).wait_stream(s)
            return out
    s = torch.cuda.Stream()  # on the current device: cuda:0
    with torch.cuda.stream(s):  # (this also makes cuda:0 current)
        return add_one(x, guarded=False)


class _GraphLauncher:
    """Capture add_one once, replay it on every call."""

    def __init__(self, x: torch.Tensor, guarded: bool):
        self.device = x.device if guarded else None
        ctx = torch.cuda.device(x.device) if guarded else contextlib.nullcontext()
        with ctx:
            add_one(x, guarded=guarded)  # compile and load outside capture
            torch.cuda.synchronize(x.device)
            self.graph = torch.cuda.CUDAGraph()
            # If the body raises, torch.cuda.graph's __exit__ still ends the capture, which then
            # fails with "operation failed due to a previous error during capture": the error
            # that reaches the caller is a follow-on, and the first one is its __context__
            # (device_matrix records it as first_error, from the child's traceback).
            with _capture(self.graph):
                self.out = add_one(x, guarded=guarded)

    def __call__(self) -> torch.Tensor:
        with torch.cuda.device(self.device) if self.device is not None else contextlib.nullcontext():
            with timing.around_launch():  # a replay runs on the stream current at replay
                self.graph.replay()
        return self.out


def capture_kwargs(graph_init=None) -> dict:
    """``capture_error_mode=CAPTURE_ERROR_MODE`` where ``torch.cuda.graph`` takes it, else {}:
    torch has taken it since 2.1, but a torch without it still captures (in its default mode)."""
    try:
        params = inspect.signature(graph_init or torch.cuda.graph.__init__).parameters
    except (TypeError, ValueError):
        return {}
    return {"capture_error_mode": CAPTURE_ERROR_MODE} if "capture_error_mode" in params else {}


def _capture(graph):
    kwargs = capture_kwargs()
    print(f"{_CAPTURE_LINE}{kwargs.get('capture_error_mode', 'default')}", flush=True)
    return torch.cuda.graph(graph, **kwargs)


def copy_across_like_accelerate() -> None:
    """Cross-device copies both ways, as accelerate's hooks make when they move activations from
    layer to layer. PyTorch enables peer access lazily inside such a copy, for its direction."""
    a = torch.ones(1 << 18, device="cuda:0")
    a.to("cuda:1").to("cuda:0")
    for d in (0, 1):
        torch.cuda.synchronize(d)


def peer_enabled(dev: int, peer: int) -> bool | None:
    """Whether dev's context may access peer's memory now (None where CuPy is missing to ask).

    CUDA has no query for "enabled"; cudaDeviceEnablePeerAccess answers "already enabled" (704)
    when it is, and otherwise enables it, which this undoes at once."""
    try:
        import cupy
    except ImportError:
        return None
    with cupy.cuda.Device(dev):
        try:
            cupy.cuda.runtime.deviceEnablePeerAccess(peer)
        except cupy.cuda.runtime.CUDARuntimeError as e:
            return e.status == 704
        cupy.cuda.runtime.deviceDisablePeerAccess(peer)
        return False


def run_cell(
    pattern: str,
    peer_access: bool,
    guarded: bool,
    nbytes: int = 64 << 20,
    delay_cycles: int = 200_000_000,
    reps: int = 10,
) -> dict:
    """One cell of the matrix; meant to run in a child process (labkit.workbench.sandbox.run_isolated)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern: {pattern!r} is not one of {PATTERNS}")
    if torch.cuda.device_count() < 2:
        raise RuntimeError("run_cell needs 2 CUDA GPUs")
    torch.cuda.set_device(0)
    if peer_access:
        copy_across_like_accelerate()
    enabled = peer_enabled(0, 1)  # checked, not assumed: the record says what really held
    print(f"{_PEER_LINE}{enabled}", flush=True)  # reaches the parent even if the launch then fails
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    x = torch.empty(nbytes // 4, device="cuda:1")
    x.fill_(0.0)
    if pattern == "graph_wrong_device":
        launch = _GraphLauncher(x, guarded)
    else:
        fn = {
            "triton_launch": lambda: add_one(x, guarded=guarded),
            "scratch_current_device": lambda: _scratch_launcher(x, guarded),
            "stream_current_device": lambda: _stream_launcher(x, guarded),
        }[pattern]
        launch = fn
    # Warm-up outside the race: the first call compiles the kernel and has the allocator fetch
    # fresh memory; both can take longer than the race's sleep, or synchronise (cudaMalloc),
    # and then hide it. A launch that fails outright fails here already.
    launch()
    for d in (0, 1):
        torch.cuda.synchronize(d)
    # The race: cuda:1's stream sleeps, then writes x = 1. A launch ordered after it reads 1s.
    with torch.cuda.device(1):
        torch.cuda._sleep(delay_cycles)
        x.fill_(1.0)
    out = launch()
    for d in (0, 1):
        torch.cuda.synchronize(d)
    correct = bool(torch.all(out == 2.0).item())
    # Kernel time, after the race: each launch alone (both GPUs idle before it), CUDA events on
    # the stream it runs on, behind a short sleep so the span holds the kernel and not the host.
    timer = timing.KernelTimer()
    with timing.timing(timer):
        for _ in range(reps):
            out = launch()
            for d in (0, 1):
                torch.cuda.synchronize(d)
    return {
        "correct": correct,
        "out_device": str(out.device),
        "peer_enabled": enabled,
        **timing.kernel_timing(timer.elapsed(), nbytes),
    }


def _parse_peer_line(stdout: str) -> bool | None:
    return {"True": True, "False": False}.get(_parse_line(stdout, _PEER_LINE))


def _parse_line(stdout: str, prefix: str) -> str | None:
    """The rest of the child's first stdout line that starts with ``prefix`` (None if none)."""
    for line in (stdout or "").splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def first_error(traceback_text: str | None) -> tuple[str, str] | None:
    """(error line, where it was raised) of the FIRST exception in a child's traceback.

    Python prints a chain of exceptions oldest first; the error the caller saw is the last one.
    "Where" is the innermost line of labkit code in that first traceback (``_reported_at``)."""
    if not traceback_text or "Traceback (most recent call last):" not in traceback_text:
        return None
    block = traceback_text
    for sep in _CHAINED:
        block = block.split(sep)[0]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):"))
    error = next((line.strip() for line in lines[start + 1 :] if line.strip() and not line[0].isspace()), "")
    return error, _reported_at(block)


def classify_cell(res: sandbox.SandboxResult) -> tuple[str, str]:
    """(outcome, detail) of one cell from the child's result."""
    if res.status == "timeout":
        return "hang", res.summary()
    if res.status == "illegal_memory_access":
        return "illegal memory access", res.summary()
    if not res.ok:
        return "exception", res.summary()
    v = res.value
    if not v["correct"]:
        return "wrong result", f"output on {v['out_device']}: not x + 1 (read before cuda:1 wrote it?)"
    if v["out_device"] != "cuda:1":
        return "wrong device", f"right values, but the output is on {v['out_device']}"
    return "correct", f"output on {v['out_device']}"


def device_matrix(
    patterns=PATTERNS,
    nbytes: int = 64 << 20,
    timeout_s: float = 120.0,
    env: dict | None = None,
    guarded=(False, True),
    peers=(False, True),
    progress: bool = True,
) -> list[dict]:
    """Run every (pattern, peer access, guarded) cell in its own child process; one record each."""
    for p in patterns:
        if p not in PATTERNS:
            raise ValueError(f"patterns: {p!r} is not one of {PATTERNS}")
    records = []
    cells = [(p, peer, g) for p in patterns for peer in peers for g in guarded]
    for pattern, peer, guarded in tqdm(cells, desc="device matrix", unit="cell", disable=not progress):
        res = sandbox.run_isolated(run_cell, pattern, peer, guarded, nbytes, timeout=timeout_s, env=env)
        records.append(cell_record(pattern, peer, guarded, nbytes, res))
    return records


def cell_record(pattern: str, peer: bool, guarded: bool, nbytes: int, res: sandbox.SandboxResult) -> dict:
    """One matrix record from a cell's child result (pure: unit-tested with made-up results)."""
    outcome, detail = classify_cell(res)
    value = res.value if res.ok else {}
    first = first_error(res.traceback) if not res.ok else None
    return {
        "pattern": pattern,
        "peer_access": peer,
        "guarded": guarded,
        "outcome": outcome,
        "GBps": value.get("GBps"),
        "us": value.get("us"),
        "timing": timing.TIMING,
        "launch_device": value.get("launch_device"),
        "expected_launch_device": f"cuda:{timing.expected_launch_device(pattern, guarded)}",
        "timed_launches": value.get("timed_launches"),
        "detail": detail,
        "first_error": first[0] if first else None,
        "first_error_at": first[1] if first else None,
        "capture_error_mode": _parse_line(res.stdout, _CAPTURE_LINE),
        "peer_enabled": _parse_peer_line(res.stdout),
        "seconds": res.seconds,
        "nbytes": nbytes,
    }


def describe_graph_errors(records: list[dict]) -> list[str]:
    """Lines for each graph cell that failed: the error the caller saw, then the first error of
    its chain and the labkit line it was raised under (older files did not record them)."""
    out = []
    for r in records:
        if r.get("pattern") != "graph_wrong_device" or r.get("outcome") == "correct":
            continue
        # a failed child's detail is its summary, which starts with how it ended
        seen = (
            r["detail"]
            if r["outcome"] in ("exception", "illegal memory access", "hang")
            else f"{r['outcome']}: {r['detail']}"
        )
        out.append(
            f"peer {'on' if r.get('peer_access') else 'off'}, {'guarded' if r.get('guarded') else 'unguarded'}: {seen}"
        )
        if "first_error" not in r:
            out.append("    first error: not recorded (the file predates first-error recording)")
        elif r["first_error"] is None:
            out.append("    first error: none (the cell raised no Python exception)")
        else:
            same = r["first_error"].split(": ", 1)[-1] in r["detail"]
            out.append(
                f"    first error: {r['first_error']}" + ("  (the same error: nothing before it)" if same else "")
            )
            out.append(f"    raised under: {r['first_error_at']}")
        if r.get("capture_error_mode"):
            out.append(f"    capture_error_mode: {r['capture_error_mode']}")
    return out or ["no graph cell failed"]


def guard_overhead(reps: int = 20_000, device: str | None = None) -> list[dict]:
    """Microseconds the guard adds per launch: entering and leaving it around nothing, host time.

    device: where the tensor lives (default cuda:1 with 2 GPUs, else cuda:0, else cpu). On the
    CPU the guard only checks devices, so this shows what it costs the interpreter tier."""
    if device is None:
        device = "cuda:1" if torch.cuda.device_count() > 1 else ("cuda:0" if torch.cuda.is_available() else "cpu")
    x = torch.empty(16, device=device)
    records = []
    for label, ctx in (("no guard", lambda: contextlib.nullcontext()), ("on_device_of", lambda: on_device_of(x=x))):
        for _ in range(1000):
            with ctx():
                pass
        t0 = time.perf_counter()
        for _ in range(reps):
            with ctx():
                pass
        us = (time.perf_counter() - t0) / reps * 1e6
        records.append(
            {
                "pattern": "guard overhead",
                "peer_access": None,
                "guarded": label == "on_device_of",
                "outcome": "measured",
                "GBps": None,
                "detail": f"{label}, tensor on {device}",
                "peer_enabled": None,
                "us_per_launch": us,
            }
        )
    return records


def _reported_at(traceback_text: str | None) -> str:
    """The innermost source line of labkit code in a child's traceback: where the error surfaced."""
    lines = (traceback_text or "").splitlines()
    site = ""
    for i, line in enumerate(lines):
        if line.strip().startswith('File "') and "labkit" in line and i + 1 < len(lines):
            site = f"{line.strip().split(', in ')[-1]}: {lines[i + 1].strip()}"
    return site or "(no labkit frame in the traceback)"


def launch_blocking_demo(timeout_s: float = 120.0) -> list[dict]:
    """Run ``fault_then_later_work`` in a child twice: without and with CUDA_LAUNCH_BLOCKING=1.

    One record each: how the child ended and the line that reported the error. Needs 1 GPU."""
    records = []
    for blocking in ("0", "1"):
        res = sandbox.run_isolated(
            "labkit.kernels.fault:fault_then_later_work", timeout=timeout_s, env={"CUDA_LAUNCH_BLOCKING": blocking}
        )
        records.append(
            {
                "CUDA_LAUNCH_BLOCKING": blocking,
                "status": res.status,
                "summary": res.summary(),
                "reported_at": _reported_at(res.traceback),
            }
        )
    return records


#: outcome -> colour of its cell in ``plot_matrix`` (green good; orange silent; red loud)
OUTCOME_COLOURS = {
    "correct": "#4caf50",
    "wrong result": "#ff9800",
    "wrong device": "#ffc107",
    "exception": "#e53935",
    "illegal memory access": "#8e24aa",
    "hang": "#424242",
}


def plot_matrix(records: list[dict], ax, title: str = "") -> None:
    """The device-confusion matrix as a coloured table: rows are patterns, columns are
    (peer access, guarded); each cell names its outcome and, where it ran, its GB/s."""
    from matplotlib.patches import Patch, Rectangle

    cells = [r for r in records if r.get("pattern") in PATTERNS]
    cols = [(peer, g) for peer in (False, True) for g in (False, True)]
    patterns = [p for p in PATTERNS if any(r["pattern"] == p for r in cells)]
    for i, p in enumerate(patterns):
        for j, (peer, g) in enumerate(cols):
            match = [r for r in cells if r["pattern"] == p and r["peer_access"] == peer and r["guarded"] == g]
            if not match:
                continue
            r = match[0]
            ax.add_patch(
                Rectangle((j, i), 1, 1, facecolor=OUTCOME_COLOURS.get(r["outcome"], "white"), edgecolor="white", lw=2)
            )
            text = r["outcome"] + (f"\n{r['GBps']:.0f} GB/s" if r.get("GBps") else "")
            if peer and r.get("peer_enabled") is False:
                text += "\n(peer NOT enabled)"
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8, color="white")
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(patterns), 0)
    ax.set_xticks(
        [j + 0.5 for j in range(len(cols))],
        [f"peer {'on' if peer else 'off'}\n{'guarded' if g else 'unguarded'}" for peer, g in cols],
    )
    ax.set_yticks([i + 0.5 for i in range(len(patterns))], [p.replace("_", " ") for p in patterns])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(
        handles=[Patch(color=c, label=o) for o, c in OUTCOME_COLOURS.items()],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    ax.set_title(title, fontsize=10)
