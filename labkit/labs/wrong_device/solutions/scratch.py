import torch
import triton

from labkit.labs.wrong_device.experiments import _add_one_kernel
from labkit.workbench import guard


def add_one(x):
    """x + 1 in a new tensor, with the add-one kernel."""
    # empty_like allocates on x's device; device="cuda" would mean the current device
    out = torch.empty_like(x)
    n = x.numel()
    # and the launch, on the current device too, runs with x's device current for its length
    with guard.on_device_of(x=x, out=out):
        _add_one_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out
