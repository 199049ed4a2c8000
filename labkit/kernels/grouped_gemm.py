"""A grouped GEMM for mixture-of-experts layers that reads the token counts on the device.

An MoE layer routes each token to a few experts and then multiplies every expert's rows by
that expert's weight: E matrix products of different heights, one per expert. The heights
(``m_splits``, tokens per expert) are computed on the GPU by the router. The common way to run
the products, a Python loop of ``x_e @ w_e``, needs those heights on the host first
(``m_splits.tolist()``): a device-to-host copy that waits for the router, stalls the CPU while
the GPU drains, and cannot be captured in a CUDA graph. ``grouped_mm`` takes ``m_splits`` as a
CUDA tensor and never looks at it from the host: every program of the kernel reads the counts
itself and walks the experts' row ranges on the GPU.

The schedule (persistent, after the grouped GEMM of Triton's tutorials and vLLM's ``fused_moe``):

* the grid is a fixed number of programs P (one per SM, sized from what the host knows: M, E,
  N), so it never depends on the counts;
* the work is numbered as one list of output tiles: expert 0's tiles (ceil(m_0 / BLOCK_M) x
  ceil(N / BLOCK_N) of them), then expert 1's, ...; program p takes tiles p, p + P, p + 2P, ...;
* each program walks the experts in order, reading ``m_splits[e]`` from global memory and keeping
  a running row offset, so it knows where each expert's rows start without a prefix-sum kernel
  and without the host. An expert with 0 tokens has no tiles; a split of any size is fine (the
  last tile of an expert is masked), so nothing is asked of the caller's alignment;
* or (``GroupedConfig.flat``) each program runs one loop over its tiles of every expert, finding
  a tile's expert from the counts held as one vector; Triton fuses that loop with the tile's
  reduction loop, so the pipeline of loads runs on from one tile into the next.

A wrong device-side ``m_splits`` cannot be checked without a sync, so the kernel makes it safe
instead: a negative count is read as 0, and every expert's range is clamped to the M rows of x,
so a bad count gives wrong rows (or rows of ``out`` left unwritten), never an out-of-bounds
access. ``check_splits=True`` adds the check (and its sync) for debugging.

Backward needs two more products over the same ragged rows:

* dgrad, dx_e = dy_e @ w_e^T: the same kernel, given ``w.transpose(1, 2)`` (it takes any
  strides; nothing is copied);
* wgrad, dW_e = x_e^T @ dy_e, whose ragged dimension is the REDUCTION: ``grouped_mm_wgrad``,
  a second kernel with a fixed number of tiles per expert (K/BLOCK_K x N/BLOCK_N), each summing
  over its expert's rows. It can add into an fp32 ``main_grad`` buffer, per expert: an
  ``accumulate`` mask held on the device says which experts add (True) and which overwrite.

Precision: bf16, fp16 (fp32 accumulation) or fp32 inputs. Under the Triton interpreter (CPU
tier) bf16 tiles are upcast to fp32 before ``tl.dot`` (the interpreter multiplies bf16 bit
patterns: upstream issue #11584); products of bf16 values are exact in fp32, so results agree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from labkit.kernels.launch_helpers import dtype_name, fp32_input_precision, needs_int64
from labkit.workbench import tier
from labkit.workbench.checks import check_tensor
from labkit.workbench.guard import common_device, on_device_of

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: dtypes accepted for a tensor of token counts
COUNT_DTYPES = (torch.int32, torch.int64)

Splits = Sequence[int] | torch.Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupedConfig:
    """Tile sizes and launch options of one launch. BLOCK_M runs along the ragged rows (forward)
    or along K (wgrad); BLOCK_K is the step of the reduction loop."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int  # tile-rows per L2 swizzle group (``_tile_of``): programs running together share w's column blocks
    num_warps: int
    num_stages: int
    programs_per_sm: int = 1  # persistent programs per SM (2 when two fit in shared memory)
    tma: bool = False  # load tiles through TMA descriptors where the layout allows (tma_ok / tma_ok_wgrad)
    # one loop over every expert's tiles instead of a loop per expert, fused with each tile's
    # reduction loop (Triton's tl.range(flatten=True)), so the software pipeline can run across
    # tiles: the next tile's first loads in flight during this tile's last dots and its store.
    # warp_specialize: that loop warp-specialised too (tl.range(warp_specialize=True): loads and
    # dots in separate warps). Both kernels, grouped_mm's and grouped_mm_wgrad's.
    flat: bool = False
    warp_specialize: bool = False

    def __post_init__(self):
        if self.warp_specialize and not self.flat:
            raise ValueError(
                "GroupedConfig: warp_specialize: only the flat tile loop is warp-specialised; set flat=True"
            )


#: The products a configuration table is for. "forward": x @ w[e] with w N-contiguous (as
#: ``GroupedLinear`` holds it); "dgrad": the same kernel given a K-contiguous w (dy @ w[e]^T
#: through ``w.transpose(1, 2)``, which is how backward calls it; ``grouped_mm`` tells the two
#: apart by w's strides); "wgrad": ``grouped_mm_wgrad``.
OPS = ("forward", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfigTable:
    """One GPU's configurations for one product, keyed by tokens per expert (M // E: known on
    the host without reading the counts).

    ``rows``: (tokens per expert at least, config), largest threshold first; the first row a
    shape reaches is its config. ``source``: the recorded sweep the picks are the winners of
    (``labkit bench grouped_gemm_tune --reference`` on that GPU; a test reads it and checks every
    row against it), or None for a table no sweep has chosen (a default, said so)."""

    device: str  # the name the GPU reports (torch.cuda.get_device_name)
    op: str  # one of OPS
    source: str | None
    rows: tuple[tuple[int, GroupedConfig], ...]

    def pick(self, per_expert: int) -> GroupedConfig:
        return next(cfg for at_least, cfg in self.rows if per_expert >= at_least)


def _cfg(m, n, k, g, w, s, p=1, tma=False, flat=False, ws=False) -> GroupedConfig:
    return GroupedConfig(
        block_m=m,
        block_n=n,
        block_k=k,
        group_m=g,
        num_warps=w,
        num_stages=s,
        programs_per_sm=p,
        tma=tma,
        flat=flat,
        warp_specialize=ws,
    )


H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
_H200_SWEEP = "reference/h200x1/grouped_gemm_tune.json"
_H100_SWEEP = "reference/h100x1/grouped_gemm_tune.json"

#: Per-GPU tables, keyed by (device name, op). Each row is the winner of its source sweep for
#: the lab shapes that reach it: the config with the least total median time over the shape's
#: uniform and skewed splits (``labkit.labs.grouped_gemm.tune.table_winners``;
#: tests/test_grouped_gemm_bench.py checks it).
#: The lab shapes reach the rows one each: E=8 (2048 tokens per expert), E=64 (256), E=128 (64).
TABLES: dict[tuple[str, str], ConfigTable] = {
    (H200, "forward"): ConfigTable(
        device=H200,
        op="forward",
        source=_H200_SWEEP,
        rows=(
            (1024, _cfg(128, 256, 64, 8, 8, 3, tma=True, flat=True)),
            (128, _cfg(128, 256, 64, 8, 8, 4, tma=True, flat=True)),
            (0, _cfg(128, 256, 64, 16, 8, 3, tma=True, flat=True)),
        ),
    ),
    (H200, "dgrad"): ConfigTable(
        device=H200,
        op="dgrad",
        source=_H200_SWEEP,
        rows=(
            (1024, _cfg(128, 256, 64, 8, 8, 3)),
            (128, _cfg(128, 256, 64, 8, 8, 4, tma=True, flat=True)),
            (0, _cfg(64, 128, 64, 8, 4, 4, p=2, tma=True)),
        ),
    ),
    (H200, "wgrad"): ConfigTable(
        device=H200,
        op="wgrad",
        source=_H200_SWEEP,
        rows=(
            (1024, _cfg(128, 256, 64, 4, 8, 4)),
            (128, _cfg(128, 256, 64, 8, 8, 3, tma=True)),
            (0, _cfg(128, 128, 64, 8, 8, 2, p=2, tma=True, flat=True)),
        ),
    ),
    (H100, "forward"): ConfigTable(
        device=H100,
        op="forward",
        source=_H100_SWEEP,
        rows=(
            (1024, _cfg(64, 256, 64, 8, 8, 4, tma=True)),
            (128, _cfg(128, 256, 64, 8, 8, 4)),
            (0, _cfg(64, 128, 64, 8, 4, 4, p=2, tma=True)),
        ),
    ),
    (H100, "dgrad"): ConfigTable(
        device=H100,
        op="dgrad",
        source=_H100_SWEEP,
        rows=(
            (1024, _cfg(128, 256, 64, 8, 8, 3)),
            (128, _cfg(128, 256, 64, 8, 8, 4, tma=True)),
            (0, _cfg(64, 128, 64, 8, 4, 4, p=2, tma=True)),
        ),
    ),
    (H100, "wgrad"): ConfigTable(
        device=H100,
        op="wgrad",
        source=_H100_SWEEP,
        rows=(
            (1024, _cfg(64, 256, 64, 16, 8, 4)),
            (128, _cfg(128, 256, 64, 8, 8, 3, tma=True)),
            (0, _cfg(128, 128, 64, 8, 8, 2, p=2, tma=True)),
        ),
    ),
}

#: What an sm_90 GPU without a table of its own (an H100 PCIe or H800, say: another name than
#: the tables' GPUs) launches with: the H200 forward table (the nearest recorded sweep: sm_90,
#: 228 KB of shared memory per SM), else these defaults.
#: ``config_source`` says which, and the bench records it beside every timing.
HOPPER_DEFAULTS: dict[str, ConfigTable] = {
    "forward": TABLES[(H200, "forward")],
    # dgrad: the forward's tiles with pointer loads (TMA on a K-contiguous w is for the sweep to show)
    "dgrad": ConfigTable(
        device="sm_90 default",
        op="dgrad",
        source=None,
        rows=(
            (1024, _cfg(64, 256, 64, 8, 8, 4)),
            (128, _cfg(128, 256, 64, 8, 8, 4)),
            (0, _cfg(64, 128, 64, 8, 4, 4, p=2)),
        ),
    ),
    # wgrad: output tiles of [BLOCK_M along K, BLOCK_N along N], reduction steps of BLOCK_K tokens;
    # rows at the same tokens-per-expert thresholds, so a sweep can pick per shape (the reduction
    # runs over an expert's tokens: its length, not the tile count, is what changes)
    "wgrad": ConfigTable(
        device="sm_90 default",
        op="wgrad",
        source=None,
        rows=(
            (1024, _cfg(128, 128, 64, 8, 8, 3)),
            (128, _cfg(128, 128, 64, 8, 8, 3)),
            (0, _cfg(128, 128, 64, 8, 8, 3)),
        ),
    ),
}
#: The forward rows an sm_90 GPU without a table of its own falls back to (the H200's).
HOPPER_FORWARD = HOPPER_DEFAULTS["forward"].rows
#: fp32 inputs on any GPU (tf32 or ieee dots): half the bytes per stage of the 2-byte configs.
FP32 = GroupedConfig(block_m=64, block_n=128, block_k=32, group_m=8, num_warps=4, num_stages=3)
#: Other GPUs: a safe middle (less shared memory than Hopper's 228 KB per SM).
GENERIC_FORWARD = GroupedConfig(block_m=128, block_n=128, block_k=32, group_m=8, num_warps=4, num_stages=3)
GENERIC_WGRAD = GroupedConfig(block_m=64, block_n=64, block_k=32, group_m=8, num_warps=4, num_stages=3)
#: Under the interpreter: large tiles, few programs (each costs about 1 ms per tile op).
INTERPRETER = GroupedConfig(block_m=32, block_n=32, block_k=32, group_m=4, num_warps=4, num_stages=1)
INTERPRETER_PROGRAMS = 4


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def config_table(device: torch.device | str, op: str = "forward") -> ConfigTable | None:
    """The table ``op`` launches from on ``device``: its own (by the name the GPU reports), else
    on sm_90 ``HOPPER_DEFAULTS[op]``; None elsewhere (the generic configs, and every non-CUDA
    device: the interpreter's)."""
    if op not in OPS:
        raise ValueError(f"config_table: op {op!r} is not one of {OPS}")
    device = torch.device(device)
    if tier.interpreted() or device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    own = TABLES.get((_device_name(index), op))
    if own is not None:
        return own
    return HOPPER_DEFAULTS[op] if torch.cuda.get_device_capability(index)[0] == 9 else None


def config_source(device: torch.device | str, op: str = "forward") -> str:
    """Where ``op``'s configurations on ``device`` come from, in one line (what bench records carry)."""
    table = config_table(device, op)
    device = torch.device(device)
    if table is None:
        return "interpreter config" if device.type != "cuda" or tier.interpreted() else "generic config (no table)"
    name = _device_name(device.index if device.index is not None else torch.cuda.current_device())
    where = table.source or "not swept: a default"
    return where if table.device == name else f"{where} (fallback: no table of {name}'s own for {op})"


def forward_config(
    M: int, E: int, device: torch.device, dtype: torch.dtype = torch.bfloat16, op: str = "forward"
) -> GroupedConfig:
    """The configuration ``grouped_mm`` launches with for M rows over E experts on ``device``;
    ``op`` "dgrad" for a K-contiguous w (the transposed weights of backward)."""
    if tier.interpreted() or device.type != "cuda":
        return INTERPRETER
    if dtype == torch.float32:  # 4-byte tiles: the 2-byte configs would overflow shared memory
        return FP32
    table = config_table(device, op)
    return GENERIC_FORWARD if table is None else table.pick(M // max(E, 1))


def hopper_config(M: int, E: int) -> GroupedConfig:
    """The sm_90 fallback configuration for M rows over E experts (``HOPPER_FORWARD``; what the
    schedule figures draw with, on any machine)."""
    return HOPPER_DEFAULTS["forward"].pick(M // max(E, 1))


def wgrad_config(M: int, E: int, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> GroupedConfig:
    """The configuration ``grouped_mm_wgrad`` launches with for M rows over E experts on ``device``."""
    if tier.interpreted() or device.type != "cuda":
        return INTERPRETER
    if dtype == torch.float32:
        return FP32
    table = config_table(device, "wgrad")
    return GENERIC_WGRAD if table is None else table.pick(M // max(E, 1))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _programs(device: torch.device, upper_bound_tiles: int, per_sm: int = 1) -> int:
    """Persistent grid size: ``per_sm`` programs per SM, never more than there can be tiles."""
    most = INTERPRETER_PROGRAMS if device.type != "cuda" else per_sm * _sm_count(device.index)
    return max(1, min(most, upper_bound_tiles))


def flops(M: int, N: int, K: int) -> int:
    """Floating-point operations of a grouped product over M rows in all: 2 per multiply-add."""
    return 2 * M * N * K


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


# ----------------------------------------------------------------------------------------------
# Launchers: input checks, the device guard, the launch.


def grouped_mm(
    x: torch.Tensor,
    w: torch.Tensor,
    m_splits: Splits,
    *,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    check_splits: bool = False,
) -> torch.Tensor:
    """out[rows of expert e] = x[rows of expert e] @ w[e] (+ bias[e]), for every expert at once.

    x: [M, K]; rows grouped by expert (expert 0's m_splits[0] rows, then expert 1's, ...).
    w: [E, K, N], x's dtype (bfloat16, float16 or float32), any strides (``w.transpose(1, 2)``
       of a [E, N, K] weight works without a copy: that is dgrad).
    m_splits: tokens per expert, E non-negative integers summing to M: a list or a CPU tensor
       (checked here in full, on every tier) or a CUDA tensor on x's device (int32/int64; only
       its dtype and shape are checked: never read by the host, so nothing synchronises and the
       call can be captured in a CUDA graph; a wrong count is clamped on the device, see above).
    bias: optional [E, N], x's dtype. out: optional [M, N], x's dtype, column stride 1.
    check_splits: also check a CUDA ``m_splits`` (non-negative, summing to M): this syncs.
    Accumulates in fp32. Returns ``out``.
    """
    for name, t in (("x", x), ("w", w), ("bias", bias), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            check_tensor(name, t)  # raises the TypeError naming the argument
    common_device(x=x, w=w, bias=bias, out=out)
    check_tensor("x", x, dtypes=DTYPES, ndim=2, contiguous=False)
    check_tensor("w", w, dtypes=DTYPES, ndim=3, contiguous=False)
    if w.dtype != x.dtype:
        raise TypeError(f"w: dtype {dtype_name(w.dtype)} differs from x's dtype {dtype_name(x.dtype)}")
    (M, K), (E, Kw, N) = x.shape, w.shape
    if Kw != K:
        raise ValueError(f"w: shape {tuple(w.shape)} is not [E, K, N] with K = {K} (x's columns)")
    counts = device_counts("m_splits", m_splits, E, M, x.device, check=check_splits)
    if bias is not None:
        check_tensor("bias", bias, dtypes=DTYPES, ndim=2, contiguous=False)
        if bias.dtype != x.dtype or tuple(bias.shape) != (E, N) or (N > 1 and bias.stride(1) != 1):
            raise ValueError(
                f"bias: expected [E, N] = {[E, N]} of {dtype_name(x.dtype)} with column stride 1, "
                f"got {tuple(bias.shape)} of {dtype_name(bias.dtype)}, strides {bias.stride()}"
            )
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    else:
        _check_out("out", out, (M, N), x.dtype)
    if M == 0 or N == 0 or E == 0:
        return out
    w_kmajor = w.stride(1) == 1 and w.stride(2) != 1 and N > 1
    cfg = forward_config(M, E, x.device, x.dtype, op="dgrad" if w_kmajor else "forward")
    int64 = needs_int64(x, w, out, pad=cfg.block_m)
    use_tma = cfg.tma and not int64 and tma_ok(x, w)
    if use_tma:
        _ensure_scratch_allocator()
    upper_tiles = (triton.cdiv(M, cfg.block_m) + E) * triton.cdiv(N, cfg.block_n)
    with on_device_of(x=x, w=w, out=out):
        _grouped_mm_kernel[(_programs(x.device, upper_tiles, cfg.programs_per_sm),)](
            x,
            w,
            out,
            bias if bias is not None else out,
            counts,
            M,
            N,
            K,
            E,
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            w.stride(2),
            out.stride(0),
            bias.stride(0) if bias is not None else 0,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            HAS_BIAS=bias is not None,
            EVEN_K=K % cfg.block_k == 0,
            UPCAST=tier.interpreted() and x.dtype == torch.bfloat16,
            INPUT_PRECISION=_input_precision(x.dtype),
            INT64=int64,
            USE_TMA=use_tma,
            W_KMAJOR=use_tma and w.stride(2) != 1,
            FLAT=cfg.flat,
            WARP_SPECIALIZE=cfg.warp_specialize,
            E_LANES=triton.next_power_of_2(E) if cfg.flat else 1,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out


def grouped_mm_wgrad(
    x: torch.Tensor,
    dy: torch.Tensor,
    m_splits: Splits,
    *,
    out: torch.Tensor | None = None,
    accumulate: bool | torch.Tensor = False,
    check_splits: bool = False,
) -> torch.Tensor:
    """dW[e] = x[rows of e]^T @ dy[rows of e]: the weight gradient of ``grouped_mm``, [E, K, N].

    x: [M, K] and dy: [M, N], one dtype, rows grouped by expert as in the forward.
    m_splits: as for ``grouped_mm`` (a CUDA tensor is never read by the host).
    out: optional [E, K, N] in float32 (a ``main_grad`` buffer) or x's dtype, column stride 1.
    accumulate: False (overwrite every dW[e]), True (add into every out[e]), or a bool tensor of
       E flags on out's device (per expert: True adds, False overwrites), read on the device.
    An expert with 0 tokens gets dW[e] = 0 (or keeps out[e] when it accumulates). Returns out.
    """
    for name, t in (("x", x), ("dy", dy), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            check_tensor(name, t)
    mask = accumulate if isinstance(accumulate, torch.Tensor) else None
    common_device(x=x, dy=dy, out=out, accumulate=mask)
    check_tensor("x", x, dtypes=DTYPES, ndim=2, contiguous=False)
    check_tensor("dy", dy, dtypes=DTYPES, ndim=2, contiguous=False)
    if dy.dtype != x.dtype:
        raise TypeError(f"dy: dtype {dtype_name(dy.dtype)} differs from x's dtype {dtype_name(x.dtype)}")
    (M, K), (Md, N) = x.shape, dy.shape
    if Md != M:
        raise ValueError(f"dy: has {Md} rows, x has {M}: both hold the same tokens")
    if mask is None and not isinstance(accumulate, bool):
        raise TypeError(f"accumulate: expected a bool or a bool tensor, got {type(accumulate).__name__}")
    E = _num_experts(m_splits)
    if E < 0:
        raise TypeError(
            f"m_splits: expected a list of ints or a 1-D integer tensor, got {type(m_splits).__name__}"
            + (f" of shape {tuple(m_splits.shape)}" if isinstance(m_splits, torch.Tensor) else "")
        )
    if out is None:
        if mask is not None or accumulate:
            raise ValueError("out: accumulating needs the buffer to add into (pass out=main_grad)")
        out = torch.empty(
            (E, K, N), dtype=torch.float32, device=x.device
        )  # fp32: accumulated gradients are not rounded to bf16
    _check_out("out", out, (E, K, N), None, allowed=(torch.float32, x.dtype))
    if mask is not None:
        check_tensor("accumulate", mask, dtypes=(torch.bool,), ndim=1, contiguous=True)
        if mask.shape[0] != E:
            raise ValueError(f"accumulate: has {mask.shape[0]} flags for {E} experts")
    counts = device_counts("m_splits", m_splits, E, M, x.device, check=check_splits)
    if E == 0 or K == 0 or N == 0:
        return out
    cfg = wgrad_config(M, E, x.device, x.dtype)
    mode = 2 if mask is not None else int(bool(accumulate))
    int64 = needs_int64(x, dy, out, pad=cfg.block_m)
    use_tma = cfg.tma and not int64 and tma_ok_wgrad(x, dy, out)
    if use_tma:
        _ensure_scratch_allocator()
    with on_device_of(x=x, dy=dy, out=out):
        _grouped_wgrad_kernel[
            (_programs(x.device, E * triton.cdiv(K, cfg.block_m) * triton.cdiv(N, cfg.block_n), cfg.programs_per_sm),)
        ](
            x,
            dy,
            out,
            counts,
            mask.view(torch.int8) if mask is not None else counts,
            M,
            K,
            N,
            E,
            x.stride(0),
            x.stride(1),
            dy.stride(0),
            dy.stride(1),
            out.stride(0),
            out.stride(1),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            MODE=mode,
            UPCAST=tier.interpreted() and x.dtype == torch.bfloat16,
            INPUT_PRECISION=_input_precision(x.dtype),
            INT64=int64,
            EVEN=K % cfg.block_m == 0 and N % cfg.block_n == 0,
            USE_TMA=use_tma,
            TMA_STORE=use_tma and out.element_size() == 2,
            FLAT=cfg.flat,
            WARP_SPECIALIZE=cfg.warp_specialize,
            E_LANES=triton.next_power_of_2(E) if cfg.flat else 1,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out


def device_counts(
    name: str, m_splits: Splits, E: int, M: int, device: torch.device, *, check: bool = False
) -> torch.Tensor:
    """``m_splits`` as an int32/int64 tensor of E counts on ``device``, for the kernels to read.

    A list or a CPU tensor is checked here in full (integers, E of them, none negative, summing
    to M), whatever ``device`` is: reading CPU counts costs no sync, so a CPU tensor is checked
    on the CPU tier too, where x is on the CPU. A CUDA tensor on ``device`` is checked for
    dtype, shape and device only (O(1) on the host, no sync; the kernels clamp its values so a
    wrong count cannot read out of bounds), unless ``check`` (which reads it back: a sync)."""
    if isinstance(m_splits, torch.Tensor):
        if m_splits.dtype not in COUNT_DTYPES:
            raise TypeError(
                f"{name}: dtype {dtype_name(m_splits.dtype)} is not an integer count type; expected int32 or int64"
            )
        if m_splits.dim() != 1 or m_splits.shape[0] != E:
            raise ValueError(f"{name}: expected {E} counts (one per expert of w), got shape {tuple(m_splits.shape)}")
        if m_splits.device.type == "cpu":  # the host reads it without a sync: always checked
            _check_values(name, m_splits.tolist(), M)
            if m_splits.device == device:
                return m_splits if m_splits.is_contiguous() else m_splits.contiguous()
            return m_splits.to(device=device, dtype=torch.int32)
        if m_splits.device != device:
            raise ValueError(
                f"{name}: is on {m_splits.device}, x is on {device}: pass the counts on "
                f"x's device (or on the CPU, or as a list)"
            )
        if check:
            _check_values(name, m_splits.tolist(), M)
        return m_splits if m_splits.is_contiguous() else m_splits.contiguous()
    elif isinstance(m_splits, (list, tuple)):
        values = list(m_splits)
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise TypeError(f"{name}: expected integer counts, got {type(bad[0]).__name__} {bad[0]!r}")
        if len(values) != E:
            raise ValueError(f"{name}: expected {E} counts (one per expert of w), got {len(values)}")
    else:
        raise TypeError(f"{name}: expected a list of ints or an integer tensor, got {type(m_splits).__name__}")
    _check_values(name, values, M)
    return torch.tensor(values, dtype=torch.int32, device=device)


def _check_values(name: str, values: list[int], M: int) -> None:
    negative = [i for i, v in enumerate(values) if v < 0]
    if negative:
        raise ValueError(f"{name}: count of expert {negative[0]} is negative ({values[negative[0]]})")
    if sum(values) != M:
        raise ValueError(f"{name}: counts sum to {sum(values)}, but x has M = {M} rows")


def _num_experts(m_splits: Splits) -> int:
    if isinstance(m_splits, torch.Tensor):
        return m_splits.shape[0] if m_splits.dim() == 1 else -1
    return len(m_splits) if isinstance(m_splits, (list, tuple)) else -1


def _check_out(name: str, out: torch.Tensor, shape: tuple, dtype: torch.dtype | None, allowed: tuple = ()) -> None:
    check_tensor(name, out, dtypes=DTYPES, contiguous=False)
    if dtype is not None and out.dtype != dtype:
        raise TypeError(f"{name}: dtype {dtype_name(out.dtype)} differs from x's dtype {dtype_name(dtype)}")
    if allowed and out.dtype not in allowed:
        names = ", ".join(dict.fromkeys(map(dtype_name, allowed)))  # once each: x's dtype may be float32 too
        raise TypeError(f"{name}: dtype {dtype_name(out.dtype)}; expected one of {names}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(out.shape)} is not {tuple(shape)}")
    if shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"{name}: needs column stride 1, got strides {out.stride()}")


def tma_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``grouped_mm`` can load through TMA descriptors: a GPU with TMA (sm_90+) or the
    interpreter, x with unit column stride, w with a unit stride along N (forward) or along K
    (dgrad's ``w.transpose(1, 2)``), and 16-byte aligned base pointers and other strides (what
    the hardware requires). Otherwise the pointer path runs: same results, any layout."""
    if not _tma_device(x.device) or x.stride(1) != 1:
        return False
    if w.stride(2) == 1:
        other = (w.stride(0), w.stride(1))
    elif w.stride(1) == 1:
        other = (w.stride(0), w.stride(2))
    else:
        return False
    return _aligned(x, w, x.stride(0), *other)


def tma_ok_wgrad(x: torch.Tensor, dy: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``grouped_mm_wgrad`` can move its tiles through TMA descriptors: as ``tma_ok``,
    x, dy and out with unit column strides, 16-byte aligned bases and other strides."""
    return (
        _tma_device(x.device)
        and x.stride(1) == 1
        and dy.stride(1) == 1
        and out.stride(2) == 1
        and _aligned(x, dy, x.stride(0), dy.stride(0))
        and out.data_ptr() % 16 == 0
        and all(v * out.element_size() % 16 == 0 for v in (out.stride(0), out.stride(1)))
    )


def _tma_device(device: torch.device) -> bool:
    if not hasattr(tl, "make_tensor_descriptor"):
        return False
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def _aligned(a: torch.Tensor, b: torch.Tensor, *strides: int) -> bool:
    size = a.element_size()
    return all(v % 16 == 0 for v in (a.data_ptr(), b.data_ptr(), *(s * size for s in strides)))


def _scratch(size: int, alignment: int, stream):
    """Global scratch for device-side TMA descriptors (128 bytes per program), from torch's
    caching allocator: stream-ordered, and legal inside CUDA-graph capture."""
    return torch.empty(
        size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() and not tier.interpreted() else "cpu"
    )


def _ensure_scratch_allocator() -> None:
    """Give Triton an allocator for descriptor scratch, unless the caller has set one.
    (Triton keeps it in a context variable: each thread starts without one.)"""
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
        if not isinstance(current, _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_scratch)


def _input_precision(dtype: torch.dtype) -> str:
    return fp32_input_precision() if dtype == torch.float32 else "ieee"


__all__ = [
    "COUNT_DTYPES",
    "DTYPES",
    "OPS",
    "TABLES",
    "ConfigTable",
    "GroupedConfig",
    "HOPPER_DEFAULTS",
    "HOPPER_FORWARD",
    "config_source",
    "config_table",
    "device_counts",
    "flops",
    "forward_config",
    "grouped_mm",
    "hopper_config",
    "grouped_mm_wgrad",
    "tma_ok",
    "tma_ok_wgrad",
    "wgrad_config",
]
