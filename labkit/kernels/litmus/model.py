"""Which outcomes of a litmus test a machine may produce: sequential consistency, and a
simplified model of the PTX memory model, enumerated exhaustively (the tests are tiny).

**Variants.** A test runs in one *semantics*, one *scope* and one *placement*:

* semantics, how every access is made (what ``labkit.kernels.litmus.kernels`` emits):
  ``plain`` (``tl.load``/``tl.store``: PTX weak ``ld``/``st``), ``volatile`` (loads
  ``ld.volatile``, which has the memory semantics of ``ld.relaxed.sys`` per the PTX ISA, as
  LLVM's NVPTX review D50391 quotes it; stores plain: ``tl.store`` has no volatile form),
  ``relaxed`` (``ld/st.relaxed.<scope>``), ``acq_rel`` (every load
  ``ld.acquire.<scope>``, every store ``st.release.<scope>``), ``fence`` (relaxed accesses with
  ``fence.acq_rel.<scope>`` between a thread's two accesses) and ``fence_sc`` (the same with
  ``fence.sc.<scope>``). ``plain`` and ``volatile`` take no scope (``scope=None``).
* scope: ``cta``, ``gpu`` or ``sys``: which threads an ordering promise is made to.
* placement: ``same_cta`` (every thread of an instance in one CTA, on different warps),
  ``cross_cta`` (each thread in its own CTA of one GPU), ``two_gpus`` (thread t on GPU t % 2).

**The relaxed model** (``outcomes(..., model="relaxed")``). Each thread's accesses may be
performed out of program order, then all are interleaved over one shared memory. Two accesses
of one thread stay in order when

* they touch the same location (coherence: CoRR's weak outcome is forbidden even relaxed), or
* the later one is a release store (a release orders everything before it), or the earlier one
  is an acquire load (an acquire orders everything after it), or a fence lies between them:
  ``fence.sc`` orders every pair, ``fence.acq_rel`` every pair but a store followed by a load
  (store buffering needs ``fence.sc``),
* and that release, acquire or fence has a scope that includes every thread of the test:
  ``cta`` covers ``same_cta`` only, ``gpu`` covers ``same_cta`` and ``cross_cta``, ``sys``
  covers everything. A narrower scope orders nothing here.

Sequential consistency (``model="sc"``) keeps every pair in program order.

**Where PTX differs** (``ptx_verdict`` says so for each variant, with its source). The model is
a *reordering* model over one memory, so it is multi-copy atomic: a store becomes visible to
every other thread at once. PTX is not, and it is weaker in two more places:

1. IRIW: once both readers' loads are ordered (acquire, or ``fence.acq_rel``), the model
   forbids the weak outcome; PTX still allows it. PTX forbids it only with ``fence.sc`` in both
   readers. Source: reeselevine/cuda-litmus, ``pldi26-output/results.csv``: column ``base``
   (the PTX model, checked by Alloy) is ``INSTANCE`` (allowed) for every IRIW row, including
   ``iriw_TB_0_1_2_3_SCOPE_DEVICE_NO_FENCE_ACQUIRE`` and ``..._FENCE_SCOPE_DEVICE_BOTH_FENCE``
   (fences there are ``atomic_thread_fence(memory_order_acq_rel)``, kernels/iriw.cu). Hopper
   was not seen doing it in those two rows (same file, columns h100 and gh200).
2. 2+2W: with release stores or ``fence.acq_rel`` at a covering scope the model forbids the
   weak outcome; PTX's axioms allow it (same file: ``two_2w_TB_0_1_SCOPE_DEVICE_NO_FENCE_RELEASE``
   is ``INSTANCE`` under ``base`` and ``UNSAT`` under ``strengthened``, the model that file
   proposes; not seen on any of its GPUs).
3. CoRR: PTX's coherence binds only *morally strong* pairs (both accesses strong with a scope
   that includes the other thread). Plain and volatile stores are weak, and a scope that does
   not cover the placement is not morally strong: PTX promises nothing there (a data race);
   the model still keeps same-location order.

So "forbidden" here means forbidden *by this model*. A test on hardware must only treat an
outcome as a bug where PTX forbids it too (``guaranteed_forbidden``).
"""

from __future__ import annotations

import functools
import itertools

from labkit.kernels.litmus.catalogue import TESTS, Access, LitmusTest, get_test
from labkit.workbench.errors import UsageError

SEMANTICS = ("plain", "volatile", "relaxed", "acq_rel", "fence", "fence_sc")
#: semantics whose accesses or fences carry a scope
SCOPED = ("relaxed", "acq_rel", "fence", "fence_sc")
SCOPES = ("cta", "gpu", "sys")
PLACEMENTS = ("same_cta", "cross_cta", "two_gpus")
#: the narrowest scope that includes every thread of a placement
NEEDED_SCOPE = {"same_cta": "cta", "cross_cta": "gpu", "two_gpus": "sys"}
MODELS = ("sc", "relaxed")


def check_variant(semantics: str, scope: str | None, placement: str) -> None:
    """UsageError naming the argument unless (semantics, scope, placement) is a variant."""
    if semantics not in SEMANTICS:
        raise UsageError(f"semantics: {semantics!r} is not one of {list(SEMANTICS)}")
    if semantics in SCOPED:
        if scope not in SCOPES:
            raise UsageError(f"scope: {scope!r} is not one of {list(SCOPES)} (semantics {semantics!r} needs a scope)")
    elif scope is not None:
        raise UsageError(f"scope: {scope!r} given, but {semantics!r} accesses carry no scope; pass scope=None")
    if placement not in PLACEMENTS:
        raise UsageError(f"placement: {placement!r} is not one of {list(PLACEMENTS)}")


def covers(scope: str | None, placement: str) -> bool:
    """True when ``scope`` includes every thread of a test placed as ``placement``."""
    if scope is None:
        return False
    return SCOPES.index(scope) >= SCOPES.index(NEEDED_SCOPE[placement])


def stays_ordered(a: Access, b: Access, semantics: str, scope: str | None, placement: str) -> bool:
    """Whether access ``a`` stays before ``b`` (later in the same thread) in the relaxed model."""
    if a.loc == b.loc:
        return True  # coherence
    if semantics in ("plain", "volatile", "relaxed") or not covers(scope, placement):
        return False
    if semantics == "acq_rel":
        return b.kind == "st" or a.kind == "ld"  # release orders what precedes; acquire what follows
    if semantics == "fence":
        return not (a.kind == "st" and b.kind == "ld")
    return True  # fence_sc


def _kept_pairs(test: LitmusTest, model: str, semantics, scope, placement) -> list[set[tuple[int, int]]]:
    kept = []
    for accesses in test.threads:
        pairs = set()
        for i, j in itertools.combinations(range(len(accesses)), 2):
            if model == "sc" or stays_ordered(accesses[i], accesses[j], semantics, scope, placement):
                pairs.add((i, j))
        kept.append(pairs)
    return kept


@functools.cache
def _enumerate(test_name: str, model: str, semantics, scope, placement) -> frozenset[tuple[int, ...]]:
    test = TESTS[test_name]
    kept = _kept_pairs(test, model, semantics, scope, placement)
    found: set[tuple[int, ...]] = set()

    def step(done: tuple[frozenset, ...], memory: dict, regs: dict) -> None:
        if all(len(d) == len(acc) for d, acc in zip(done, test.threads)):
            found.add(tuple(regs[o] if o.startswith("r") else memory[o] for o in test.observed))
            return
        for t, accesses in enumerate(test.threads):
            for i, a in enumerate(accesses):
                if i in done[t] or any(j not in done[t] for j, k in kept[t] if k == i):
                    continue
                mem, reg = dict(memory), dict(regs)
                if a.kind == "st":
                    mem[a.loc] = a.value
                else:
                    reg[a.reg] = mem[a.loc]
                step(done[:t] + (done[t] | {i},) + done[t + 1 :], mem, reg)

    step(tuple(frozenset() for _ in test.threads), {"x": 0, "y": 0}, {})
    return frozenset(found)


def outcomes(
    test: str | LitmusTest,
    model: str = "relaxed",
    semantics: str = "plain",
    scope: str | None = None,
    placement: str = "cross_cta",
) -> frozenset[tuple[int, ...]]:
    """Every outcome (tuple over ``test.observed``) the model allows; ``model="sc"`` ignores the
    variant (sequential consistency orders everything)."""
    t = get_test(test)
    if model not in MODELS:
        raise UsageError(f"model: {model!r} is not one of {list(MODELS)}")
    check_variant(semantics, scope, placement)
    if model == "sc":
        semantics, scope, placement = "plain", None, "cross_cta"  # one cache entry
    return _enumerate(t.name, model, semantics, scope, placement)


def verdict(test: str | LitmusTest, semantics: str, scope: str | None, placement: str) -> str:
    """ "allowed" or "forbidden": the weak outcome under the relaxed model."""
    t = get_test(test)
    return "allowed" if t.weak in outcomes(t, "relaxed", semantics, scope, placement) else "forbidden"


def ptx_verdict(test: str | LitmusTest, semantics: str, scope: str | None, placement: str) -> tuple[str, str]:
    """(verdict, why) for the weak outcome under PTX, where it differs from ``verdict``: the
    three differences of the module docstring; ("", "") reasons elsewhere (PTX agrees)."""
    t = get_test(test)
    mine = verdict(t, semantics, scope, placement)
    strong = semantics in SCOPED and covers(scope, placement)
    if t.name == "CoRR" and not strong:
        return "allowed", (
            "PTX coherence binds morally strong accesses only; these are weak or "
            "scoped too narrowly: a data race, no promise"
        )
    if t.name == "IRIW" and strong and semantics in ("acq_rel", "fence"):
        return "allowed", (
            "PTX is not multi-copy atomic: readers ordered by acquire or fence.acq_rel may "
            "still disagree; only fence.sc in both readers forbids it "
            "(cuda-litmus pldi26-output/results.csv, base column: INSTANCE)"
        )
    if t.name == "2+2W" and strong and semantics in ("acq_rel", "fence"):
        return "allowed", (
            "PTX's axioms allow it (cuda-litmus pldi26-output/results.csv: base INSTANCE, "
            "strengthened UNSAT, never seen on A100/H100/GH200)"
        )
    return mine, ""


def guaranteed_forbidden(test, semantics, scope, placement) -> bool:
    """True when both this model and PTX forbid the weak outcome: seeing it is a bug (of the
    hardware, the compiler, or labkit's kernels), not a memory-model subtlety."""
    return (
        verdict(test, semantics, scope, placement) == "forbidden"
        and ptx_verdict(test, semantics, scope, placement)[0] == "forbidden"
    )


def possible(test, semantics, scope, placement) -> frozenset[tuple[int, ...]]:
    """Outcomes that are no bug on a GPU: what the relaxed model allows, plus the weak outcome
    where PTX allows it although the model does not. For these seven tests every other outcome
    is sequentially consistent, so this is the whole of what PTX allows."""
    t = get_test(test)
    allowed = outcomes(t, "relaxed", semantics, scope, placement)
    if ptx_verdict(t, semantics, scope, placement)[0] == "allowed":
        allowed = allowed | {t.weak}
    return allowed


def variants() -> list[tuple[str, str | None, str]]:
    """Every (semantics, scope, placement) there is: unscoped semantics once per placement."""
    out = []
    for sem in SEMANTICS:
        for scope in SCOPES if sem in SCOPED else (None,):
            out += [(sem, scope, p) for p in PLACEMENTS]
    return out


def table(tests=None) -> list[dict]:
    """One row per test and variant: the model's and PTX's verdict on the weak outcome, and
    how many outcomes each model allows."""
    rows = []
    for name in tests or TESTS:
        t = get_test(name)
        for sem, scope, placement in variants():
            ptx, why = ptx_verdict(t, sem, scope, placement)
            rows.append(
                {
                    "test": t.name,
                    "semantics": sem,
                    "scope": scope,
                    "placement": placement,
                    "model": verdict(t, sem, scope, placement),
                    "ptx": ptx,
                    "ptx_note": why,
                    "sc_outcomes": len(outcomes(t, "sc")),
                    "relaxed_outcomes": len(outcomes(t, "relaxed", sem, scope, placement)),
                }
            )
    return rows
