"""What the parameters of ``notebooks/03_stream_races.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import TRIALS, at_least, list_of, number, optional

PARAMETERS = {
    "RACE_TRIALS": TRIALS,
    # a side stream busy for up to 10 s per trial (the notebook's longest: 25 ms)
    "RACE_SLEEPS_MS": list_of(number(0, 10_000), max_len=64, non_empty=True),
    "RACE_NUMEL": optional(at_least(1)),
    "WGRAD_TRIALS": TRIALS,
    "SANITIZER_TRIALS": TRIALS,
    "GEMM_SIZE": at_least(1),
    "ALLOC_GROUPS": at_least(1),
}
