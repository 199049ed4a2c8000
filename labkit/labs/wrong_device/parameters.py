"""What the parameters of ``notebooks/01_wrong_device.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import SECONDS, TRIALS, at_least, optional

PARAMETERS = {
    "MATRIX_BYTES": optional(at_least(1)),
    "CELL_TIMEOUT_S": SECONDS,
    "EXACTNESS_TRIALS": TRIALS,
    "MODEL_LAYERS": at_least(1),
    "NEW_TOKENS": at_least(1),
}
