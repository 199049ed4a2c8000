"""Lab 05, FP8 scaling across GPUs: delayed-scaling state made on the current device under accelerate.dispatch_model."""
