"""What the parameters of ``notebooks/00_start_here.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import SECONDS, at_least, list_of

PARAMETERS = {
    "COPY_SIZES_BYTES": list_of(at_least(1)),
    "REPS": at_least(0),  # 0: the profile's default
    "HANG_TIMEOUT_S": SECONDS,
}
