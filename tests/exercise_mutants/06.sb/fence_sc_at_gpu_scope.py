# The right fence at too narrow a scope: gpu scope binds one GPU's threads, not its peer's.
sb_choice = {"semantics": "fence_sc", "scope": "gpu"}
