# Guarded, but the output pinned to "cuda:0": the story's first GPU, not x's.
import torch
import triton

from labkit.labs.wrong_device.experiments import _add_one_kernel


def add_one(x):
    with torch.cuda.device(x.device):
        out = torch.empty(x.shape, dtype=x.dtype, device="cuda:0")
        n = x.numel()
        _add_one_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out
