"""The literal emulation: build every bitstream, XNOR them bit by bit, count. Slow (M*K*N*L
comparisons) and only for tests and small demonstrations; it never uses the count table, so
agreeing with it checks the table and the kernel independently."""

from __future__ import annotations

import torch

from labkit.kernels.sc.encoding import bitstreams


def chunk_counts(
    qa: torch.Tensor, qb: torch.Tensor, chunk: int, sc_prec: int, stoc_len: int, a_seq: str, b_seq: str, halve: bool
) -> torch.Tensor:
    """S[h, c, m, n] = sum over k in chunk c of (2 * XNOR-count - L), int64.

    qa: [H, M, K] int8, qb: [H, K, N] int8 (quantised values).
    """
    H, M, K = qa.shape
    N = qb.shape[2]
    C = max(1, -(-K // chunk))
    even = torch.arange(K, device=qa.device) % 2 == 0  # k's parity, along K
    sa = torch.where(
        even[None, None, :, None],  # [H, M, K, L]
        bitstreams(qa, sc_prec, stoc_len, a_seq, halve, 0),
        bitstreams(qa, sc_prec, stoc_len, a_seq, halve, 1),
    )
    sb = torch.where(
        even[None, :, None, None],  # [H, K, N, L]
        bitstreams(qb, sc_prec, stoc_len, b_seq, halve, 0),
        bitstreams(qb, sc_prec, stoc_len, b_seq, halve, 1),
    )
    out = torch.zeros(H, C, M, N, dtype=torch.int64, device=qa.device)
    for c in range(C):
        ks = slice(c * chunk, min(K, (c + 1) * chunk))
        for n in range(N):  # one output column at a time keeps memory at H*M*K*L
            agree = (sa[:, :, ks, :] == sb[:, None, ks, n, :]).sum(-1)  # [H, M, k]
            out[:, c, :, n] = (2 * agree - stoc_len).sum(-1)
    return out
