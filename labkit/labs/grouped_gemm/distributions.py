"""Tokens per expert for the grouped-GEMM benchmarks: even, or skewed the way a router skews them.

``token_counts(experts, tokens, skew)`` returns E non-negative integers summing exactly to
``tokens``, deterministically (same arguments, same list, on every machine):

* ``"uniform"``: ``tokens // E`` each; the remainder ``tokens % E`` adds one token to each of
  the first experts (experts 0, 1, ...).
* ``"skewed"``: a Zipf law with exponent s = 1.2 over the experts' popularity ranks, with the
  least popular tenth of the experts (``ceil(E / 10)`` of them, at least one) given no tokens,
  as a trained router leaves some experts idle in a batch. Exactly:

  1. ``z = ceil(E / 10)`` experts get weight 0; ranks r = 1 .. E - z get weight ``r ** -1.2``;
  2. rank r's quota is ``tokens * weight_r / sum(weights)``; every rank gets the floor of its
     quota, and the tokens left over (fewer than E) go one each to the ranks with the largest
     fractional parts (largest-remainder rounding; ties to the more popular rank), so the
     counts sum to ``tokens`` exactly. A quota below 1 can round to 0: then more than a tenth
     of the experts are empty ("at least 10%" is the promise);
  3. which expert holds which rank is a permutation of the experts drawn by
     ``random.Random(seed).shuffle`` (seed 0 by default), so the heavy expert is not always
     expert 0 and the counts do not come sorted.

  The counts are the law's quotas, not a random sample of it: the skew is the same at every
  size, and only the seed's permutation is random. Needs E >= 2 (one expert cannot be both
  the only one with tokens and one of the empty tenth).

``describe(counts)`` summarises a split for captions (max/mean, empty experts, ...).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

SKEWS = ("uniform", "skewed")
#: exponent s of the Zipf law of the skewed split: weight of popularity rank r is r ** -s
ZIPF_S = 1.2
#: share of the experts (rounded up) that the skewed split leaves without tokens
ZERO_FRACTION = 0.1


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def zero_experts(experts: int) -> int:
    """How many experts the skewed split empties on purpose: ceil(E / 10)."""
    return -(-experts // 10)


def token_counts(experts: int, tokens: int, skew: str = "uniform", seed: int = 0) -> list[int]:
    """Tokens per expert, E ints summing to ``tokens``; see the module docstring for the
    construction of each ``skew`` ("uniform" or "skewed")."""
    _check_count("experts", experts, 1)
    _check_count("tokens", tokens, 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__} {seed!r}")
    if skew not in SKEWS:
        raise ValueError(f"skew: {skew!r} is not one of {SKEWS}")
    if skew == "uniform":
        base, extra = divmod(tokens, experts)
        return [base + (1 if e < extra else 0) for e in range(experts)]
    if experts < 2:
        raise ValueError(f"experts: the skewed split needs at least 2 experts (one of them left empty), got {experts}")
    z = zero_experts(experts)
    weights = [r**-ZIPF_S for r in range(1, experts - z + 1)] + [0.0] * z
    total = math.fsum(weights)
    quotas = [tokens * w / total for w in weights]
    by_rank = [math.floor(q) for q in quotas]
    left = tokens - sum(by_rank)
    # largest remainders first; ties to the lower (more popular) rank; never an emptied rank
    order = sorted(range(experts - z), key=lambda r: (-(quotas[r] - by_rank[r]), r))
    for r in order[:left]:
        by_rank[r] += 1
    assert sum(by_rank) == tokens, "largest-remainder rounding must preserve the sum"
    perm = list(range(experts))
    random.Random(seed).shuffle(perm)
    counts = [0] * experts
    for rank, expert in enumerate(perm):
        counts[expert] = by_rank[rank]
    return counts


def describe(counts: Sequence[int] | torch.Tensor) -> dict:
    """A split in a few JSON-able numbers: experts, tokens, max, min, mean, max/mean, empty
    experts (count and share), the largest expert's share of the tokens, and one line of text."""
    values = counts.tolist() if isinstance(counts, torch.Tensor) else list(counts)
    if not values:
        raise ValueError("counts: expected at least one expert, got none")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        raise ValueError(f"counts: expected non-negative ints, got {bad[0]!r}")
    E, total = len(values), sum(values)
    mean = total / E
    zeros = sum(1 for v in values if v == 0)
    ratio = max(values) / mean if mean else None
    text = (
        f"{total} tokens over {E} experts: max/mean {ratio:.2f}, {zeros} of {E} experts empty"
        if ratio is not None
        else f"0 tokens over {E} experts"
    )
    return {
        "experts": E,
        "tokens": total,
        "max": max(values),
        "min": min(values),
        "mean": mean,
        "max_over_mean": ratio,
        "zero_experts": zeros,
        "zero_fraction": zeros / E,
        "largest_share": max(values) / total if total else None,
        "text": text,
    }


__all__ = ["SKEWS", "ZIPF_S", "ZERO_FRACTION", "describe", "token_counts", "zero_experts"]
