"""labkit.kernels.litmus: the tests as data, the outcome enumerator against hand-derived tables
and against an independent classification (reeselevine/cuda-litmus), the classifier's
statistics, every test run under the interpreter (only SC outcomes may appear there), the PTX
the GPU-only variants compile to, and bad input. GPU tests run every variant at 1e5 instances."""

import math
import secrets

import pytest
import torch

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels import litmus
from labkit.kernels.litmus import catalogue, model
from labkit.kernels.litmus import classify as C
from labkit.kernels.litmus.run import Stress, allocate, run_litmus, run_two_gpus
from labkit.workbench import tier
from labkit.workbench.errors import UsageError

TESTS = list(catalogue.TESTS)
INTERPRETED = tier.interpreted()


# --- the catalogue ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TESTS)
def test_every_test_is_well_formed(name):
    t = catalogue.TESTS[name]
    assert 1 <= max(len(th) for th in t.threads) <= 2  # the kernel plays at most two accesses a thread
    loads = [a.reg for th in t.threads for a in th if a.kind == "ld"]
    assert sorted(loads) == sorted(t.registers) and len(set(loads)) == len(loads)
    assert len(t.weak) == len(t.observed) and set(t.finals) <= set(catalogue.LOCATIONS)
    assert name in t.describe()


# --- the model -----------------------------------------------------------------------------------

#: SC outcomes, derived by hand (all interleavings), in ``observed`` order
SC = {
    "MP": {(0, 0), (0, 1), (1, 1)},
    "SB": {(0, 1), (1, 0), (1, 1)},
    "LB": {(0, 0), (0, 1), (1, 0)},
    "CoRR": {(0, 0), (0, 1), (1, 1)},
    "2+2W": {(1, 2), (2, 1), (2, 2)},
    # RWC: r0=1, r1=0 puts T1 between x=1 and y=1, so T2's load (after y=1) sees x=1
    "RWC": {(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 1), (1, 1, 0), (1, 1, 1)},
}
#: semantics that forbid the weak outcome when their scope covers the placement (module docstring)
FORBIDDING = {
    "MP": {"acq_rel", "fence", "fence_sc"},
    "SB": {"fence_sc"},
    "LB": {"acq_rel", "fence", "fence_sc"},
    "CoRR": set(model.SEMANTICS),
    "IRIW": {"acq_rel", "fence", "fence_sc"},
    "2+2W": {"acq_rel", "fence", "fence_sc"},
    "RWC": {"fence_sc"},
}


@pytest.mark.parametrize("name", TESTS)
def test_sc_outcomes_match_the_hand_derived_sets(name):
    got = model.outcomes(name, "sc")
    if name == "IRIW":  # 16 register combinations, all but the weak one
        assert got == {o for o in __import__("itertools").product((0, 1), repeat=4)} - {(1, 0, 1, 0)}
    else:
        assert got == SC[name]
    assert catalogue.TESTS[name].weak not in got


@pytest.mark.parametrize("name", TESTS)
def test_the_relaxed_table_matches_the_hand_derived_rules(name):
    for sem, scope, placement in model.variants():
        weak_forbidden = (name == "CoRR") or (sem in FORBIDDING[name] and model.covers(scope, placement))
        assert model.verdict(name, sem, scope, placement) == ("forbidden" if weak_forbidden else "allowed"), (
            name,
            sem,
            scope,
            placement,
        )


@pytest.mark.parametrize("name", TESTS)
def test_stronger_semantics_or_wider_scope_only_remove_outcomes(name):
    sc = model.outcomes(name, "sc")
    plain = model.outcomes(name, "relaxed", "plain", None, "cross_cta")
    for sem, scope, placement in model.variants():
        got = model.outcomes(name, "relaxed", sem, scope, placement)
        assert sc <= got <= plain, (sem, scope, placement)
        if scope is not None and scope != "sys":
            wider = model.outcomes(name, "relaxed", sem, model.SCOPES[model.SCOPES.index(scope) + 1], placement)
            assert wider <= got
    assert model.outcomes(name, "relaxed", "fence_sc", "sys", "two_gpus") == sc  # fence.sc everywhere: SC


def test_scope_covers_placement():
    assert model.covers("cta", "same_cta") and not model.covers("cta", "cross_cta")
    assert model.covers("gpu", "cross_cta") and not model.covers("gpu", "two_gpus")
    assert model.covers("sys", "two_gpus") and not model.covers(None, "same_cta")


# reeselevine/cuda-litmus, pldi26-output/results.csv (test, base, strengthened, a100, h100, gh200):
# `base` is the PTX model run in Alloy (INSTANCE: the weak outcome is allowed; UNSAT: forbidden),
# `strengthened` the stronger model that repository proposes, then whether each GPU showed it.
# TB_0_1[_2[_3]]: every thread in its own thread block (our cross_cta); TB_01: one block (same_cta).
# SCOPE_*: the atomics' scope; FENCE_SCOPE_*: the fences' (atomic_thread_fence(acq_rel), 2+2w.cu
# and iriw.cu); NO_FENCE_ACQUIRE: first loads acquire; NO_FENCE_RELEASE: second stores release.
# Each row maps to the variant of ours that orders the same pairs at the same scope.
ANCHOR = [
    # (row, base, strengthened, seen on h100, our (test, semantics, scope, placement))
    (
        "iriw_TB_0_1_2_3_SCOPE_DEVICE_NO_FENCE_RELAXED",
        "INSTANCE",
        "INSTANCE",
        True,
        ("IRIW", "relaxed", "gpu", "cross_cta"),
    ),
    (
        "iriw_TB_0_1_2_3_SCOPE_DEVICE_NO_FENCE_ACQUIRE",
        "INSTANCE",
        "INSTANCE",
        False,
        ("IRIW", "acq_rel", "gpu", "cross_cta"),
    ),
    (
        "iriw_TB_0_1_2_3_SCOPE_DEVICE_FENCE_SCOPE_DEVICE_BOTH_FENCE",
        "INSTANCE",
        "INSTANCE",
        False,
        ("IRIW", "fence", "gpu", "cross_cta"),
    ),
    (
        "iriw_TB_0_1_2_3_SCOPE_BLOCK_FENCE_SCOPE_BLOCK_BOTH_FENCE",
        "INSTANCE",
        "INSTANCE",
        True,
        ("IRIW", "fence", "cta", "cross_cta"),
    ),
    (
        "two_2w_TB_0_1_SCOPE_DEVICE_NO_FENCE_RELAXED",
        "INSTANCE",
        "INSTANCE",
        True,
        ("2+2W", "relaxed", "gpu", "cross_cta"),
    ),
    (
        "two_2w_TB_0_1_SCOPE_DEVICE_NO_FENCE_RELEASE",
        "INSTANCE",
        "UNSAT",
        False,
        ("2+2W", "acq_rel", "gpu", "cross_cta"),
    ),
    (
        "two_2w_TB_0_1_SCOPE_DEVICE_FENCE_SCOPE_DEVICE_BOTH_FENCE",
        "INSTANCE",
        "UNSAT",
        False,
        ("2+2W", "fence", "gpu", "cross_cta"),
    ),
    (
        "two_2w_TB_0_1_SCOPE_BLOCK_NO_FENCE_RELEASE",
        "INSTANCE",
        "INSTANCE",
        True,
        ("2+2W", "acq_rel", "cta", "cross_cta"),
    ),
    ("two_2w_TB_01_SCOPE_BLOCK_NO_FENCE_RELEASE", "INSTANCE", "UNSAT", False, ("2+2W", "acq_rel", "cta", "same_cta")),
    (
        "two_2w_TB_01_SCOPE_BLOCK_NO_FENCE_RELAXED",
        "INSTANCE",
        "INSTANCE",
        False,
        ("2+2W", "relaxed", "cta", "same_cta"),
    ),
    (
        "rwc_TB_0_1_2_SCOPE_DEVICE_NO_FENCE_RELAXED",
        "INSTANCE",
        "INSTANCE",
        True,
        ("RWC", "relaxed", "gpu", "cross_cta"),
    ),
]
#: rows where their variant is stronger than ours (theirs: acq_rel fence in T1, fence.sc in T2;
#: ours, `fence`: acq_rel fences in both): allowed for theirs implies allowed for ours
ANCHOR_STRONGER = [
    (
        "rwc_TB_0_1_2_SCOPE_DEVICE_FENCE_SCOPE_DEVICE_BOTH_FENCE",
        "INSTANCE",
        "INSTANCE",
        False,
        ("RWC", "fence", "gpu", "cross_cta"),
    ),
]


@pytest.mark.parametrize("row", ANCHOR, ids=[r[0] for r in ANCHOR])
def test_ptx_verdicts_agree_with_the_alloy_model_of_cuda_litmus(row):
    name, base, strengthened, seen, variant = row
    ptx, why = model.ptx_verdict(*variant)
    assert ptx == ("allowed" if base == "INSTANCE" else "forbidden")
    mine = model.verdict(*variant)
    if seen:  # a model that forbids what a GPU did would be wrong
        assert mine == "allowed"
    if variant[0] == "2+2W":  # our 2+2W rule is the strengthened model's
        assert mine == ("allowed" if strengthened == "INSTANCE" else "forbidden")
    if mine != ptx:  # every disagreement is a documented one, with its reason
        assert why and variant[0] in ("IRIW", "2+2W", "CoRR")


@pytest.mark.parametrize("row", ANCHOR_STRONGER, ids=[r[0] for r in ANCHOR_STRONGER])
def test_a_weaker_variant_of_an_allowed_anchor_row_is_allowed(row):
    _, base, _, _, variant = row
    assert base == "INSTANCE" and model.verdict(*variant) == "allowed" and model.ptx_verdict(*variant)[0] == "allowed"


def test_model_and_ptx_differ_only_where_the_docstring_says():
    diffs = {(r["test"], r["semantics"]) for r in model.table() if r["model"] != r["ptx"]}
    assert diffs == {("CoRR", s) for s in model.SEMANTICS} | {
        (t, s) for t in ("IRIW", "2+2W") for s in ("acq_rel", "fence")
    }
    assert all(
        r["ptx"] == "forbidden"
        for r in model.table()
        if r["semantics"] == "fence_sc" and model.covers(r["scope"], r["placement"])
    )


def test_possible_adds_only_the_weak_outcome_where_ptx_allows_it():
    for name in TESTS:
        t = catalogue.TESTS[name]
        for sem, scope, placement in model.variants():
            extra = model.possible(name, sem, scope, placement) - model.outcomes(name, "relaxed", sem, scope, placement)
            ptx_only = (
                model.ptx_verdict(name, sem, scope, placement)[0] == "allowed"
                and model.verdict(name, sem, scope, placement) == "forbidden"
            )
            assert extra == ({t.weak} if ptx_only else set())
            # every outcome but the weak one is SC: nothing else can be a PTX-only outcome
            assert model.outcomes(name, "sc") | {t.weak} == model.outcomes(
                name, "relaxed", "plain", None, placement
            ) | {t.weak}


# --- the classifier ---------------------------------------------------------------------------------


def test_histogram_and_weak_count_on_hand_made_records():
    records = torch.tensor([[0, 0], [1, 1], [1, 0], [1, 1], [0, 1], [1, 0]], dtype=torch.int32)
    res = C.classify("MP", records, "relaxed", "gpu", "cross_cta")
    assert res.counts == {(0, 0): 1, (0, 1): 1, (1, 0): 2, (1, 1): 2}
    assert (res.weak, res.instances, res.rate) == (2, 6, 2 / 6)
    assert res.not_sc == {(1, 0): 2} and res.forbidden == {} and res.verdict == "allowed"
    strict = C.classify("MP", records, "acq_rel", "gpu", "cross_cta")
    assert strict.forbidden == {(1, 0): 2} and "FORBIDDEN" in strict.summary()


def test_classify_takes_a_histogram_and_marks_coherence_violations():
    res = C.classify("CoRR", {(1, 0): 3, (1, 1): 97}, "relaxed", "sys", "two_gpus")
    assert res.forbidden == {(1, 0): 3} and res.weak == 3 and res.verdict == "forbidden"


def test_zero_weak_is_reported_as_a_bound_not_a_zero():
    n = 1000
    res = C.classify("SB", {(0, 1): 600, (1, 0): 400})
    assert res.weak == 0 and res.forbidden is None
    assert res.upper == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-12) and 2.9 / n < res.upper < 3.1 / n
    assert "not observed in 1,000 instances" in res.summary()


@pytest.mark.parametrize("k,n", [(1, 10), (5, 100), (3, 7), (50, 60), (0, 1)])
def test_clopper_pearson_bounds_solve_the_binomial_tail(k, n):
    def cdf(k, n, p):
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))

    up = C.upper_bound(k, n)
    assert cdf(k, n, up) == pytest.approx(0.05, abs=1e-9)
    lo = C.lower_bound(k, n)
    if k:
        assert 1 - cdf(k - 1, n, lo) == pytest.approx(0.05, abs=1e-9)
    assert lo <= k / n <= up


def test_bounds_at_the_anchor_scale():
    """35,449 weak of 1.19e9 (cuda-litmus's cta-fence IRIW count): the bound is tight; fast."""
    k, n = 35_449, 1_190_000_000
    assert k / n < C.upper_bound(k, n) < 1.01 * k / n
    assert C.upper_bound(n, n) == 1.0


def test_classifier_refuses_bad_records():
    with pytest.raises(UsageError, match="records"):
        C.histogram(torch.zeros(3))
    with pytest.raises(UsageError, match="records"):
        C.histogram(torch.zeros(3, 2))  # floats
    with pytest.raises(UsageError, match="observes 4"):
        C.classify("IRIW", {(0, 1): 3})
    with pytest.raises(UsageError, match="n: 0"):
        C.upper_bound(0, 0)
    with pytest.raises(UsageError, match="impossible"):
        C.upper_bound(5, 3)
    with pytest.raises(UsageError, match="confidence"):
        C.upper_bound(1, 3, confidence=95)


# --- runs under the interpreter (and the CPU-safe parts of the API everywhere) -----------------------

CPU_SEMANTICS = ("plain", "volatile")


@pytest.mark.parametrize("name", TESTS)
@pytest.mark.parametrize("placement", ["cross_cta", "same_cta"])
def test_every_test_runs_and_every_outcome_is_possible(name, placement):
    """Under the interpreter programs run one after another: every outcome must be SC. On a GPU
    (plain accesses race) every outcome must be possible (``model.possible``)."""
    seed = secrets.randbelow(2**20)
    n = 200 if INTERPRETED else 20_000
    for sem in CPU_SEMANTICS:
        res = run_litmus(name, sem, None, placement, n, seed=seed)
        assert sum(res.counts.values()) == n and res.unwritten == 0 and res.timeouts == 0, (seed, res)
        allowed = model.outcomes(name, "sc") if INTERPRETED else model.possible(name, sem, None, placement)
        assert set(res.counts) <= allowed, (seed, sem, res.counts)


@pytest.mark.skipif(
    not INTERPRETED, reason="checks the interpreter's sequential programs (a GPU may show weak outcomes)"
)
def test_stress_and_delay_change_nothing_under_the_interpreter():
    res = run_litmus(
        "IRIW", "volatile", None, "cross_cta", 100, seed=3, stress=Stress(programs=3, iterations=4, lines=4, delay=2)
    )
    assert sum(res.counts.values()) == 100 and set(res.counts) <= model.outcomes("IRIW", "sc")
    assert res.stress.programs == 3 and res.classify().instances == 100


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter runs programs one after another")
def test_a_barrier_that_cannot_complete_becomes_a_timeout_count():
    """Sequential programs never meet: all but the last give up after `spin` polls, and say so."""
    res = run_litmus("MP", "plain", None, "cross_cta", 64, stress=Stress(barrier=True, spin=5))
    programs = 2 * 64 // res.lanes  # 2 roles x groups
    assert res.timeouts == programs - 1 and sum(res.counts.values()) == 64


def test_many_instances_are_split_into_launches_of_resident_programs():
    """programs_per_launch=4 with 2 roles and 32 lanes: 64 instances a launch, 200 in 4 launches."""
    res = run_litmus("MP", "plain", None, "cross_cta", 200, programs_per_launch=4, lanes=32)
    assert res.launches == 4 and sum(res.counts.values()) == 200 and res.unwritten == 0
    assert set(res.counts) <= model.outcomes("MP", "sc" if INTERPRETED else "relaxed")
    with pytest.raises(UsageError, match="stress.programs: 4 leaves no room"):
        run_litmus("MP", "plain", None, "cross_cta", 200, programs_per_launch=4, stress=Stress(programs=4))


def test_buffers_are_reused_and_layouts_follow_the_seed():
    bufs = allocate(300)
    a = run_litmus("SB", "plain", None, "cross_cta", 300, buffers=bufs, seed=5, keep_records=True)
    b = run_litmus("SB", "plain", None, "cross_cta", 300, buffers=bufs, seed=5, keep_records=True)
    if INTERPRETED:  # deterministic there: same seed, same interleaving, same records
        assert torch.equal(a.records, b.records)
    assert a.records.shape == (300, 2)
    with pytest.raises(UsageError, match="instances: 301 is more than the buffers hold"):
        run_litmus("SB", "plain", None, "cross_cta", 301, buffers=bufs)
    with pytest.raises(UsageError, match="stride: 8 differs"):
        run_litmus("SB", "plain", None, "cross_cta", 30, buffers=bufs, stride=8)


@pytest.mark.skipif(not INTERPRETED, reason="under the interpreter only")
def test_two_gpus_runs_on_emulated_ranks_and_says_whose_memory_model_applies():
    res = run_litmus("MP", "plain", None, "two_gpus", 100, seed=1, timeout=120, programs_per_launch=2)
    assert res.note.startswith("emulated ranks") and "x86-TSO" in res.note
    assert res.launches == 2  # one role per rank, 2 programs of 32 lanes: 64 instances a launch
    assert sum(res.counts.values()) == 100 and res.unwritten == 0
    # real processes run concurrently: only what the host's TSO allows (MP's weak outcome is not)
    assert set(res.counts) <= model.outcomes("MP", "sc")


@pytest.mark.skipif(not INTERPRETED, reason="under the interpreter only")
def test_several_tests_run_in_one_start_of_the_two_ranks():
    runs = run_two_gpus(["SB", "MP", "IRIW"], "plain", None, 96, seed=3, timeout=120)
    assert [r.test for r in runs] == ["SB", "MP", "IRIW"]  # in the order asked
    for r in runs:
        assert r.placement == "two_gpus" and r.seed == 3 and r.note.startswith("emulated ranks")
        assert sum(r.counts.values()) == 96 and r.unwritten == 0
        assert set(r.counts) <= model.outcomes(r.test, "sc")
    one = run_litmus("IRIW", "plain", None, "two_gpus", 96, seed=3, timeout=120)
    assert (one.instances, one.stride, one.lanes, one.launches) == (
        runs[2].instances,
        runs[2].stride,
        runs[2].lanes,
        runs[2].launches,
    )  # what run_litmus runs


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        (("MP",), {}, "tests: expected a non-empty list"),
        (([],), {}, "tests: expected a non-empty list"),
        ((["MP", "XYZ"],), {}, "test: 'XYZ' is not a litmus test"),
        ((["MP"], "relaxed", "device"), {}, "scope: 'device'"),
        ((["MP"],), {"instances": 0}, "instances"),
        ((["MP"],), {"stress": {"programs": 1}}, "stress: expected"),
    ],
)
def test_run_two_gpus_refuses_bad_input_naming_the_argument(args, kwargs, match):
    with pytest.raises(UsageError, match=match):
        run_two_gpus(*args, **kwargs)


# --- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"test": "XYZ"}, "test: 'XYZ' is not a litmus test"),
        ({"semantics": "seq_cst"}, "semantics: 'seq_cst'"),
        ({"semantics": "relaxed", "scope": "device"}, "scope: 'device'"),
        ({"semantics": "relaxed", "scope": None}, "needs a scope"),
        ({"scope": "gpu"}, "carry no scope"),
        ({"placement": "two_ctas"}, "placement: 'two_ctas'"),
        ({"instances": 0}, "instances"),
        ({"instances": 2.5}, "instances"),
        ({"lanes": 48}, "lanes"),
        ({"stress": Stress(programs=-1)}, "stress.programs"),
        ({"stress": {"programs": 1}}, "stress: expected"),
        ({"programs_per_launch": 0}, "programs_per_launch"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {"test": "MP", "semantics": "plain", "scope": None, "placement": "cross_cta", "instances": 32}
    args.update(kwargs)
    with pytest.raises(UsageError, match=match):
        run_litmus(args.pop("test"), **args)


@pytest.mark.skipif(not INTERPRETED, reason="the refusal is the interpreter's")
@pytest.mark.parametrize("sem", model.SCOPED)
def test_ptx_semantics_under_the_interpreter_say_they_need_a_gpu(sem):
    with pytest.raises(UsageError, match=f"semantics='{sem}' needs a compiled GPU"):
        run_litmus("MP", sem, "gpu", "cross_cta", 32)


def test_two_gpus_needs_symmetric_memory_not_given_buffers():
    with pytest.raises(UsageError, match="symmetric memory"):
        run_litmus("MP", "plain", None, "two_gpus", 32, buffers=allocate(32))


@pytest.mark.skipif(INTERPRETED, reason="the interpreter emulates two ranks instead")
def test_two_gpus_without_two_gpus_is_refused():
    from labkit.workbench import gates

    if gates.requires(gpus=2, peer_access=True, compiled=True).ok:
        pytest.skip("this machine has two GPUs")
    with pytest.raises(gates.HardwareUnavailable, match="placement='two_gpus'"):
        run_litmus("MP", "acq_rel", "sys", "two_gpus", 32)


def test_model_functions_check_their_inputs():
    with pytest.raises(UsageError, match="model: 'tso'"):
        model.outcomes("MP", "tso")
    with pytest.raises(UsageError, match="test"):
        model.verdict("mp", "plain", None, "same_cta")
    with pytest.raises(UsageError, match="capacity"):
        allocate(0)


# --- the PTX the GPU-only variants compile to (no GPU needed) --------------------------------------

PTX_CASES = [
    (("MP", "acq_rel", "gpu", "cross_cta"), {"ld.acquire.gpu.global.b32", "st.release.gpu.global.b32"}, {"fence"}),
    (
        ("SB", "fence_sc", "sys", "cross_cta"),
        {"ld.relaxed.sys.global.b32", "st.relaxed.sys.global.b32", "fence.sc.sys"},
        {"ld.acquire", "st.release"},
    ),
    (
        ("IRIW", "fence", "cta", "same_cta"),
        {"ld.relaxed.cta.global.b32", "st.relaxed.cta.global.b32", "fence.acq_rel.cta"},
        {"fence.sc"},
    ),
    (("2+2W", "relaxed", "sys", "cross_cta"), {"st.relaxed.sys.global.b32"}, {"fence", "st.release"}),
    (("MP", "plain", None, "cross_cta"), {"ld.global.b32", "st.global.b32"}, {"ld.acquire", "ld.relaxed.", "fence"}),
    (("RWC", "acq_rel", "sys", "same_cta"), {"ld.acquire.sys.global.b32", "st.release.sys.global.b32"}, {"fence"}),
    (("MP", "volatile", None, "same_cta"), {"ld.volatile.global.b32", "st.global.b32"}, {"ld.acquire", "fence"}),
]


def test_gpu_variants_compile_to_the_ptx_the_model_assumes():
    from labkit.workbench import sandbox

    res = sandbox.run_isolated(
        "labkit.kernels.litmus.ptx:memory_ops_table",
        [c[0] for c in PTX_CASES],
        timeout=300,
        env={"TRITON_INTERPRET": "0"},
    )
    for row, (variant, must, must_not) in zip(res.unwrap(), PTX_CASES):
        ops = set(row["ops"])
        assert must <= ops, (variant, sorted(ops))
        assert not any(op.startswith(bad) for op in ops for bad in must_not), (variant, sorted(ops))
        if variant[3] == "same_cta":  # one lane per thread, 32 lanes per warp: each role on its own warps
            warps = len(catalogue.TESTS[variant[0]].threads)
            warps = 1 << (warps - 1).bit_length()
            assert row["layouts"] == [
                f"#ttg.blocked<{{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [{warps}], order = [0]}}>"
            ], row["layouts"]


# --- GPU tier ------------------------------------------------------------------------------------------

GPU_VARIANTS = [(sem, scope, p) for sem, scope, p in model.variants() if p != "two_gpus"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", TESTS)
def test_no_guaranteed_forbidden_outcome_on_one_gpu(name):
    """Every semantics, scope and placement on one GPU at 1e5 instances: counts add up, nothing
    unwritten, every outcome possible (``model.possible``), so the weak outcome never where both
    the model and PTX forbid it. Where only the model forbids it (IRIW, 2+2W with acq_rel or
    fence.acq_rel; CoRR with weak or narrow-scoped accesses), a weak count is printed, not failed."""
    n = 100_000
    stress = Stress(programs=64, iterations=64)
    report = []
    for sem, scope, placement in GPU_VARIANTS:
        res = run_litmus(name, sem, scope, placement, n, stress=stress, seed=secrets.randbelow(2**20))
        assert sum(res.counts.values()) == n and res.unwritten == 0, res
        weak = res.counts.get(catalogue.TESTS[name].weak, 0)
        assert set(res.counts) <= model.possible(name, sem, scope, placement), (sem, scope, placement, res.counts)
        if model.guaranteed_forbidden(name, sem, scope, placement):
            assert weak == 0, (sem, scope, placement, res.counts)
        report.append(f"{sem}/{scope}/{placement}: weak {weak}, timeouts {res.timeouts}")
    print("\n".join(report))


@pytest.mark.multigpu
@pytest.mark.parametrize(
    "sem,scope", [("plain", None), ("relaxed", "sys"), ("acq_rel", "gpu"), ("acq_rel", "sys"), ("fence_sc", "sys")]
)
def test_no_guaranteed_forbidden_outcome_across_two_gpus(sem, scope):
    """Every test at 1e5 instances across two GPUs, all in one start of the two ranks (a start
    costs about as much as a run): counts add up, nothing unwritten, every outcome possible, and
    the weak outcome never where the model and PTX forbid it. Every test is checked before the
    assert, so a failure lists all the tests that failed."""
    n = 100_000
    runs = run_two_gpus(list(TESTS), sem, scope, n, stress=Stress(programs=32), timeout=600)
    failed = []
    for name, res in zip(TESTS, runs):
        weak = res.counts.get(catalogue.TESTS[name].weak, 0)
        if sum(res.counts.values()) != n or res.unwritten:
            failed.append((name, "counts do not add up", res.counts, res.unwritten))
        elif not set(res.counts) <= model.possible(name, sem, scope, "two_gpus"):
            failed.append((name, "an impossible outcome", res.counts))
        elif model.guaranteed_forbidden(name, sem, scope, "two_gpus") and weak:
            failed.append((name, "a forbidden weak outcome", res.counts))
        print(name, res.classify().summary(), f"timeouts {res.timeouts}")
    assert not failed, failed


def test_the_package_exports_its_api():
    assert set(litmus.__all__) >= {"run_litmus", "outcomes", "verdict", "Stress", "allocate", "Classified"}
    assert litmus.classify is C  # the module, not hidden by its function


def _refuse_allocations(monkeypatch):
    """torch.zeros raises as the allocator does when memory runs out: nothing is allocated."""

    def refuse(*shape, **kw):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")

    monkeypatch.setattr(torch, "zeros", refuse)


@pytest.mark.parametrize("instances", [10**12, 10**9])
def test_instances_past_the_int32_offsets_are_refused_naming_instances(instances):
    """Slot offsets and register indices are int32 in the kernel: more instances than they can
    address would wrap (a silent wrong answer); the error names instances, before any allocation."""
    with pytest.raises(UsageError, match=f"instances: {instances} is more than .* at most {(2**31 - 1) // 8}"):
        run_litmus("MP", instances=instances)
    with pytest.raises(UsageError, match=f"capacity: {instances} is more than"):
        allocate(instances)


def test_the_int32_bound_is_exact_and_follows_the_stride(monkeypatch):
    _refuse_allocations(monkeypatch)  # the bound itself is checked without allocating
    for stride, most in ((4, (2**31 - 1) // 8), (16, (2**31 - 1) // 32)):
        with pytest.raises(UsageError, match=f"instances: {most + 1} is more than .*stride {stride}.* at most {most}"):
            run_litmus("MP", instances=most + 1, stride=stride)
        with pytest.raises(UsageError, match=f"instances: {most} instances need .* could not be allocated"):
            run_litmus("MP", instances=most, stride=stride)


def test_buffers_that_cannot_be_allocated_are_named(monkeypatch):
    """Below the int32 bound the buffers may still not fit the memory: the error names instances
    (or allocate's capacity) and the bytes asked for, not only the allocator's message."""
    _refuse_allocations(monkeypatch)
    with pytest.raises(
        UsageError, match=r"instances: 5000 instances need \d+ bytes of buffers .*could not be allocated"
    ):
        run_litmus("MP", instances=5000)
    with pytest.raises(UsageError, match="capacity: 5000 instances need"):
        allocate(5000)
