"""What the parameters of ``notebooks/04_grouped_gemm.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import TRIALS, at_least

PARAMETERS = {
    "CHECK_TRIALS": TRIALS,
    "CHECK_TOKENS": at_least(38),  # the fixed split [7, 0, 31, CHECK_TOKENS - 38]
    "CHECK_K": at_least(1),
    "CHECK_N": at_least(1),
}
