# torch's default device: another name for "wherever tensors go when nobody says", not the layer's.
import torch

from labkit.kernels.fp8.recipe import FP8Meta


def make_state(layer, n_tensors, history_len):
    return FP8Meta.create(n_tensors, history_len, torch.get_default_device())
