# Registered, so it moves, but as parameters: they get gradients and an optimizer would step them.
import torch


def keep_state(layer, meta):
    for field in ("scale", "scale_inv", "amax_history"):
        setattr(layer, f"fp8_{field}", torch.nn.Parameter(getattr(meta, field)))
