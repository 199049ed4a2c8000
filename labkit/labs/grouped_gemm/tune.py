"""Lab 04's configuration sweep: the per-GPU tables ``labkit.kernels.grouped_gemm.TABLES`` are
chosen from its records.

``labkit bench grouped_gemm_tune`` runs ``tune_benchmark(profile)``: for every op (forward,
dgrad, wgrad), shape of ``grouped_gemm.bench.SHAPES`` and split, every candidate tile config (``TUNE_GRID``
plus ``TUNE_EXTRA``, minus those over ``SMEM_LIMIT``) is checked against float32, then all are
timed in one comparison (graph replays on a GPU), paired against the kernel's own choice
(``tune_case``). ``table_winners`` is the rule a table's rows are written by (and checked
against); ``python -m labkit.labs.grouped_gemm.tune --table FILE`` prints the ``TABLES`` entries
a recorded sweep's winners make.

On the CPU tier (Triton interpreter) the same code runs at tiny shapes with ``method="cpu_clock"``;
its numbers are interpreter times, never GPU performance (records say ``tier``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Iterator, Sequence

import torch

from labkit.kernels import grouped_gemm as gg
from labkit.labs.grouped_gemm import distributions
from labkit.labs.grouped_gemm.bench import (
    DTYPE,
    SHAPES,
    TOLERANCE,
    _bench_device,
    _blank,
    _gpu_name,
    _operands,
    _profile,
    _shape_fields,
)
from labkit.labs.grouped_gemm.bench import (
    REQUIRED as REQUIRED,  # re-exported: the fields every record has (labkit.app.benchmarks reads it)
)
from labkit.labs.grouped_gemm.measure import _capture_error, _checked_experts, _one_line, _paired, _reference, _rel_err
from labkit.workbench import bench, tier

#: fields every tune record carries (None where they do not apply), so tables line up
_TUNE_FIELDS = dict.fromkeys(
    (
        "ms",
        "ms_p25",
        "ms_p75",
        "samples",
        "inner",
        "tflops",
        "ratio_vs_chosen",
        "ratio_vs_chosen_p25",
        "ratio_vs_chosen_p75",
        "best",
        "max_rel_err",
        "correct",
        "error",
    )
)


def _tflops(E: int, M: int, K: int, N: int, ms: float | None) -> float | None:
    return gg.flops(M, N, K) / ms / 1e9 if ms else None


#: candidate tile grids per profile (every combination, minus those over SMEM_LIMIT), for the
#: forward and dgrad (the same kernel; dgrad's w K-contiguous) and for wgrad
TUNE_GRID = {
    # 8 warps beat 4 at every shape in a probe on one H100 (not kept in reference/), so the GPU
    # grid keeps 4 warps only for 64-row tiles, where two programs per SM can fit; TMA on and off
    "gpu": {
        "block_m": (64, 128),
        "block_n": (128, 256),
        "block_k": (64,),
        "group_m": (8,),
        "num_warps": (8,),
        "num_stages": (3, 4),
        "programs_per_sm": (1,),
        "tma": (False, True),
        "flat": (False,),
        "warp_specialize": (False,),
    },
    "cpu": {
        "block_m": (16, 32),
        "block_n": (32,),
        "block_k": (32,),
        "group_m": (4,),
        "num_warps": (4,),
        "num_stages": (1,),
        "programs_per_sm": (1,),
        "tma": (False, True),
        "flat": (False,),
        "warp_specialize": (False,),
    },
}
_c = gg._cfg  # (block_m, block_n, block_k, group_m, num_warps, num_stages, programs_per_sm, tma, flat, ws)
#: the flat tile loop's candidates at every shape (forward and dgrad): 128x256 tiles, TMA loads,
#: 3 stages with L2 groups of 8 and 16 tile-rows, 4 stages with 8
_FLAT = [_c(128, 256, 64, g, 8, s, 1, True, True) for g, s in ((8, 3), (16, 3), (8, 4))]
#: configurations added to the grid, per profile and op: "any" at every shape, an int at that
#: number of experts only
TUNE_EXTRA: dict[str, dict[str, dict]] = {
    "gpu": {
        "forward": {
            # two programs per SM where two fit (64-row tiles, 4 warps); the flat tile loop
            # (fused with the K loop) at 128x256 tiles with TMA loads (``_FLAT``)
            "any": [_c(64, 128, 64, 8, 4, 4, 2), _c(64, 128, 64, 8, 4, 4, 2, True), *_FLAT],
            # E=8 (2048 tokens per expert, K = N = 4096): the shape where torch's CUTLASS kernel
            # is hardest to beat. L2-grouped tile order (GROUP_M: tile-rows sharing w's column
            # blocks), a deeper reduction step (BLOCK_K 128, fewer stages to fit) and deeper
            # pipelines, around the recorded winner, pointer and TMA loads.
            8: [
                *(_c(64, 256, 64, g, 8, 4, 1, t) for g in (4, 16, 32) for t in (False, True)),
                *(_c(128, 256, 64, g, 8, 3, 1, True) for g in (4, 16)),
                *(_c(m, n, 128, 8, 8, s, 1, t) for m, n, s in ((64, 256, 2), (128, 128, 3)) for t in (False, True)),
                _c(128, 256, 128, 8, 8, 2, 1, True),
                *(_c(m, n, 64, 8, 8, 5, 1, t) for m, n in ((64, 256), (128, 128)) for t in (False, True)),
                # the flat loop at 64x256 tiles, 5 stages, and warp-specialised (loads and dots in
                # separate warps, what Triton offers on Hopper with TMA loads)
                _c(64, 256, 64, 8, 8, 5, 1, True, True),
                _c(128, 256, 64, 8, 8, 3, 1, True, True, True),
            ],
        },
        "dgrad": {"any": [_c(64, 128, 64, 8, 4, 4, 2), _c(64, 128, 64, 8, 4, 4, 2, True), *_FLAT]},
        # wgrad: the largest gap to torch (docs/labs.md's backward table). Its reduction runs over an
        # expert's tokens (32, 4 and 1 steps of 64 at the lab's E=8, 64 and 128), so the sweep tries
        # taller tiles and two programs per SM at every shape; at E=8, where the reduction is long,
        # BLOCK_K 128 and other L2 group sizes; at E=128, where it is one step and the [E, K, N]
        # output is most of the bytes, two stages (all one step can use) and two programs per SM,
        # so that one program's loads overlap another's stores. A TMA config also stores through
        # TMA, its tile staged in shared memory beside the stages (those that do not fit fail to
        # compile, and the sweep records the error).
        "wgrad": {
            "any": [
                _c(256, 128, 64, 8, 8, 3),
                _c(64, 128, 64, 8, 4, 4, 2),
                # the flat tile loop at each lab shape's recorded winner, TMA (loads and stores)
                # and pointer loads
                *(
                    _c(m, n, 64, 8, 8, s, p, t, True)
                    for m, n, s, p in ((64, 256, 4, 1), (128, 256, 3, 1), (128, 128, 2, 2))
                    for t in (True, False)
                ),
            ],
            8: [
                _c(128, 128, 128, 8, 8, 3),
                _c(64, 256, 128, 8, 8, 2),
                _c(128, 256, 128, 8, 8, 2),
                *(_c(m, 256, 64, g, 8, 4) for m in (64, 128) for g in (4, 16)),
            ],
            128: [
                *(_c(128, 256, 64, 8, 8, 2, 1, t) for t in (False, True)),
                *(_c(128, 128, 64, 8, 8, 2, 2, t) for t in (False, True)),
                *(_c(64, 256, 64, 8, 4, 2, 2, t) for t in (False, True)),
            ],
        },
    },
    "cpu": {"forward": {"any": []}, "dgrad": {"any": []}, "wgrad": {"any": []}},
}
del _c, _FLAT
TUNE_TIMING = {"gpu": {"warmup": 3, "reps": 10, "inner": 10}, "cpu": {"warmup": 1, "reps": 2, "inner": 1}}
#: shared memory a config may ask for (H100/H200: 228 KiB per SM, 227 KiB per block at most)
SMEM_LIMIT = 200 * 1024


def smem_bytes(cfg: gg.GroupedConfig, itemsize: int = 2) -> int:
    """Approximate shared memory of a config: one x tile and one w tile per pipeline stage."""
    return (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n) * itemsize * cfg.num_stages


def candidate_configs(
    grid: dict, chosen: gg.GroupedConfig | None = None, extra: Sequence[gg.GroupedConfig] = ()
) -> list[gg.GroupedConfig]:
    """Every combination of ``grid`` whose ``smem_bytes`` fits SMEM_LIMIT, then ``extra`` (those
    that fit, not already there), plus ``chosen`` (what the kernel picks, measured whatever it
    asks for)."""
    keys = [f.name for f in dataclasses.fields(gg.GroupedConfig)]
    missing = [k for k in keys if k not in grid]
    if missing:
        raise ValueError(f"grid: lacks {missing}")
    configs = [gg.GroupedConfig(**dict(zip(keys, values))) for values in itertools.product(*(grid[k] for k in keys))]
    configs = [c for c in configs if smem_bytes(c) <= SMEM_LIMIT]
    configs += [c for c in dict.fromkeys(extra) if c not in configs and smem_bytes(c) <= SMEM_LIMIT]
    if chosen is not None and chosen not in configs:
        configs.insert(0, chosen)
    return configs


def _extra(profile: str, op: str, experts: int) -> list[gg.GroupedConfig]:
    table = TUNE_EXTRA[profile][op]
    return list(table.get("any", ())) + list(table.get(experts, ()))


@contextlib.contextmanager
def forced_config(cfg: gg.GroupedConfig) -> Iterator[None]:
    """Benchmark-only hook: while inside, ``grouped_mm`` and ``grouped_mm_wgrad`` launch with
    ``cfg`` whatever the shape. It swaps ``labkit.kernels.grouped_gemm.forward_config`` and
    ``wgrad_config`` (looked up on each call) and puts them back on exit; not thread-safe, not
    for use outside the sweep."""
    if not isinstance(cfg, gg.GroupedConfig):
        raise TypeError(f"cfg: expected a GroupedConfig, got {type(cfg).__name__}")
    originals = gg.forward_config, gg.wgrad_config
    gg.forward_config = lambda M, E, device, dtype=None, op="forward": cfg
    gg.wgrad_config = lambda M, E, device, dtype=None: cfg
    try:
        yield
    finally:
        gg.forward_config, gg.wgrad_config = originals


def _chosen(op: str, M: int, E: int, device: torch.device) -> gg.GroupedConfig:
    if op == "wgrad":
        return gg.wgrad_config(M, E, device)
    return gg.forward_config(M, E, device, op=op)


def config_name(cfg: gg.GroupedConfig) -> str:
    """A config in one short string, as tune records name it ("m64 n256 k64 g8 w8 s4 p1 tma")."""
    return (
        f"m{cfg.block_m} n{cfg.block_n} k{cfg.block_k} g{cfg.group_m} w{cfg.num_warps} s{cfg.num_stages}"
        f" p{cfg.programs_per_sm}"
        + (" tma" if cfg.tma else "")
        + (" flat" if cfg.flat else "")
        + (" ws" if cfg.warp_specialize else "")
    )


def tune_case(
    E: int,
    M: int,
    K: int,
    N: int,
    skew: str,
    device: torch.device,
    grid: dict,
    timing: dict,
    seed: int = 0,
    bar=None,
    op: str = "forward",
    extra: Sequence[gg.GroupedConfig] = (),
) -> list[dict]:
    """Records of one product (``op``: "forward", "dgrad" or "wgrad" of the forward x [M, K] @
    w[e] [K, N]) at one shape and split: each candidate config checked against float32, then all
    timed in one comparison (graph replays on a GPU), paired against the kernel's own choice."""
    if op not in gg.OPS:
        raise ValueError(f"op: {op!r} is not one of {gg.OPS}")
    cuda = device.type == "cuda"
    started = time.perf_counter()
    counts = distributions.token_counts(E, M, skew, seed=seed)
    desc = distributions.describe(counts)
    call, ref, result = _product(op, E, M, K, N, counts, device, seed)
    chosen = _chosen(op, M, E, device)
    configs = candidate_configs(grid, chosen, extra)
    method = "graph" if cuda else "cpu_clock"
    base = {
        "kind": "tune",
        "impl": "labkit",
        "op": op,
        **_shape_fields(E, M, K, N, skew),
        "method": method,
        "timing_method": "cuda_graph" if cuda else "cpu_clock",
        "max_over_mean": desc["max_over_mean"],
        "zero_experts": desc["zero_experts"],
        "gpu": _gpu_name(device),
        "tier": tier.TIER,
        "config_source": gg.config_source(device, op),
        **_TUNE_FIELDS,
    }

    def forced(cfg):
        with forced_config(cfg):
            return call()

    records, fns, errors = _checked_configs(configs, chosen, base, forced, result, ref, device, bar)
    if not fns:
        return records
    return records + _timed_configs(fns, errors, chosen, forced, device, timing, started, (E, M, K, N))


def _product(op: str, E: int, M: int, K: int, N: int, counts: list[int], device: torch.device, seed: int):
    """(call, ref, result) of ``op`` at one shape and split: the launch (into one output buffer),
    the float32 reference rows and how to read the output as rows of that reference."""
    counts_dev = torch.tensor(counts, dtype=torch.int32, device=device)
    x, w = _operands(E, M, K, N, device, seed=1 + seed)
    if op == "forward":
        out = torch.empty(M, N, dtype=DTYPE, device=device)
        return (lambda: gg.grouped_mm(x, w, counts_dev, out=out)), _reference(x, w, counts), (lambda y: y)
    g = torch.Generator(device=device).manual_seed(2 + seed)
    dy = torch.randn(M, N, generator=g, device=device).to(DTYPE)
    if op == "dgrad":
        w_t = w.transpose(1, 2)
        out = torch.empty(M, K, dtype=DTYPE, device=device)
        return (lambda: gg.grouped_mm(dy, w_t, counts_dev, out=out)), _reference(dy, w_t, counts), (lambda y: y)
    # wgrad, checked as rows of x^T: expert e's [K, N] block stacked at row e * K
    out = torch.empty(E, K, N, dtype=DTYPE, device=device)
    starts = list(itertools.accumulate([0] + counts[:-1]))
    ref = {
        e: (
            e * K,
            x[starts[e] : starts[e] + counts[e]].float().T @ dy[starts[e] : starts[e] + counts[e]].float(),
        )
        for e in _checked_experts(counts)
    }
    return (lambda: gg.grouped_mm_wgrad(x, dy, counts_dev, out=out)), ref, (lambda y: y.reshape(E * K, N))


def _checked_configs(configs, chosen, base: dict, forced, result, ref, device: torch.device, bar):
    """Every candidate run once and checked against ``ref`` (and captured in a graph on a GPU):
    (records of the ones that failed, {name: (cfg, fields)} of the ones to time, {name: error})."""
    cuda = device.type == "cuda"
    records, fns, errors = [], {}, {}
    for cfg in configs:
        name = config_name(cfg)
        fields = dict(base, config=name, **dataclasses.asdict(cfg), smem_bytes=smem_bytes(cfg), chosen=cfg == chosen)
        try:
            errors[name] = _rel_err(result(forced(cfg)), ref)
            err = _capture_error(lambda cfg=cfg: forced(cfg), device) if cuda else None
            if err:
                raise RuntimeError(f"capture failed: {err}")
            fns[name] = (cfg, fields)
        except Exception as e:
            records.append(_blank(dict(fields, error=_one_line(e), max_rel_err=errors.get(name))))
        if bar is not None:
            bar.update()
    return records, fns, errors


def _timed_configs(
    fns: dict, errors: dict, chosen, forced, device: torch.device, timing: dict, started: float, shape: tuple
) -> list[dict]:
    """The checked candidates timed in one comparison, each paired against the chosen config's
    (or the first's, where the chosen one failed); a record each."""
    cuda = device.type == "cuda"
    chosen_name = next((n for n, (cfg, _) in fns.items() if cfg == chosen), next(iter(fns)))
    try:
        cmp = bench.compare(
            {n: (lambda cfg=cfg: forced(cfg)) for n, (cfg, _) in fns.items()},
            baseline=chosen_name,
            device=device if cuda else None,
            warmup=timing["warmup"],
            reps=timing["reps"],
            inner=timing["inner"],
            method="cuda_graph" if cuda else "cpu_clock",
        )
    except Exception as e:
        return [
            _blank(dict(fields, max_rel_err=errors[n], error=f"timing failed: {_one_line(e)}"))
            for n, (_, fields) in fns.items()
        ]
    best = min(fns, key=lambda n: cmp.timings[n].median_us)
    case_s = time.perf_counter() - started
    records = []
    for name, (_, fields) in fns.items():
        t = cmp.timings[name]
        ms = t.median_us / 1e3
        r = _paired(cmp, name, chosen_name)
        records.append(
            _blank(
                dict(
                    fields,
                    ms=ms,
                    ms_p25=t.p25_us / 1e3,
                    ms_p75=t.p75_us / 1e3,
                    samples=len(t.samples_us),
                    inner=t.inner,
                    tflops=_tflops(*shape, ms),
                    ratio_vs_chosen=r[0],
                    ratio_vs_chosen_p25=r[1],
                    ratio_vs_chosen_p75=r[2],
                    best=name == best,
                    max_rel_err=errors[name],
                    correct=errors[name] <= TOLERANCE,
                    case_s=case_s,
                )
            )
        )
    return records


def tune_benchmark(
    profile: str,
    shapes=None,
    skews=distributions.SKEWS,
    grid: dict | None = None,
    timing: dict | None = None,
    progress: bool = True,
    ops: Sequence[str] = gg.OPS,
) -> list[dict]:
    """Entry point of ``labkit bench grouped_gemm_tune``: ``tune_case`` for every op, shape and
    split of the profile, labkit only. ``chosen`` marks the kernel's pick, ``best`` the fastest,
    ``case_s`` the seconds a case took (compiles included: the sweep's budget is about 4 minutes
    on one H200). On an H100 ``--reference`` writes reference/h100x1/grouped_gemm_tune.json:
    the source of that GPU's tables (``labkit.kernels.grouped_gemm.TABLES``)."""
    from tqdm.auto import tqdm

    profile = _profile(profile)
    device = _bench_device()
    shapes = list(shapes or SHAPES[profile])
    grid = grid or TUNE_GRID[profile]
    timing = dict(TUNE_TIMING[profile], **(timing or {}))
    bad = [op for op in ops if op not in gg.OPS]
    if bad:
        raise ValueError(f"ops: {bad} not in {gg.OPS}")
    cases = [(op, shape, skew) for op in ops for shape in shapes for skew in skews]
    total = sum(
        len(candidate_configs(grid, _chosen(op, s[1], s[0], device), _extra(profile, op, s[0]))) for op, s, _ in cases
    )
    records = []
    with tqdm(total=total, desc="grouped GEMM configs", unit="config", disable=not progress) as bar:
        for op, (E, M, K, N), skew in cases:
            extra = _extra(profile, op, E)
            records += tune_case(E, M, K, N, skew, device, grid, timing, bar=bar, op=op, extra=extra)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return records


def best_configs(records: list[dict]) -> list[dict]:
    """Per (op, experts, tokens, K, N, skew) of ``tune`` records: the fastest correct config and
    the chosen one's TFLOP/s beside it (the evidence for the tables, or against them)."""
    groups: dict = {}
    for r in records:
        if r.get("kind") == "tune" and r.get("ms") and r.get("correct"):
            key = (r.get("op") or "forward", r["experts"], r["tokens"], r["K"], r["N"], r["skew"])
            groups.setdefault(key, []).append(r)
    rows = []
    for key, rs in sorted(groups.items()):
        top = min(rs, key=lambda r: r["ms"])
        chosen = next((r for r in rs if r.get("chosen")), None)
        rows.append(
            {
                "op": key[0],
                "experts": key[1],
                "tokens": key[2],
                "K": key[3],
                "N": key[4],
                "skew": key[5],
                "best": top["config"],
                "best_tflops": top["tflops"],
                "chosen": chosen["config"] if chosen else None,
                "chosen_tflops": chosen["tflops"] if chosen else None,
                "chosen_vs_best": (chosen["ms"] / top["ms"]) if chosen else None,
            }
        )
    return rows


def table_winners(records: list[dict], table: gg.ConfigTable) -> dict[int, gg.GroupedConfig]:
    """The winner of each row of ``table`` in a sweep's ``tune`` records of the table's op: among
    the configs measured (correct, timed) at every case that reaches the row (each shape whose
    tokens per expert pick it, each split), the least total median time. Rows no case reaches
    are left out. The rule the tables are written by, and checked against."""
    cases: dict[int, dict] = {}
    for r in records:
        if r.get("kind") != "tune" or (r.get("op") or "forward") != table.op or r.get("error"):
            continue
        if not (r.get("ms") and r.get("correct")):
            continue
        per_expert = r["tokens"] // max(r["experts"], 1)
        row = next(at for at, _ in table.rows if per_expert >= at)
        case = (r["experts"], r["tokens"], r["K"], r["N"], r["skew"])
        # fields a sweep did not record yet (``flat``, ``warp_specialize``) take their defaults
        cfg = gg.GroupedConfig(**{f.name: r.get(f.name, f.default) for f in dataclasses.fields(gg.GroupedConfig)})
        cases.setdefault(row, {}).setdefault(cfg, {})[case] = r["ms"]
    winners = {}
    for row, by_cfg in cases.items():
        every = set().union(*(set(c) for c in by_cfg.values()))
        complete = {cfg: sum(t.values()) for cfg, t in by_cfg.items() if set(t) == every}
        if complete:
            winners[row] = min(complete, key=complete.get)
    return winners


def table_text(records: list[dict], op: str, device: str, source: str) -> str:
    """Python text of a ``ConfigTable`` of ``device``'s ``op`` from a sweep's records, rows at
    the thresholds of ``HOPPER_DEFAULTS[op]``: what to paste into ``TABLES`` after recording a
    sweep on a new GPU (``python -m labkit.labs.grouped_gemm.tune --table FILE``)."""
    rows = gg.HOPPER_DEFAULTS[op].rows
    probe = gg.ConfigTable(device=device, op=op, source=source, rows=rows)
    winners = table_winners(records, probe)
    lines = [f"    ({device!r}, {op!r}): ConfigTable(", f"        device={device!r},", f"        op={op!r},"]
    lines += [f"        source={source!r},", "        rows=("]
    for at, default in rows:
        c = winners.get(at, default)
        args = f"{c.block_m}, {c.block_n}, {c.block_k}, {c.group_m}, {c.num_warps}, {c.num_stages}"
        args += f", p={c.programs_per_sm}" if c.programs_per_sm != 1 else ""
        args += ", tma=True" if c.tma else ""
        args += ", flat=True" if c.flat else ""
        args += ", ws=True" if c.warp_specialize else ""
        note = "" if at in winners else "  # no case of the sweep reaches this row: the default"
        lines.append(f"            ({at}, _cfg({args})),{note}")
    lines += ["        ),", "    ),"]
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    """``python -m labkit.labs.grouped_gemm.tune --table reference/<machine>/grouped_gemm_tune.json``:
    print the ``TABLES`` entries that file's winners make, one per op it holds."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m labkit.labs.grouped_gemm.tune")
    parser.add_argument("--table", metavar="FILE", required=True, help="a recorded grouped_gemm_tune.json")
    args = parser.parse_args(argv)
    data = json.loads(open(args.table).read())
    records = data["records"]
    devices = {r["gpu"] for r in records if r.get("kind") == "tune"}
    if len(devices) != 1:
        parser.error(f"--table: expected the records of one GPU, found {sorted(devices)}")
    device = devices.pop()
    source = "reference/" + "/".join(args.table.replace("\\", "/").split("/")[-2:])
    for op in gg.OPS:
        if any((r.get("op") or "forward") == op for r in records if r.get("kind") == "tune"):
            print(table_text(records, op, device, source))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
