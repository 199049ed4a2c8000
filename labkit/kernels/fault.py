"""A deliberately faulting kernel: a store far past the end of a buffer, as a wrong index does.

On a GPU this is an illegal memory access, which poisons the CUDA context of the process that
launched it; under the Triton interpreter it is a segmentation fault of the whole process.
Either way it must only ever run inside :func:`labkit.workbench.sandbox.run_isolated`, which is what the
start-here notebook and the sandbox tests demonstrate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit.workbench.guard import on_device_of
from labkit.workbench.tier import kernel_device


@triton.jit
def _store_at_kernel(
    ptr,  # *fp32: a valid buffer
    offset,  # int64: element offset of the store; far out of bounds on purpose
    value,  # fp32: what to write
):
    tl.store(ptr + offset, value)


def write_out_of_bounds(elements_past_end: int = 1 << 36, sync: bool = True) -> str:
    """Store one float ``elements_past_end`` elements after a 16-element buffer.

    The default, 2**36 floats (256 GiB) past the end, lands in unmapped memory on any machine.
    Returns only if nothing faulted (then the message says so).
    """
    if elements_past_end < 0:
        raise ValueError(f"elements_past_end: expected >= 0, got {elements_past_end}")
    buf = torch.zeros(16, dtype=torch.float32, device=kernel_device())
    with on_device_of(buf=buf):
        _store_at_kernel[(1,)](buf, buf.numel() + elements_past_end, 1.0)
        if sync and buf.is_cuda:
            torch.cuda.synchronize()  # the fault of an asynchronous launch surfaces here
    return f"no fault detected writing {elements_past_end} elements past the end"


def write_out_of_bounds_no_sync() -> str:
    """The same bad store without a synchronize: the launch returns before the kernel faults,
    so the error surfaces at whatever CUDA call comes next (or, with CUDA_LAUNCH_BLOCKING=1,
    at this launch)."""
    return write_out_of_bounds(sync=False)


def fault_then_later_work() -> str:
    """The seed story's shape: a bad launch, then unrelated work, then a sync point.

    Without CUDA_LAUNCH_BLOCKING the error is reported by a later CUDA call (on the H200
    machine: the next launch, the innocent ``arange``), away from the kernel that caused it; with
    CUDA_LAUNCH_BLOCKING=1 every launch waits for its kernel, so the launch line reports it."""
    write_out_of_bounds(sync=False)
    innocent = torch.arange(1 << 20, device=kernel_device(), dtype=torch.float32)
    total = innocent.sum().item()  # a later sync point
    return f"no fault reported (sum {total})"
