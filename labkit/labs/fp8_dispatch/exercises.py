"""Lab 05's exercises, registered with :mod:`labkit.workbench.exercises`; solutions in ``solutions/``.

The two fixes are judged on any machine by where the learner's state ends up: on the CPU tier the
``meta`` device stands in for "the current device" (as in section 3's demonstration), so a state
made on the current device lands on ``meta`` while the layer lives on the CPU, and a state that
does not move with ``.to("meta")`` stays on the CPU. With two GPUs (compiled kernels), ``05.state``
also runs ``labkit.check.device_independence`` on an FP8 layer's forward whose state the
learner's ``make_state`` makes (``catch.forward_with_state``): the data on each GPU while the other
is current, bit-identical to the call with the data's GPU current. ``05.moves`` asks for buffers,
which no checker targets: the lab's "Catch it in your code" cells run
``labkit.check.device_independence`` on ``catch.forward_seed`` and ``catch.forward_fixed``
instead. The prediction is judged by the recorded two-GPU matrix (``reference/<machine>/fp8_dispatch.json``,
kind ``matrix``).
"""

import contextlib

import torch

from labkit.kernels.fp8.recipe import FP8Meta
from labkit.labs.fp8_dispatch import catch, naive
from labkit.workbench import results, tier
from labkit.workbench.exercises import Wrong, exercise

FIELDS = ("scale", "scale_inv", "amax_history")
N_TENSORS, HISTORY = 2, 16


@contextlib.contextmanager
def current_device_is(device: str):
    """``naive.current_device`` answers ``device`` for the duration (the CPU tier's stand-in)."""
    saved = naive.current_device
    naive.current_device = lambda: torch.device(device)
    try:
        yield
    finally:
        naive.current_device = saved


def _devices(meta) -> dict[str, str]:
    return {f: str(getattr(meta, f).device) for f in FIELDS}


def _device_independence_on_two_gpus(make_state) -> str:
    """With two GPUs, ``labkit.check.device_independence`` (in this process: the learner's
    function lives in the notebook) on a forward whose state ``make_state`` makes; '' elsewhere."""
    if tier.interpreted() or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return ""
    from labkit.check import device_independence

    r = device_independence(catch.forward_with_state(make_state), catch.inputs, isolate=False)
    if not r.ok:
        raise Wrong(f"on two GPUs, labkit.check.device_independence says: {r.outcome}: {r.message[:200]}.")
    return (
        " On two real GPUs, labkit.check.device_independence passes an FP8 layer with your state: "
        "bit-identical on either GPU's data."
    )


@exercise(
    "05.state",
    kind="fix",
    question="Make a layer's FP8 scaling state where it will be used, not on the current device",
    answer="make_state",
    hint="Under dispatch_model the current device stays cuda:0 while a layer lives on cuda:1: which device does "
    "the layer itself tell you it lives on?",
)
def judge_state(make_state) -> str:
    if not callable(make_state):
        raise Wrong(f"`make_state` must be a function (layer, n_tensors, history_len) -> FP8Meta; got {make_state!r}.")
    seen = []
    for layer_on, current in (("cpu", "meta"), ("meta", "cpu")):
        layer = torch.nn.Linear(8, 4, bias=False, device=layer_on)
        with current_device_is(current):
            meta = make_state(layer, N_TENSORS, HISTORY)
        if not isinstance(meta, FP8Meta):
            raise Wrong(f"`make_state` must return an FP8Meta; it returned {type(meta).__name__}.")
        if (meta.n_tensors, meta.history_len) != (N_TENSORS, HISTORY):
            raise Wrong(f"asked for {N_TENSORS} tensors, history {HISTORY}; got {meta.n_tensors}, {meta.history_len}.")
        where = _devices(meta)
        seen.append(f"layer on {layer_on}, current device {current}: state on {meta.device}")
        if set(where.values()) != {layer_on}:
            raise Wrong("; ".join(seen) + f" (the layer's weight is on {layer_on}).")
    return "; ".join(seen) + ": the state follows the layer." + _device_independence_on_two_gpus(make_state)


def _stale(value, path: str, found: list[str], depth: int = 0) -> None:
    """Tensors reachable from a plain attribute (through FP8Metas, dicts, lists), with where they are."""
    if depth > 3:
        return
    if isinstance(value, torch.Tensor):
        found.append(f"{path} on {value.device}")
    elif isinstance(value, FP8Meta):
        for f in FIELDS:
            _stale(getattr(value, f), f"{path}.{f}", found, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _stale(v, f"{path}[{k!r}]", found, depth + 1)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _stale(v, f"{path}[{i}]", found, depth + 1)


@exercise(
    "05.moves",
    kind="fix",
    question="Keep a layer's FP8 scaling state so that it moves with the layer (`.to()`, accelerate's hooks) and is "
    "saved with its state dict",
    answer="keep_state",
    hint="`.to()` and accelerate move what a module registers (parameters and buffers), never a plain attribute; "
    "and scaling state is no parameter: no gradient, no optimizer step.",
)
def judge_moves(keep_state) -> str:
    if not callable(keep_state):
        raise Wrong(f"`keep_state` must be a function (layer, meta) -> None; got {keep_state!r}.")
    layer = torch.nn.Linear(8, 4, bias=False)
    before_buffers, before_params = set(dict(layer.named_buffers())), set(dict(layer.named_parameters()))
    keep_state(layer, FP8Meta.create(N_TENSORS, HISTORY, "cpu"))
    layer.to("meta")
    params = [n for n, _ in layer.named_parameters() if n not in before_params]
    buffers = {n: b for n, b in layer.named_buffers() if n not in before_buffers}
    plain: list[str] = []
    internals = set(vars(torch.nn.Linear(1, 1, bias=False)))  # what every module keeps: buffers, hooks, ...
    for name, value in vars(layer).items():
        if name not in internals:
            _stale(value, f"layer.{name}", plain)
    left = [p for p in plain if not p.endswith("on meta")]
    seen = (
        f"after layer.to('meta'): new buffers {({n: str(b.device) for n, b in buffers.items()}) or 'none'}"
        + (f", new parameters {params}" if params else "")
        + (f", plain attributes holding state {left}" if left else "")
    )
    if params:
        raise Wrong(f"{seen}: parameters get gradients and optimizer steps.")
    shapes = sorted(tuple(b.shape) for b in buffers.values())
    wanted = sorted([(N_TENSORS,), (N_TENSORS,), (HISTORY, N_TENSORS)])
    if shapes != wanted or any(b.device.type != "meta" for b in buffers.values()):
        raise Wrong(f"{seen}; expected the three fields {FIELDS} to have moved to meta with the layer.")
    if left:
        raise Wrong(f"{seen}: a copy left behind is what the policy would go on reading.")
    unsaved = sorted(set(buffers) - set(layer.state_dict()))
    if unsaved:
        raise Wrong(f"{seen}; but {unsaved} are not in the state dict: a checkpoint would lose them.")
    return f"{seen}; all three in the state dict."


#: the outcome words a prediction may use (an exception's message is reduced to "exception")
OUTCOME_WORDS = ("ok", "wrong_scale", "wrong_output", "exception", "illegal_memory_access", "timeout")


def _word(outcome: str) -> str:
    return "exception" if outcome.startswith("exception") else outcome


def _recorded_alone() -> dict[str, dict[str, str]]:
    """Per mechanism, each recorded machine's outcome of the two-GPU cell with that mechanism alone."""
    found: dict[str, dict[str, str]] = {}
    for machine, rs in results.load_references("fp8_dispatch").items():
        for r in rs.records:
            if r.get("kind") == "matrix" and r.get("placement") == "two_gpus" and r.get("mode") in naive.MECHANISMS:
                if not str(r.get("outcome")).startswith("skipped"):
                    found.setdefault(r["mode"], {})[machine] = _word(str(r["outcome"]))
    return found


@exercise(
    "05.mechanisms",
    kind="predict",
    question="Before the matrix: with the stack split over two GPUs, what does each of the story's three mechanisms "
    "do on its own (the recorded outcome)?",
    answer="outcomes",
    hint="Ask of each mechanism what first touches a tensor on the wrong GPU, and whether that code checks devices "
    "(torch ops do; a kernel given raw addresses does not).",
)
def judge_mechanisms(outcomes) -> str:
    if not isinstance(outcomes, dict) or set(outcomes) != set(naive.MECHANISMS):
        raise Wrong(f"`outcomes` must be a dict with the keys {list(naive.MECHANISMS)}; got {outcomes!r}.")
    bad = {m: w for m, w in outcomes.items() if w not in OUTCOME_WORDS}
    if bad:
        raise Wrong(f"outcomes are words from {list(OUTCOME_WORDS)}; got {bad}.")
    recorded = _recorded_alone()
    if set(recorded) != set(naive.MECHANISMS):
        raise Wrong("no reference file holds every mechanism's two-GPU cell: nothing to check against.")
    off = [m for m in naive.MECHANISMS if outcomes[m] not in recorded[m].values()]
    seen = "; ".join(
        f"{m}: " + ", ".join(f"{w} ({mach})" for mach, w in sorted(recorded[m].items())) for m in naive.MECHANISMS
    )
    if off:
        raise Wrong(f"{len(off)} of 3 differ from the recordings ({', '.join(off)}). Recorded: {seen}.")
    return f"recorded on two GPUs: {seen}."
