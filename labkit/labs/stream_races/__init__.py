"""Lab 03, buffers that escape the allocator: the stream race, the wgrad pattern, the sanitizer,
the allocator timeline, allocation and misaligned-GEMM costs, and plots."""
