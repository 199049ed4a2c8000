"""What the parameters of ``notebooks/02_collectives.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

import os

from labkit.workbench.parameters import TRIALS, at_least, int_range, list_of, number, one_of

#: bytes per rank (or per copy) of the live GPU parts: the profiles' largest is 256 MiB
_BYTES = int_range(1, 1 << 32)


def _world_most() -> int:
    """The largest world worth asking for: the notebook skips worlds past its machine's (8
    emulated ranks, or the GPU count), and a host has no more GPUs than a few per core."""
    return max(8, 4 * (os.cpu_count() or 1))


PARAMETERS = {
    "WORLD_SIZES": list_of(int_range(2, _world_most), max_len=16),  # symmetric memory needs two ranks or more
    "CHECK_ELEMENTS": at_least(1),
    "BROKEN_TRIALS": TRIALS,
    "BROKEN_ELEMENTS": at_least(1),
    "LATE_US": number(0),
    "BROKEN_LOAD": one_of("late", "gemm", "held"),
    "SWEEP_SIZES": list_of(_BYTES, max_len=64, non_empty=True),
    "LINK_SIZES": list_of(_BYTES, max_len=64, non_empty=True),
    "ORDER_SHARD_BYTES": list_of(_BYTES, max_len=64, non_empty=True),
}
