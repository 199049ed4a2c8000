"""``sc_matmul(a, b)``: a stochastic-computing matrix product, checked, guarded and exact.

Options (the seed story's run used sc_prec=8, stoc_len=256, "halve", "bitrev", per_row):

* ``sc_prec``: bits per quantised value, 2..8: values in [-Q, Q], Q = 2**(sc_prec-1) - 1.
* ``stoc_len``: bits per stream L, a power of two from 2 to 4096. Precision grows like sqrt(L).
* ``granularity``: the scale groups. ``per_tensor``: one scale for all of a, one for all of b.
  ``per_row``: one per row of a and one per column of b (per head, for 3-D inputs).
  ``per_head``: 3-D inputs [H, M, K] @ [H, K, N] only: one scale per head for a and for b.
* ``chunk_d``: 0 for one chunk; otherwise K is split into chunks of this length (the last may
  be shorter), each with its own scales, and the chunk results are summed in fp32 in order.
  This is the path of the story's MLP down-projection (long K).
* ``a_seq`` / ``b_seq``: threshold sequences of a's and b's streams ("bitrev" / "counter_alt";
  also "counter", whose error adds up over K: see labkit.kernels.sc.encoding).
* ``halve``: thresholds at the middle of each 1/L interval (see labkit.kernels.sc.encoding).

out = sum over chunks c of S_c * (s_a,c * Q * Q / L) * s_b,c, where S_c sums (2 C - L) over the
chunk's K and C counts the agreeing bits of the two streams. Everything that decides bits is
integer or exact IEEE arithmetic, so the same inputs give the same bits on any GPU.

Non-finite inputs (NaN, +-inf): out[i, j] is NaN exactly when row i of a or column j of b holds
a NaN or an inf; every other output is what the same inputs give with those entries set to 0.
Quantisation alone would turn a NaN into some finite level (a silent wrong answer), so the
non-finite entries are left out of the scales and quantised as 0 (``encoding.finite_part``) and
the scale of every (row, chunk) of a and (chunk, column) of b that held one is stored as NaN:
each output is a sum of counts * (sa * sb) over chunks, so that NaN reaches exactly the outputs
of the row / column, in every launch path and in the reference, at no cost in the product
kernels. inf gives NaN rather than torch's +-inf: the sign (or NaN, for inf * 0 or inf - inf)
of torch's result depends on the signs of the other operand's entries along K, which would take
a second product to work out; NaN says "no meaningful value" and is never a finite wrong answer.
The check is device-side (no host sync): a compare per element in the fused quantisation of a,
an isfinite pass plus a where over b (once per ``prepare_b``) and over a for the other
granularities.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch
import triton

from labkit.kernels.sc import encoding
from labkit.kernels.sc.kernel import quantize_rows_kernel, sc_finalize_kernel, sc_kernel
from labkit.workbench import tier
from labkit.workbench.checks import check_tensor
from labkit.workbench.guard import common_device, on_device_of

GRANULARITIES = ("per_tensor", "per_row", "per_head")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SCConfig:
    sc_prec: int = 8
    stoc_len: int = 256
    granularity: str = "per_row"
    chunk_d: int = 0
    a_seq: str = "bitrev"
    b_seq: str = "counter_alt"
    halve: bool = False

    def check(self, ndim: int) -> None:
        if not (isinstance(self.sc_prec, int) and 2 <= self.sc_prec <= 8):
            raise ValueError(f"sc_prec: expected an int from 2 to 8, got {self.sc_prec!r}")
        L = self.stoc_len
        if not (isinstance(L, int) and 2 <= L <= 4096 and L & (L - 1) == 0):
            raise ValueError(f"stoc_len: expected a power of two from 2 to 4096, got {L!r}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity: {self.granularity!r} is not one of {GRANULARITIES}")
        if self.granularity == "per_head" and ndim != 3:
            raise ValueError(f"granularity='per_head' needs 3-D inputs [H, M, K] @ [H, K, N]; got {ndim}-D")
        if not (isinstance(self.chunk_d, int) and self.chunk_d >= 0):
            raise ValueError(f"chunk_d: expected an int >= 0 (0 = one chunk), got {self.chunk_d!r}")
        for name in ("a_seq", "b_seq"):
            if getattr(self, name) not in encoding.SEQUENCES:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of {encoding.SEQUENCES}")


@functools.lru_cache(maxsize=64)
def _table(cfg: SCConfig, device: torch.device) -> torch.Tensor:
    """The kernel's table: count_table as int16 [phases * (2Q+1), WP], rows zero-padded to a power
    of two (tl.arange and tl.gather need one). |2C - L| <= L <= 4096 fits int16."""
    t = encoding.count_table(cfg.sc_prec, cfg.stoc_len, cfg.a_seq, cfg.b_seq, cfg.halve)
    P, W, _ = t.shape
    padded = torch.zeros(P * W, triton.next_power_of_2(W), dtype=torch.int16)
    padded[:, :W] = t.reshape(P * W, W)
    return padded.to(device)


def _check_inputs(a, b, cfg: SCConfig) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    common_device(a=a, b=b)  # mixed devices first: the most telling message
    check_tensor("a", a, dtypes=DTYPES, contiguous=False)
    check_tensor("b", b, dtypes=DTYPES, contiguous=False)
    if a.dim() not in (2, 3) or b.dim() != a.dim():
        raise ValueError(
            f"a, b: expected both 2-D ([M, K] @ [K, N]) or both 3-D ([H, M, K] @ [H, K, N]);"
            f" got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise TypeError(f"a, b: dtypes differ ({a.dtype} and {b.dtype})")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"a, b: K mismatch: a has K={a.shape[-1]} (shape {tuple(a.shape)}),"
            f" b has K={b.shape[-2]} (shape {tuple(b.shape)})"
        )
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"a, b: head counts differ: {a.shape[0]} and {b.shape[0]}")
    cfg.check(a.dim())


def _chunking(K: int, cfg: SCConfig) -> tuple[int, int]:
    chunk = cfg.chunk_d if 0 < cfg.chunk_d < K else max(K, 1)  # K = 0: no chunks at all
    return chunk, -(-K // chunk)


def quantize_a_torch(a3: torch.Tensor, cfg: SCConfig):
    """(qa [H,M,K] int8, sa [H,C,M] fp32 times Q*Q/L) in plain torch: a's scale groups are rows,
    heads or all. The definition; ``quantize_a`` runs a fused kernel for per_row."""
    H, M, K = a3.shape
    chunk, C = _chunking(K, cfg)
    # Zero padding never raises an amax; the padded part is cut off again after quantising.
    av = torch.nn.functional.pad(a3.float(), (0, C * chunk - K)).view(H, M, C, chunk)
    av, nonfinite = encoding.finite_part(av)  # NaN / inf: left out here, flagged in sa below
    dims = {"per_tensor": (0, 1, 3), "per_row": (3,), "per_head": (1, 3)}[cfg.granularity]
    s = encoding.scales(av, dims, cfg.sc_prec)  # [H|1, M|1, C, 1]
    qa = encoding.quantize(av, s, cfg.sc_prec).view(H, M, C * chunk)[:, :, :K].contiguous()
    Q = encoding.qmax(cfg.sc_prec)
    sa = (s * (Q * Q / cfg.stoc_len)).expand(H, M, C, 1)[..., 0]  # [H, M, C]
    # The non-finite flag of each (row, chunk): a NaN scale makes the row's outputs NaN.
    sa = torch.where(nonfinite.any(dim=3), torch.full_like(sa, float("nan")), sa)
    return qa, sa.permute(0, 2, 1).contiguous()


def quantize_a(a3: torch.Tensor, cfg: SCConfig):
    """Like ``quantize_a_torch`` (bit-identical, tested); per_row runs as one fused Triton launch
    instead of about ten torch ops, which is most of an SC linear's cost at decode (M = 1)."""
    if cfg.granularity != "per_row":
        return quantize_a_torch(a3, cfg)
    H, M, K = a3.shape
    chunk, C = _chunking(K, cfg)
    Q = encoding.qmax(cfg.sc_prec)
    qa = torch.empty(H, M, K, dtype=torch.int8, device=a3.device)
    sa = torch.empty(H, C, M, dtype=torch.float32, device=a3.device)
    block = min(1024, triton.next_power_of_2(chunk))
    quantize_rows_kernel[(H * M,)](
        a3, qa, sa, M, K, chunk, C, *a3.stride(), Q * Q / cfg.stoc_len, QMAX=Q, BLOCK=block, num_warps=4
    )
    return qa, sa


@dataclasses.dataclass(frozen=True)
class PreparedB:
    """b quantised once (a layer's weight): reuse it for every product with the same options.

    sb carries b's non-finite flag: NaN in each (chunk, column) that held a NaN or an inf (whose
    entries are quantised as 0), so every product with this b has those output columns NaN."""

    qb: torch.Tensor  # [H, K, N] int8, N contiguous
    sb: torch.Tensor  # [H, C, N] fp32; NaN where the column's chunk holds a non-finite value
    cfg: SCConfig
    squeeze: bool  # b was 2-D

    @property
    def shape(self):
        return (self.qb.shape[1], self.qb.shape[2]) if self.squeeze else tuple(self.qb.shape)


def prepare_b(b: torch.Tensor, **options) -> PreparedB:
    """Quantise b [K, N] or [H, K, N] (columns of b are the scale groups of per_row)."""
    cfg = SCConfig(**options)
    check_tensor("b", b, dtypes=DTYPES, contiguous=False)
    if b.dim() not in (2, 3):
        raise ValueError(f"b: expected [K, N] or [H, K, N], got shape {tuple(b.shape)}")
    cfg.check(b.dim())
    b3 = b[None] if b.dim() == 2 else b
    with on_device_of(b=b):
        H, K, N = b3.shape
        chunk, C = _chunking(K, cfg)
        bv = torch.nn.functional.pad(b3.float(), (0, 0, 0, C * chunk - K)).view(H, C, chunk, N)
        bv, nonfinite = encoding.finite_part(bv)  # NaN / inf: left out here, flagged in sb below
        dims = {"per_tensor": (0, 2, 3), "per_row": (2,), "per_head": (2, 3)}[cfg.granularity]
        s = encoding.scales(bv, dims, cfg.sc_prec)  # [H|1, C, 1, N|1]
        qb = encoding.quantize(bv, s, cfg.sc_prec).view(H, C * chunk, N)[:, :K, :].contiguous()
        sb = s.expand(H, C, 1, N)[:, :, 0, :]  # [H, C, N]
        # The non-finite flag of each (chunk, column): a NaN scale makes the column's outputs NaN.
        sb = torch.where(nonfinite.any(dim=2), torch.full_like(sb, float("nan")), sb).contiguous()
    return PreparedB(qb, sb, cfg, b.dim() == 2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How sc_kernel is launched. Chosen from the shapes alone (never from the GPU), so the same
    inputs take the same path, and give the same bits, on any GPU."""

    gather: int  # 0 global lookups, 1 table rows + tl.gather (see labkit.kernels.sc.kernel)
    block_m: int
    block_n: int
    block_k: int
    splits: int  # programs along K per head; > 1 means atomic counts + finalize kernel
    num_warps: int = 4


# Enough programs to fill a GPU of ~132 SMs a few times over: below this, K is split.
TARGET_PROGRAMS = 528
# Never spend more than this on the int32 counts buffer of the split path.
MAX_COUNTS_BYTES = 256 << 20


def split_k(tiles: int, K: int, block_k: int) -> int:
    """How many programs share K when ``tiles`` output tiles alone would leave the GPU idle:
    enough for TARGET_PROGRAMS in all, keeping at least 4 K-blocks per program."""
    return max(1, min(triton.cdiv(TARGET_PROGRAMS, tiles), K // (4 * block_k)))


def launch_config(H: int, M: int, N: int, K: int, C: int) -> LaunchConfig:
    """Defaults from the sweep in reference/h200x2/wrong_device_sc_launch.json
    (``labkit bench wrong_device_sc_launch``):
    global lookups beat gathered rows at every shape measured there (tl.gather stages the rows
    through shared memory on every call, three memory operations per lookup instead of one),
    and a decode step needs K split across programs to fill the GPU."""
    if tier.interpreted():
        # The interpreter runs programs and K steps one after another in Python, each on numpy
        # blocks: few, wider blocks (a TINY decode's linears: 4 to 9 times faster than 16 x 8,
        # the same bits). The split path (atomic counts + finalize) stays exercised by the CPU
        # tier through M = 1.
        bm = max(1, min(4, triton.next_power_of_2(M)))
        return LaunchConfig(gather=0, block_m=bm, block_n=64, block_k=16, splits=2 if M == 1 else 1)
    if M <= 4:  # decode: one row block per program, K split across programs
        cfg = LaunchConfig(gather=0, block_m=triton.next_power_of_2(M), block_n=256, block_k=8, splits=1)
    else:
        cfg = LaunchConfig(gather=0, block_m=4, block_n=256, block_k=4, splits=1)
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n) * H
    if M <= 4 and tiles < TARGET_PROGRAMS and H * C * M * N * 4 <= MAX_COUNTS_BYTES:
        cfg = dataclasses.replace(cfg, splits=split_k(tiles, K, cfg.block_k))
    return cfg


def _as_stored(out: torch.Tensor) -> torch.Tensor:
    """The kernels write bf16 results as rounded int16 bit patterns (see kernel._store_output)."""
    return out.view(torch.int16) if out.dtype == torch.bfloat16 else out


def _launch(
    qa,
    qb,
    table,
    sa,
    sb,
    chunk,
    C,
    cfg: SCConfig,
    out_dtype,
    counts_only: bool = False,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Counts [H*C, M, N] int32 (counts_only) or the scaled product [H, M, N] in out_dtype."""
    H, M, K = qa.shape
    N = qb.shape[2]
    lc = config or launch_config(H, M, N, K, C)
    Q = encoding.qmax(cfg.sc_prec)
    const = dict(
        QMAX=Q,
        WP=table.shape[1],
        BLOCK_M=lc.block_m,
        BLOCK_N=lc.block_n,
        BLOCK_K=lc.block_k,
        PHASES=encoding.phases(cfg.a_seq, cfg.b_seq),
        GATHER=lc.gather,
        num_warps=lc.num_warps,
        enable_fp_fusion=False,
    )
    grid_mn = (triton.cdiv(M, lc.block_m), triton.cdiv(N, lc.block_n))
    if lc.splits == 1 and not counts_only:
        out = torch.empty(H, M, N, dtype=out_dtype, device=qa.device)
        sc_kernel[grid_mn + (H,)](
            qa,
            qb,
            table,
            sa,
            sb,
            _as_stored(out),
            M,
            N,
            K,
            chunk,
            C,
            K,
            1,
            *qa.stride(),
            *qb.stride(),
            *out.stride(),
            MODE=0,
            BF16_BITS=out_dtype == torch.bfloat16,
            **const,
        )
        return out
    counts = torch.zeros(H * C, M, N, dtype=torch.int32, device=qa.device)
    split_len = triton.cdiv(triton.cdiv(K, lc.splits), lc.block_k) * lc.block_k
    splits = triton.cdiv(K, split_len)
    sc_kernel[grid_mn + (H * splits,)](
        qa,
        qb,
        table,
        sa,
        sb,
        counts,
        M,
        N,
        K,
        chunk,
        C,
        split_len,
        splits,
        *qa.stride(),
        *qb.stride(),
        *counts.stride(),
        MODE=1,
        BF16_BITS=False,
        **const,
    )
    return counts if counts_only else _finalize(counts, sa, sb, H, M, N, C, out_dtype)


def _finalize(counts: torch.Tensor, sa, sb, H: int, M: int, N: int, C: int, out_dtype) -> torch.Tensor:
    """The scaled product [H, M, N] in out_dtype from the split launches' counts [H*C, M, N]."""
    out = torch.empty(H, M, N, dtype=out_dtype, device=counts.device)
    bm, bn = min(16, triton.next_power_of_2(M)), 128
    sc_finalize_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn), H)](
        counts,
        sa,
        sb,
        _as_stored(out),
        M,
        N,
        C,
        *out.stride(),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BF16_BITS=out_dtype == torch.bfloat16,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out


def sc_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    sc_prec: int = 8,
    stoc_len: int = 256,
    granularity: str = "per_row",
    chunk_d: int = 0,
    a_seq: str = "bitrev",
    b_seq: str = "counter_alt",
    halve: bool = False,
) -> torch.Tensor:
    """SC product of a [M, K] @ b [K, N] (or [H, M, K] @ [H, K, N]); fp32 sums, output in a.dtype.

    out[i, j] is NaN where row i of a or column j of b holds a NaN or +-inf (see the module
    docstring); the other outputs are unaffected by those entries.

    Runs on the device of a and b (never the current device), under labkit's device guard.
    """
    cfg = SCConfig(
        sc_prec=sc_prec,
        stoc_len=stoc_len,
        granularity=granularity,
        chunk_d=chunk_d,
        a_seq=a_seq,
        b_seq=b_seq,
        halve=halve,
    )
    _check_inputs(a, b, cfg)
    return sc_matmul_prepared(a, prepare_b(b, **dataclasses.asdict(cfg)))


def sc_matmul_prepared(
    a: torch.Tensor, w: PreparedB, *, guarded: bool = True, config: LaunchConfig | None = None
) -> torch.Tensor:
    """SC product of a with an already quantised b (see prepare_b).

    guarded=False launches on whatever device is current, without labkit's device guard: the
    seed story's bug, kept only for the wrong-device experiments. config: force a launch
    configuration (tuning and tests); by default ``launch_config`` picks one from the shapes."""
    if not isinstance(w, PreparedB):
        raise TypeError(f"w: expected a PreparedB from labkit.kernels.sc.prepare_b, got {type(w).__name__}")
    check_tensor("a", a, dtypes=DTYPES, contiguous=False)
    common_device(a=a, w=w.qb)
    if (
        a.dim() != (2 if w.squeeze else 3)
        or a.shape[-1] != w.qb.shape[1]
        or (not w.squeeze and a.shape[0] != w.qb.shape[0])
    ):
        raise ValueError(
            f"a: shape {tuple(a.shape)} does not fit the prepared b of shape {w.shape}"
            " (K must match; 3-D needs the same number of heads)"
        )
    a3 = a[None] if w.squeeze else a
    guard = on_device_of(a=a, w=w.qb) if guarded else contextlib.nullcontext(a.device)
    with guard as dev:
        H, M, K = a3.shape
        N = w.qb.shape[2]
        if M == 0 or N == 0 or K == 0:
            out = torch.zeros(H, M, N, dtype=a.dtype, device=dev)
        else:
            qa, sa = quantize_a(a3, w.cfg)
            chunk, C = _chunking(K, w.cfg)
            out = _launch(qa, w.qb, _table(w.cfg, dev), sa, w.sb, chunk, C, w.cfg, a.dtype, config=config)
    return out[0] if w.squeeze else out


def _quantized(a, b, cfg: SCConfig, fused: bool = True):
    a3 = a[None] if a.dim() == 2 else a
    w = prepare_b(b, **dataclasses.asdict(cfg))
    qa, sa = (quantize_a if fused else quantize_a_torch)(a3, cfg)
    chunk, C = _chunking(a3.shape[2], cfg)
    return qa, sa, w.qb, w.sb, chunk, C


def sc_counts(
    a: torch.Tensor, b: torch.Tensor, *, impl: str = "triton", config: LaunchConfig | None = None, **options
) -> torch.Tensor:
    """The exact integer sums S[h, c, m, n] per chunk, from the kernel or the literal reference.

    For tests and teaching: the two must be identical on any input.
    """
    from labkit.kernels.sc.reference import chunk_counts

    cfg = SCConfig(**options)
    _check_inputs(a, b, cfg)
    if impl not in ("triton", "reference"):
        raise ValueError(f"impl: {impl!r} is not 'triton' or 'reference'")
    with on_device_of(a=a, b=b) as dev:
        qa, sa, qb, sb, chunk, C = _quantized(a, b, cfg)
        if impl == "reference":
            return chunk_counts(qa, qb, chunk, cfg.sc_prec, cfg.stoc_len, cfg.a_seq, cfg.b_seq, cfg.halve)
        H, M, K = qa.shape
        return (
            _launch(qa, qb, _table(cfg, dev), sa, sb, chunk, C, cfg, torch.float32, counts_only=True, config=config)
            .view(H, C, M, qb.shape[2])
            .to(torch.int64)
        )


def sc_matmul_reference(a: torch.Tensor, b: torch.Tensor, **options) -> torch.Tensor:
    """The same product from the literal bitstreams, with the kernel's float steps (for tests)."""
    cfg = SCConfig(**options)
    _check_inputs(a, b, cfg)
    from labkit.kernels.sc.reference import chunk_counts

    qa, sa, qb, sb, chunk, C = _quantized(a, b, cfg, fused=False)
    S = chunk_counts(qa, qb, chunk, cfg.sc_prec, cfg.stoc_len, cfg.a_seq, cfg.b_seq, cfg.halve)  # [H, C, M, N]
    out = torch.zeros(S.shape[0], S.shape[2], S.shape[3], dtype=torch.float32, device=a.device)
    for c in range(C):
        out += S[:, c].float() * (sa[:, c, :, None] * sb[:, c, None, :])
    out = out.to(a.dtype)
    return out[0] if a.dim() == 2 else out
