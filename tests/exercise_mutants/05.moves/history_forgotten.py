# The scales registered, the amax history left out: the history stays behind on the old device.
def keep_state(layer, meta):
    layer.register_buffer("fp8_scale", meta.scale)
    layer.register_buffer("fp8_scale_inv", meta.scale_inv)
    layer.fp8_amax_history = meta.amax_history.tolist()
