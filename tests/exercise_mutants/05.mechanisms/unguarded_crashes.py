# Expects lab 01's unguarded launch to fault, and the lazy state to be merely slow (ok).
outcomes = {"lazy_meta_on_current_device": "ok", "global_reduction": "ok", "unguarded_launch": "illegal_memory_access"}
