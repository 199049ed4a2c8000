# TransformerEngine's own line, device="cuda": the current CUDA device (and no device at all on the CPU).
from labkit.kernels.fp8.recipe import FP8Meta


def make_state(layer, n_tensors, history_len):
    return FP8Meta.create(n_tensors, history_len, "cuda")
