def keep_state(layer, meta):
    # Registered buffers: .to() and accelerate's hooks move them with the layer, and the state dict
    # saves them. Nothing else keeps a reference to the old tensors: .to() replaces a buffer, so a
    # copy kept elsewhere (an FP8Meta in an attribute) would stay behind. The policy rebuilds the
    # FP8Meta from these buffers when it needs one (as FP8Linear.fp8_meta does).
    for field in ("scale", "scale_inv", "amax_history"):
        layer.register_buffer(f"fp8_{field}", getattr(meta, field))
