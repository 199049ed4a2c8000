"""The ranks' agreement on a plan: when a plan is made, every rank checks that every other is
making the same one (``agree``), by exchanging a ``fingerprint`` of what it will launch; ranks
that differ all raise the same UsageError, naming what differs and each rank's value. Once per
buffer and fingerprint (``plan.CollectivePlan``'s calls never exchange anything).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from labkit.kernels.comm import symm

if TYPE_CHECKING:  # plan imports this module
    from labkit.kernels.comm.plan import CollectivePlan

#: what ``agree``'s error tells the caller
CONTRACT = (
    "every rank must make the same call, with the same buffer, out (in place or not), algorithm, "
    "blocks, variant, config and order; make the calls agree"
)


def fingerprint(p: CollectivePlan, arguments: dict) -> dict:
    """What ``p`` launches, as the ranks must agree on it: the buffer (allocation, shape, dtype),
    in place or not, the call's ``arguments`` as given (name -> value), and, derived (keys with a
    leading "="), the algorithm chosen and every kernel's grid and launch options. Addresses and
    the rank's own arguments (its rank, its pointers) are left out: they differ by design."""
    buf = p._buf()
    fields = {
        "buf": f"allocation #{buf.serial}, {tuple(p._x_shape)} {str(p.dtype).replace('torch.', '')}",
        "out": "buf.tensor (in place)" if p.in_place else "a separate tensor",
    }
    fields.update((k, repr(v)) for k, v in arguments.items())
    fields["=algorithm chosen"] = p.algorithm
    fields["=launch"] = "; ".join(
        f"{getattr(s.kernel, 'fn', s.kernel).__name__} grid {s.grid} {sorted(s.kwargs.items())}"
        if hasattr(s, "kernel")  # a plan.KernelLaunch (a plan.CopySteps has none)
        else "copies"  # how many: by rank (a peer's shard may be empty)
        for s in p.steps
    )
    return fields


def agree(p: CollectivePlan, arguments: dict) -> None:
    """Check, when a plan is made, that every rank is making the same one: the first time a buffer
    sees a ``fingerprint`` (its arguments as given and what they resolve to), the ranks exchange
    theirs (``symm.agree``: one small ``all_gather_object``, collective) and every rank raises the
    same UsageError naming what differs, with each rank's value. Remembered on the buffer once
    agreed, so a buffer's later plans of the same arguments (an eager call into another out, a
    held plan) exchange nothing, and calls through a plan never do: the per-call path is untouched.

    Why per fingerprint, not per plan: a plan cache misses on one rank and not another (an out at
    an address one rank has seen and the other has not), and only the ranks that miss would enter
    the exchange; the fingerprint leaves addresses out, so ranks making the same calls in the same
    order reach each new fingerprint together.

    Not caught (each still waits until the world's timeout: ``run_ranks``' timeout, the process
    group's under torchrun): a rank that never calls, and a rank whose arguments are new to the
    buffer while its peers reuse arguments already agreed on it (only that rank enters the
    exchange; the others launch and wait in the kernel's barrier). Skipped during CUDA-graph
    capture (no collective may run there; every rank skips alike)."""
    buf = p._buf()
    fields = fingerprint(p, arguments)
    key = (p.op, *fields.items())
    if key in buf._agreed:
        return
    if p.device.type == "cuda":
        # under the plan's device: the capture check reads that device's current stream, and
        # NCCL's object collective runs on the current device (another may be current here)
        with torch.cuda.device(p.device):
            if torch.cuda.is_current_stream_capturing():
                return
            symm.agree(p.op, fields, CONTRACT)
    else:
        symm.agree(p.op, fields, CONTRACT)
    buf._agreed.add(key)
