# fence.sc at system scope: release/acquire (and fence.acq_rel) never keep a store before a later
# load of another address, which is the reordering SB's weak outcome needs; only a sequentially
# consistent fence does, and only sys scope binds threads on two GPUs.
sb_choice = {"semantics": "fence_sc", "scope": "sys"}
