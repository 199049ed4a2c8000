"""Lab 06's exercises: the learner's answers, judged by the litmus model (nothing here varies
from run to run). Registered with :mod:`labkit.workbench.exercises`; solutions in ``solutions/``."""

from labkit.kernels.litmus import model
from labkit.workbench.exercises import Wrong, exercise


@exercise(
    "06.forbid",
    kind="fix",
    question="MP across two GPUs: pick the semantics and scope of the flag's store and load that forbid the "
    "weak outcome (the reader sees the flag but stale data)",
    answer="choice",
    hint="The flag's store must publish the data before it and the flag's load must keep the data load after it; "
    "and a scope binds only the threads inside it: which scope holds two GPUs?",
)
def judge_forbid(choice) -> str:
    semantics, scope = _semantics_and_scope("choice", choice)
    if model.guaranteed_forbidden("MP", semantics, scope, "two_gpus"):
        return f"{semantics} at scope {scope}: the model and PTX both forbid MP's weak outcome across two GPUs."
    why = model.ptx_verdict("MP", semantics, scope, "two_gpus")[1]
    said = semantics + (f" at scope {scope}" if scope else "")
    raise Wrong(f"under {said}, MP's weak outcome across two GPUs is allowed" + (f" ({why})." if why else "."))


def _semantics_and_scope(name: str, answer) -> tuple[str, str | None]:
    """(semantics, scope) from an answer ``{"semantics": ..., "scope": ...}``; the scope is None
    for semantics that take none. Wrong, naming the answer, when it is not that."""
    if not isinstance(answer, dict) or set(answer) != {"semantics", "scope"}:
        raise Wrong(f"`{name}` must be a dict with the keys 'semantics' and 'scope'; got {answer!r}.")
    semantics, scope = answer["semantics"], answer["scope"]
    if semantics not in model.SEMANTICS:
        raise Wrong(f"semantics {semantics!r} is not one of {list(model.SEMANTICS)}.")
    if semantics in model.SCOPED and scope not in model.SCOPES:
        raise Wrong(f"{semantics} takes a scope, one of {list(model.SCOPES)}; got {scope!r}.")
    return semantics, scope if semantics in model.SCOPED else None


@exercise(
    "06.sb",
    kind="fix",
    question="SB across two GPUs: pick the semantics and scope, the same for every access, that forbid the weak "
    "outcome (each thread stores its flag, then loads the other's, and both read 0)",
    answer="sb_choice",
    hint="In SB each thread's store comes before its own load of another address: which orderings keep a store "
    "before a LATER load (release orders what came before a store; acquire what comes after a load)? "
    "Section 7 and the model grid of section 3 say which semantics it takes.",
)
def judge_sb(sb_choice) -> str:
    semantics, scope = _semantics_and_scope("sb_choice", sb_choice)
    said = semantics + (f" at scope {scope}" if scope else "")
    if model.guaranteed_forbidden("SB", semantics, scope, "two_gpus"):
        return f"{said}: the model and PTX both forbid SB's weak outcome (both read 0) across two GPUs."
    raise Wrong(f"under {said}, SB's weak outcome across two GPUs is allowed (the model's verdict).")


#: the tests 06.allowed asks about, and the variant: release/acquire at gpu scope, two CTAs of one GPU
ALLOWED_VARIANT = ("acq_rel", "gpu", "cross_cta")


def _allowed_under_ptx() -> set[str]:
    from labkit.kernels.litmus import TESTS

    semantics, scope, placement = ALLOWED_VARIANT
    return {t for t in TESTS if model.ptx_verdict(t, semantics, scope, placement)[0] == "allowed"}


@exercise(
    "06.allowed",
    kind="predict",
    question="Before the model grid: with every access release/acquire at gpu scope and the threads in two CTAs "
    "of one GPU, which of the seven tests' weak outcomes does PTX allow?",
    answer="allowed",
    hint="Release/acquire orders a store after earlier accesses and a load before later ones, never a store "
    "before a later load; and PTX does not promise that a store reaches every thread at once "
    "(the paragraph above the grid names the tests where that matters).",
)
def judge_allowed(allowed) -> str:
    from labkit.kernels.litmus import TESTS

    if not isinstance(allowed, set | frozenset | list | tuple) or not all(isinstance(t, str) for t in allowed):
        raise Wrong(f"`allowed` must be a set of test names from {list(TESTS)}; got {allowed!r}.")
    unknown = sorted(set(allowed) - set(TESTS))
    if unknown:
        raise Wrong(f"{unknown} are not tests; the seven are {list(TESTS)}.")
    truth, said = _allowed_under_ptx(), set(allowed)
    if said == truth:
        return f"PTX allows the weak outcome of {sorted(truth)} and forbids it in the other {len(TESTS) - len(truth)}."
    missed, extra = sorted(truth - said), sorted(said - truth)
    parts = ([f"PTX also allows {missed}"] if missed else []) + ([f"PTX forbids {extra}"] if extra else [])
    raise Wrong(f"{len(truth & said)} of the {len(truth)} allowed tests named; " + "; ".join(parts) + ".")
