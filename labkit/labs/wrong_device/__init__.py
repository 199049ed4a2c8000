"""Lab 01, the wrong current device: the device-confusion matrix, the SC matmul benchmarks and
plots, and a Llama-shaped model sharded across GPUs."""
