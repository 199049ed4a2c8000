"""What the parameters of ``notebooks/06_memory_model.ipynb`` may hold, checked by ``labkit run`` before
any cell runs (``labkit.workbench.parameters``; ``PROFILE`` and ``REFERENCE_MACHINES`` are
common to every notebook)."""

from labkit.workbench.parameters import TRIALS, int_range, list_of, one_of


def _litmus_tests() -> tuple:
    from labkit.kernels.litmus import catalogue

    return tuple(catalogue.TESTS)


def _litmus_semantics() -> tuple:
    from labkit.kernels.litmus import model

    return model.SEMANTICS


def _litmus_most() -> int:
    from labkit.kernels.litmus.run import max_instances

    return max_instances(4)


def _all_reduce_forms() -> tuple:
    from labkit.labs.memory_model.broken_barriers import FORMS

    return FORMS


def _stresses() -> tuple:
    from labkit.labs.memory_model.sweep import STRESSES

    return tuple(STRESSES)


PARAMETERS = {
    "LIVE_INSTANCES": int_range(1, _litmus_most),
    "LIVE_TESTS": list_of(one_of(values=_litmus_tests), max_len=64, non_empty=True),
    "LIVE_STRESS": one_of(values=_stresses),
    "BROKEN_TRIALS": TRIALS,
    # volatile-load round trips on rank 1 (the notebook's: 400; the GPU push demonstration's: 100,000)
    "BROKEN_DELAYS": list_of(int_range(0, 10_000_000), max_len=64, non_empty=True),
    "BROKEN_FORMS": list_of(one_of(values=_all_reduce_forms), max_len=16, non_empty=True),
    "TWO_GPU_SEMANTICS": list_of(one_of(values=_litmus_semantics), max_len=16, non_empty=True),
}
