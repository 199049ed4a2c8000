# labkit.labs.grouped_gemm: token splits, the two baselines, the benchmark records, the configuration
# sweep (tune) and plots.
#
# On the CPU tier the benchmark runs its tiny profile under the Triton interpreter (labkit and
# the host-sync loop, method="cpu_clock"); the GPU tests check torch's grouped GEMM against
# labkit's and the capture experiment's claims.
import dataclasses
import json
import math

import pytest
import torch

import labkit  # noqa: F401  (first: picks the tier before any kernel module is imported)
from labkit.kernels import grouped_gemm as gg
from labkit.labs.grouped_gemm import baselines, bench, distributions, gemm_plots, tune
from labkit.labs.grouped_gemm.distributions import describe, token_counts
from labkit.workbench import tier

#: under pytest-xdist (make test) every test of this file runs in one worker: the CPU benchmark of its module fixture
#: runs once, not once per worker
pytestmark = pytest.mark.xdist_group("grouped_gemm_bench")

DEV = tier.kernel_device()


# ----------------------------------------------------------------------------------------------
# distributions


@pytest.mark.parametrize("experts,tokens", [(1, 7), (4, 10), (8, 16384), (64, 16384), (128, 8192), (7, 3)])
def test_uniform_split_is_even_and_exact(experts, tokens):
    c = token_counts(experts, tokens, "uniform")
    assert sum(c) == tokens and len(c) == experts
    assert max(c) - min(c) <= 1
    assert c == sorted(c, reverse=True)  # the remainder goes to the first experts


@pytest.mark.parametrize(
    "experts,tokens", [(2, 1), (2, 5), (4, 96), (8, 16384), (10, 3), (11, 1000), (64, 16384), (128, 8192), (100, 12345)]
)
def test_skewed_split_sums_exactly_and_empties_a_tenth(experts, tokens):
    c = token_counts(experts, tokens, "skewed")
    assert len(c) == experts and sum(c) == tokens
    assert all(isinstance(v, int) and v >= 0 for v in c)
    assert sum(v == 0 for v in c) >= math.ceil(experts / 10)
    assert any(c)


def test_skewed_split_is_deterministic_and_the_seed_only_permutes():
    a = token_counts(64, 16384, "skewed")
    assert a == token_counts(64, 16384, "skewed", seed=0)
    b = token_counts(64, 16384, "skewed", seed=1)
    assert a != b and sorted(a) == sorted(b)
    assert a != sorted(a, reverse=True)  # shuffled: the heavy expert is not simply expert 0


def test_skewed_split_follows_zipf_1_2():
    E, M = 64, 16384
    c = sorted(token_counts(E, M, "skewed"), reverse=True)
    z = distributions.zero_experts(E)
    weights = [r**-distributions.ZIPF_S for r in range(1, E - z + 1)]
    quotas = [M * w / sum(weights) for w in weights]
    # largest-remainder rounding: every rank is within one token of its quota
    assert all(abs(got - q) < 1 for got, q in zip(c, quotas))
    assert c[E - z :] == [0] * z
    # and the log-log slope over the busy ranks is -1.2
    xs = [math.log(r) for r in range(1, 41)]
    ys = [math.log(v) for v in c[:40]]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert slope == pytest.approx(-1.2, abs=0.02)


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        ((0, 10), {}, ValueError, "experts"),
        (("4", 10), {}, TypeError, "experts"),
        ((True, 10), {}, TypeError, "experts"),
        ((4, 0), {}, ValueError, "tokens"),
        ((4, 2.5), {}, TypeError, "tokens"),
        ((4, 10, "zipf"), {}, ValueError, "skew"),
        ((4, 10, "skewed"), {"seed": "a"}, TypeError, "seed"),
        ((1, 10, "skewed"), {}, ValueError, "experts"),
    ],
)
def test_bad_split_arguments_are_named(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        token_counts(*args, **kwargs)


def test_describe_summarises_a_split():
    d = describe([6, 0, 2, 0])
    assert d["experts"] == 4 and d["tokens"] == 8 and d["zero_experts"] == 2
    assert d["max_over_mean"] == pytest.approx(3.0) and d["largest_share"] == pytest.approx(0.75)
    assert "2 of 4 experts empty" in d["text"]
    assert describe(torch.tensor([1, 1]))["max_over_mean"] == pytest.approx(1.0)
    json.dumps(d)
    with pytest.raises(ValueError, match="counts"):
        describe([])
    with pytest.raises(ValueError, match="counts"):
        describe([1, -1])


# ----------------------------------------------------------------------------------------------
# baselines on the CPU


def _operands(E, M, K, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g).to(dtype), torch.randn(E, K, N, generator=g).to(dtype)


def _reference64(x, w, counts):
    out, row = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64), 0
    for e, m in enumerate(counts):
        out[row : row + m] = x[row : row + m].double() @ w[e].double()
        row += m
    return out


@pytest.mark.parametrize("skew", distributions.SKEWS)
def test_host_sync_loop_matches_a_float64_reference(skew):
    counts = token_counts(8, 100, skew, seed=3)
    x, w = _operands(8, 100, 24, 40, torch.float64, seed=1)
    out = torch.full((100, 40), float("nan"), dtype=torch.float64)
    got = baselines.host_sync_loop(x, w, torch.tensor(counts), out=out)
    assert got is out
    torch.testing.assert_close(got, _reference64(x, w, counts), rtol=1e-12, atol=1e-12)
    # bf16 inputs, list counts, out allocated by the call
    xb, wb = _operands(8, 100, 24, 40, torch.bfloat16, seed=2)
    ref = _reference64(xb, wb, counts)
    got = baselines.host_sync_loop(xb, wb, counts).double()
    assert float((got - ref).abs().max()) <= 2**-7 * float(ref.abs().max())


def test_host_sync_loop_refuses_bad_input():
    x, w = _operands(4, 12, 8, 8, torch.float32)
    with pytest.raises(ValueError, match="counts"):
        baselines.host_sync_loop(x, w, [3, 3, 3])
    with pytest.raises(ValueError, match="counts"):
        baselines.host_sync_loop(x, w, [3, 3, 3, 4])
    with pytest.raises(ValueError, match="w"):
        baselines.host_sync_loop(x, w[:, :4], [3, 3, 3, 3])
    with pytest.raises(ValueError, match="out"):
        baselines.host_sync_loop(x, w, [3, 3, 3, 3], out=torch.empty(12, 9))


def test_end_offsets_are_int32_ends():
    offs = baselines.end_offsets(torch.tensor([2, 0, 5], dtype=torch.int64), torch.device("cpu"))
    assert offs.dtype == torch.int32 and offs.tolist() == [2, 2, 7]
    assert baselines.end_offsets([1, 2], torch.device("cpu")).tolist() == [1, 3]
    with pytest.raises(ValueError, match="counts"):
        baselines.end_offsets(torch.tensor([[1, 2]]), torch.device("cpu"))


def test_torch_grouped_mm_is_not_available_on_the_cpu():
    ok, reason = baselines.torch_grouped_mm_available("cpu")
    assert ok is False and reason
    assert "cpu" in reason or "no torch._grouped_mm" in reason


def test_torch_grouped_mm_availability_names_a_missing_op(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "grouped_mm", None, raising=False)
    monkeypatch.setattr(torch, "_grouped_mm", None, raising=False)
    ok, reason = baselines.torch_grouped_mm_available("cpu")
    assert not ok and "no torch._grouped_mm" in reason
    with pytest.raises(RuntimeError, match="no grouped GEMM op"):
        baselines.torch_grouped_mm(torch.zeros(2, 8), torch.zeros(1, 8, 8), [2])


def test_torch_grouped_mm_call_shape_on_the_cpu():
    """torch >= 2.9 runs its op on the CPU too (a loop over groups): the baseline's call shape,
    offsets and both layouts of w are checked here where it does; skipped where it does not."""
    if baselines.op_name() is None:
        pytest.skip(f"torch {torch.__version__} has no grouped GEMM op")
    counts = token_counts(4, 64, "skewed")
    x, w = _operands(4, 64, 32, 48, torch.bfloat16, seed=5)
    try:
        got = baselines.torch_grouped_mm(x, w, torch.tensor(counts, dtype=torch.int32))
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch's grouped GEMM does not run on the CPU here: {e}")
    ref = _reference64(x, w, counts)
    assert float((got.double() - ref).abs().max()) <= 2**-7 * float(ref.abs().max())
    got_k = baselines.torch_grouped_mm(x, baselines.k_major(w), counts)
    assert baselines.k_major(w).stride(1) == 1
    torch.testing.assert_close(got_k, got)


# ----------------------------------------------------------------------------------------------
# the benchmark's records (CPU profile: interpreter, tiny shapes)


@pytest.fixture(scope="module")
def cpu_records():
    return bench.benchmark("cpu", progress=False)


def test_benchmark_records_carry_the_required_fields(cpu_records):
    assert cpu_records
    for r in cpu_records:
        missing = [k for k in bench.REQUIRED if k not in r]
        assert not missing, f"{r['kind']} {r['impl']} lacks {missing}"
    json.dumps(cpu_records)


def test_benchmark_times_labkit_and_the_loop_and_checks_them_first(cpu_records):
    timed = [r for r in cpu_records if r["kind"] == "gemm" and r["ms"] is not None]
    if DEV.type == "cpu":
        assert {r["impl"] for r in timed} == {"labkit", "host_sync_loop"}
        assert {r["method"] for r in timed} == {"cpu_clock"}
        assert {r["tier"] for r in timed} == {"interpreter"}
    cases = {(r["experts"], r["tokens"], r["K"], r["N"], r["skew"]) for r in timed}
    assert len(cases) == len(bench.SHAPES["cpu"]) * len(distributions.SKEWS)
    for r in timed:
        for key in ("ms", "ms_p25", "ms_p75", "tflops"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert r["ms_p25"] <= r["ms"] <= r["ms_p75"]
        assert r["tflops"] == pytest.approx(gg.flops(r["tokens"], r["N"], r["K"]) / r["ms"] / 1e9)
        assert r["correct"] is True and r["max_rel_err"] <= bench.TOLERANCE
        if r["method"] != "graph":
            assert math.isfinite(r["cpu_us"]) and r["cpu_us"] > 0
        assert sum(r["counts"]) == r["tokens"]
    labkit_recs = [r for r in timed if r["impl"] == "labkit"]
    assert all(r["block_m"] is not None for r in labkit_recs)
    # the loop has no graph-replay timing (it syncs with the host): only eager records compare
    assert all(r["ratio_vs_loop"] > 0 for r in labkit_recs if r["method"] != "graph")
    assert all(r["ratio_vs_loop"] is None for r in labkit_recs if r["method"] == "graph")


def test_benchmark_records_dgrad_and_wgrad_beside_the_forward(cpu_records):
    """kind "gemm_backward": each backward product at every shape and split, labkit timed and
    checked against float32 first, with the forward's fields; torch's calls (direct and through
    autograd) checked where its op runs, timed only where its device path does."""
    back = [r for r in cpu_records if r["kind"] == "gemm_backward"]
    cases = {(r["op"], r["experts"], r["skew"]) for r in back}
    assert cases == {
        (op, s[0], skew) for op in bench.BACKWARD_OPS for s in bench.SHAPES["cpu"] for skew in distributions.SKEWS
    }
    for r in back:
        assert set(bench._GEMM_FIELDS) <= set(r) and r["config_source"]
        assert r["correct"] is True and r["max_rel_err"] <= bench.TOLERANCE, r
    labkit_recs = [r for r in back if r["impl"] == "labkit"]
    assert len(labkit_recs) == len(cases) * (1 if DEV.type == "cpu" else 2)  # cpu_clock; eager and graph
    for r in labkit_recs:
        assert math.isfinite(r["ms"]) and r["ms"] > 0 and r["block_m"] is not None
        assert r["tflops"] == pytest.approx(gg.flops(r["tokens"], r["N"], r["K"]) / r["ms"] / 1e9)
        assert r["ratio_vs_loop"] is None
    torch_recs = [r for r in back if r["impl"] == "torch_grouped_mm"]
    if baselines.op_name() is not None:
        assert {(r["op"], r["w_layout"]) for r in torch_recs} == {
            ("dgrad", "N-contiguous"),
            ("dgrad", "K-contiguous"),
            ("dgrad", "autograd"),
            ("wgrad", None),
            ("wgrad", "autograd"),
        }
    if DEV.type == "cpu":
        assert all(r["ms"] is None and r["error"].startswith("not timed") for r in torch_recs)
    with pytest.raises(ValueError, match="op"):
        bench.compare_backward_case(4, 96, 32, 32, "uniform", "fgrad", DEV, bench.TIMING["cpu"])


def test_torch_backward_baselines_are_autograds_products():
    """The direct calls timed as torch's dgrad and wgrad equal autograd's gradients of its op
    (same op, same products), and both agree with float64, where this torch runs the op here."""
    if baselines.op_name() is None:
        pytest.skip(f"torch {torch.__version__} has no grouped GEMM op")
    counts = token_counts(4, 40, "skewed", seed=3)
    g = torch.Generator().manual_seed(5)
    x, w, dy = (torch.randn(*s, generator=g).bfloat16().to(DEV) for s in ((40, 16), (4, 16, 24), (40, 24)))
    try:
        dx = baselines.torch_grouped_mm_dgrad(dy, w, counts)
    except RuntimeError as e:
        pytest.skip(f"torch's grouped GEMM does not run here: {e}")
    dw = baselines.torch_grouped_mm_wgrad(x, dy, counts)
    assert torch.equal(dx, baselines.torch_autograd_backward(x, w, counts, dy, "x")())
    assert torch.equal(dw, baselines.torch_autograd_backward(x, w, counts, dy, "w")())
    row = 0
    for e, m in enumerate(counts):
        xe, ge = x[row : row + m].double(), dy[row : row + m].double()
        torch.testing.assert_close(dx[row : row + m].double(), ge @ w[e].double().T, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(dw[e].double(), xe.T @ ge, rtol=2e-2, atol=5e-2)
        row += m
    with pytest.raises(ValueError, match="wrt"):
        baselines.torch_autograd_backward(x, w, counts, dy, "bias")


def test_benchmark_records_the_capture_experiment(cpu_records):
    caps = [r for r in cpu_records if r["kind"] == "capture"]
    assert {r["impl"] for r in caps} >= {"labkit", "host_sync_loop"}
    if DEV.type == "cpu":
        assert all(r["captured"] is None and "CUDA" in r["error"] for r in caps)


def test_benchmark_refuses_an_unknown_profile():
    with pytest.raises(ValueError, match="profile"):
        bench.benchmark("huge")


# ----------------------------------------------------------------------------------------------
# the configuration sweep


def test_forced_config_is_used_and_put_back():
    cfg = gg.GroupedConfig(block_m=16, block_n=32, block_k=32, group_m=4, num_warps=4, num_stages=1)
    original, original_wgrad = gg.forward_config, gg.wgrad_config
    with tune.forced_config(cfg):
        assert gg.forward_config(100, 4, DEV) == cfg == gg.forward_config(100, 4, DEV, op="dgrad")
        assert gg.wgrad_config(100, 4, DEV) == cfg
    assert gg.forward_config is original and gg.wgrad_config is original_wgrad
    with pytest.raises(KeyError):
        with tune.forced_config(cfg):
            raise KeyError("inside")
    assert gg.forward_config is original
    with pytest.raises(TypeError, match="cfg"):
        with tune.forced_config((16, 32)):
            pass


def test_candidate_configs_drop_what_shared_memory_cannot_hold():
    gpu = tune.candidate_configs(tune.TUNE_GRID["gpu"], extra=tune._extra("gpu", "forward", 64))
    assert len(gpu) == 21 and all(tune.smem_bytes(c) <= tune.SMEM_LIMIT for c in gpu)  # 16 + 2 two-per-SM + 3 flat
    assert sum(c.flat for c in gpu) == 3 and all(c.tma and not c.warp_specialize for c in gpu if c.flat)
    for op in gg.OPS:  # every default and every table's pick is in its op's sweep at every lab shape
        tables = [gg.HOPPER_DEFAULTS[op]] + [t for (_, o), t in gg.TABLES.items() if o == op]
        for E, M, _, _ in bench.SHAPES["gpu"]:
            swept = tune.candidate_configs(tune.TUNE_GRID["gpu"], extra=tune._extra("gpu", op, E))
            for table in tables:
                assert table.pick(M // E) in swept, (table.device, op, E)
    # E=8 gets the wider sweep: BLOCK_K 128, L2 group sizes, deeper pipelines, all fitting
    wide = tune.candidate_configs(tune.TUNE_GRID["gpu"], extra=tune._extra("gpu", "forward", 8))
    assert len(wide) > len(gpu) and all(tune.smem_bytes(c) <= tune.SMEM_LIMIT for c in wide)
    assert {c.block_k for c in wide} == {64, 128} and {c.group_m for c in wide} >= {4, 8, 16, 32}
    assert max(c.num_stages for c in wide) == 5 and len(wide) - len(gpu) == len(
        set(tune.TUNE_EXTRA["gpu"]["forward"][8])
    )
    # wgrad: taller tiles and two per SM everywhere; at E=8 BLOCK_K 128 and other group sizes, all fitting
    wgrad_any = tune.candidate_configs(tune.TUNE_GRID["gpu"], extra=tune._extra("gpu", "wgrad", 64))
    wgrad_8 = tune.candidate_configs(tune.TUNE_GRID["gpu"], extra=tune._extra("gpu", "wgrad", 8))
    assert {c.block_m for c in wgrad_any} == {64, 128, 256} and any(c.programs_per_sm == 2 for c in wgrad_any)
    assert {c.block_k for c in wgrad_8} == {64, 128} and {c.group_m for c in wgrad_8} >= {4, 8, 16}
    assert len(wgrad_8) - len(wgrad_any) == len(tune.TUNE_EXTRA["gpu"]["wgrad"][8])
    assert all(tune.smem_bytes(c) <= tune.SMEM_LIMIT for c in wgrad_8)
    big = dict(tune.TUNE_GRID["gpu"], block_k=(64, 128))
    kept = tune.candidate_configs(big)
    assert len(kept) < 32 and all(tune.smem_bytes(c) <= tune.SMEM_LIMIT for c in kept)
    chosen = gg.GroupedConfig(
        block_m=256, block_n=256, block_k=128, group_m=8, num_warps=8, num_stages=4
    )  # over the limit, still measured when chosen
    assert tune.candidate_configs(big, chosen)[0] == chosen
    with pytest.raises(ValueError, match="grid"):
        tune.candidate_configs({"block_m": (64,)})


def test_tune_benchmark_marks_the_chosen_and_the_best_config():
    recs = tune.tune_benchmark("cpu", shapes=[(4, 96, 32, 40)], skews=("skewed",), progress=False)
    assert recs and all(r["kind"] == "tune" for r in recs)
    assert all(k in r for r in recs for k in bench.REQUIRED)
    assert {r["op"] for r in recs} == set(gg.OPS)
    for op in gg.OPS:
        mine = [r for r in recs if r["op"] == op]
        assert sum(r["chosen"] for r in mine) == 1 and sum(bool(r["best"]) for r in mine) == 1, op
        assert all(r["correct"] and r["ms"] > 0 and r["tflops"] > 0 and r["case_s"] > 0 for r in mine), op
        chosen = next(r for r in mine if r["chosen"])
        assert chosen["ratio_vs_chosen"] == pytest.approx(1.0)
    rows = tune.best_configs(recs)
    assert len(rows) == 3 and all(row["chosen"] for row in rows)
    json.dumps(recs)
    with pytest.raises(ValueError, match="ops"):
        tune.tune_benchmark("cpu", ops=("bwd",), progress=False)


def test_the_bench_registry_finds_the_sweep_and_its_required_fields():
    """``labkit bench grouped_gemm_tune`` resolves its entry point and REQUIRED in ``tune``."""
    from labkit.app import benchmarks

    generator, _, required = benchmarks.BENCHMARKS["grouped_gemm_tune"]
    assert generator == "labkit.labs.grouped_gemm.tune.tune_benchmark"
    assert required() == bench.REQUIRED


def _made_up_sweep(op: str, ms_of: dict) -> list[dict]:
    """Tune records of one op at the GPU profile's shapes: ``ms_of[(config, experts, skew)]``."""
    recs = []
    for (cfg, E, skew), ms in ms_of.items():
        M = next(s[1] for s in bench.SHAPES["gpu"] if s[0] == E)
        recs.append(
            {"kind": "tune", "op": op, "experts": E, "tokens": M, "K": 1, "N": 1, "skew": skew, "ms": ms}
            | {"correct": True, "error": None, "gpu": "X", **dataclasses.asdict(cfg)}
        )
    return recs


def test_table_winners_sum_both_splits_and_need_every_case():
    """The rule the tables are written by: per row, the least total time over the cases that
    reach it; a config missing from a case cannot win."""
    a, b, c = (gg._cfg(64, n, 64, 8, 8, 4) for n in (64, 128, 256))
    table = gg.ConfigTable(device="X", op="wgrad", source=None, rows=((1024, a), (0, a)))
    recs = _made_up_sweep(
        "wgrad",
        {
            (a, 8, "uniform"): 1.0,
            (a, 8, "skewed"): 1.0,
            (b, 8, "uniform"): 0.5,  # fastest uniform, slow skewed: loses on the total
            (b, 8, "skewed"): 1.6,
            (c, 8, "uniform"): 0.1,  # fastest of all, but measured at one split only
            (a, 64, "uniform"): 1.0,
            (a, 64, "skewed"): 1.0,
            (b, 64, "uniform"): 0.9,
            (b, 64, "skewed"): 0.9,
        },
    )
    recs += _made_up_sweep("forward", {(c, 64, "uniform"): 0.01, (c, 64, "skewed"): 0.01})  # another op
    assert tune.table_winners(recs, table) == {1024: a, 0: b}
    text = tune.table_text(recs, "wgrad", "X", "reference/x/grouped_gemm_tune.json")
    # table_text writes the rows of the op's defaults (1024, 128, 0): E=64's winner reaches the
    # 128 row there, and the row no case reaches keeps the default, saying so
    assert "source='reference/x/grouped_gemm_tune.json'" in text and "(128, _cfg(64, 128, 64, 8, 8, 4))" in text
    assert "(0, _cfg(128, 128, 64, 8, 8, 3)),  # no case of the sweep reaches this row: the default" in text


def _tune_files() -> list:
    from pathlib import Path

    return sorted((Path(__file__).resolve().parents[3] / "reference").glob("*/grouped_gemm_tune.json"))


def test_each_table_row_is_its_recorded_sweeps_winner():
    """Every table naming a sweep: each row is that sweep's winner for the shapes reaching it
    (``tune.table_winners``), every row reached; the sweep is of the table's GPU. And every
    recorded sweep has its GPU's tables for each op it holds, naming it (a new sweep fails here
    until its tables are pasted in: ``python -m labkit.labs.grouped_gemm.tune --table FILE``)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    checked = 0
    for table in gg.TABLES.values():
        if table.source is None:
            continue
        records = json.loads((root / table.source).read_text())["records"]
        assert {r["gpu"] for r in records if r["kind"] == "tune"} == {table.device}, table.source
        winners = tune.table_winners(records, table)
        assert set(winners) == {at for at, _ in table.rows}, (table.device, table.op, "rows no sweep case reaches")
        for at, cfg in table.rows:
            assert cfg == winners[at], (table.device, table.op, at, tune.config_name(winners[at]))
            checked += 1
    assert checked
    for path in _tune_files():
        records = [r for r in json.loads(path.read_text())["records"] if r["kind"] == "tune"]
        source = str(path.relative_to(root))
        for gpu, op in {(r["gpu"], r.get("op") or "forward") for r in records}:
            table = gg.TABLES.get((gpu, op))
            assert table is not None and table.source == source, (source, gpu, op, "no table from this sweep")


# ----------------------------------------------------------------------------------------------
# plots


def _made_up_record(kind: str, case: dict, impl: str, layout: str | None, best: bool | None, ms: float) -> dict:
    """One record as the GPU profile writes it: ``case`` names the shape, split and method."""
    flops = gg.flops(case["tokens"], case["N"], case["K"])
    return {
        "kind": kind,
        "impl": impl,
        "w_layout": layout,
        **case,
        "ms": ms,
        "tflops": flops / ms / 1e9,
        "gpu": "NVIDIA H200",
        "torch_layout_best": best,
    }


def _gpu_like_records():
    """Records shaped as the GPU profile writes them (made up numbers): torch in two layouts,
    eager and graph, the host cost, a datasheet-listed GPU."""
    rows = []
    for i, (E, M, K, N) in enumerate(bench.SHAPES["gpu"]):
        for skew in distributions.SKEWS:
            for method in ("eager", "graph"):
                case = {"experts": E, "tokens": M, "K": K, "N": N, "skew": skew, "method": method}
                for impl, best, ms in (("labkit", None, 0.8 + 0.01 * i), ("torch_grouped_mm", True, 1.0)):
                    record = _made_up_record("gemm_backward", case, impl, None, best, ms)
                    rows.append(record | {"op": "wgrad", "ratio_vs_torch": ms / 1.0})
                for impl, layout, best, ms in (
                    ("labkit", "N-contiguous", None, 1.0),
                    ("torch_grouped_mm", "N-contiguous", False, 1.2),
                    ("torch_grouped_mm", "K-contiguous", True, 1.1),
                    ("host_sync_loop", "N-contiguous", None, 3.0),
                ):
                    if method == "graph" and impl == "host_sync_loop":
                        continue
                    rows.append(
                        _made_up_record("gemm", case, impl, layout, best, ms)
                        | {
                            "ratio_vs_torch": ms / 1.1,
                            "ratio_vs_torch_p25": ms / 1.15,
                            "ratio_vs_torch_p75": ms / 1.05,
                            "ratio_vs_loop": ms / 3.0 if method == "eager" else None,
                            "cpu_us": 30.0 if method == "eager" else None,
                        }
                    )
    return rows


@pytest.mark.parametrize("which", ["cpu", "gpu_like", "empty"])
def test_plots_draw(which, cpu_records):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = {"cpu": cpu_records, "gpu_like": _gpu_like_records(), "empty": []}[which]
    shapes = gemm_plots.shapes_of(records)
    fig, panels = plt.subplots(1, max(len(shapes), 1), figsize=(15, 3), squeeze=False)
    gemm_plots.plot_tflops_panels(records, panels[0], method="eager" if which == "gpu_like" else None)
    fig2, axes = plt.subplots(1, 4, figsize=(16, 3))
    gemm_plots.plot_ratio(records, axes[0], "vs torch")
    gemm_plots.plot_ratio(records, axes[1], "vs torch, wgrad", op="wgrad")
    gemm_plots.plot_ratio(records, axes[2], "vs loop", against="loop")
    gemm_plots.plot_cpu_cost(records, axes[3], "host cost")
    fig.canvas.draw()
    fig2.canvas.draw()
    if which == "gpu_like":
        assert shapes == sorted(bench.SHAPES["gpu"])  # one panel per shape
        for ax, shape in zip(panels[0], shapes):
            assert ax.get_title().startswith(f"E={shape[0]}:")
            # the ceiling in every panel, and labkit's ratio from each of its records above its bar
            assert any(line.get_ydata()[0] == pytest.approx(989.4) for line in ax.get_lines())
            ratios = {t.get_text() for t in ax.texts}
            expected = {
                f"×{r['ratio_vs_torch']:.2f}"
                for r in records
                if r["impl"] == "labkit" and r["method"] == "eager" and (r["experts"], r["tokens"]) == shape[:2]
            }
            assert ratios == expected and len(expected) == 2  # two made-up ratios per shape (forward, wgrad)
        labels = [t.get_text() for t in panels[0][0].get_legend().get_texts()]
        assert any("datasheet bf16 dense peak" in s and "989.4" in s for s in labels)
        assert len(axes[0].patches) == 2 * len(bench.SHAPES["gpu"]) * len(distributions.SKEWS)
        assert len(axes[1].patches) == 2 * len(bench.SHAPES["gpu"]) * len(distributions.SKEWS)
    plt.close(fig)
    plt.close(fig2)
    with pytest.raises(ValueError, match="against"):
        gemm_plots.ratio_rows(records, against="cublas")
    with pytest.raises(ValueError, match="op"):
        gemm_plots.ratio_rows(records, op="fgrad")


def test_datasheet_peak_is_only_for_listed_gpus():
    assert gemm_plots.datasheet_bf16_tflops("NVIDIA H200") == pytest.approx(989.4)
    assert gemm_plots.datasheet_bf16_tflops("NVIDIA H200 NVL") is None
    assert gemm_plots.datasheet_bf16_tflops(None) is None


# ----------------------------------------------------------------------------------------------
# GPU


def _torch_gate():
    ok, reason = baselines.torch_grouped_mm_available(torch.device("cuda"))
    if not ok:
        pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.parametrize("skew", distributions.SKEWS)
def test_torch_grouped_mm_and_labkit_agree(skew):
    _torch_gate()
    E, M, K, N = 8, 512, 256, 384
    counts = token_counts(E, M, skew, seed=7)
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(E, K, N, device="cuda", generator=g) / K**0.5).bfloat16()
    c = torch.tensor(counts, dtype=torch.int32, device="cuda")
    ours = gg.grouped_mm(x, w, c).float()
    ref = _reference64(x.cpu(), w.cpu(), counts).float().cuda()
    scale = float(ref.abs().max())
    for ww in (w, baselines.k_major(w)):
        theirs = baselines.torch_grouped_mm(x, ww, c).float()
        assert float((theirs - ref).abs().max()) <= 2**-7 * scale
        assert float((ours - theirs).abs().max()) <= 2**-6 * scale
    loop = baselines.host_sync_loop(x, w, c).float()
    assert float((loop - ref).abs().max()) <= 2**-7 * scale


@pytest.mark.gpu
def test_the_loop_cannot_be_captured_and_labkit_replays_new_counts():
    from labkit.workbench import sandbox

    res = sandbox.run_isolated(bench.capture_check, 8, 512, 128, 256, timeout=300)
    rows = {r["impl"]: r for r in res.unwrap()}
    assert rows["labkit"]["captured"] and rows["labkit"]["recount_correct"], rows["labkit"]
    assert rows["host_sync_loop"]["captured"] is False and rows["host_sync_loop"]["error"]
    if "torch_grouped_mm" in rows:
        assert rows["torch_grouped_mm"]["captured"] and rows["torch_grouped_mm"]["recount_correct"]
