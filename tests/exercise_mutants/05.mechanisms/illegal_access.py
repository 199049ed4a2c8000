# Expects the story's illegal memory access from the lazy state, and the update to go wrong silently.
outcomes = {
    "lazy_meta_on_current_device": "illegal_memory_access",
    "global_reduction": "wrong_scale",
    "unguarded_launch": "wrong_scale",
}
