"""The Triton SC matmul: one table lookup per multiply-add instead of an L-bit XNOR loop.

For fixed sequences the XNOR count of two streams depends only on the pair (q_a, q_b), so the
kernel looks up T[q_a + Q, q_b + Q] (``labkit.kernels.sc.encoding.count_table``, int16, rows padded to a
power of two) for a BLOCK_M x BLOCK_K x BLOCK_N block at once and sums over K in int32. Integer
sums are exact in any order, which is what makes split-K and atomics safe here.

Two ways to look a value up (``GATHER``):

* ``0`` (global): every lookup is its own load from the table in global memory. Simple; the
  loads are scattered over the table, so the L1 serves about one lookup per clock per SM.
* ``1`` (rows): load the BLOCK_M x BLOCK_K table rows T[q_a, :] that this block needs, once,
  then ``tl.gather`` the BLOCK_N columns q_b from them. Measured slower on an H200 at every
  shape tried (reference/h200x2/wrong_device_sc_launch.json): the gather stages the rows through shared
  memory on every call, so each lookup costs a row load, a shared store and a shared load.
  Kept, tested, as the experiment that says so.

Three outputs (``MODE``):

* ``0``: scaled. Each chunk's counts times its a- and b-scales, summed in fp32 in chunk order,
  stored in the output dtype. One program covers all of K (no split).
* ``1``: counts. Each program ``tl.atomic_add``s its int32 counts into counts[h * C + c, m, n]
  (zeroed first). Any split of K across programs gives the same integers; ``sc_finalize_kernel``
  then scales them with the same fp32 expression, in the same chunk order, as mode 0.

Both are launched with ``enable_fp_fusion=False``: a fused multiply-add rounds once where torch
rounds twice, so without it the output would differ from the torch reference in the last bit.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _block_counts(
    qa_base,
    qb_base,
    table_ptr,
    offs_m,
    offs_n,
    k0,
    k_end,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    QMAX: tl.constexpr,
    WP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PHASES: tl.constexpr,
    GATHER: tl.constexpr,
):
    """int32 [BLOCK_M, BLOCK_N]: sum of T over k in [k0, min(k0 + BLOCK_K, k_end)).

    Rows beyond M and columns beyond N read q = 0 (a valid table index) and are never stored.
    """
    W = 2 * QMAX + 1
    offs_k = k0 + tl.arange(0, BLOCK_K)
    k_mask = offs_k < k_end
    # Masked-off elements load q = 0, so every index stays inside the table; their values are
    # zeroed below instead.
    a = (
        tl.load(qa_base + offs_m[:, None] * s_am + offs_k[None, :] * s_ak, mask=k_mask[None, :], other=0).to(tl.int32)
        + QMAX
    )  # [BM, BK]
    b = (
        tl.load(qb_base + offs_k[:, None] * s_bk + offs_n[None, :] * s_bn, mask=k_mask[:, None], other=0).to(tl.int32)
        + QMAX
    )  # [BK, BN]
    row = a
    if PHASES == 2:  # a sequence alternates with k's parity: the second table follows the first
        row += ((offs_k % 2) * W)[None, :]
    if GATHER == 1:
        cols = tl.arange(0, WP)
        rows = tl.load(table_ptr + row[:, :, None] * WP + cols[None, None, :])  # [BM, BK, WP]
        idx = tl.broadcast_to(b[None, :, :], (row.shape[0], BLOCK_K, b.shape[1]))
        t = tl.gather(rows, idx, 2)  # [BM, BK, BN]
    else:
        t = tl.load(table_ptr + row[:, :, None] * WP + b[None, :, :])  # [BM, BK, BN]
    t = tl.where(k_mask[None, :, None], t.to(tl.int32), 0)
    return tl.sum(t, axis=1)


@triton.jit
def _store_output(ptrs, acc, mask, BF16_BITS: tl.constexpr):
    """Store fp32 results in the output's element type. For bf16 the output is passed as int16
    and rounded here, to nearest even, by integer arithmetic: the interpreter's own bf16 cast
    truncates, and both tiers must give the bits of torch's ``.to(torch.bfloat16)`` (finite
    values; inf stays inf). NaN (a non-finite input's flag, see labkit.kernels.sc.matmul) is stored as
    the quiet NaN 0x7FC0: rounding its bits would not do, as a GPU's canonical fp32 NaN
    0x7FFFFFFF plus the rounding increment wraps to 0x8000, i.e. -0.0, a silent wrong answer."""
    if BF16_BITS:
        bits = acc.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        half = tl.where(acc == acc, bits >> 16, 0x7FC0)
        tl.store(ptrs, half.to(tl.int16), mask=mask)
    else:
        tl.store(ptrs, acc, mask=mask)


@triton.jit
def sc_kernel(
    qa_ptr,  # *int8 [H, M, K]: quantised a, values in [-QMAX, QMAX]
    qb_ptr,  # *int8 [H, K, N]: quantised b
    table_ptr,  # *int16 [PHASES * (2Q+1), WP]: 2 * XNOR-count - L per (k parity, q_a, q_b)
    sa_ptr,  # *fp32 [H, C, M]: a's scale per chunk and row, times Q*Q/L   (MODE 0)
    sb_ptr,  # *fp32 [H, C, N]: b's scale per chunk and column             (MODE 0)
    out_ptr,  # MODE 0: [H, M, N] in the output dtype; MODE 1: *int32 [H*C, M, N], zeroed
    M,
    N,
    K,  # problem sizes
    CHUNK,  # K-chunk length (K when there is one chunk)
    NUM_CHUNKS,  # C = ceil(K / CHUNK)
    SPLIT_LEN,  # K range per program along grid axis 2 (K when MODE 0)
    SPLITS,  # programs per head along grid axis 2 (1 when MODE 0)
    s_ah,
    s_am,
    s_ak,  # strides of qa, in elements
    s_bh,
    s_bk,
    s_bn,  # strides of qb
    s_oh,
    s_om,
    s_on,  # strides of out (the first one steps over h, or h*C + c in MODE 1)
    QMAX: tl.constexpr,  # 2**(sc_prec-1) - 1
    WP: tl.constexpr,  # table row length: next power of two >= 2Q+1
    BLOCK_M: tl.constexpr,  # output rows per program
    BLOCK_N: tl.constexpr,  # output columns per program
    BLOCK_K: tl.constexpr,  # K steps looked up at once
    MODE: tl.constexpr,  # 0 scaled output, 1 atomic int32 counts per chunk
    PHASES: tl.constexpr,  # 1, or 2 when a stream's sequence alternates with k's parity
    GATHER: tl.constexpr,  # 0 global lookups, 1 table rows + tl.gather
    BF16_BITS: tl.constexpr,  # out is a bf16 tensor viewed as int16 (MODE 0)
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    h = tl.program_id(2) // SPLITS
    split = tl.program_id(2) % SPLITS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    tile = m_mask[:, None] & n_mask[None, :]
    # Out-of-range rows and columns read row 0 / column 0 (valid) and are never stored.
    offs_m_safe = tl.where(m_mask, offs_m, 0)
    offs_n_safe = tl.where(n_mask, offs_n, 0)
    qa_base = qa_ptr + h.to(tl.int64) * s_ah
    qb_base = qb_ptr + h.to(tl.int64) * s_bh
    k_lo = split * SPLIT_LEN
    k_hi = tl.minimum(k_lo + SPLIT_LEN, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c in range(k_lo // CHUNK, tl.cdiv(k_hi, CHUNK)):  # the chunks this program touches
        k_start = tl.maximum(c * CHUNK, k_lo)
        k_end = tl.minimum((c + 1) * CHUNK, k_hi)
        counts = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k0 in range(k_start, k_end, BLOCK_K):
            counts += _block_counts(
                qa_base,
                qb_base,
                table_ptr,
                offs_m_safe,
                offs_n_safe,
                k0,
                k_end,
                s_am,
                s_ak,
                s_bk,
                s_bn,
                QMAX,
                WP,
                BLOCK_K,
                PHASES,
                GATHER,
            )
        if MODE == 0:
            hc = (h * NUM_CHUNKS + c).to(tl.int64)
            sa = tl.load(sa_ptr + hc * M + offs_m_safe)
            sb = tl.load(sb_ptr + hc * N + offs_n_safe)
            acc += counts.to(tl.float32) * (sa[:, None] * sb[None, :])
        else:
            row = (h * NUM_CHUNKS + c).to(tl.int64) * s_oh
            tl.atomic_add(
                out_ptr + row + offs_m[:, None] * s_om + offs_n[None, :] * s_on, counts, mask=tile, sem="relaxed"
            )
    if MODE == 0:
        _store_output(
            out_ptr + h.to(tl.int64) * s_oh + offs_m[:, None] * s_om + offs_n[None, :] * s_on, acc, tile, BF16_BITS
        )


@triton.jit
def sc_finalize_kernel(
    counts_ptr,  # *int32 [H*C, M, N]: exact counts per chunk (MODE 1 of sc_kernel)
    sa_ptr,  # *fp32 [H, C, M]: a's scale per chunk and row, times Q*Q/L
    sb_ptr,  # *fp32 [H, C, N]: b's scale per chunk and column
    out_ptr,  # [H, M, N] in the output dtype
    M,
    N,
    NUM_CHUNKS,
    s_oh,
    s_om,
    s_on,  # strides of out
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BF16_BITS: tl.constexpr,  # out is a bf16 tensor viewed as int16
):
    """out = sum over chunks, in order, of counts * (sa * sb): the same fp32 steps as MODE 0."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    h = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    tile = m_mask[:, None] & n_mask[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c in range(0, NUM_CHUNKS):
        hc = (h * NUM_CHUNKS + c).to(tl.int64)
        counts = tl.load(counts_ptr + hc * M * N + offs_m[:, None] * N + offs_n[None, :], mask=tile, other=0)
        sa = tl.load(sa_ptr + hc * M + offs_m, mask=m_mask, other=0.0)
        sb = tl.load(sb_ptr + hc * N + offs_n, mask=n_mask, other=0.0)
        acc += counts.to(tl.float32) * (sa[:, None] * sb[None, :])
    _store_output(
        out_ptr + h.to(tl.int64) * s_oh + offs_m[:, None] * s_om + offs_n[None, :] * s_on, acc, tile, BF16_BITS
    )


@triton.jit
def quantize_rows_kernel(
    x_ptr,  # [H, M, K] fp16/bf16/fp32 (any strides)
    q_ptr,  # *int8 [H, M, K], contiguous: clamp(round_half_even(x / s), -Q, Q)
    s_ptr,  # *fp32 [H, C, M]: s * SA_FACTOR, s = amax / Q of the row's chunk (1 if 0)
    M,
    K,
    CHUNK,  # K-chunk length (K when there is one chunk)
    NUM_CHUNKS,
    s_xh,
    s_xm,
    s_xk,  # strides of x
    SA_FACTOR,  # Q * Q / L (exact in fp32)
    QMAX: tl.constexpr,
    BLOCK: tl.constexpr,  # elements per step along K
):
    """The per_row quantisation of a, fused: one program per row, two passes per chunk.

    NaN and +-inf are left out of the scale and quantised as 0, and the (row, chunk) scale that
    held one is stored as NaN: the flag that makes the row's outputs NaN (``encoding.finite_part``
    and ``quantize_a_torch`` do the same in torch). One compare per element, no extra pass.

    Bit-identical to ``labkit.kernels.sc.matmul.quantize_a_torch`` (tested): both divide with IEEE rounding
    (``div_rn``; Triton's plain ``/`` on fp32 is an approximate division) and round half to even
    (adding and subtracting 1.5 * 2**23 does that exactly for |v| < 2**22 in fp32).
    """
    r = tl.program_id(0)
    h = r // M
    m = r % M
    x_row = x_ptr + h.to(tl.int64) * s_xh + m.to(tl.int64) * s_xm
    q_row = q_ptr + r.to(tl.int64) * K
    offs = tl.arange(0, BLOCK)
    for c in range(0, NUM_CHUNKS):
        k_lo = c * CHUNK
        k_hi = tl.minimum(k_lo + CHUNK, K)
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        nonfinite = tl.zeros((BLOCK,), dtype=tl.int32)
        for k0 in range(k_lo, k_hi, BLOCK):
            k = k0 + offs
            x = tl.load(x_row + k * s_xk, mask=k < k_hi, other=0.0).to(tl.float32)
            finite = tl.abs(x) < float("inf")  # False for NaN and +-inf
            amax = tl.maximum(amax, tl.where(finite, tl.abs(x), 0.0))
            nonfinite = tl.maximum(nonfinite, tl.where(finite, 0, 1))
        top = tl.max(amax, axis=0)
        s = tl.math.div_rn(top, tl.full((), QMAX, tl.float32))
        s = tl.where(top > 0, s, 1.0)
        for k0 in range(k_lo, k_hi, BLOCK):
            k = k0 + offs
            x = tl.load(x_row + k * s_xk, mask=k < k_hi, other=0.0).to(tl.float32)
            x = tl.where(tl.abs(x) < float("inf"), x, 0.0)
            v = tl.math.div_rn(x, tl.zeros_like(x) + s)
            v = (v + 12582912.0) - 12582912.0  # round half to even
            v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
            tl.store(q_row + k, v.to(tl.int8), mask=k < k_hi)
        flagged = tl.max(nonfinite, axis=0) > 0
        tl.store(s_ptr + (h * NUM_CHUNKS + c).to(tl.int64) * M + m, tl.where(flagged, float("nan"), s * SA_FACTOR))
