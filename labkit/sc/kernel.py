"""The Triton SC matmul: one table lookup per multiply-add instead of an L-bit XNOR loop.

For each output tile and each K-chunk the kernel gathers T[q_a + Q, q_b + Q] (the table of
``labkit.sc.encoding.count_table``) for a BLOCK_M x BLOCK_K x BLOCK_N block at once and sums
over K in int32: the integer count sum is exact, whatever the order. Then either the counts of
every chunk are written (``COUNTS_ONLY``, for bit-exact tests) or each chunk's counts are scaled
by its a- and b-scales and summed in fp32, in chunk order, into the output.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sc_kernel(
    qa_ptr,            # *int8 [H, M, K]: quantised a, values in [-QMAX, QMAX]
    qb_ptr,            # *int8 [H, K, N]: quantised b
    table_ptr,         # *int32 [PHASES, 2Q+1, 2Q+1]: 2 * XNOR-count - L per (k parity, q_a, q_b)
    sa_ptr,            # *fp32 [H, C, M]: a's scale per chunk and row, times Q*Q/L
    sb_ptr,            # *fp32 [H, C, N]: b's scale per chunk and column
    out_ptr,           # *int32 [H*C, M, N] (COUNTS_ONLY) or *fp32 [H, M, N]
    M, N, K,           # problem sizes
    CHUNK,             # K-chunk length (K when there is one chunk)
    NUM_CHUNKS,        # ceil(K / CHUNK)
    s_ah, s_am, s_ak,  # strides of qa, in elements
    s_bh, s_bk, s_bn,  # strides of qb
    s_oh, s_om, s_on,  # strides of out (first one steps over h*C + c, or h)
    QMAX: tl.constexpr,         # 2**(sc_prec-1) - 1
    BLOCK_M: tl.constexpr,      # output rows per program
    BLOCK_N: tl.constexpr,      # output columns per program
    BLOCK_K: tl.constexpr,      # K steps gathered at once (BLOCK_M*BLOCK_K*BLOCK_N lookups)
    COUNTS_ONLY: tl.constexpr,  # write int32 counts per chunk instead of the scaled sum
    PHASES: tl.constexpr,       # 1, or 2 when a stream's sequence alternates with k's parity
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    h = tl.program_id(2)
    W = 2 * QMAX + 1  # table width (QMAX is constexpr, so this folds)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    qa_base = qa_ptr + h.to(tl.int64) * s_ah
    qb_base = qb_ptr + h.to(tl.int64) * s_bh
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c in range(0, NUM_CHUNKS):
        k_start = c * CHUNK
        k_end = tl.minimum(k_start + CHUNK, K)
        counts = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < k_end
            a = tl.load(qa_base + offs_m[:, None] * s_am + offs_k[None, :] * s_ak,
                        mask=m_mask[:, None] & k_mask[None, :], other=0).to(tl.int32) + QMAX
            b = tl.load(qb_base + offs_k[:, None] * s_bk + offs_n[None, :] * s_bn,
                        mask=k_mask[:, None] & n_mask[None, :], other=0).to(tl.int32) + QMAX
            idx = a[:, :, None] * W + b[None, :, :]                       # [BM, BK, BN]
            if PHASES == 2:
                idx += ((offs_k % 2) * (W * W))[None, :, None]
            t = tl.load(table_ptr + idx, mask=k_mask[None, :, None], other=0)
            counts += tl.sum(t, axis=1)
        tile = m_mask[:, None] & n_mask[None, :]
        if COUNTS_ONLY:
            row = (h * NUM_CHUNKS + c).to(tl.int64) * s_oh
            tl.store(out_ptr + row + offs_m[:, None] * s_om + offs_n[None, :] * s_on, counts, mask=tile)
        else:
            sa = tl.load(sa_ptr + (h * NUM_CHUNKS + c).to(tl.int64) * M + offs_m, mask=m_mask, other=0.0)
            sb = tl.load(sb_ptr + (h * NUM_CHUNKS + c).to(tl.int64) * N + offs_n, mask=n_mask, other=0.0)
            acc += counts.to(tl.float32) * (sa[:, None] * sb[None, :])
    if not COUNTS_ONLY:
        tl.store(out_ptr + h.to(tl.int64) * s_oh + offs_m[:, None] * s_om + offs_n[None, :] * s_on,
                 acc, mask=m_mask[:, None] & n_mask[None, :])
