"""What the parameters of ``notebooks/05_fp8_dispatch.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import SECONDS, at_least, number

PARAMETERS = {
    "SIZE": number(0),  # 0: the profile's
    "STEPS": at_least(1),
    "CELL_TIMEOUT_S": SECONDS,
    "DRIFT_STEPS": at_least(1),
}
