"""Lab 04's "catch it in your code": the host-sync loop and the staging buffer, for ``labkit.check``.

* ``experts_seed`` reads ``m_splits`` on the host (``.tolist()``): a sync per call, and no CUDA
  graph can capture it; ``experts_fixed`` is labkit's grouped GEMM, which reads the counts on the
  device. ``moe_inputs`` builds (x, w, m_splits).
* ``staged_seed`` stages a layer's expert addresses in a shared pinned buffer that every call
  starts again at 0 (``ResettingStaging``) and copies them to the device: a captured graph then
  replays its copy from a slot another layer's call rewrote; ``staged_fixed`` gives the layer a
  slot of its own (``OwnedStaging``). ``weights_inputs`` builds the layer's weights;
  ``other_layer(args, kwargs, step)`` is the ``vary`` of ``graph_safe``: new weights, and another
  layer's call between capture and replay.
"""

from __future__ import annotations

import torch

from labkit.kernels import grouped_gemm as gg
from labkit.labs.grouped_gemm import staging

EXPERTS, K, N = 4, 32, 24


ROWS = 24  # fixed, so that a CUDA graph can replay on new counts


def moe_inputs(device) -> tuple[tuple, dict]:
    """(x, w, m_splits): ROWS tokens split among the experts at random (some may get none)."""
    cuts = torch.randint(0, ROWS + 1, (EXPERTS - 1,)).sort().values
    counts = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([ROWS])]))
    x = torch.randn(ROWS, K, device=device)
    return (x, torch.randn(EXPERTS, K, N, device=device), counts.to(device)), {}


def experts_seed(x, w, m_splits):
    """The seed: every expert's rows, sliced with counts read on the host."""
    out, row = [], 0
    for e, m in enumerate(m_splits.tolist()):
        out.append(x[row : row + m] @ w[e])
        row += m
    return torch.cat(out)


def experts_fixed(x, w, m_splits):
    """The fix: one grouped GEMM that reads m_splits on the device."""
    return gg.grouped_mm(x, w, m_splits)


WORDS = 2 * EXPERTS
_SHARED = staging.SharedWorkspace(4 * WORDS)
_RESETTING = [staging.ResettingStaging(_SHARED) for _ in range(2)]  # layer A and another layer B
_OWNED = [staging.OwnedStaging(WORDS) for _ in range(2)]


def weights_inputs(device) -> tuple[tuple, dict]:
    return (torch.randn(EXPERTS, N, K, device=device),), {}


def _addresses(weights: torch.Tensor) -> list[int]:
    """Each expert's weight address and a second word (its index), as the PR stages 2 per GEMM."""
    base, step = weights.data_ptr(), weights.stride(0) * weights.element_size()
    return [w for e in range(weights.shape[0]) for w in (base + e * step, e)]


def _staged(op, weights: torch.Tensor) -> torch.Tensor:
    start, stop = op.stage(_addresses(weights))
    dst = torch.empty(stop - start, dtype=torch.int64, device=weights.device)
    dst.copy_(op.host[start:stop], non_blocking=True)  # captured, a graph keeps the host address
    return dst


def staged_seed(weights):
    """The seed: layer A stages its addresses in the resetting shared buffer."""
    return _staged(_RESETTING[0], weights)


def staged_fixed(weights):
    """The fix: layer A's own slot."""
    return _staged(_OWNED[0], weights)


def other_layer(args, kwargs, step) -> None:
    """``vary``: another layer's call (its addresses staged in the same way) between capture and replay."""
    args[0].copy_(torch.randn_like(args[0]))  # new weight values (the addresses stay)
    other = torch.randn(EXPERTS, N, K, device=args[0].device)
    for op in (_RESETTING[1], _OWNED[1]):
        op.stage(_addresses(other) if step % 2 else [a + 8 for a in _addresses(other)])


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("no_host_sync", fn, moe_inputs, {}) for fn in (experts_seed, experts_fixed)] + [
    ("graph_safe", fn, weights_inputs, {"vary": other_layer}) for fn in (staged_seed, staged_fixed)
]
