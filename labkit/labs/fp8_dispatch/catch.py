"""Lab 05's "catch it in your code": an FP8 linear layer under the story's policy and the product's,
for ``labkit.check.device_independence``.

``forward_seed`` runs a fresh ``FP8Linear`` on the inputs' device under the story's three
mechanisms (state made on the current device, one update kernel on the current device, an
unguarded cast launch); ``forward_fixed`` under the product's ``device_aware`` policy. ``inputs``
builds (x, weight) on a device.
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


#: what the notebook's cell and ``labkit bench checkers`` run: (checker, fn, make_inputs, kwargs)
CASES = [("device_independence", fn, inputs, {}) for fn in (forward_seed, forward_fixed)]
