"""The grouped GEMM's Triton kernels; ``labkit.kernels.grouped_gemm`` (whose docstring is the
spec: the persistent schedule, the clamped counts, TMA, the flat loop) checks inputs and launches
them.

* ``_grouped_mm_kernel``: out[rows of e] = x[rows of e] @ w[e] (+ bias[e]) for every expert, a
  persistent grid walking the experts' ragged row ranges read from ``m_splits`` on the device;
  ``_mm_tile`` is one output tile of it (the K loop, bias, the masked store). Also dgrad, given
  ``w.transpose(1, 2)``.
* ``_grouped_wgrad_kernel``: dW[e] = x[rows of e]^T @ dy[rows of e], a fixed number of tiles per
  expert, each reducing over that expert's tokens; ``_wgrad_tile`` is one tile of it (whole steps,
  the partial last step, the epilogue that adds into out[e] where asked).
* ``_tile_of``: the L2 swizzle that orders an expert's tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_of(local, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(tile-row, tile-column) of an expert's ``local``-th tile: tile-rows in groups of GROUP_M,
    down a group's rows first, so programs running together share a few column blocks in L2."""
    per_group = GROUP_M * tiles_n
    group_first_m = (local // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - group_first_m, GROUP_M)
    return group_first_m + (local % per_group) % group_rows, (local % per_group) // group_rows


@triton.jit
def _grouped_mm_kernel(
    x_ptr,  # *T: x[0, 0]; x is [M, K], expert 0's rows first, then expert 1's, ...
    w_ptr,  # *T: w[0, 0, 0]; w is [E, K, N] with any strides (a transposed view for dgrad)
    out_ptr,  # *T: out[0, 0]; [M, N] with column stride 1
    bias_ptr,  # *T: bias[0, 0]; [E, N] with column stride 1 (read only if HAS_BIAS)
    counts_ptr,  # *int32 or *int64: m_splits, [E], on the device; never read by the host
    M,
    N,
    K,
    E,  # int: sizes; the counts are clamped so that no expert's rows pass M
    stride_xm,
    stride_xk,  # int: elements between rows / columns of x
    stride_we,
    stride_wk,
    stride_wn,  # int: elements between experts / rows / columns of w
    stride_om,  # int: elements between rows of out
    stride_be,  # int: elements between experts of bias
    BLOCK_M: tl.constexpr,  # rows of an output tile (along an expert's tokens)
    BLOCK_N: tl.constexpr,  # columns of an output tile
    BLOCK_K: tl.constexpr,  # depth of one step of the reduction over K
    GROUP_M: tl.constexpr,  # tile-rows per swizzle group (L2 reuse of w's columns)
    HAS_BIAS: tl.constexpr,  # add bias[e] to expert e's rows
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K
    UPCAST: tl.constexpr,  # convert tiles to fp32 before tl.dot (interpreter + bf16)
    INPUT_PRECISION: tl.constexpr,  # "ieee" or "tf32": tl.dot on fp32 inputs
    INT64: tl.constexpr,  # element offsets in int64 (an operand spans >= 2**31 elements)
    USE_TMA: tl.constexpr,  # load x and w tiles through TMA descriptors (16-byte aligned, one unit stride each)
    W_KMAJOR: tl.constexpr,  # with USE_TMA: w's unit stride is along K (dgrad's w.transpose(1, 2))
    FLAT: tl.constexpr = False,  # one loop over every expert's tiles, fused with the K loop
    WARP_SPECIALIZE: tl.constexpr = False,  # with FLAT: warp-specialise that loop (loads and dots in separate warps)
    E_LANES: tl.constexpr = 1,  # with FLAT: a power of two >= E (the counts as one vector)
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if USE_TMA:
        # Tensor-memory-accelerator descriptors: the copy engine fetches whole tiles and fills
        # what lies outside a tensor's bounds with zeros. w's is 3-D, so a tile never reads
        # past its own expert's K rows; x's rows past an expert's end belong to the next
        # expert: computed, never stored.
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
        if W_KMAJOR:  # tiles of w[e]^T as stored, [BLOCK_N, BLOCK_K], transposed in registers
            w_desc = tl.make_tensor_descriptor(
                w_ptr, shape=[E, N, K], strides=[stride_we, stride_wn, 1], block_shape=[1, BLOCK_N, BLOCK_K]
            )
        else:
            w_desc = tl.make_tensor_descriptor(
                w_ptr, shape=[E, K, N], strides=[stride_we, stride_wk, 1], block_shape=[1, BLOCK_K, BLOCK_N]
            )
    else:
        x_desc = x_ptr  # not read: the tile loads go through pointers
        w_desc = w_ptr
    if FLAT:
        # Every expert's clamped count and tile count as vectors, once per program: expert e's
        # rows start at min(c[e-1], M) for c the running sum of the non-negative counts, so no
        # expert's rows pass M (what the per-expert loop below computes one expert at a time).
        lanes = tl.arange(0, E_LANES)
        counts = tl.maximum(tl.load(counts_ptr + lanes, mask=lanes < E, other=0).to(tl.int32), 0)
        ends = tl.cumsum(counts, 0)
        rows = tl.minimum(ends, M) - tl.minimum(ends - counts, M)  # each expert's clamped count
        tiles = tl.cdiv(rows, BLOCK_M) * tiles_n
        tile_ends = tl.cumsum(tiles, 0)
        for tile in tl.range(pid, tl.sum(tiles, 0), programs, flatten=True, warp_specialize=WARP_SPECIALIZE):
            e = tl.sum((tile_ends <= tile).to(tl.int32), 0)  # the expert whose tiles hold ``tile``
            before = lanes < e
            _mm_tile(
                x_ptr, w_ptr, out_ptr, bias_ptr, x_desc, w_desc,
                e, tl.sum(tl.where(before, rows, 0), 0), tl.sum(tl.where(lanes == e, rows, 0), 0),
                tile - tl.sum(tl.where(before, tiles, 0), 0), tiles_n, N, K,
                stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_om, stride_be,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                HAS_BIAS, EVEN_K, UPCAST, INPUT_PRECISION, INT64, USE_TMA, W_KMAJOR,
            )  # fmt: skip
    else:
        tile = pid  # the next tile (in the global numbering) this program computes
        first_tile = 0  # global number of expert e's first tile
        row0 = 0  # expert e's first row in x and out: a running sum of the counts
        for e in range(E):
            # The one place m_splits is read: by every program, on the device. Negative counts
            # count as 0; no expert's rows run past row M (a wrong count cannot fault).
            m = tl.load(counts_ptr + e).to(tl.int32)
            m = tl.minimum(tl.maximum(m, 0), M - row0)
            expert_tiles = tl.cdiv(m, BLOCK_M) * tiles_n
            while tile < first_tile + expert_tiles:
                _mm_tile(
                    x_ptr, w_ptr, out_ptr, bias_ptr, x_desc, w_desc,
                    e, row0, m, tile - first_tile, tiles_n, N, K,
                    stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_om, stride_be,
                    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                    HAS_BIAS, EVEN_K, UPCAST, INPUT_PRECISION, INT64, USE_TMA, W_KMAJOR,
                )  # fmt: skip
                tile += programs
            first_tile += expert_tiles
            row0 += m


@triton.jit
def _mm_tile(
    x_ptr, w_ptr, out_ptr, bias_ptr, x_desc, w_desc,
    e,  # the tile's expert
    row0,  # expert e's first row in x and out
    m,  # expert e's rows (clamped)
    local,  # the tile's number among expert e's tiles
    tiles_n, N, K,
    stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_om, stride_be,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    INT64: tl.constexpr, USE_TMA: tl.constexpr, W_KMAJOR: tl.constexpr,
):  # fmt: skip
    """One output tile of ``_grouped_mm_kernel`` (its arguments as the kernel's): the reduction
    over K, then bias and the masked store."""
    tile_m, tile_n = _tile_of(local, tl.cdiv(m, BLOCK_M), tiles_n, GROUP_M)
    ks = tl.arange(0, BLOCK_K)
    rows = row0 + tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < row0 + m
    # Rows past the expert's end load a valid row of its own (row0) instead of being
    # masked: loads stay unmasked along M, and those rows are never stored.
    rows_in = tl.where(row_ok, rows, row0)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    expert = tl.cast(e, tl.int64) if INT64 else e
    if INT64:
        rows_in = rows_in.to(tl.int64)
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
    x_ptrs = x_ptr + rows_in[:, None] * stride_xm + ks[None, :] * stride_xk
    w_ptrs = w_ptr + expert * stride_we + ks[:, None] * stride_wk + cols[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(tl.cdiv(K, BLOCK_K)):
        if USE_TMA:
            a = x_desc.load([row0 + tile_m * BLOCK_M, step * BLOCK_K])
            if W_KMAJOR:
                b = tl.trans(w_desc.load([e, tile_n * BLOCK_N, step * BLOCK_K]).reshape(BLOCK_N, BLOCK_K))
            else:
                b = w_desc.load([e, step * BLOCK_K, tile_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
        elif EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_left = K - step * BLOCK_K
            a = tl.load(x_ptrs, mask=ks[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=(ks[:, None] < k_left) & col_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + cols, mask=col_ok, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _grouped_wgrad_kernel(
    x_ptr,  # *T: x[0, 0]; [M, K], rows grouped by expert as in the forward
    dy_ptr,  # *T: dy[0, 0]; [M, N], the output gradient, same row grouping
    out_ptr,  # *fp32 or *T: out[0, 0, 0]; [E, K, N], column stride 1
    counts_ptr,  # *int32 or *int64: m_splits, [E], on the device
    accumulate_ptr,  # *int8: [E], 1 = add into out[e], 0 = overwrite (read if MODE == 2)
    M,
    K,
    N,
    E,  # int: sizes
    stride_xm,
    stride_xk,  # int: elements between rows / columns of x
    stride_dm,
    stride_dn,  # int: elements between rows / columns of dy
    stride_oe,
    stride_ok,  # int: elements between experts / rows of out
    BLOCK_M: tl.constexpr,  # rows of an output tile (along K)
    BLOCK_N: tl.constexpr,  # columns of an output tile (along N)
    BLOCK_K: tl.constexpr,  # tokens per step of the reduction (the ragged dimension)
    GROUP_M: tl.constexpr,  # tile-rows per swizzle group
    MODE: tl.constexpr,  # 0: overwrite every expert, 1: add into every expert, 2: per-expert mask
    UPCAST: tl.constexpr,  # convert tiles to fp32 before tl.dot (interpreter + bf16)
    INPUT_PRECISION: tl.constexpr,
    INT64: tl.constexpr,  # element offsets in int64
    EVEN: tl.constexpr,  # K % BLOCK_M == 0 and N % BLOCK_N == 0: no tile crosses out's edge
    USE_TMA: tl.constexpr,  # load x and dy tiles through TMA descriptors (16-byte aligned, unit column strides)
    TMA_STORE: tl.constexpr,  # with USE_TMA: store (and read back) out tiles through a descriptor (2-byte out)
    FLAT: tl.constexpr = False,  # one loop over every expert's tiles, fused with the reduction loop
    WARP_SPECIALIZE: tl.constexpr = False,  # with FLAT: warp-specialise that loop (loads and dots in separate warps)
    E_LANES: tl.constexpr = 1,  # with FLAT: a power of two >= E (the counts as one vector)
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if USE_TMA:
        # The copy engine moves whole tiles, and fills zeros only outside the tensor: rows past
        # an expert's end are the next expert's. So TMA loads only whole steps (phase 1, every
        # row e's own); the last, partial step masks its rows with pointer loads (phase 2).
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_K, BLOCK_M])
        dy_desc = tl.make_tensor_descriptor(
            dy_ptr, shape=[M, N], strides=[stride_dm, 1], block_shape=[BLOCK_K, BLOCK_N]
        )
    else:
        x_desc = x_ptr  # not read: the tile loads go through pointers
        dy_desc = dy_ptr
    if TMA_STORE:
        # 3-D, so a tile's store is clipped at its own expert's K rows and N columns. The tile is
        # staged in shared memory (BLOCK_M x BLOCK_N x 2 bytes beside the pipeline's stages):
        # 2-byte outs only, an fp32 tile of the large configs would not fit beside them.
        out_desc = tl.make_tensor_descriptor(
            out_ptr, shape=[E, K, N], strides=[stride_oe, stride_ok, 1], block_shape=[1, BLOCK_M, BLOCK_N]
        )
    else:
        out_desc = out_ptr  # not read: the tiles are stored through pointers
    tiles_m = tl.cdiv(K, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    expert_tiles = tiles_m * tiles_n  # the same for every expert: dW_e is K x N whatever m_e is
    if FLAT:
        # Every expert's first row and clamped count as vectors, once per program (what the
        # per-expert loop below computes one expert at a time): expert e's rows start at
        # min(c[e-1], M) for c the running sum of the non-negative counts. A tile's expert is its
        # number over expert_tiles, as every expert has that many.
        lanes = tl.arange(0, E_LANES)
        counts = tl.maximum(tl.load(counts_ptr + lanes, mask=lanes < E, other=0).to(tl.int32), 0)
        ends = tl.cumsum(counts, 0)
        starts = tl.minimum(ends - counts, M)
        rows = tl.minimum(ends, M) - starts
        for tile in tl.range(pid, E * expert_tiles, programs, flatten=True, warp_specialize=WARP_SPECIALIZE):
            e = tile // expert_tiles
            here = lanes == e
            m = tl.sum(tl.where(here, rows, 0), 0)
            _wgrad_tile(
                x_ptr, dy_ptr, out_ptr, accumulate_ptr, x_desc, dy_desc, out_desc,
                e, tl.sum(tl.where(here, starts, 0), 0), m, m - m % BLOCK_K,
                tile - e * expert_tiles, tiles_m, tiles_n, K, N,
                stride_xm, stride_xk, stride_dm, stride_dn, stride_oe, stride_ok,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, MODE, UPCAST, INPUT_PRECISION, INT64, EVEN, USE_TMA, TMA_STORE,
            )  # fmt: skip
    else:
        tile = pid
        first_tile = 0
        row0 = 0
        for e in range(E):
            m = tl.load(counts_ptr + e).to(tl.int32)
            m = tl.minimum(tl.maximum(m, 0), M - row0)
            full = m - m % BLOCK_K
            while tile < first_tile + expert_tiles:
                _wgrad_tile(
                    x_ptr, dy_ptr, out_ptr, accumulate_ptr, x_desc, dy_desc, out_desc,
                    e, row0, m, full, tile - first_tile, tiles_m, tiles_n, K, N,
                    stride_xm, stride_xk, stride_dm, stride_dn, stride_oe, stride_ok,
                    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, MODE, UPCAST, INPUT_PRECISION, INT64, EVEN, USE_TMA, TMA_STORE,
                )  # fmt: skip
                tile += programs
            first_tile += expert_tiles
            row0 += m


@triton.jit
def _wgrad_tile(
    x_ptr, dy_ptr, out_ptr, accumulate_ptr, x_desc, dy_desc, out_desc,
    e,  # the tile's expert
    row0,  # expert e's first row in x and dy
    m,  # expert e's rows (clamped)
    full,  # m - m % BLOCK_K: tokens in whole steps, which phase 1 reads without a row mask
    local,  # the tile's number among expert e's tiles
    tiles_m, tiles_n, K, N,
    stride_xm, stride_xk, stride_dm, stride_dn, stride_oe, stride_ok,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    MODE: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,
    EVEN: tl.constexpr, USE_TMA: tl.constexpr, TMA_STORE: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] tile of dW_e = x_e^T @ dy_e (``_grouped_wgrad_kernel``'s arguments):
    the reduction over the expert's m tokens in three phases."""
    rs = tl.arange(0, BLOCK_K)
    tile_m, tile_n = _tile_of(local, tiles_m, tiles_n, GROUP_M)
    kk = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_ok = kk < K
    n_ok = nn < N
    expert = tl.cast(e, tl.int64) if INT64 else e
    start = tl.cast(row0, tl.int64) if INT64 else row0
    if INT64:
        kk = kk.to(tl.int64)
        nn = nn.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # The reduction runs over expert e's m tokens: a loop whose length only the device
    # knows. A zero-token expert runs no step and gets dW_e = 0.
    # Phase 1: the whole steps. No row mask (every row is e's), so TMA tiles go from
    # shared memory to the tensor cores as loaded. Pointer loads: the first step's tile
    # pointers are made once and moved down BLOCK_K rows per step (as the forward's K loop
    # does), so the loop carries two pointer tiles instead of rebuilding both from the row
    # index each step; x's tile is read as stored, [BLOCK_K, BLOCK_M], and transposed in
    # registers.
    x_step = x_ptr + (start + rs)[:, None] * stride_xm + kk[None, :] * stride_xk
    dy_step = dy_ptr + (start + rs)[:, None] * stride_dm + nn[None, :] * stride_dn
    x_stride_step = BLOCK_K * (tl.cast(stride_xm, tl.int64) if INT64 else stride_xm)
    dy_stride_step = BLOCK_K * (tl.cast(stride_dm, tl.int64) if INT64 else stride_dm)
    for r in range(0, full, BLOCK_K):
        if USE_TMA:
            xt = tl.trans(x_desc.load([row0 + r, tile_m * BLOCK_M]))
            g = dy_desc.load([row0 + r, tile_n * BLOCK_N])
        else:
            if EVEN:
                xt = tl.trans(tl.load(x_step))  # [BLOCK_M, BLOCK_K] = x_e^T
                g = tl.load(dy_step)  # [BLOCK_K, BLOCK_N]
            else:
                xt = tl.trans(tl.load(x_step, mask=k_ok[None, :], other=0.0))
                g = tl.load(dy_step, mask=n_ok[None, :], other=0.0)
            x_step += x_stride_step
            dy_step += dy_stride_step
        if UPCAST:
            xt = xt.to(tl.float32)
            g = g.to(tl.float32)
        acc = tl.dot(xt, g, acc, input_precision=INPUT_PRECISION)
    # Phase 2: the last, partial step (m % BLOCK_K tokens), rows past e's end masked.
    if full < m:
        rows = start + full + rs
        r_ok = full + rs < m
        xt = tl.load(
            x_ptr + rows[None, :] * stride_xm + kk[:, None] * stride_xk,
            mask=r_ok[None, :] & k_ok[:, None],
            other=0.0,
        )
        g = tl.load(
            dy_ptr + rows[:, None] * stride_dm + nn[None, :] * stride_dn,
            mask=r_ok[:, None] & n_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            xt = xt.to(tl.float32)
            g = g.to(tl.float32)
        acc = tl.dot(xt, g, acc, input_precision=INPUT_PRECISION)
    # Phase 3: the epilogue, adding into out[e] where asked.
    add = MODE == 1
    if MODE == 2:
        add = tl.load(accumulate_ptr + e) != 0
    if TMA_STORE:
        where = [e, tile_m * BLOCK_M, tile_n * BLOCK_N]
        if add:
            acc += out_desc.load(where).reshape(BLOCK_M, BLOCK_N).to(tl.float32)
        out_desc.store(where, acc.to(out_ptr.dtype.element_ty).reshape(1, BLOCK_M, BLOCK_N))
    else:
        out_ptrs = out_ptr + expert * stride_oe + kk[:, None] * stride_ok + nn[None, :]
        ok = k_ok[:, None] & n_ok[None, :]
        if add:
            acc += tl.load(out_ptrs, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=ok)
