# (a) state on cuda:0 for a layer on cuda:1: torch's scaled GEMM checks the devices of its
#     scales and refuses, with an exception.
# (b) one update kernel on cuda:0 writing every layer's state through raw addresses: on a node
#     with peer access those addresses are reachable, and the arithmetic is the same: ok.
# (c) the cast launched on cuda:0 for an input on cuda:1: nothing raises, but an amax or scale
#     differs from the independent model of delayed scaling: wrong_scale.
outcomes = {"lazy_meta_on_current_device": "exception", "global_reduction": "ok", "unguarded_launch": "wrong_scale"}
