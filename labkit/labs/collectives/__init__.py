"""Lab 02, collectives are kernels: correctness experiments, broken variants, sweeps against NCCL
and torch symm_mem, the link probe, the PTX proof and plots."""
