"""The product: the kernels and helpers a user imports. Each launcher is guarded (runs on its
inputs' device) and checks its inputs. This layer imports the workbench only, never a lab.

* ``copy`` (``kernels.copy``), ``triton_matmul`` (``kernels.matmul``), ``write_out_of_bounds``
  (``kernels.fault``, a kernel that faults on purpose, for the crash sandbox);
* ``kernels.sc``: the stochastic-computing matmul ``sc_matmul`` of lab 01's seed story;
* ``kernels.alloc``: bulk allocation as raw-pointer tensors or as views, and alignment reports;
* ``kernels.grouped_gemm``: ``grouped_mm`` (x_e @ w[e] for every expert, reading ``m_splits``
  on the device) and ``grouped_mm_wgrad``; ``kernels.grouped_linear.GroupedLinear``, the module;
* ``kernels.comm``: symmetric-memory buffers, barriers, the rank launcher ``run_ranks`` and the
  all-reduce / reduce-scatter / all-gather kernels (``kernels.comm.collectives``), and their
  launch plans (``kernels.comm.plan``);
* ``kernels.ops`` (imported on demand): ``torch.ops.labkit.*``, the kernels as PyTorch custom ops;
* ``kernels.litmus``: memory-model litmus tests (MP, SB, LB, CoRR, IRIW, 2+2W, RWC) as data,
  what SC and a scoped relaxed model allow, one Triton kernel for all, ``run_litmus``.

``LAUNCHERS`` lists every public launcher with a maker of small CPU example inputs, so tests can
apply one check to all of them, such as the wrong-current-device regression."""

import torch

from labkit.kernels.copy import copy
from labkit.kernels.fault import write_out_of_bounds
from labkit.kernels.grouped_gemm import grouped_mm, grouped_mm_wgrad
from labkit.kernels.matmul import matmul as triton_matmul  # the module keeps the name `matmul`
from labkit.kernels.sc import sc_matmul
from labkit.workbench import interpreter

interpreter.fast_device_calls()  # under the interpreter, before any labkit kernel runs: see there

#: name -> (launcher, make_inputs(generator) -> tuple of CPU tensors)
LAUNCHERS = {
    "copy": (copy, lambda g: (torch.randn(1 << 20, generator=g),)),
    "matmul": (triton_matmul, lambda g: (torch.randn(96, 64, generator=g), torch.randn(64, 80, generator=g))),
    "sc_matmul": (sc_matmul, lambda g: (torch.randn(48, 256, generator=g), torch.randn(256, 80, generator=g))),
    # m_splits as a tensor, so that it moves to the inputs' GPU with them (one expert without tokens)
    "grouped_mm": (
        grouped_mm,
        lambda g: (torch.randn(70, 64, generator=g), torch.randn(3, 64, 48, generator=g), torch.tensor([20, 0, 50])),
    ),
    "grouped_mm_wgrad": (
        grouped_mm_wgrad,
        lambda g: (torch.randn(70, 64, generator=g), torch.randn(70, 48, generator=g), torch.tensor([20, 0, 50])),
    ),
}

__all__ = ["copy", "triton_matmul", "sc_matmul", "grouped_mm", "grouped_mm_wgrad", "write_out_of_bounds", "LAUNCHERS"]
