"""labkit's Triton kernels. Each launcher is guarded (runs on its inputs' device) and checks its
inputs. ``LAUNCHERS`` lists every public launcher with a maker of small CPU example inputs, so
tests can apply one check to all of them, such as the wrong-current-device regression."""
import torch

from labkit.kernels.copy import copy
from labkit.kernels.fault import write_out_of_bounds
from labkit.kernels.matmul import matmul as triton_matmul  # the module keeps the name `matmul`
from labkit.sc import sc_matmul
from labkit.wrong_device import add_one

#: name -> (launcher, make_inputs(generator) -> tuple of CPU tensors)
LAUNCHERS = {
    "copy": (copy, lambda g: (torch.randn(1 << 20, generator=g),)),
    "add_one": (add_one, lambda g: (torch.randn(1 << 20, generator=g),)),
    "matmul": (triton_matmul, lambda g: (torch.randn(96, 64, generator=g), torch.randn(64, 80, generator=g))),
    "sc_matmul": (sc_matmul, lambda g: (torch.randn(48, 256, generator=g), torch.randn(256, 80, generator=g))),
}

__all__ = ["copy", "add_one", "triton_matmul", "sc_matmul", "write_out_of_bounds", "LAUNCHERS"]
