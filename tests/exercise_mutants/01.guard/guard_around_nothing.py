# The guard entered and left before the launch: it checks the devices, then launches unguarded.
import triton

from labkit.labs.wrong_device.experiments import _add_one_kernel
from labkit.workbench import guard


def launch(x, out):
    n = x.numel()
    with guard.on_device_of(x=x, out=out):
        grid = (triton.cdiv(n, 1024),)
    _add_one_kernel[grid](x, out, n, BLOCK=1024)
