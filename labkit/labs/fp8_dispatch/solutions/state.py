from labkit.kernels.fp8.recipe import FP8Meta


def make_state(layer, n_tensors, history_len):
    # On the weight's device: the layer's casts and GEMMs run there, whatever device is current
    # (under dispatch_model the current device stays cuda:0 while this layer may live on cuda:1).
    return FP8Meta.create(n_tensors, history_len, layer.weight.device)
