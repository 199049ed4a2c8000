# A guard on "cuda": that is the current device, so it changes nothing.
import torch
import triton

from labkit.labs.wrong_device.experiments import _add_one_kernel


def launch(x, out):
    n = x.numel()
    with torch.cuda.device("cuda"):
        _add_one_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
