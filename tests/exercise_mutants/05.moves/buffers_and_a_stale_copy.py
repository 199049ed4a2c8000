# Buffers, plus the FP8Meta kept for convenience: .to() replaces the buffers and the kept FP8Meta
# still points at the old tensors on the old device.
def keep_state(layer, meta):
    for field in ("scale", "scale_inv", "amax_history"):
        layer.register_buffer(f"fp8_{field}", getattr(meta, field))
    layer.fp8_state = meta
