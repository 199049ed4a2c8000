"""What the parameters of ``notebooks/02_collectives.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import TRIALS, at_least, list_of, number, one_of

PARAMETERS = {
    "WORLD_SIZES": list_of(at_least(2)),  # symmetric memory needs two ranks or more
    "CHECK_ELEMENTS": at_least(1),
    "BROKEN_TRIALS": TRIALS,
    "BROKEN_ELEMENTS": at_least(1),
    "LATE_US": number(0),
    "BROKEN_LOAD": one_of("late", "gemm", "held"),
}
