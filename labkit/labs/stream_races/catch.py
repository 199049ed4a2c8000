"""Lab 03's "catch it in your code": the story's grouped weight gradients, for ``labkit.check``.

``wgrad_seed`` computes each group's dW = dYᵀ X into pieces cut from one block through raw
pointers (``alloc.allocate_raw``: record_stream on them does nothing); ``wgrad_fixed`` cuts views
of one ``torch.empty`` (``alloc.allocate_views``). ``inputs`` builds (x, dy) on a device.

``backward_with(wgrad_buffers)`` turns exercise 03.record's answer into a function of (x, dy) for
``labkit.check.stream_safety``: the pieces come from the learner's ``wgrad_buffers``, the side
stream writes into them, and they are dropped before that work is done.
"""

from __future__ import annotations

import torch

from labkit.kernels import alloc
from labkit.labs.stream_races import race

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


def backward_with(wgrad_buffers):
    """A backward step that takes its weight-gradient pieces from ``wgrad_buffers(shapes, device,
    side)`` (exercise 03.record's answer): ``backward(x, dy)`` returns the bias gradients, computed
    on the current stream, while the side stream writes each group's dW = dYᵀ X into the pieces;
    the pieces are dropped when it returns, their writes still queued on the side stream.

    Under ``labkit.check.stream_safety`` the side stream starts late and the current stream takes
    every free block after the call: pieces whose block the allocator handed back before the side
    stream was done (no ``record_stream`` on them, on the wrong stream, or on raw-pointer memory)
    overwrite that fresh memory. Needs a GPU (it enters a CUDA stream)."""

    def backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        side = race.side_stream(x.device)
        pieces = wgrad_buffers([(dy.shape[2], x.shape[2])] * x.shape[0], x.device, side)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for g, piece in enumerate(pieces):
                torch.matmul(dy[g].t(), x[g], out=piece)
        return dy.sum(dim=1)

    backward.__qualname__ = f"backward_with({getattr(wgrad_buffers, '__name__', 'wgrad_buffers')})"
    return backward


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("stream_safety", fn, inputs, {}) for fn in (wgrad_seed, wgrad_fixed)]
