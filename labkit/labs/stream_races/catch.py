"""Lab 03's "catch it in your code": the story's grouped weight gradients, for ``labkit.check``.

``wgrad_seed`` computes each group's dW = dYᵀ X into pieces cut from one block through raw
pointers (``alloc.allocate_raw``: record_stream on them does nothing); ``wgrad_fixed`` cuts views
of one ``torch.empty`` (``alloc.allocate_views``). ``inputs`` builds (x, dy) on a device.
"""

from __future__ import annotations

import torch

from labkit.kernels import alloc

GROUPS, TOKENS, IN_FEATURES, OUT_FEATURES = 4, 64, 48, 32


def inputs(device) -> tuple[tuple, dict]:
    x = torch.randn(GROUPS, TOKENS, IN_FEATURES, device=device)
    dy = torch.randn(GROUPS, TOKENS, OUT_FEATURES, device=device)
    return (x, dy), {}


def _wgrad(style: str, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    shapes = [(OUT_FEATURES, IN_FEATURES)] * x.shape[0]
    pieces = alloc.allocate(style, shapes, x.dtype, x.device).tensors
    for g, piece in enumerate(pieces):
        torch.matmul(dy[g].t(), x[g], out=piece)
    return pieces


def wgrad_seed(x, dy) -> list[torch.Tensor]:
    """The seed: pieces made from raw pointers into one block."""
    return _wgrad("raw", x, dy)


def wgrad_fixed(x, dy) -> list[torch.Tensor]:
    """The fix: views of one block, which the caching allocator owns."""
    return _wgrad("views", x, dy)


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("stream_safety", fn, inputs, {}) for fn in (wgrad_seed, wgrad_fixed)]
