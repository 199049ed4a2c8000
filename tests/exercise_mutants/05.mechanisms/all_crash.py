# Expects every mechanism alone to crash on two GPUs, as the three together do.
outcomes = {
    "lazy_meta_on_current_device": "exception",
    "global_reduction": "exception",
    "unguarded_launch": "exception",
}
