# The guard added around the launch only: the output was already made on the current device.
import torch
import triton

from labkit.labs.wrong_device.experiments import _add_one_kernel


def add_one(x):
    out = torch.empty(x.shape, dtype=x.dtype, device="cuda")
    n = x.numel()
    with torch.cuda.device(x.device):
        _add_one_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out
