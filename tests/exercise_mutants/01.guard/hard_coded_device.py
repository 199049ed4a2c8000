# The story's GPU written in: right for data on cuda:1, wrong for data anywhere else.
import torch
import triton

from labkit.labs.wrong_device.experiments import _add_one_kernel


def launch(x, out):
    n = x.numel()
    with torch.cuda.device(1):
        _add_one_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
