# Right semantics, scope too narrow: gpu scope binds the threads of one GPU, not its peer's.
choice = {"semantics": "acq_rel", "scope": "gpu"}
