"""Lab 05's "catch it in your code": an FP8 linear layer under the story's policy and the product's,
for ``labkit.check.device_independence``.

``forward_seed`` runs a fresh ``FP8Linear`` on the inputs' device under the story's three
mechanisms (state made on the current device, one update kernel on the current device, an
unguarded cast launch); ``forward_fixed`` under the product's ``device_aware`` policy. ``inputs``
builds (x, weight) on a device.

``forward_with_state(make_state)`` turns exercise 05.state's answer into a function of (x, weight):
the story's first mechanism (state made lazily at the first forward, kept in a plain attribute)
with the state made by ``make_state(layer, n_tensors, history_len)``, the rest as the product's.
"""

from __future__ import annotations

import torch

from labkit.kernels.fp8 import FP8Linear, fp8_autocast
from labkit.labs.fp8_dispatch import naive

IN_FEATURES, OUT_FEATURES, TOKENS = 32, 16, 16


def inputs(device) -> tuple[tuple, dict]:
    x = torch.randn(TOKENS, IN_FEATURES, device=device).to(torch.bfloat16)
    return (x, torch.randn(OUT_FEATURES, IN_FEATURES, device=device).to(torch.bfloat16)), {}


def _forward(mode, x, weight):
    layer = FP8Linear(IN_FEATURES, OUT_FEATURES, dtype=torch.bfloat16, device=x.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
    with fp8_autocast(mode=mode):
        return layer(x)


def forward_seed(x, weight):
    """The story: all three mechanisms on."""
    return _forward(naive.StoryPolicy(naive.NAIVE), x, weight)


def forward_fixed(x, weight):
    """The product's policy: state, update and launch on the layer's device."""
    return _forward("device_aware", x, weight)


class _StateFrom(naive.StoryPolicy):
    """The story's mechanism (a) alone, the state made by ``make_state`` instead of on the
    current device."""

    def __init__(self, make_state):
        super().__init__(naive.Mechanisms.only("lazy_meta_on_current_device"))
        self.make_state = make_state
        self.name = "story[state from make_state]"

    def meta(self, module, direction: str):
        store = module.__dict__.setdefault("_story_meta", {})
        if direction not in store:
            tensors = {"forward": 2, "backward": 1}[direction]
            store[direction] = self.make_state(module, tensors, module.fp8_meta(direction).history_len)
        return store[direction]


def forward_with_state(make_state):
    """``forward(x, weight)``: a fresh ``FP8Linear`` on x's device whose scaling state comes from
    ``make_state(layer, n_tensors, history_len)`` (exercise 05.state's answer), for
    ``labkit.check.device_independence``: a state made on the current device lands on another GPU
    than the layer when the data's GPU is not current."""

    def forward(x, weight):
        return _forward(_StateFrom(make_state), x, weight)

    forward.__qualname__ = f"forward_with_state({getattr(make_state, '__name__', 'make_state')})"
    return forward


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("device_independence", fn, inputs, {}) for fn in (forward_seed, forward_fixed)]
