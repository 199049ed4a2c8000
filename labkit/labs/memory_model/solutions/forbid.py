# A release store of the flag and an acquire load of it, at system scope: the only scope that
# holds threads on two GPUs (gpu scope binds one GPU's threads; cta one block's).
choice = {"semantics": "acq_rel", "scope": "sys"}
