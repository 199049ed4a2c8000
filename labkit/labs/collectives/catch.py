"""Lab 02's "catch it in your code": collectives over symmetric memory, for ``labkit.check.collective``.

Each takes ``buf`` (this rank's ``SymmBuffer``, holding its input) and returns this rank's sum:

* ``one_shot_seed``: labkit's one-shot all-reduce without its end barrier (variant
  ``no_end_barrier``): a rank that finishes first writes its next input while a peer still reads;
* ``one_shot_fixed``: the kernel as it should be;
* ``peers_seed``: an all-reduce written in plain torch on the peers' buffers with a barrier before
  the reads but none after them: the same race, in a user's own code;
* ``peers_fixed``: the same with both barriers.

``inputs(device)`` gives this rank's input (4096 float32 values).
"""

from __future__ import annotations

import torch

from labkit.kernels.comm import collectives as C

NUMEL = 4096


def inputs(device) -> tuple[tuple, dict]:
    return (torch.randn(NUMEL, device=device),), {}


def one_shot_seed(buf):
    return C.all_reduce(buf, algorithm="one_shot", variant="no_end_barrier")


def one_shot_fixed(buf):
    return C.all_reduce(buf, algorithm="one_shot")


def _peers_sum(buf, end_barrier: bool):
    C.barrier(buf)  # every rank's input is written before anyone reads
    out = torch.zeros_like(buf.tensor, dtype=torch.float32)
    for peer in buf.peers:
        out += peer.float()
    if end_barrier:
        C.barrier(buf)  # nobody writes its next input while a peer still reads this one
    return out.to(buf.tensor.dtype)


def peers_seed(buf):
    return _peers_sum(buf, end_barrier=False)


def peers_fixed(buf):
    return _peers_sum(buf, end_barrier=True)


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("collective", fn, inputs, {"world_size": 2}) for fn in (one_shot_seed, one_shot_fixed)]
