"""Lab 02's exercises, registered with :mod:`labkit.workbench.exercises`; solutions in ``solutions/``.

* 02.barrier (fix): the check runs the learner's signal-then-wait with a recording ``tl``
  (:mod:`labkit.labs.collectives.atomics_probe`), twice. With the peer's signal there, it reads
  the ``sem`` and ``scope`` of the atomic that signals and of the one that consumes the signal.
  A race cannot decide that: the emulated world runs on x86, where relaxed and release/acquire
  order alike, and the recorded GPU runs saw no wrong result from relaxed atomics either. With no
  signal from the peer, the wait must still be waiting when the probe gives up (``Hang``): a wait
  that walks on without a signal is a barrier that does not hold, and only sometimes a wrong sum,
  so no race is asked to show it. An answer that passes both then meets
  ``labkit.check.collective``: it becomes both barriers of an all-reduce on two ranks
  (``catch.peers_with_your_barrier``), run back to back with a late rank in turn and compared with
  fp64, in the emulated world on the CPU tier and on two GPUs on the GPU tier (skipped with one
  GPU).
* 02.order (predict): judged by the all-gather kernel's read order (``gather_order.read_order``).
* 02.contention (predict): judged by the recorded comparisons of the two orders
  (``reference/<machine>/collectives.json``, kind ``gather_order``).
"""

import os

from labkit.check import report as check_report
from labkit.labs.collectives import atomics_probe, catch, gather_order
from labkit.workbench import results, tier
from labkit.workbench.exercises import Wrong, exercise

RELEASES = ("release", "acq_rel")
ACQUIRES = ("acquire", "acq_rel")


def _said(op) -> str:
    how = "a plain store" if op.what == "store" else f"{op.what}(sem={op.sem!r}, scope={op.scope!r})"
    return f"{how} on {op.slot}, {op.old} -> {op.new}"


#: seconds the two-rank world of 02.barrier's collective may take before its barrier counts as a hang
COLLECTIVE_TIMEOUT_S = 120.0


def _collective_with(signal_then_wait) -> str:
    """``labkit.check.collective`` on an all-reduce whose two barriers are the learner's
    (``catch.peers_with_your_barrier``), on two GPUs or in the emulated world; '' on a GPU tier
    with fewer than two GPUs. The answer reaches the ranks as text (``catch.BARRIER_SOURCE_ENV``)."""
    if tier.TIER == "gpu" and check_report.cuda_count() < 2:
        return ""
    from labkit.check import collective

    saved = os.environ.get(catch.BARRIER_SOURCE_ENV)
    os.environ[catch.BARRIER_SOURCE_ENV] = catch.barrier_source(signal_then_wait)
    try:
        r = collective(
            "labkit.labs.collectives.catch:peers_with_your_barrier",
            2,
            "labkit.labs.collectives.catch:inputs",
            timeout=COLLECTIVE_TIMEOUT_S,
        )
    finally:
        if saved is None:
            os.environ.pop(catch.BARRIER_SOURCE_ENV, None)
        else:
            os.environ[catch.BARRIER_SOURCE_ENV] = saved
    where = "two GPUs" if tier.TIER == "gpu" else "the emulated world"
    if not r.ok:
        raise Wrong(
            f"your barrier, as both barriers of an all-reduce on two ranks ({where}): labkit.check.collective "
            f"says: {r.outcome}: {r.message[:200]}."
        )
    return (
        f" labkit.check.collective passes an all-reduce with your barrier at both ends ({where}: back to back, "
        "a late rank in turn, right against fp64)."
    )


@exercise(
    "02.barrier",
    kind="fix",
    question="Fix the signal and the wait of a barrier between two GPUs, built with relaxed atomics, so that the "
    "data written before the signal is visible after the wait",
    answer="signal_then_wait",
    hint="A signal must publish the writes before it and a wait must keep the reads after it; each atomic takes a "
    "`sem` and a `scope`, and the peer is another GPU (section 2 names the pair; section 5 shows their PTX).",
)
def judge_barrier(signal_then_wait) -> str:
    try:
        rec = atomics_probe.run_recorded(signal_then_wait, {"peer_slot": 0, "my_slot": 1}, "peer_slot", "my_slot")
    except atomics_probe.Hang as e:
        raise Wrong(f"with peer_slot at 0 and my_slot at 1 (the peer has signalled), it ran {e}.") from None
    seen = "; ".join(_said(op) for op in rec.ops) or "no memory operation"
    signals = [i for i, op in enumerate(rec.ops) if op.slot == "peer_slot" and (op.old, op.new) == (0, 1)]
    waits = [i for i, op in enumerate(rec.ops) if op.slot == "my_slot" and (op.old, op.new) == (1, 0)]
    if not signals or not waits or rec.memory != {"peer_slot": 1, "my_slot": 0}:
        raise Wrong(
            f"the protocol: peer_slot must go 0 -> 1 (the signal) and my_slot 1 -> 0 (the wait consumes it); "
            f"observed: {seen}."
        )
    signal, wait = rec.ops[signals[0]], rec.ops[waits[-1]]
    if waits[-1] < signals[0]:
        raise Wrong(f"it waits before it signals: two ranks doing that wait for each other forever; observed: {seen}.")
    wrong = []
    if signal.what == "store" or signal.sem not in RELEASES:
        wrong.append("the signal is a plain store" if signal.what == "store" else "the signal does not release")
    if wait.sem not in ACQUIRES:
        wrong.append("the wait does not acquire")
    if (signal.what != "store" and signal.scope != "sys") or wait.scope != "sys":
        wrong.append("a scope narrower than the system (the peer is another GPU)")
    if wrong:
        raise Wrong("; ".join(wrong) + f". Observed: {seen}.")
    try:  # no signal from the peer: a wait that waits never returns (the probe gives up)
        alone = atomics_probe.run_recorded(signal_then_wait, {"peer_slot": 0, "my_slot": 0}, "peer_slot", "my_slot")
    except atomics_probe.Hang:
        pass
    else:
        raise Wrong(
            "with my_slot at 0 (the peer has not signalled yet) it returned after "
            f"{'; '.join(_said(op) for op in alone.ops) or 'no memory operation'}: the wait must repeat until "
            "it consumes the signal (a loop), or the barrier lets a rank through before its peer arrives."
        )
    return f"observed {seen}: the signal releases and the wait acquires, at system scope." + _collective_with(
        signal_then_wait
    )


#: 02.order asks about this world size
ORDER_WORLD = 4


@exercise(
    "02.order",
    kind="predict",
    question=f"All-gather on {ORDER_WORLD} GPUs: in the naive and in the rotated order, what is the most peers that "
    "read one GPU's shard in the same step?",
    answer="readers",
    hint="Write out, for each rank, the shard it reads at steps 0, 1, 2, 3 in each order (the kernel's `s` above), "
    "then count, per step, the ranks reading the same GPU; a rank reading its own shard uses no link.",
)
def judge_order(readers) -> str:
    if not isinstance(readers, dict) or set(readers) != set(gather_order.ORDERS):
        raise Wrong(f"`readers` must be a dict with the keys {list(gather_order.ORDERS)}; got {readers!r}.")
    truth = {o: gather_order.most_readers(ORDER_WORLD, o) for o in gather_order.ORDERS}
    steps = {
        o: " | ".join(
            "step " + str(k) + ": " + ",".join(str(gather_order.read_order(r, ORDER_WORLD, o)[k]) for r in range(4))
            for k in range(ORDER_WORLD)
        )
        for o in gather_order.ORDERS
    }
    off = [o for o in gather_order.ORDERS if readers[o] != truth[o]]
    if off:
        said = ", ".join(f"{o}: you said {readers[o]!r}" for o in off)
        raise Wrong(f"{said}; count again from the kernel's read order.")
    return (
        f"{truth} peers at most on one GPU. Shards read by ranks 0-3, naive: {steps['naive']}; "
        f"rotated: {steps['rotated']}."
    )


def _recorded_orders() -> dict[int, list[dict]]:
    """The recorded naive-order rows (their ratio to the rotated order), by world size."""
    by_world: dict[int, list[dict]] = {}
    for rs in results.load_references("collectives").values():
        for r in gather_order.order_records(rs.records):
            if r["order"] == "naive":
                by_world.setdefault(r["world_size"], []).append(r)
    return by_world


@exercise(
    "02.contention",
    kind="predict",
    question="Of the world sizes recorded (the reference files), at which was the naive order slower than the "
    "rotated one at every size recorded (its ratio's lower quartile above 1)?",
    answer="slower_at",
    hint="Contention needs two or more readers on one GPU's links in the same step: with how many ranks can that "
    "happen? (02.order counts the readers.)",
)
def judge_contention(slower_at) -> str:
    if not isinstance(slower_at, set | frozenset | list | tuple) or not all(isinstance(w, int) for w in slower_at):
        raise Wrong(f"`slower_at` must be a set of world sizes (ints); got {slower_at!r}.")
    by_world = _recorded_orders()
    if not by_world:
        raise Wrong(
            "no reference file holds a comparison of the orders (kind 'gather_order'): nothing to check against."
        )
    truth = {w for w, rows in by_world.items() if all(r["ratio_p25"] > 1 for r in rows)}
    seen = "; ".join(
        f"W={w}: naive/rotated "
        + ", ".join(f"x{r['ratio_to_rotated']:.2f}" for r in sorted(rows, key=lambda r: r["bytes"]))
        for w, rows in sorted(by_world.items())
    )
    unknown = sorted(set(slower_at) - set(by_world))
    if unknown:
        raise Wrong(f"no recording at W={unknown}; recorded: W={sorted(by_world)}.")
    if set(slower_at) != truth:
        raise Wrong(f"you said {sorted(set(slower_at))}; recorded (median ratio per size, smallest first): {seen}.")
    return f"recorded (median ratio per size, smallest first): {seen}."
