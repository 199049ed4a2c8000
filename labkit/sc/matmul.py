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
  also "counter", whose error adds up over K: see labkit.sc.encoding).
* ``halve``: thresholds at the middle of each 1/L interval (see labkit.sc.encoding).

out = sum over chunks c of S_c * (s_a,c * Q * Q / L) * s_b,c, where S_c sums (2 C - L) over the
chunk's K and C counts the agreeing bits of the two streams. Everything that decides bits is
integer or exact IEEE arithmetic, so the same inputs give the same bits on any GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch
import triton

from labkit import tier
from labkit.checks import check_tensor
from labkit.guard import common_device, on_device_of
from labkit.sc import encoding
from labkit.sc.kernel import sc_kernel

GRANULARITIES = ("per_tensor", "per_row", "per_head")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass(frozen=True)
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
    return encoding.count_table(cfg.sc_prec, cfg.stoc_len, cfg.a_seq, cfg.b_seq, cfg.halve).to(device)


def _check_inputs(a, b, cfg: SCConfig) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    common_device(a=a, b=b)  # mixed devices first: the most telling message
    check_tensor("a", a, dtypes=DTYPES, contiguous=False)
    check_tensor("b", b, dtypes=DTYPES, contiguous=False)
    if a.dim() not in (2, 3) or b.dim() != a.dim():
        raise ValueError(f"a, b: expected both 2-D ([M, K] @ [K, N]) or both 3-D ([H, M, K] @ [H, K, N]);"
                         f" got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a, b: dtypes differ ({a.dtype} and {b.dtype})")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a, b: K mismatch: a has K={a.shape[-1]} (shape {tuple(a.shape)}),"
                         f" b has K={b.shape[-2]} (shape {tuple(b.shape)})")
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"a, b: head counts differ: {a.shape[0]} and {b.shape[0]}")
    cfg.check(a.dim())


def _chunking(K: int, cfg: SCConfig) -> tuple[int, int]:
    chunk = cfg.chunk_d if 0 < cfg.chunk_d < K else max(K, 1)  # K = 0: no chunks at all
    return chunk, -(-K // chunk)


def quantize_a(a3: torch.Tensor, cfg: SCConfig):
    """(qa [H,M,K] int8, sa [H,C,M] fp32 times Q*Q/L): a's scale groups are rows, heads or all."""
    H, M, K = a3.shape
    chunk, C = _chunking(K, cfg)
    # Zero padding never raises an amax; the padded part is cut off again after quantising.
    av = torch.nn.functional.pad(a3.float(), (0, C * chunk - K)).view(H, M, C, chunk)
    dims = {"per_tensor": (0, 1, 3), "per_row": (3,), "per_head": (1, 3)}[cfg.granularity]
    s = encoding.scales(av, dims, cfg.sc_prec)                                   # [H|1, M|1, C, 1]
    qa = encoding.quantize(av, s, cfg.sc_prec).view(H, M, C * chunk)[:, :, :K].contiguous()
    Q = encoding.qmax(cfg.sc_prec)
    sa = (s * (Q * Q / cfg.stoc_len)).expand(H, M, C, 1)[..., 0].permute(0, 2, 1).contiguous()
    return qa, sa


@dataclasses.dataclass(frozen=True)
class PreparedB:
    """b quantised once (a layer's weight): reuse it for every product with the same options."""
    qb: torch.Tensor      # [H, K, N] int8, N contiguous
    sb: torch.Tensor      # [H, C, N] fp32
    cfg: SCConfig
    squeeze: bool         # b was 2-D

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
        dims = {"per_tensor": (0, 2, 3), "per_row": (2,), "per_head": (2, 3)}[cfg.granularity]
        s = encoding.scales(bv, dims, cfg.sc_prec)                               # [H|1, C, 1, N|1]
        qb = encoding.quantize(bv, s, cfg.sc_prec).view(H, C * chunk, N)[:, :K, :].contiguous()
        sb = s.expand(H, C, 1, N)[:, :, 0, :].contiguous()
    return PreparedB(qb, sb, cfg, b.dim() == 2)


def _launch(qa, qb, table, sa, sb, chunk, C, cfg: SCConfig, counts_only: bool) -> torch.Tensor:
    H, M, K = qa.shape
    N = qb.shape[2]
    if counts_only:
        out = torch.empty(H * C, M, N, dtype=torch.int32, device=qa.device)
    else:
        out = torch.empty(H, M, N, dtype=torch.float32, device=qa.device)
    bm, bn = max(2, min(16, triton.next_power_of_2(M))), 64
    # Compiled: about 8192 lookups in flight per program. Interpreted: smaller 3-D blocks, since
    # the interpreter materialises every one of them in numpy.
    bk = 16 if tier.interpreted() else max(4, 8192 // (bm * bn))
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn), H)
    sc_kernel[grid](qa, qb, table, sa, sb, out, M, N, K, chunk, C,
                    *qa.stride(), *qb.stride(), *out.stride(),
                    QMAX=encoding.qmax(cfg.sc_prec), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                    COUNTS_ONLY=counts_only, PHASES=encoding.phases(cfg.a_seq, cfg.b_seq), num_warps=4)
    return out


def sc_matmul(a: torch.Tensor, b: torch.Tensor, *, sc_prec: int = 8, stoc_len: int = 256,
              granularity: str = "per_row", chunk_d: int = 0, a_seq: str = "bitrev",
              b_seq: str = "counter_alt", halve: bool = False) -> torch.Tensor:
    """SC product of a [M, K] @ b [K, N] (or [H, M, K] @ [H, K, N]); fp32 sums, output in a.dtype.

    Runs on the device of a and b (never the current device), under labkit's device guard.
    """
    cfg = SCConfig(sc_prec, stoc_len, granularity, chunk_d, a_seq, b_seq, halve)
    _check_inputs(a, b, cfg)
    return sc_matmul_prepared(a, prepare_b(b, **dataclasses.asdict(cfg)))


def sc_matmul_prepared(a: torch.Tensor, w: PreparedB, *, guarded: bool = True) -> torch.Tensor:
    """SC product of a with an already quantised b (see prepare_b).

    guarded=False launches on whatever device is current, without labkit's device guard: the
    seed story's bug, kept only for the wrong-device experiments."""
    if not isinstance(w, PreparedB):
        raise TypeError(f"w: expected a PreparedB from labkit.sc.prepare_b, got {type(w).__name__}")
    check_tensor("a", a, dtypes=DTYPES, contiguous=False)
    common_device(a=a, w=w.qb)
    if a.dim() != (2 if w.squeeze else 3) or a.shape[-1] != w.qb.shape[1] or (not w.squeeze and a.shape[0] != w.qb.shape[0]):
        raise ValueError(f"a: shape {tuple(a.shape)} does not fit the prepared b of shape {w.shape}"
                         " (K must match; 3-D needs the same number of heads)")
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
            out = _launch(qa, w.qb, _table(w.cfg, dev), sa, w.sb, chunk, C, w.cfg, counts_only=False).to(a.dtype)
    return out[0] if w.squeeze else out


def _quantized(a, b, cfg: SCConfig):
    a3 = a[None] if a.dim() == 2 else a
    w = prepare_b(b, **dataclasses.asdict(cfg))
    qa, sa = quantize_a(a3, cfg)
    chunk, C = _chunking(a3.shape[2], cfg)
    return qa, sa, w.qb, w.sb, chunk, C


def sc_counts(a: torch.Tensor, b: torch.Tensor, *, impl: str = "triton", **options) -> torch.Tensor:
    """The exact integer sums S[h, c, m, n] per chunk, from the kernel or the literal reference.

    For tests and teaching: the two must be identical on any input.
    """
    from labkit.sc.reference import chunk_counts

    cfg = SCConfig(**options)
    _check_inputs(a, b, cfg)
    if impl not in ("triton", "reference"):
        raise ValueError(f"impl: {impl!r} is not 'triton' or 'reference'")
    with on_device_of(a=a, b=b) as dev:
        qa, sa, qb, sb, chunk, C = _quantized(a, b, cfg)
        if impl == "reference":
            return chunk_counts(qa, qb, chunk, cfg.sc_prec, cfg.stoc_len, cfg.a_seq, cfg.b_seq, cfg.halve)
        H, M, K = qa.shape
        return _launch(qa, qb, _table(cfg, dev), sa, sb, chunk, C, cfg, counts_only=True).view(
            H, C, M, qb.shape[2]).to(torch.int64)


def sc_matmul_reference(a: torch.Tensor, b: torch.Tensor, **options) -> torch.Tensor:
    """The same product from the literal bitstreams, with the kernel's float steps (for tests)."""
    cfg = SCConfig(**options)
    _check_inputs(a, b, cfg)
    from labkit.sc.reference import chunk_counts

    qa, sa, qb, sb, chunk, C = _quantized(a, b, cfg)
    S = chunk_counts(qa, qb, chunk, cfg.sc_prec, cfg.stoc_len, cfg.a_seq, cfg.b_seq, cfg.halve)  # [H, C, M, N]
    out = torch.zeros(S.shape[0], S.shape[2], S.shape[3], dtype=torch.float32, device=a.device)
    for c in range(C):
        out += S[:, c].float() * (sa[:, c, :, None] * sb[:, c, None, :])
    out = out.to(a.dtype)
    return out[0] if a.dim() == 2 else out
