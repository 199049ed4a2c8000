# A fence, but fence.acq_rel: it does not keep a store before a later load either.
sb_choice = {"semantics": "fence", "scope": "sys"}
