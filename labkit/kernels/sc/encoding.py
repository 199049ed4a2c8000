"""Stochastic-computing encoding: quantisation, threshold sequences, bitstreams, count table.

Definitions (shared by the literal reference and the Triton kernel):

* Quantisation. A value x with scale s becomes q = clamp(round_half_even(x / s), -Q, Q), with
  Q = 2**(sc_prec-1) - 1 and s = amax / Q over the value's scale group (s = 1 where amax = 0).
* Bipolar encoding. q stands for v = q / Q in [-1, 1], i.e. the probability P = (v + 1) / 2 of a
  one. Its ``stoc_len``-bit stream (L bits) has bit t set when the t-th threshold lies below P:

      bit_t = [ (2 * r_t + h) * Q  <  (q + Q) * L ]          (integers only, so exact)

  where r_t in {0..L-1} is the t-th element of the stream's threshold sequence and h = 1 with
  ``halve`` (thresholds at the middle of each 1/L interval, (r + 1/2) / L: the number of ones is
  round(P L) instead of ceil(P L), which removes a systematic bias of up to one bit) else h = 0.
* Sequences. ``"counter"``: r_t = t. ``"bitrev"``: r_t = t with its log2(L) bits reversed.
  ``"counter_alt"``: r_t = t at even k and L-1-t at odd k (k: the index along the summed
  dimension K). a and b use different sequences so their streams are uncorrelated enough for
  XNOR to multiply. Why "counter_alt" is b's default: with bitrev x counter every product's error
  has a positive mean (about +4/L), with bitrev x reversed counter a negative one (about -4/L),
  so over a long K the plain counter's error adds up (measured here: relative error 6 to 16 for
  K = 1024 to 4096 at L = 256); alternating the two cancels it pairwise (about 0.1).
* Non-finite values. NaN and +-inf have no stream (a stream encodes a value in [-1, 1] relative
  to a finite scale). ``finite_part`` zeroes them before the scales and the quantisation, so they
  cannot poison the scales of their group (per_tensor: the whole matrix), and the matmul marks
  the outputs they reach as NaN through the scale of their row / column (labkit.kernels.sc.matmul).
* Multiplication. XNOR of the two streams, bit by bit; C = number of ones (agreements). The
  product of the two encoded values is decoded as (2C - L) / L.

The kernel's key fact: for fixed sequences C depends only on the pair (q_a, q_b). So a table of
(2Q+1)^2 counts (65 025 entries for 8 bits), built from the bitstreams, replaces the L-step
bit loop by one lookup per multiply-add.
"""

from __future__ import annotations

import torch

SEQUENCES = ("counter", "bitrev", "counter_alt")


def qmax(sc_prec: int) -> int:
    return (1 << (sc_prec - 1)) - 1


def threshold_sequence(kind: str, stoc_len: int, k_parity: int = 0) -> torch.Tensor:
    """r_t for t = 0..L-1 (int64, CPU), for a position k along K of the given parity."""
    t = torch.arange(stoc_len, dtype=torch.int64)
    if kind == "counter":
        return t
    if kind == "counter_alt":
        return t if k_parity % 2 == 0 else stoc_len - 1 - t
    if kind == "bitrev":
        bits = stoc_len.bit_length() - 1
        r = torch.zeros_like(t)
        for i in range(bits):
            r |= ((t >> i) & 1) << (bits - 1 - i)
        return r
    raise ValueError(f"sequence: {kind!r} is not one of {SEQUENCES}")


def phases(a_seq: str, b_seq: str) -> int:
    """How many different tables the pair needs: 2 when a sequence depends on k's parity."""
    return 2 if "counter_alt" in (a_seq, b_seq) else 1


def bitstreams(q: torch.Tensor, sc_prec: int, stoc_len: int, seq: str, halve: bool, k_parity: int = 0) -> torch.Tensor:
    """The literal streams: bool tensor of shape q.shape + (L,)."""
    Q = qmax(sc_prec)
    r = threshold_sequence(seq, stoc_len, k_parity).to(q.device)
    lhs = (2 * r + int(halve)) * Q  # (L,)
    rhs = (q.to(torch.int64) + Q) * stoc_len  # q.shape
    return lhs < rhs.unsqueeze(-1)


def count_table(sc_prec: int, stoc_len: int, a_seq: str, b_seq: str, halve: bool) -> torch.Tensor:
    """T[p, i, j] = 2 C - L for q_a = i - Q, q_b = j - Q at k parity p, from the bitstreams.

    Shape (phases, 2Q+1, 2Q+1), int32, CPU; phases = 1 unless a sequence alternates with k.
    """
    Q = qmax(sc_prec)
    levels = torch.arange(-Q, Q + 1)
    tables = []
    for p in range(phases(a_seq, b_seq)):
        sa = bitstreams(levels, sc_prec, stoc_len, a_seq, halve, p)  # (2Q+1, L)
        sb = bitstreams(levels, sc_prec, stoc_len, b_seq, halve, p)
        agree = (sa[:, None, :] == sb[None, :, :]).sum(-1)  # C for every pair
        tables.append(2 * agree - stoc_len)
    return torch.stack(tables).to(torch.int32).contiguous()


def scales(x: torch.Tensor, reduce_dims: tuple[int, ...], sc_prec: int) -> torch.Tensor:
    """amax / Q over ``reduce_dims`` (kept), in fp32; 1 where the group is all zeros."""
    amax = x.detach().abs().float().amax(dim=reduce_dims, keepdim=True)
    # A tensor divisor, not a Python number: CUDA torch turns "tensor / scalar" into a multiply
    # by the rounded reciprocal, which is not the IEEE quotient the Triton kernels compute.
    s = amax / torch.full_like(amax, qmax(sc_prec))
    return torch.where(amax > 0, s, torch.ones_like(s))


def finite_part(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with every NaN and +-inf replaced by 0, bool mask of those entries). Finite entries are
    passed through unchanged, so finite inputs quantise to the same bits as without this step."""
    nonfinite = ~torch.isfinite(x)
    return torch.where(nonfinite, torch.zeros_like(x), x), nonfinite


def quantize(x: torch.Tensor, s: torch.Tensor, sc_prec: int) -> torch.Tensor:
    """clamp(round_half_even(x / s), -Q, Q) as int8 (exact IEEE ops: identical on any device)."""
    Q = qmax(sc_prec)
    return torch.clamp(torch.round(x.float() / s), -Q, Q).to(torch.int8)
