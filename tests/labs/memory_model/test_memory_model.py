"""Lab 06 (labkit.labs.memory_model): the litmus sweep's records, the plots drawn from records
(skipped and zero-count rows included), lab 02's broken barriers under an in-kernel delay (the
emulated world on the CPU tier; 2 GPUs marked multigpu), the delay compiled away at 0, bad input."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from worlds import skip_without_a_world

from labkit.kernels.comm.ranks import run_ranks
from labkit.kernels.litmus import model, run_litmus
from labkit.labs.memory_model import broken_barriers as bb
from labkit.labs.memory_model import plots, sweep
from labkit.workbench import results, tier
from labkit.workbench.errors import UsageError

#: under pytest-xdist (make test) every test of this file runs in one worker: the CPU benchmark of its module fixture
#: runs once, not once per worker
pytestmark = pytest.mark.xdist_group("memory_model")


@pytest.fixture(scope="module")
def cpu_records():
    return sweep.sweep(("cross_cta", "same_cta"), "cpu", instances=64, tests=["MP", "IRIW"], progress=False)


@pytest.mark.skipif(not tier.interpreted(), reason="the cpu profile runs under the interpreter")
def test_cpu_records_carry_the_required_fields(cpu_records, tmp_path):
    assert len(cpu_records) == 2 * 2 * 2  # tests x plain/volatile x placements
    for r in cpu_records:
        assert all(k in r for k in sweep.REQUIRED), r
        assert r["tier"] == "interpreter" and r["skipped"] is None and r["stress_name"] == "none"
        assert r["warmup_s"] == 0.0  # nothing to compile under the interpreter: no warm-up launch
        assert r["runs"] == 64 and sum(r["counts"].values()) == 64 - r["unwritten"]
        assert r["unwritten"] == 0 and r["timeouts"] == 0
        # the interpreter runs programs one after another: sequentially consistent outcomes only
        assert set(r["counts"]) <= set(r["sc_outcomes"]) and r["weak_outcomes"] == 0
        assert r["rate"] == 0.0 and r["lower"] == 0.0 and 0 < r["upper"] < 0.06
        assert r["verdict"] == model.verdict(r["test"], r["semantics"], r["scope"], r["placement"])
        assert r["ptx_verdict"] in ("allowed", "forbidden") and r["not_possible"] == 0
        assert all("," in k for k in r["counts"]) and isinstance(r["stress"], dict)
    path = results.write_results(
        tmp_path / "memory_model_litmus.json", "litmus", cpu_records, generator="test", required=sweep.REQUIRED
    )
    assert len(results.load_results(path).records) == len(cpu_records)
    json.loads(path.read_text())


def test_the_grid_is_every_variant_of_the_model():
    grid = sweep.rows(("cross_cta", "same_cta"))
    per_placement = sum(1 for v in model.variants() if v[2] == "cross_cta")
    assert per_placement == 14
    assert len(grid) == 7 * 14 * 2 * len(sweep.STRESSES)
    assert len({sweep.key_of(r) for r in grid}) == len(grid)
    # rows sharing a kernel run one after another
    assert [r["stress_name"] for r in grid[:3]] == list(sweep.STRESSES)
    # "none" and "memory" compile to the same kernel: equal constexprs
    a, b = sweep.STRESSES["none"], sweep.STRESSES["memory"]
    assert (a.iterations, a.lines, a.delay) == (b.iterations, b.lines, b.delay) and a.programs == 0 < b.programs


def test_gpu_profile_without_gpus_records_every_row_as_skipped(monkeypatch):
    from labkit.workbench import gates

    monkeypatch.setattr(gates, "requires", lambda **kw: gates.Gate(False, "needs 2 CUDA GPUs; this machine has 0"))
    recs = sweep.benchmark_two_gpus("gpu")
    assert len(recs) == 7 * 14 * len(sweep.STRESSES)
    assert all(r["skipped"].startswith("needs 2") and r["runs"] == 0 and r["counts"] == {} for r in recs)
    assert all(k in r for r in recs for k in sweep.REQUIRED)
    recs = bb.benchmark("gpu")
    assert recs and all(r["skipped"] and r["wrong_results"] is None for r in recs)
    assert all(k in r for r in recs for k in bb.REQUIRED)


def test_budget_records_pending_rows_and_resume_keeps_finished_ones(tmp_path, cpu_records, monkeypatch):
    # a "gpu" sweep whose budget is spent at once: every row pending (nothing is launched)
    monkeypatch.setattr(sweep, "run_row", lambda *a, **k: pytest.fail("no row may run"))
    recs = sweep.sweep(("cross_cta",), "gpu", tests=["MP"], budget_s=-1.0, progress=False)
    assert len(recs) == 14 * len(sweep.STRESSES) and len(sweep.pending(recs)) == len(recs)
    # resume: a finished row with enough instances is kept as it was, not rerun
    done = dict(sweep.record(recs[0], skipped=None), runs=sweep.INSTANCES, skipped=None)
    path = results.write_results(
        tmp_path / "memory_model_litmus.json", "litmus", [done] + recs[1:], generator="test", required=sweep.REQUIRED
    )
    resume = sweep.load_resume(path)
    assert list(resume) == [sweep.key_of(done)]
    again = sweep.sweep(("cross_cta",), "gpu", tests=["MP"], budget_s=-1.0, resume=resume, progress=False)
    # kept as it was, marked with the commit that measured it (the earlier file's)
    commit = results.load_results(path).env.get("git_commit") or "unknown"
    assert again[0] == dict(done, resumed_from=commit) and len(sweep.pending(again)) == len(again) - 1
    # resumed a second time, a row keeps its first mark (a later file's commit did not measure it)
    path2 = results.write_results(
        tmp_path / "litmus2.json",
        "litmus",
        [dict(again[0], resumed_from="abc123")],
        generator="test",
        required=sweep.REQUIRED,
    )
    assert sweep.load_resume(path2)[sweep.key_of(done)]["resumed_from"] == "abc123"
    assert sweep.load_resume(tmp_path / "absent.json") == {}


@pytest.mark.skipif(not tier.interpreted(), reason="two CPU workers: the interpreter's rows")
def test_rows_dealt_to_two_workers_match_the_rows_run_here(cpu_records):
    """devices=[two]: the one-GPU rows run in two worker processes at once (on a GPU machine one
    per GPU); the records are those of the same rows run in this process (same seeds, the
    interpreter's deterministic order), in the grid's order, each naming the device that ran it."""
    dealt = sweep.sweep(
        ("cross_cta", "same_cta"), "cpu", instances=64, tests=["MP", "IRIW"], progress=False, devices=["cpu", "cpu"]
    )
    assert [sweep.key_of(r) for r in dealt] == [sweep.key_of(r) for r in cpu_records]
    for a, b in zip(dealt, cpu_records):
        assert a["skipped"] is None and a["counts"] == b["counts"] and a["runs"] == b["runs"] == 64
        assert a["device"] == "cpu"


def test_first_tests_run_first_and_nothing_is_left_out():
    grid = sweep.rows(("cross_cta",), tests=["MP", "SB", "IRIW"])
    order = sweep.batches(grid, list(range(len(grid))), first=("IRIW",))
    assert sorted(i for b in order for i in b) == list(range(len(grid)))
    tests = [grid[b[0]]["test"] for b in order]
    assert tests[:14] == ["IRIW"] * 14 and set(tests[14:]) == {"MP", "SB"}
    # one batch per test and variant: its three stresses, so one worker compiles the variant once
    assert all(len(b) == len(sweep.STRESSES) and len({sweep.key_of(grid[i])[:4] for i in b}) == 1 for b in order)
    assert sweep.first_tests(" IRIW, 2+2W ") == ("IRIW", "2+2W") and sweep.first_tests(None) == ()
    with pytest.raises(UsageError, match="LABKIT_LITMUS_FIRST: 'IRWI'"):
        sweep.first_tests("IRWI")
    with pytest.raises(UsageError, match="devices: expected a list"):
        sweep.sweep(("cross_cta",), "cpu", tests=["MP"], devices="cuda:0", progress=False)
    if tier.interpreted():
        assert sweep.gpu_devices() == []


def test_two_gpu_rows_sharing_a_variant_start_the_ranks_once(monkeypatch):
    """Two tests x (plain, volatile) in a world of 2 ranks (emulated on the CPU tier, 2 GPUs on the
    GPU tier): 2 starts of the ranks, not 4; the records come back in the grid's order, each with
    its own test's counts."""
    skip_without_a_world()
    starts = []
    real = sweep.run_two_gpus

    def counting(tests, *a, **k):
        starts.append(list(tests))
        return real(tests, *a, **k)

    monkeypatch.setattr(sweep, "run_two_gpus", counting)
    recs = sweep.sweep(("two_gpus",), "cpu", tests=["MP", "SB"], progress=False)
    assert starts == [["MP", "SB"], ["MP", "SB"]]
    assert [(r["test"], r["semantics"]) for r in recs] == [
        ("MP", "plain"),
        ("MP", "volatile"),
        ("SB", "plain"),
        ("SB", "volatile"),
    ]
    for r in recs:
        assert r["batch_rows"] == 2 and r["runs"] == sweep.TWO_RANK_CPU_INSTANCES and r["unwritten"] == 0
        assert sum(r["counts"].values()) == sweep.TWO_RANK_CPU_INSTANCES
        # what the simplified relaxed model allows: on two GPUs plain MP shows its weak outcome
        # (1,0) (reference/h200x2/memory_model_litmus_two_gpus.json); an emulated world runs on the host's TSO,
        # which keeps store-store and load-load order, so MP's weak outcome is forbidden there
        assert set(r["counts"]) <= set(r["model_outcomes"])
        if tier.interpreted() and r["test"] == "MP":
            assert set(r["counts"]) <= set(r["sc_outcomes"])
    with pytest.raises(UsageError, match="batch: every row must be two_gpus"):
        sweep.run_rows_two_gpus([recs[0], recs[1]], 16)


def test_bad_input_is_refused_naming_the_argument():
    with pytest.raises(UsageError, match="test: 'XY'"):
        sweep.rows(("cross_cta",), tests=["XY"])
    with pytest.raises(UsageError, match="stresses: 'heavy'"):
        sweep.rows(("cross_cta",), stresses=["heavy"])
    with pytest.raises(UsageError, match="placements: 'three_gpus'"):
        sweep.rows(("three_gpus",))
    with pytest.raises(UsageError, match="semantics: 'seq_cst'"):
        sweep.rows(("cross_cta",), semantics=["seq_cst"])
    # the product's own checks, through the lab's row runner
    with pytest.raises(UsageError, match="scope: 'device'"):
        sweep.run_row(
            {"test": "MP", "semantics": "relaxed", "scope": "device", "placement": "cross_cta", "stress_name": "none"},
            32,
        )
    with pytest.raises(UsageError, match="scope: 'gpu' given"):
        sweep.run_row(
            {"test": "MP", "semantics": "plain", "scope": "gpu", "placement": "cross_cta", "stress_name": "none"}, 32
        )
    # sys scope across GPUs needs symmetric memory: buffers of one device are refused
    from labkit.kernels.litmus import allocate

    with pytest.raises(UsageError, match="buffers: placement='two_gpus' needs symmetric memory"):
        run_litmus("MP", "plain", None, "two_gpus", 32, buffers=allocate(32))
    with pytest.raises(UsageError, match="instances: 64 is more than the buffers hold"):
        run_litmus("MP", "plain", None, "cross_cta", 64, buffers=allocate(32))
    for args, match in (
        ((("x", "one_shot", 0)), "variant: 'x'"),
        ((("correct", "ring", 0)), "algorithm: 'ring'"),
        ((("correct", "one_shot", -1)), "delay: expected an int >= 0"),
    ):
        with pytest.raises(UsageError, match=match):
            bb.measure(*args, trials=1, n=64)


# --- plots from records ----------------------------------------------------------------------


def _row(test="MP", semantics="relaxed", scope="gpu", placement="cross_cta", counts=None, skipped=None):
    row = {"test": test, "semantics": semantics, "scope": scope, "placement": placement, "stress_name": "memory"}
    if skipped:
        return sweep.record(row, skipped=skipped)
    rec = sweep.record(row)
    n = sum(counts.values())
    weak = counts.get(",".join(map(str, sweep.get_test(test).weak)), 0)
    return dict(
        rec,
        runs=n,
        classified=n,
        counts=counts,
        weak_outcomes=weak,
        rate=weak / n,
        lower=sweep.lower_bound(weak, n),
        upper=sweep.upper_bound(weak, n),
    )


def test_plots_draw_from_records_with_skipped_and_zero_rows():
    seen = _row(counts={"0,0": 500, "0,1": 3, "1,0": 7, "1,1": 490})
    zero = _row("IRIW", "fence_sc", "gpu", counts={"0,0,0,0": 10, "1,1,1,1": 990})
    skipped = _row("SB", "acq_rel", "sys", "two_gpus", skipped="needs 2 CUDA GPUs; this machine has 0")
    recs = [seen, zero, skipped]
    assert plots.rate_text(zero).startswith("weak not observed in 1,000")
    assert plots.rate_text(seen).startswith("weak 7 of 1,000")
    assert plots.rate_text(skipped).startswith("not run: needs 2")
    fig, axes = plt.subplots(1, 3)
    for ax, r in zip(axes, recs):
        plots.plot_histogram(r, ax)
    # model-forbidden outcomes are hatched: IRIW's weak outcome under fence_sc.gpu, cross_cta
    hatched = [b for b in axes[1].patches if b.get_hatch()]
    assert hatched
    plt.close(fig)
    rows, cols, cells = plots.observed_grid(recs)
    assert len(cols) == 14 and all(len(line) == 14 for line in cells)
    placed = {(t, p): line for (t, p), line in zip(rows, cells)}
    assert sum(c is not None for line in cells for c in line) == 2  # the skipped row is left blank
    ax = plots.plot_observed_grid(recs)
    labels = [t.get_text() for t in ax.texts]
    assert "0" in labels and plots.short_rate(0.007) in labels
    assert zero["verdict"] == "forbidden" and any(p.get_hatch() for p in ax.patches)
    assert placed[("SB", "two_gpus")] == [None] * 14
    plt.close(ax.figure)
    # an outcome both the model and PTX forbid, seen: framed in red
    weak = ",".join(map(str, sweep.get_test("IRIW").weak))
    bug = _row("IRIW", "fence_sc", "gpu", counts={"0,0,0,0": 10, weak: 1})
    ax = plots.plot_observed_grid([bug])
    assert any(not p.get_fill() and p.get_edgecolor()[:3] == matplotlib.colors.to_rgb(plots.WEAK) for p in ax.patches)
    plt.close(ax.figure)
    assert plots.short_rate(0.0241) == "2.4%" and plots.short_rate(7.06e-4) == "7e-4"
    # the cost figure keeps rows timed without their compile: warmup_s present (any stress), or
    # an older one-GPU row under "memory"; an older "none" row (its compile inside) is left out
    timed = dict(seen, seconds=0.5, runs=1000, warmup_s=0.2, stress_name="none")
    old_memory = dict(seen, seconds=0.2, runs=1000, semantics="acq_rel")
    old_none = dict(seen, seconds=9.0, runs=1000, stress_name="none", semantics="fence")
    assert plots.cost_rows([timed, old_memory, old_none], None) == [timed, old_memory]
    assert plots.cost_rows([timed, old_memory, old_none], "memory") == [old_memory]
    assert [(k, n) for k, *_, n in plots.cost_by_variant([timed, old_memory], None)] == [
        ("relaxed.gpu", 1),
        ("acq_rel.gpu", 1),
    ]
    assert plots.cost_by_variant([timed], None)[0][1] == pytest.approx(0.5 / 1000 * 1e9)
    ax = plots.plot_cost([timed, old_memory], None, "t", None)
    assert len(ax.patches) == 2 and "stress memory, none" in ax.get_title()
    plt.close(ax.figure)
    ax = plots.plot_cost([old_none], None, "t", "memory")
    assert "no row timed without its compile" in ax.texts[0].get_text()
    plt.close(ax.figure)
    for name in sweep.TESTS:
        plt.close(plots.plot_test(name).figure)
    plt.close(plots.plot_barrier_hb().figure)
    broken = [
        bb.row("one_shot", "no_end_barrier", 0, 4, "emulated", wrong_results=0),
        bb.row("one_shot", "no_end_barrier", 400, 4, "emulated", wrong_results=3),
        bb.row("tree", "gpu_scope", 400, 4, "gpus", skipped="needs 2 CUDA GPUs"),
    ]
    assert [(e["trials"], e["wrong"]) for e in bb.rates(broken)] == [(4, 0), (4, 3), (0, 0)]
    ax = plots.plot_broken(broken)
    assert "1 rows not run" in ax.get_title()
    plt.close(ax.figure)
    assert "allowed" in plots.model_table_text("MP")


# --- broken barriers -------------------------------------------------------------------------


@pytest.mark.skipif(not tier.interpreted(), reason="the emulated world is the CPU tier's; GPUs: the multigpu test")
def test_broken_barriers_in_the_emulated_world():
    """The correct kernel with a delay on rank 1 is never wrong; no_end_barrier goes wrong in
    some trials (a rank's next input lands while the slow rank reads), also when it runs after the
    correct one in the same pair of processes (measure_variants, as notebook 06 runs them)."""
    # every delay in one spawn: one record per delay, in order
    good = bb.measure_delays("correct", "one_shot", (0, 400), 4, 4096)
    assert [g["delay"] for g in good] == [0, 400] and [g["stress"] for g in good] == ["none", bb.STRESS]
    for g in good:
        assert g["world"] == "emulated" and g["skipped"] is None and g["wrong_results"] == 0 and g["pads_zero"], g
        assert g["wrong_per_rank"] == [0, 0] and g["seconds"] > 0 and g["wall_s"] >= 0
        assert g["setup_s"] > 0 and g["check_s"] > 0  # where a row's wall time goes besides its trials
        assert g["compare_s"] >= 0 and g["pads_s"] >= 0 and g["compare_s"] + g["pads_s"] <= g["check_s"] + 2e-3, g
    both = bb.measure_variants(["correct", "no_end_barrier"], "one_shot", (400,), 4, 4096)  # one spawn
    assert [(r["variant"], r["delay"]) for r in both] == [("correct", 400), ("no_end_barrier", 400)]
    assert both[0]["wrong_results"] == 0 and both[0]["pads_zero"] and both[0]["skipped"] is None, both[0]
    bad = both[1]
    assert bad["wrong_results"] > 0, bad
    assert all(k in bad for k in bb.REQUIRED) and set(bad) == set(good[1]) == set(both[0])


class _FakeRanks:
    """What ``run_ranks`` returns, made up: per rank, one dict per delay (``delayed_sweep``'s)."""

    def __init__(self, ok, variant, form, delays, trials, n, dtype_name):
        self.ok = ok
        self._values = [
            [
                {
                    "variant": variant,
                    "algorithm": form,
                    "delay": d,
                    "trials": trials,
                    "n": n,
                    "dtype": dtype_name,
                    "rank": r,
                    "wrong": int(d > 0 and r == 1),
                    "wrong_trials": [0] if d > 0 and r == 1 else [],
                    "seconds": 0.5 + r,
                    "pads_zero": True,
                    "setup_s": 2.0 + r,
                    "check_s": 0.1,
                    "compare_s": 0.06,
                    "pads_s": 0.04,
                }
                for d in delays
            ]
            for r in range(2)
        ]

    def summary(self):
        return "rank 0 ok (1.0 s); rank 1 illegal_memory_access (1.0 s)" if not self.ok else "ok"

    def unwrap(self):
        assert self.ok
        return self._values


def test_measure_variants_spawns_once_and_pins_a_failure_to_its_variant(monkeypatch, capsys):
    """Every variant and delay in one spawn (variants_sweep), the records those of measure_delays in
    variant order; if that spawn fails, each variant again in a spawn of its own."""
    calls = []

    def fake_run_ranks(fn, world, variants, form, delays, trials, n, dtype_name, timeout):
        calls.append((fn, variants))
        if fn is bb.variants_sweep:
            per_variant = [_FakeRanks(True, v, form, delays, trials, n, dtype_name).unwrap() for v in variants]
            fake = _FakeRanks(ok, variants[0], form, delays, trials, n, dtype_name)
            fake._values = [[rows[r] for rows in per_variant] for r in range(2)]
            return fake
        return _FakeRanks(variants != "no_end_barrier", variants, form, delays, trials, n, dtype_name)

    monkeypatch.setattr(bb, "run_ranks", fake_run_ranks)
    ok = True
    recs = bb.measure_variants(["correct", "no_end_barrier"], "one_shot", (0, 400), 4, 4096)
    assert calls == [(bb.variants_sweep, ["correct", "no_end_barrier"])]
    assert [(r["variant"], r["delay"]) for r in recs] == [
        (v, d) for v in ("correct", "no_end_barrier") for d in (0, 400)
    ]
    assert all(r["skipped"] is None and r["seconds"] == 1.5 for r in recs)
    assert [r["wrong_results"] for r in recs] == [0, 1, 0, 1]
    calls.clear()
    ok = False  # the shared spawn fails: each variant alone, and only no_end_barrier's rows are skipped
    recs = bb.measure_variants(["correct", "no_end_barrier"], "one_shot", (0, 400), 4, 4096)
    assert [c[0] for c in calls] == [bb.variants_sweep, bb.delayed_sweep, bb.delayed_sweep]
    assert [c[1] for c in calls[1:]] == ["correct", "no_end_barrier"]
    assert "measuring each variant in a spawn of its own" in capsys.readouterr().out
    assert [r["skipped"] is None for r in recs] == [True, True, False, False]
    calls.clear()
    one = bb.measure_variants(["correct"], "one_shot", (400,), 4, 4096)  # one variant: measure_delays
    assert calls == [(bb.delayed_sweep, "correct")] and one[0]["wrong_results"] == 1
    with pytest.raises(UsageError, match="variants"):
        bb.measure_variants("correct", "one_shot", (400,), 4, 4096)
    with pytest.raises(UsageError):
        bb.measure_variants(["correct", "no_such_variant"], "one_shot", (400,), 4, 4096)


def test_the_benchmark_spawns_once_per_form_and_variant(monkeypatch):
    """16 spawns for the profile's rows, every delay in each; a spawn that fails costs its own rows
    only (each skipped with run_ranks's reason), the others are kept; the records' keys unchanged."""
    calls = []

    def fake_run_ranks(fn, world, variant, form, delays, trials, n, dtype_name, timeout):
        calls.append((fn, world, variant, form, delays, timeout))
        return _FakeRanks((form, variant) != ("tree", "gpu_scope"), variant, form, delays, trials, n, dtype_name)

    monkeypatch.setattr(bb, "run_ranks", fake_run_ranks)
    monkeypatch.delenv(bb.BUDGET_ENV, raising=False)
    p = bb.PROFILES["cpu"]
    recs = bb.benchmark("cpu", progress=False)
    pairs = [(f, v) for f in p["forms"] for v in p["variants"]]
    assert len(calls) == len(pairs) == 16
    assert all(c[0] is bb.delayed_sweep and c[1] == 2 and c[4] == p["delays"] for c in calls)
    assert [(c[3], c[2]) for c in calls] == pairs
    assert all(0 < c[5] <= bb.SPAWN_TIMEOUT_S for c in calls)
    assert [(r["algorithm"], r["variant"], r["delay"]) for r in recs] == [
        (f, v, d) for f, v in pairs for d in p["delays"]
    ]
    world = "emulated" if tier.interpreted() else "gpus"
    ok = [r for r in recs if (r["algorithm"], r["variant"]) != ("tree", "gpu_scope")]
    failed = [r for r in recs if (r["algorithm"], r["variant"]) == ("tree", "gpu_scope")]
    assert len(failed) == len(p["delays"])
    assert all(r["skipped"].startswith("run_ranks: rank 0 ok") and r["wrong_results"] is None for r in failed)
    assert set(failed[0]) == set(bb.row("tree", "gpu_scope", 0, 4, world, skipped="x"))
    for r in ok:
        assert r["skipped"] is None and r["world"] == world and r["trials"] == p["trials"]
        assert r["wrong_results"] == (r["delay"] > 0) and r["wrong_per_rank"] == [0, int(r["delay"] > 0)]
        assert r["seconds"] == 1.5 and r["pads_zero"] is True and r["n"] == p["n"] and r["dtype"] == p["dtype"]
        assert r["setup_s"] == 3.0 and r["check_s"] == 0.1  # the slowest rank's phases
        assert r["compare_s"] == 0.06 and r["pads_s"] == 0.04
        assert set(r) == set(bb.REQUIRED) | {
            "stress",
            "slow_rank",
            "wrong_per_rank",
            "n",
            "dtype",
            "pads_zero",
            "seconds",
            "setup_s",
            "check_s",
            "compare_s",
            "pads_s",
            "wall_s",
        }
    # measure: one row, one spawn of one delay, the same record
    calls.clear()
    one = bb.measure("no_end_barrier", "two_shot", 400, 4, 4096)
    assert len(calls) == 1 and calls[0][4] == (400,) and calls[0][5] == bb.SPAWN_TIMEOUT_S
    assert one["wrong_results"] == 1 and set(one) == set(ok[0])
    calls.clear()  # bad delays are refused before any spawn
    with pytest.raises(UsageError, match="delays: expected at least one delay"):
        bb.measure_delays("correct", "one_shot", (), 4, 4096)
    with pytest.raises(UsageError, match="delays: expected a sequence"):
        bb.measure_delays("correct", "one_shot", 400, 4, 4096)
    with pytest.raises(UsageError, match="delay: expected an int >= 0"):
        bb.measure_delays("correct", "one_shot", (0, -5), 4, 4096)
    assert not calls


def test_a_resumed_call_keeps_finished_spawns_and_runs_the_rest(monkeypatch, tmp_path):
    """LABKIT_BARRIERS_RESUME: a (form, variant) whose every delay ran in the earlier file is kept,
    marked with the commit that measured it; one with a row not started is run again, whole."""
    from labkit.workbench import results

    p = bb.PROFILES["cpu"]
    pairs = [(f, v) for f in p["forms"] for v in p["variants"]]
    done, half = pairs[0], pairs[1]
    earlier = [bb.row(f, v, d, p["trials"], "emulated", wrong_results=0) for f, v in (done, half) for d in p["delays"]]
    earlier[-1] = bb.row(*half, p["delays"][-1], p["trials"], "emulated", skipped=bb.not_started(10))
    path = results.write_results(
        tmp_path / "memory_model_broken_barriers.json",
        "broken_barriers",
        earlier,
        generator="test",
        required=bb.REQUIRED,
    )
    spawns = []

    def fake_measure_delays(variant, form, delays, trials, n, dtype_name, timeout):
        spawns.append((form, variant))
        return [bb.row(form, variant, d, trials, "emulated", wrong_results=1) for d in delays]

    monkeypatch.setattr(bb, "measure_delays", fake_measure_delays)
    monkeypatch.setenv(bb.RESUME_ENV, str(path))
    monkeypatch.delenv(bb.BUDGET_ENV, raising=False)
    recs = bb.benchmark("cpu", progress=False)
    assert spawns == pairs[1:]  # the finished pair is not spawned again
    assert [(r["algorithm"], r["variant"], r["delay"]) for r in recs] == [
        (f, v, d) for f, v in pairs for d in p["delays"]
    ]  # the grid's order, kept rows included
    commit = results.load_results(path).env.get("git_commit") or "unknown"
    kept = recs[: len(p["delays"])]
    assert all(r["wrong_results"] == 0 and r["resumed_from"] == commit for r in kept)
    assert all("resumed_from" not in r and r["wrong_results"] == 1 for r in recs[len(p["delays"]) :])
    assert bb.load_resume(None) == {} and bb.load_resume(tmp_path / "absent.json") == {}


def test_the_budget_stops_new_spawns_and_records_the_rest(monkeypatch):
    """After LABKIT_BARRIERS_BUDGET_S seconds no new spawn starts: the rows left are recorded as not
    started, and a spawn's timeout is cut to end by the budget plus GRACE_S (a fake clock, no spawn)."""
    now = [1000.0]
    spawns = []

    def fake_measure_delays(variant, form, delays, trials, n, dtype_name, timeout):
        spawns.append((form, variant, timeout))
        now[0] += 100.0  # every spawn takes 100 s
        return [bb.row(form, variant, d, trials, "gpus", wrong_results=0) for d in delays]

    monkeypatch.setattr(bb, "_clock", lambda: now[0])
    monkeypatch.setattr(bb, "measure_delays", fake_measure_delays)
    monkeypatch.setenv(bb.BUDGET_ENV, "250")
    assert bb.budget_s() == 250.0
    p = bb.PROFILES["cpu"]
    recs = bb.benchmark("cpu", progress=False)
    # spawns start at 0, 100 and 200 s (within 250 s); the fourth would start at 300 s
    assert len(spawns) == 3
    assert [t for _, _, t in spawns] == [250 + bb.GRACE_S, 150 + bb.GRACE_S, 50 + bb.GRACE_S]
    assert len(recs) == 16 * len(p["delays"])
    run, rest = recs[: 3 * len(p["delays"])], recs[3 * len(p["delays"]) :]
    assert all(r["skipped"] is None for r in run)
    assert all(r["skipped"] == "not started: the budget of 250 s ran out" and r["wrong_results"] is None for r in rest)
    assert all(k in r for r in recs for k in bb.REQUIRED)
    assert [(e["trials"], e["skipped"]) for e in bb.rates(rest)][:1] == [(0, rest[0]["skipped"])]
    # the default, an explicit budget, and bad values naming the variable
    monkeypatch.delenv(bb.BUDGET_ENV)
    assert bb.budget_s() == bb.BUDGET_S == 480.0
    spawns.clear()
    assert all(r["skipped"].startswith("not started") for r in bb.benchmark("cpu", budget=-1, progress=False))
    assert not spawns
    for bad in ("soon", "-3", "nan"):
        monkeypatch.setenv(bb.BUDGET_ENV, bad)
        with pytest.raises(UsageError, match=f"{bb.BUDGET_ENV}: expected seconds >= 0"):
            bb.budget_s()


@pytest.mark.skipif(not tier.interpreted(), reason="the emulated world")
def test_delay_zero_leaves_results_identical():
    """The same inputs with DELAY=0 given explicitly and without it: bit-identical results (the
    delayed plan adds nothing at 0), correct against the fp64 reference."""
    res = run_ranks(bb.zero_delay_matches, 2, timeout=300).unwrap()
    assert all(r == (True, True) for r in res), res


def test_delay_compiles_away_at_zero_and_gpu_scope_is_gpu_scoped():
    """Compiled for sm_90 in a child with TRITON_INTERPRET=0 (no GPU needed)."""
    from labkit.workbench import sandbox

    res = sandbox.run_isolated(
        bb.delay_ptx, ["one_shot", "two_shot", "tree"], timeout=600, env={"TRITON_INTERPRET": "0"}
    )
    rows = res.unwrap()
    for r in rows:
        if r["delay"] == 0:
            # the start barrier's spin has no volatile load: every one is the delay's
            assert r["volatile_loads"] == 0, r
        else:
            assert r["volatile_loads"] > 0, r
        if r["sem"] == 2:
            assert all(".sys." not in a for a in r["atomics"]) and any(".gpu." in a for a in r["atomics"]), r
        else:
            assert any("release.sys" in a for a in r["atomics"]), r


@pytest.mark.multigpu
def test_broken_barriers_on_two_gpus():
    """2 GPUs: the correct kernel under the largest delay is never wrong; the rows carry what the
    records need (how often no_end_barrier breaks is measured, not asserted: the bench records it)."""
    from labkit.workbench import gates

    gate = gates.requires(gpus=2, peer_access=True, compiled=True)
    if not gate.ok:
        pytest.skip(gate.reason)
    good = bb.measure("correct", "one_shot", 10000, 8, 1 << 16, "bfloat16")
    assert good["world"] == "gpus" and good["wrong_results"] == 0 and good["pads_zero"], good
    bad = bb.measure("no_end_barrier", "one_shot", 10000, 8, 1 << 16, "bfloat16")
    assert bad["skipped"] is None and 0 <= bad["wrong_results"] <= 8, bad


@pytest.mark.gpu
def test_litmus_rows_on_one_gpu():
    from labkit.workbench import gates

    gate = gates.requires(gpus=1, compiled=True)
    if not gate.ok:
        pytest.skip(gate.reason)
    recs = sweep.sweep(
        ("cross_cta", "same_cta"),
        "gpu",
        instances=20_000,
        tests=["MP"],
        semantics=["plain", "acq_rel"],
        stresses=["memory"],
        budget_s=1e9,
        progress=False,
    )
    assert len(recs) == 2 * (1 + 3)
    for r in recs:
        assert r["tier"] == "gpu" and r["skipped"] is None and r["runs"] == 20_000, r
        assert r["timeouts"] == 0 and r["unwritten"] == 0 and r["not_possible"] == 0, r
        assert r["warmup_s"] > 0 and r["seconds"] > 0, r  # the compile ran untimed, before the launches


@pytest.mark.multigpu
def test_one_gpu_rows_dealt_to_every_gpu():
    """labkit bench memory_model_litmus on a machine of several GPUs: one worker per GPU, each row on its GPU."""
    from labkit.workbench import gates

    gate = gates.requires(gpus=2, compiled=True)
    if not gate.ok:
        pytest.skip(gate.reason)
    devices = sweep.gpu_devices()
    recs = sweep.sweep(
        ("cross_cta",),
        "gpu",
        instances=20_000,
        tests=["MP", "SB"],
        semantics=["plain", "acq_rel"],
        stresses=["memory"],
        budget_s=1e9,
        progress=False,
        devices=devices,
    )
    assert len(recs) == 2 * (1 + 3)
    for r in recs:
        assert r["skipped"] is None and r["runs"] == 20_000 and r["timeouts"] == 0 and r["unwritten"] == 0, r
        assert r["device"] in devices, r
    assert {r["device"] for r in recs} == set(devices[: len(recs)])  # each worker took a row at the start


@pytest.mark.multigpu
def test_litmus_rows_on_two_gpus():
    from labkit.workbench import gates

    gate = gates.requires(gpus=2, peer_access=True, compiled=True)
    if not gate.ok:
        pytest.skip(gate.reason)
    recs = sweep.sweep(
        ("two_gpus",),
        "gpu",
        instances=20_000,
        tests=["MP"],
        semantics=["acq_rel"],
        stresses=["none"],
        budget_s=1e9,
        progress=False,
    )
    assert len(recs) == 3
    for r in recs:
        assert r["skipped"] is None and r["runs"] == 20_000 and r["timeouts"] == 0 and r["not_possible"] == 0, r
        assert r["warmup_s"] > 0, r


# --- panels ----------------------------------------------------------------------------------


def test_the_litmus_panel_reruns_and_redraws():
    from labkit.labs.memory_model import widgets

    panel = widgets.litmus_explorer([], 0)
    text, figure = panel.children[5], panel.children[6]
    first, drawn = text.value, figure.value
    panel.children[0].value = "SB"  # the first control: the test
    assert text.value != first and "SB" in text.value
    assert bytes(drawn)[:4] == b"\x89PNG" and bytes(figure.value) != bytes(drawn)
    panel.children[1].value = "acq_rel"
    if tier.interpreted():
        assert "not run" in text.value and "outcomes the model allows" in text.value
    rec, where = widgets.litmus_record("MP", "plain", "none", "cross_cta", "none")
    assert rec["runs"] == widgets.LIVE_INSTANCES["interpreter" if tier.interpreted() else "gpu"]
    plt.close(widgets.litmus_figure(rec))


def test_the_broken_panel_reads_recorded_rows():
    from labkit.labs.memory_model import widgets

    recorded = [bb.row("one_shot", "no_end_barrier", 100, 60, "gpus", wrong_results=41, pads_zero=True)]
    text = widgets.broken_report("one_shot", "no_end_barrier", 100, 60, recorded, live=False)
    assert "RECORDED" in text and "41 of 60" in text
    assert "no recorded row" in widgets.broken_report("tree", "relaxed", 100, 60, recorded, live=False)
    panel = widgets.broken_explorer(recorded, live=False)
    assert panel.children[0].value == "no_end_barrier"


def test_the_model_grid_marks_where_ptx_allows_more():
    rows, cols, cells = plots.model_grid()
    at = {(r, c): v for r, line in zip(rows, cells) for c, v in zip(cols, line)}
    assert len(cells) == len(rows) and all(len(line) == len(cols) for line in cells)
    assert at[(("MP", "cross_cta"), ("acq_rel", "gpu"))] == "forbidden"
    assert at[(("MP", "two_gpus"), ("acq_rel", "gpu"))] == "allowed"  # gpu scope does not cover two GPUs
    assert at[(("CoRR", "cross_cta"), ("plain", None))] == "ptx_allows"  # coherence only for strong accesses
    assert at[(("IRIW", "cross_cta"), ("acq_rel", "gpu"))] == "ptx_allows"
    assert at[(("IRIW", "cross_cta"), ("fence_sc", "gpu"))] == "forbidden"
    ax = plots.plot_model_grid()
    assert len(ax.patches) == len(rows) * len(cols)
    plt.close(ax.figure)
