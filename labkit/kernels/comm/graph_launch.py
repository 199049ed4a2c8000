"""Replaying a repeated call's launches from a CUDA graph: under the host cost of a launch.

A kernel launch has a floor on the host that no launcher gets under: the driver's own launch
call. Replaying a CUDA graph that holds the same launches goes into the same stream for less host
time than the device guard and the launches it stands in for (``labkit.labs.collectives.host_cost``
times both: stage "graph replay", and beside it ``host_cost.ASIDE``), and a graph of several
kernels costs one replay. A collective called eagerly on the same buffer and output again and
again launches the same kernels with the same arguments every time, so its launches can be
captured once and replayed:

1. Settle. The launches run the normal way (``plan.KernelLaunch``: Triton's path, then its
   compiled launcher, then the direct C launch) until every one is armed and its direct launch
   recorded or refused; a launch sequence whose every argument is fixed for a ``key`` (the
   addresses the call passes: a kept plan's output, an inbox launch's input and output) is then
   eligible.
2. Capture, once per sequence. On a side stream of the device, in relaxed capture mode (no other
   thread's CUDA call is refused meanwhile), the sequence is launched once into a ``CUDAGraph``.
   Capturing runs nothing; the call that captured replays the graph (3) for its own launch. A
   capture that raises leaves its reason in ``reason``, and the launches go the normal way for
   good.
3. Replay, per call, when all hold: the call passes the captured ``key``; the device is the
   current device (so the current stream checked next is the one the replay goes to); it is not being
   captured (a user's capture must record the kernels themselves, not a replay); no Triton launch
   hook is registered (a profiler sees every launch); no block of ``launches_watched`` is open
   (``labkit.check.watch_launches`` sees every launch). Otherwise the call launches the normal
   way, and steps 2 and 3 wait.

Why a replay computes what the launches compute: by 1 every argument of every kernel is the one
the direct launch would pass for this ``key``, and the graph holds exactly those launches. The
kernels keep their protocol state on the device (signal pads, epochs, inbox slots), never in a
launch argument, which is what makes a plan capturable at all (``collectives.Graphed`` replays
them thousands of times in the tests). ``CUDAGraph.replay`` launches into the current stream of
the graph's device, so a replay is ordered with the caller's work as a launch is.

``GRAPH_LAUNCH`` (environment ``LABKIT_GRAPH_LAUNCH=0``) turns it off; ``plan.CollectivePlan``'s
``launch_path`` says whether a plan replays.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

#: Capture a settled launch sequence into a CUDA graph and replay it (step 2).
GRAPH_LAUNCH = os.environ.get("LABKIT_GRAPH_LAUNCH", "1") != "0"

#: open blocks of ``launches_watched`` (any thread): while above 0, nothing is captured or replayed
_watching = 0
_watching_lock = threading.Lock()


@contextlib.contextmanager
def launches_watched():
    """Within the block (process-wide) no call captures or replays a graph: every launch goes the
    normal way, one by one, where a watcher of Triton launches sees it (``labkit.check.
    watch_launches`` opens one). Blocks nest."""
    global _watching
    with _watching_lock:
        _watching += 1
    try:
        yield
    finally:
        with _watching_lock:
            _watching -= 1


def _current_device() -> int:
    return torch._C._cuda_getDevice()


def _capturing() -> bool:
    return torch._C._cuda_isCurrentStreamCapturing()


class GraphReplay:
    """Steps 2 and 3 for one launch sequence on one device (see the module docstring).

    ``no_hooks``: a function saying that no Triton launch hook is registered (read per call).
    ``graph``: the captured graph, or None; ``key``: what the calls it replays pass;
    ``reason``: why there is no graph (None once there is one)."""

    __slots__ = ("device", "graph", "key", "reason", "_index", "_no_hooks")

    def __init__(self, device: torch.device, no_hooks):
        self.device, self._no_hooks = device, no_hooks
        self.graph = self.key = None
        self._index = device.index if device.type == "cuda" and device.index is not None else -1
        if not GRAPH_LAUNCH:
            self.reason = "switched off (LABKIT_GRAPH_LAUNCH=0)"
        elif self._index < 0:
            self.reason = "not a CUDA device with an index"
        else:
            self.reason = "not captured yet"

    @property
    def open(self) -> bool:
        """Whether step 2 may still run: on, on a CUDA device, nothing captured or refused yet."""
        return self.graph is None and self.reason == "not captured yet"

    def replay(self, key) -> bool:
        """Step 3: replay and return True, or return False when this call launches the normal way."""
        if self.graph is None or key != self.key or _watching:
            return False
        if _current_device() != self._index or _capturing() or not self._no_hooks():
            return False
        self.graph.replay()
        return True

    def capture(self, key, launch) -> bool:
        """Step 2: capture ``launch()`` (the sequence, launched on the current stream) for calls
        passing ``key``; True once captured. The caller makes sure the sequence is settled (step
        1). Nothing happens while the device's current stream is being captured already or a
        launch hook is registered: then the caller launches the normal way."""
        if not self.open or _watching:
            return False
        try:
            graph = _capture(self.device, launch, self._no_hooks)
        except Exception as e:  # any failure: the normal launch stays, with the reason
            self.reason = f"capture failed: {type(e).__name__}: {e}"[:300]
            return False
        if graph is None:
            return False
        self.graph, self.key, self.reason = graph, key, None
        return True


def _capture(device: torch.device, launch, no_hooks):
    """The CUDA work of step 2: a ``CUDAGraph`` holding ``launch()``, captured on a side stream of
    ``device`` in relaxed mode; None when that device's current stream is being captured (a
    user's graph) or a launch hook is registered."""
    with torch.cuda.device(device):
        if _capturing() or not no_hooks():
            return None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(torch.cuda.Stream(device)):
            graph.capture_begin(capture_error_mode="relaxed")
            try:
                launch()
            finally:
                graph.capture_end()
    return graph
