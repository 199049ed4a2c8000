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
    if not isinstance(choice, dict) or set(choice) != {"semantics", "scope"}:
        raise Wrong(f"`choice` must be a dict with the keys 'semantics' and 'scope'; got {choice!r}.")
    semantics, scope = choice["semantics"], choice["scope"]
    if semantics not in model.SEMANTICS:
        raise Wrong(f"semantics {semantics!r} is not one of {list(model.SEMANTICS)}.")
    if semantics in model.SCOPED and scope not in model.SCOPES:
        raise Wrong(f"{semantics} takes a scope, one of {list(model.SCOPES)}; got {scope!r}.")
    if semantics not in model.SCOPED:
        scope = None
    if model.guaranteed_forbidden("MP", semantics, scope, "two_gpus"):
        return f"{semantics} at scope {scope}: the model and PTX both forbid MP's weak outcome across two GPUs."
    why = model.ptx_verdict("MP", semantics, scope, "two_gpus")[1]
    said = semantics + (f" at scope {scope}" if scope else "")
    raise Wrong(f"under {said}, MP's weak outcome across two GPUs is allowed" + (f" ({why})." if why else "."))
