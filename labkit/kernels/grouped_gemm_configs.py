"""The grouped GEMM's launch configurations: tile sizes and launch options, and which one a
launch on a given GPU and shape uses.

* ``GroupedConfig``: one launch's tiles (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M), warps, pipeline
  stages, programs per SM, and the TMA / flat-loop / warp-specialisation switches.
* ``ConfigTable`` and ``TABLES``: per-GPU tables keyed by (device name, op), one row per range of
  tokens per expert (M // E, known on the host without reading the counts). Each table's
  ``source`` names the recorded sweep its rows won (a path under reference/, a pointer for the
  test that checks the rows against that file; nothing here reads it).
* ``HOPPER_DEFAULTS`` (an sm_90 GPU without a table of its own), ``FP32``, ``GENERIC_*`` (other
  GPUs) and ``INTERPRETER`` (the CPU tier).
* ``config_table``, ``config_source``, ``forward_config``, ``wgrad_config``, ``hopper_config``:
  the lookups. ``labkit.kernels.grouped_gemm`` re-exports all of these and calls
  ``forward_config`` / ``wgrad_config`` through its own namespace (so a sweep can swap them).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from labkit.workbench import tier


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
#: tests/labs/grouped_gemm/test_grouped_gemm_bench.py checks it).
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


__all__ = [
    "FP32",
    "GENERIC_FORWARD",
    "GENERIC_WGRAD",
    "H100",
    "H200",
    "HOPPER_DEFAULTS",
    "HOPPER_FORWARD",
    "INTERPRETER",
    "INTERPRETER_PROGRAMS",
    "OPS",
    "TABLES",
    "ConfigTable",
    "GroupedConfig",
    "config_source",
    "config_table",
    "forward_config",
    "hopper_config",
    "wgrad_config",
]
