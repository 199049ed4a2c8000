"""``collective``: a user's collective over symmetric memory, against fp64, under the conditions
that break one.

The user's collective is written against labkit's rank context and symmetric memory
(``labkit.kernels.comm.symm.empty``; on GPUs PyTorch's symmetric memory underneath):

    def my_all_reduce(buf, *args, **kwargs):   # buf: this rank's SymmBuffer, holding its input
        ...                                     # read peers through buf.data_ptrs / buf.peers
        return out                              # this rank's result

On every rank of a world of ``world_size`` ranks (``labkit.kernels.comm.ranks.run_ranks``), the
check allocates the buffer from the shape and dtype of ``make_inputs(device)[0][0]`` (this rank's
input; the other arguments are passed after ``buf``), then runs ``rounds`` calls back to back,
each on fresh inputs written into the buffer in stream order, with one rank, in turn, starting
late before every third call (a GPU sleep; a host sleep in the emulated world). Each result is
copied out before the next input is written, as a caller would, and compared with the fp64
reference built from every rank's input. On GPUs one more call is captured in a CUDA graph and
replayed on new inputs. Then one held round per rank: that rank's first read of a peer's buffer
waits until every peer has returned and written its next input (``held_reader``: the interleaving
a missing end barrier breaks on, forced). A hang (a barrier waiting for a peer) becomes a "hang"
report when the world's ``timeout`` passes.

Where GPUs are missing, the CPU tier runs everything in the emulated world: ranks are processes,
symmetric buffers shared memory, kernels interpreted. A compiled kernel's loads cannot be held
from the host, so on GPUs the held rounds run in a second world beside the GPU one: the same
ranks, emulated, on ``make_inputs("cpu")``.
"""

from __future__ import annotations

import math
import time

import torch

from labkit.check import report as R
from labkit.workbench import tier

NAME = "collective"
#: the references a collective can be checked against: fp64 of every rank's input -> this rank's result
REFERENCES = ("all_reduce", "all_gather", "reduce_scatter")


def expected(reference: str, xs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """This rank's fp64 result of ``reference`` over every rank's input ``xs`` (fp64, CPU)."""
    if reference == "all_reduce":
        return sum(xs)
    if reference == "all_gather":
        return torch.cat([x.reshape(-1) for x in xs])
    total = sum(xs).reshape(-1)
    return total.chunk(len(xs))[rank]


def _tolerance(dtype: torch.dtype, w: int) -> float:
    """Allowed error relative to the sum of |inputs|: a few roundings of the output dtype."""
    eps = 2**-7 if dtype == torch.bfloat16 else 2**-10 if dtype == torch.float16 else 2**-23 * w
    return eps * (math.ceil(math.log2(max(w, 2))) + 1)


def _compare(y, xs, reference, rank, dtype) -> tuple[int, float] | None:
    """(wrong elements, max |error|) of ``y`` against fp64, or None when right."""
    want = expected(reference, xs, rank)
    scale = expected(reference, [x.abs() for x in xs], rank)
    got = y.detach().double().cpu().reshape(-1)
    if got.numel() != want.numel():  # no element to compare with: say so (``_wrong_line``)
        return (-want.numel(), float("inf"))
    err = (got - want.reshape(-1)).abs()
    bad = ~(err <= _tolerance(dtype, len(xs)) * scale.reshape(-1) + 1e-30)
    return (int(bad.sum()), float(err.max())) if bool(bad.any()) else None


def _wrong(bad: tuple[int, float], of: int, reference: str) -> str:
    """What ``_compare`` found, in words: "N of M elements wrong (max |error| E)", or, where the
    lengths differ (a negative count: the reference's length), both lengths."""
    wrong, max_error = bad
    if wrong < 0:
        return f"the result has {of} elements and the {reference} reference {-wrong}"
    return f"{wrong} of {of} elements wrong (max |error| {max_error:.3g})"


def _rank(ctx, fn_spec: str, inputs_spec: str, rounds: int, late_ms: float, reference: str, hold_s: float) -> dict:
    """One rank's rounds (module docstring); returns what went wrong where."""
    from labkit.kernels.comm import symm

    fn, make_inputs = R.resolve(NAME, "fn", fn_spec), R.resolve(NAME, "make_inputs", inputs_spec)
    torch.manual_seed(1009 * ctx.rank + 1)  # every rank its own values
    on_gpu = ctx.device.type == "cuda"
    held_rounds = ctx.world_size if (hold_s > 0 and not on_gpu) else 0
    # inputs: a first call, the rounds, the graph's spare, then one per held round and the input
    # written after the last one
    calls = _build_calls(make_inputs, ctx.device, rounds + 2 + held_rounds + 1)
    x0 = calls[0][0][0]
    everyone = symm.gather([c[0][0].detach().double().cpu() for c in calls])
    buf = symm.empty(tuple(x0.shape), x0.dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    start_late = _start_late(ctx.device, late_ms)

    def call(t):
        args, kwargs = calls[t]
        buf.tensor.copy_(args[0])  # in stream order, as a caller writes its next input
        return fn(buf, *args[1:], **kwargs)

    call(0)  # a first call: compiling, agreeing launch plans
    if on_gpu:
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    wrong = _late_rounds(ctx, call, start_late, everyone, rounds, reference, x0.dtype)
    held = [
        _held_round(ctx, buf, call, calls, everyone, rounds + 2 + k, held_rank=k, hold_s=hold_s, reference=reference)
        for k in range(held_rounds)
    ]
    graph = _graph_round(ctx, fn, buf, calls, everyone, rounds, reference) if on_gpu else None
    return {"rank": ctx.rank, "wrong": wrong, "held": held, "graph": graph, "graph_ran": on_gpu}


def _build_calls(make_inputs, device: torch.device, n: int) -> list[tuple[list, dict]]:
    """``n`` calls' (args, kwargs) from ``make_inputs(device)``; args[0] must be this rank's input."""
    calls = [R.build_inputs(NAME, make_inputs, device) for _ in range(n)]
    x0 = calls[0][0][0] if calls[0][0] else None
    if not isinstance(x0, torch.Tensor):
        raise R.UsageError(f"{NAME}: make_inputs: args[0] must be this rank's input tensor, got {type(x0).__name__}")
    return calls


def _start_late(device: torch.device, late_ms: float):
    """How this rank starts ``late_ms`` late: a sleep on its GPU stream, or a host sleep in the
    emulated world. The GPU's cycles per ms are measured here (that synchronizes), before the
    first call."""
    if device.type == "cuda":
        from labkit.workbench.bench import sleep_cycles_per_ms

        cycles = int(late_ms * sleep_cycles_per_ms(device.index))
        return lambda: torch.cuda._sleep(cycles)
    return lambda: time.sleep(late_ms / 1e3)


def _late_rounds(ctx, call, start_late, everyone, rounds: int, reference: str, dtype: torch.dtype) -> list[dict]:
    """Calls 1..``rounds`` back to back, one rank in turn starting late before every third; then
    each result against fp64. Returns the wrong rounds."""
    outs, lates = [], []
    for t in range(1, rounds + 1):
        late = (t // 3) % ctx.world_size if t % 3 == 0 else None
        lates.append(late)
        if late == ctx.rank:
            start_late()
        y = call(t)
        if not isinstance(y, torch.Tensor):
            raise R.UsageError(f"{NAME}: fn returned {type(y).__name__}, expected this rank's result tensor")
        outs.append(y.clone())  # copied out before the next input is written
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    wrong = []
    for i, t in enumerate(range(1, rounds + 1)):
        bad = _compare(outs[i], [e[t] for e in everyone], reference, ctx.rank, dtype)
        if bad:
            wrong.append({"round": t, "late": lates[i], "wrong": bad[0], "of": outs[i].numel(), "max_error": bad[1]})
    return wrong


def _graph_round(ctx, fn, buf, calls, everyone, rounds: int, reference: str) -> dict | None:
    """GPUs: the first call captured in a CUDA graph, replayed once on the spare inputs after the
    rounds. Returns what came out wrong, or None."""
    from labkit.check.graphs import replay_with_fresh_inputs

    dtype = calls[0][0][0].dtype
    ctx.barrier()

    def before_capture():
        buf.tensor.copy_(calls[0][0][0])
        torch.cuda.synchronize(ctx.device)
        ctx.barrier()

    def refill(step):  # the spare inputs after the rounds: new values in the same buffer
        t = rounds + 1
        buf.tensor.copy_(calls[t][0][0])
        torch.cuda.synchronize(ctx.device)
        ctx.barrier()  # every rank's input written before any replay reads it
        return t

    def check(step, y, t):
        return _compare(y, [e[t] for e in everyone], reference, ctx.rank, dtype)

    ran = replay_with_fresh_inputs(
        lambda: fn(buf, *calls[0][0][1:], **calls[0][1]),
        refill,
        check,
        replays=1,
        warmup=0,  # the rounds above warmed it up
        before_capture=before_capture,
    )
    graph = None
    if ran.wrong:
        bad = ran.wrong[0][1]
        graph = {"wrong": bad[0], "of": ran.outputs.numel(), "max_error": bad[1]}
    ctx.barrier()
    return graph


def _held_round(ctx, buf, call, calls, everyone, t: int, held_rank: int, hold_s: float, reference: str) -> dict:
    """One call with ``held_rank``'s first read of a peer's buffer held until every peer has
    returned and written its next input, or ``hold_s`` passed (``held_reader``, steps 1-4)."""
    from labkit.check.held_reader import hold_peer_reads, say_next_input_written

    name = f"{buf.serial}-{t}"  # this round's files: a late one never releases another round
    ctx.barrier()  # the previous round is over on every rank
    if ctx.rank == held_rank:
        with hold_peer_reads(buf, ctx.scratch_dir, name, hold_s) as seen:  # 1, 2, 4
            y = call(t).clone()
        seen = seen.as_dict()
    else:
        y = call(t).clone()  # copied out before the next input is written, as a caller would
        buf.tensor.copy_(calls[t + 1][0][0])  # 3: the next input, then say so
        say_next_input_written(ctx.scratch_dir, name, ctx.rank)
        seen = None
    bad = _compare(y, [e[t] for e in everyone], reference, ctx.rank, buf.tensor.dtype)
    ctx.barrier()  # the held rank's wait is over before anyone's next round
    return {
        "held_rank": held_rank,
        "seen": seen,
        "wrong": bad[0] if bad else 0,
        "of": y.numel(),
        "max_error": bad[1] if bad else 0.0,
    }


def collective(
    fn,
    world_size: int,
    make_inputs,
    *,
    reference: str = "all_reduce",
    rounds: int = 6,
    late_ms: float | None = None,
    hold_s: float = 1.0,
    timeout: float = 300.0,
) -> R.Report:
    """Check a collective written against labkit's symmetric memory on ``world_size`` ranks (lab 02).

    Args:
        fn: ``fn(buf, *args, **kwargs) -> result`` (module docstring), importable: a module-level
            function or ``"module:function"`` (every rank imports it).
        world_size: ranks (at least 2). On GPUs one GPU per rank; the CPU tier runs the emulated world.
        make_inputs: ``make_inputs(device) -> (args, kwargs)``, args[0] this rank's input tensor;
            importable. Called on each rank with a seed of the rank's own, once per call.
        reference: what the collective computes: "all_reduce" (sum), "all_gather" (concatenation
            in rank order) or "reduce_scatter" (this rank's chunk of the sum).
        rounds: back-to-back calls, each on fresh inputs; before every third one a rank, in turn,
            starts late.
        late_ms: how late (default: 0.2 ms on GPUs, 5 ms in the emulated world, where a step of an
            interpreted kernel takes about a millisecond).
        hold_s: the held rounds, one per rank in turn after the rounds: that
            rank's first read of a peer's buffer waits until every peer has returned and written
            its next input, or ``hold_s`` seconds (``labkit.check.held_reader``). A
            collective that protects its buffer (an end barrier) costs ``hold_s`` per held round
            and stays right; one that does not reads its peers' next inputs, every time. 0: no
            held rounds. On GPUs they run in an emulated world beside the GPU world, on
            ``make_inputs("cpu")`` (a compiled kernel's loads cannot be held from the host).
        timeout: seconds for the whole world; a collective still running then is a "hang". On
            GPUs the emulated world of the held rounds has as long again.

    Returns:
        a :class:`Report`: "correct" ("correct, held rounds not run" where the emulated world
        beside the GPUs could not run them: the message says why); "wrong elements" (which
        round, which rank was late or held, how many elements, the worst error against fp64);
        "graph replay wrong"; "hang"; "crash"; "exception".

    Note:
        The late rounds find a race only when the timing makes it happen: a pass says the rounds
        came out right, not that no interleaving can break the protocol (lab 06's litmus model
        asks that question of the memory model). The held rounds force one interleaving, a reader
        still reading when its peers write their next inputs, which is what a missing end
        barrier breaks on. They hold interpreted loads, so on GPUs they check the protocol in the
        emulated world, not the compiled kernel: a race that only the GPU's memory model allows
        (relaxed atomics) is not among what they force. On GPUs the late rank sleeps on its stream
        before the call: the start barrier lines the ranks up again, so a missing end barrier
        usually passes the late rounds there. The captured-graph round runs on GPUs only.

    Example::

        >>> r = labkit.check.collective("mypkg.ar:one_shot", 2, "mypkg.ar:inputs")  # doctest: +SKIP
        >>> print(r.summary())  # doctest: +SKIP
        collective(mypkg.ar:one_shot): FAILED: wrong elements: round 3 (rank 0 late): rank 1: 4096 of 4096 ...
    """
    from labkit.kernels.comm.ranks import run_ranks

    target = R.name_of(fn)
    specs = R.importable(NAME, "fn", fn), R.importable(NAME, "make_inputs", make_inputs)
    R.resolve(NAME, "fn", fn)
    R.resolve(NAME, "make_inputs", make_inputs)
    R.check_number(NAME, "world_size", world_size, minimum=2, integer=True)
    R.check_number(NAME, "rounds", rounds, minimum=1, integer=True)
    R.check_number(NAME, "timeout", timeout)
    if reference not in REFERENCES:
        raise R.UsageError(f"{NAME}: reference={reference!r}: expected one of {REFERENCES}")
    gpus = R.cuda_count()
    on_gpu = tier.TIER == "gpu" and gpus > 0
    if on_gpu and world_size > gpus:
        raise R.UsageError(
            f"{NAME}: world_size={world_size}: this machine has {gpus} GPU{'s' if gpus != 1 else ''} and each rank "
            "needs one (the emulated world runs on the CPU tier: TRITON_INTERPRET=1)"
        )
    if late_ms is None:
        late_ms = 0.2 if on_gpu else 5.0
    R.check_number(NAME, "late_ms", late_ms, minimum=-1e-300)
    R.check_number(NAME, "hold_s", hold_s, minimum=-1e-300)
    res = run_ranks(_rank, world_size, *specs, rounds, late_ms, reference, hold_s, timeout=timeout)
    world = f"{world_size} ranks, {'GPUs' if on_gpu else 'emulated world'}"
    beside, beside_failed = [], None
    if res.ok and on_gpu and hold_s > 0:
        beside, beside_failed = held_rounds_emulated(specs, world_size, reference, hold_s, timeout)
    if not res.ok:
        return _failed_world(res, target, timeout, world)
    lines, graph_bad = [], []
    for value in res.values:
        for w in value["wrong"]:
            late = f"rank {w['late']} late" if w["late"] is not None else "no rank late"
            lines.append(
                f"round {w['round']} ({late}): rank {value['rank']}: "
                f"{_wrong((w['wrong'], w['max_error']), w['of'], reference)} against fp64"
            )
        if value["graph"]:
            g = value["graph"]
            graph_bad.append(
                f"graph replay: rank {value['rank']}: {_wrong((g['wrong'], g['max_error']), g['of'], reference)}"
            )
    where = " in the emulated world beside the GPUs" if on_gpu else ""
    for value in res.values + beside:
        for h in value["held"]:
            if h["wrong"]:
                lines.append(
                    f"held round (rank {h['held_rank']}'s reads of its peers held until they wrote their next "
                    f"inputs{where}): rank {value['rank']}: "
                    f"{_wrong((h['wrong'], h['max_error']), h['of'], reference)} against fp64"
                )
    if lines or graph_bad:
        outcome = "wrong elements" if lines else "graph replay wrong"
        return R.Report(NAME, target, "failed", outcome, (lines + graph_bad)[0], sorted(lines) + graph_bad)
    graph_note = "a captured graph replayed right" if res.values[0]["graph_ran"] else "graph round: GPUs only"
    return R.Report(
        NAME,
        target,
        "passed",
        "correct, held rounds not run" if beside_failed else "correct",
        f"{rounds} back-to-back rounds, a late rank in turn, every result right against fp64 ({world}; "
        f"{_held_note(res.values + beside, hold_s, on_gpu, beside_failed)}; {graph_note})",
    )


def _failed_world(res, target: str, timeout: float, world: str) -> R.Report:
    """The report of a world that did not come back right: it never started, a rank hung, the
    input was refused, or a rank raised or crashed."""
    first = res.first_failure
    not_started = [
        r for r in res.results if r.status == "timeout" and r.where in (None, "starting", "init_process_group")
    ]
    if not_started:
        return R.Report(
            NAME,
            target,
            "error",
            "world did not start",
            f"the world did not start within the timeout ({timeout:g} s, {world}): rank "
            f"{not_started[0].rank} {not_started[0].message}; the check never ran fn: give a longer timeout",
            res.summary().splitlines(),
        )
    hung = [r for r in res.results if r.status == "timeout"]
    if hung:
        doing = f"; rank {hung[0].rank} in {hung[0].where}" if hung[0].where not in (None, "fn") else ""
        return R.Report(
            NAME,
            target,
            "failed",
            "hang",
            f"no result within {timeout:g} s ({world}{doing}): a rank waits for a peer that never signals "
            "(or the rounds need a longer timeout)",
            res.summary().splitlines(),
        )
    if first.status == "exception" and (first.error_type or "").endswith("UsageError"):
        return R.Report(NAME, target, "error", "bad input", R.first_line(Exception(first.message or "")))
    kind = "exception" if first.status == "exception" else "crash"
    return R.Report(NAME, target, "failed", kind, first.summary(), res.summary().splitlines())


def held_rounds_emulated(specs: tuple[str, str], world_size: int, reference: str, hold_s: float, timeout: float):
    """The held rounds alone, in an emulated world (gloo, CPU tensors, kernels interpreted): what
    a GPU host runs beside its GPU world, since a compiled kernel's loads cannot be held from the
    host. Returns (every rank's value, None), or ([], why the world gave no values)."""
    from labkit.kernels.comm.ranks import run_ranks

    # no rounds: a first call, then the held ones; no GPU visible, so nothing in it compiles for one
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    res = run_ranks(_rank, world_size, *specs, 0, 0.0, reference, hold_s, timeout=timeout, backend="gloo", env=env)
    if res.ok:
        return res.values, None
    if any(r.status == "timeout" for r in res.results):
        return [], (
            f"no result within {timeout:g} s (its kernels are interpreted: make_inputs gives its size at "
            "device 'cpu' too; a smaller one runs faster)"
        )
    return [], res.first_failure.summary().splitlines()[0]


def _held_note(values: list[dict], hold_s: float, on_gpu: bool, beside_failed: str | None) -> str:
    """What the held rounds of a passing check showed."""
    if hold_s <= 0:
        return "no held rounds (hold_s=0)"
    where = " (an emulated world beside the GPUs)" if on_gpu else ""
    if beside_failed:
        return f"held rounds not run: the emulated world beside the GPUs failed: {beside_failed}"
    seen = [h["seen"] for v in values for h in v["held"] if h["seen"]]  # each held rank's own account
    if not seen:
        return "no held round ran"
    reached = [s for s in seen if s["reached"]]
    if len(reached) < len(seen):
        return (
            f"held rounds{where}: {len(seen) - len(reached)} of {len(seen)} held ranks read no peer buffer the "
            "check could hold, so those rounds prove nothing"
        )
    early = sum(s["released_by"] != "timeout" for s in reached)
    return f"held rounds{where}: each rank's peer reads held in turn, right against fp64; " + (
        "no peer returned while a reader was held" if not early else f"{early} released early by peers"
    )
