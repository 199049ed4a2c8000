"""Lab 04, token counts that stay on the device: the grouped GEMM's host-sync cost, the MoE layer in a
CUDA graph, and the pinned staging buffer's race."""
