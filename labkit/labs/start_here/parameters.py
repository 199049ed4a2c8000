"""What the parameters of ``notebooks/00_start_here.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import SECONDS, at_least, int_range, list_of

PARAMETERS = {
    # [] is the profile's sizes; the GPU profile's largest is 1 GiB (copied from and to: twice that)
    "COPY_SIZES_BYTES": list_of(int_range(1, 1 << 34), max_len=64),
    "REPS": at_least(0),  # 0: the profile's default
    "HANG_TIMEOUT_S": SECONDS,
}
