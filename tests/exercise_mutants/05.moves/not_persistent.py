# Buffers that move but are left out of the state dict: a checkpoint loses the scaling history.
def keep_state(layer, meta):
    for field in ("scale", "scale_inv", "amax_history"):
        layer.register_buffer(f"fp8_{field}", getattr(meta, field), persistent=False)
