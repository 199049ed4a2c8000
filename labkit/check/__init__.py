"""Checkers for your own code: each lab's proof of a bug, as a tool you point at your function.

One convention for inputs everywhere: ``make_inputs(device) -> (args, kwargs)``, a function (or
``"module:function"``) that builds ``fn``'s inputs on ``device``, so that a child process or
another GPU builds its own. Each checker returns a :class:`Report` (``.ok``, ``.status``,
``.summary()``, ``.raise_for_status()``).

============================  ==============================================================
checker                       the bug it provokes (the lab that proves it)
============================  ==============================================================
``device_independence``       launches on the current GPU, not the data's (01); 2 GPUs
``watch_launches``            the same, as a context manager naming kernel and argument (01)
``collective``                a symmetric-memory collective against fp64: late ranks, back to
                              back, a graph (02); GPUs, or the emulated world on the CPU tier,
                              where a reader is also held between its barrier and its reads
``stream_safety``             cross-stream use after free, record_stream on raw memory (03)
``no_host_sync``              the host waits for the GPU (04)
``graph_safe``                host values and host memory baked into a CUDA graph (04, 05)
============================  ==============================================================

``replay_with_fresh_inputs`` is the capture-once, refill, replay and check loop that
``graph_safe``, ``collective`` and the collectives' graph tests share.

``labkit check MODULE:FUNCTION --inputs MODULE:FACTORY --checker NAME`` runs one from a shell;
the pytest plugin's ``labkit_check`` fixture runs one in a test. docs/checkers.md: an example of
each, and what each cannot see.
"""

from labkit.check.collective import collective
from labkit.check.devices import device_independence
from labkit.check.graphs import CaptureFailed, EmulatedGraph, Replays, graph_safe, replay_with_fresh_inputs
from labkit.check.launches import Finding, WrongDeviceLaunch, watch_launches
from labkit.check.report import STATUSES, CheckFailed, Report
from labkit.check.streams import stream_safety
from labkit.check.syncs import HostReads, no_host_sync

#: the checkers ``labkit check --checker NAME`` and the pytest fixture run, by name
CHECKERS = {
    "device_independence": device_independence,
    "stream_safety": stream_safety,
    "no_host_sync": no_host_sync,
    "graph_safe": graph_safe,
    "collective": collective,
}

__all__ = [
    "CHECKERS",
    "STATUSES",
    "CaptureFailed",
    "CheckFailed",
    "EmulatedGraph",
    "Finding",
    "HostReads",
    "Replays",
    "Report",
    "WrongDeviceLaunch",
    "collective",
    "device_independence",
    "graph_safe",
    "no_host_sync",
    "replay_with_fresh_inputs",
    "stream_safety",
    "watch_launches",
]
