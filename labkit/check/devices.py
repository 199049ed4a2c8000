"""``device_independence``: does ``fn`` compute the same on its data's GPU whatever GPU is current?

Lab 01's seed regression test, pointed at any function: for each GPU d, the inputs are built on
cuda:d (``make_inputs``), ``fn`` runs once with cuda:d current (the reference, twice: a function
whose two runs differ is reported as non-deterministic, not as a device bug), then again on a copy
of the same inputs while cuda:(d+1) is current, under :func:`watch_launches`. Bit for bit equal,
outputs on cuda:d and the caller's device current afterwards: independent.

The runs happen in a child process (``labkit.workbench.sandbox``): an illegal memory access
poisons the CUDA context of the process that made it, and a hang becomes a timeout.
"""

from __future__ import annotations

import torch

from labkit.check import report as R
from labkit.check.launches import watch_launches
from labkit.workbench import sandbox

NAME = "device_independence"
_STEP = "labkit.check.step: "  # the child prints one before each device pair


def _pair(fn, make_inputs, d: int, c: int, echo: bool) -> dict:
    """Data on cuda:d; reference with cuda:d current, test with cuda:c current."""
    data = torch.device("cuda", d)
    torch.cuda.set_device(d)
    args, kwargs = R.build_inputs(NAME, make_inputs, data)
    pristine = R.clone_inputs(args, kwargs)
    refs = []
    for _ in range(2):
        a, k = R.clone_inputs(*pristine)
        try:
            result = fn(*a, **k)
        except Exception as e:
            return {
                "outcome": "error",
                "line": f"fn raised {type(e).__name__} with cuda:{d} current and its data "
                f"on cuda:{d} (nothing provoked): {R.first_line(e)}",
            }
        torch.cuda.synchronize(d)
        refs.append(R.snapshot(R.outputs(NAME, result, a, k)))
    if R.differences(refs[0], refs[1]):
        return {
            "outcome": "non-deterministic",
            "line": f"with its data on cuda:{d} and cuda:{d} current, two runs "
            "on identical inputs differ: " + "; ".join(R.differences(refs[0], refs[1])[:3]),
        }
    torch.cuda.set_device(c)
    a, k = R.clone_inputs(*pristine)
    with watch_launches(echo=echo) as watch:
        try:
            result = fn(*a, **k)
            for i in range(torch.cuda.device_count()):
                torch.cuda.synchronize(i)
        except Exception as e:
            return {
                "outcome": "exception",
                "findings": [str(f) for f in watch.findings],
                "line": f"{type(e).__name__}: {R.first_line(e)}",
                "at": R.user_line(tb=e.__traceback__),
            }
    after = torch.cuda.current_device()
    named = R.outputs(NAME, result, a, k)
    moved = [f"{n} is on {t.device}" for n, t in named if t.device != data]
    diffs = R.differences(refs[0], R.snapshot(named))
    findings = [str(f) for f in watch.findings]
    if diffs or moved or findings:
        return {"outcome": "launches on the current device", "diffs": diffs, "moved": moved, "findings": findings}
    if after != c:
        return {"outcome": "changes the current device", "line": f"cuda:{c} was current, cuda:{after} after the call"}
    return {"outcome": "independent"}


def _child(fn_spec: str, inputs_spec: str) -> list[dict]:
    """In the child: every (data, current) pair, one after another."""
    fn, make_inputs = R.resolve(NAME, "fn", fn_spec), R.resolve(NAME, "make_inputs", inputs_spec)
    n = torch.cuda.device_count()
    rows = []
    for d in range(n):
        c = (d + 1) % n
        print(f"{_STEP}{d} {c}", flush=True)
        rows.append({"data": d, "current": c, **_pair(fn, make_inputs, d, c, echo=True)})
        if rows[-1]["outcome"] in ("exception", "error") and "illegal memory access" in rows[-1].get("line", ""):
            break  # the context is poisoned: nothing after this can run
    return rows


def _report(target: str, rows: list[dict]) -> R.Report:
    for row in rows:
        where = f"data on cuda:{row['data']}, cuda:{row['current']} current"
        outcome = row["outcome"]
        if outcome == "independent":
            continue
        if outcome == "error":
            return R.Report(NAME, target, "error", "exception", row["line"])
        if outcome == "non-deterministic":
            return R.Report(NAME, target, "inconclusive", "non-deterministic", row["line"])
        details = row.get("findings", []) + row.get("moved", []) + row.get("diffs", [])
        if outcome == "exception":
            kind = "illegal memory access" if "illegal memory access" in row["line"].lower() else "exception"
            return R.Report(NAME, target, "failed", kind, f"{where}: {row['line']} (at {row['at']})", details)
        return R.Report(NAME, target, "failed", outcome, f"{where}: " + (row.get("line") or details[0]), details)
    pairs = ", ".join(f"cuda:{r['data']} data with cuda:{r['current']} current" for r in rows)
    return R.Report(NAME, target, "passed", "independent", f"bit-identical outputs on their data's GPU ({pairs})")


def _crash_report(target: str, res: sandbox.SandboxResult) -> R.Report:
    steps = [ln[len(_STEP) :].split() for ln in res.stdout.splitlines() if ln.startswith(_STEP)]
    where = f"data on cuda:{steps[-1][0]}, cuda:{steps[-1][1]} current: " if steps else ""
    seen = [ln.split(": ", 1)[1] for ln in res.stdout.splitlines() if ln.startswith("labkit.check.watch_launches: ")]
    if res.status == "timeout":
        return R.Report(NAME, target, "failed", "hang", f"{where}{res.summary()}", seen)
    if res.status == "exception" and (res.error_type or "").endswith("UsageError"):
        return R.Report(NAME, target, "error", "bad input", R.first_line(Exception(res.message or "")))
    kind = {"illegal_memory_access": "illegal memory access", "cuda_error": "CUDA error"}.get(res.status, res.status)
    return R.Report(NAME, target, "failed", kind, f"{where}the child process ended: {res.summary()}", seen)


def device_independence(fn, make_inputs, *, timeout: float = 300.0, isolate: bool = True) -> R.Report:
    """Check that ``fn`` computes on its data's GPU whatever GPU is current (lab 01's bug).

    For each GPU d: inputs on cuda:d, ``fn`` run with cuda:d current (twice, to tell a
    non-deterministic function apart), then with cuda:(d+1) current under :func:`watch_launches`.
    Outcomes: "independent" (bit-identical, outputs on the data's GPU, the caller's device current
    again); "launches on the current device" (which outputs differ or moved, which kernel and
    argument); "illegal memory access"; "exception"; "hang"; "non-deterministic" (inconclusive).

    Args:
        fn: the function, or ``"module:function"``.
        make_inputs: ``make_inputs(device) -> (args, kwargs)``, or ``"module:function"``.
        timeout: seconds for the child process (a hang becomes a "hang" report).
        isolate: run in a child process (default; ``fn`` and ``make_inputs`` must be importable by
            name). ``False`` runs in this process: a function defined in a notebook can be checked,
            but an illegal memory access then poisons this process's CUDA context.

    Returns:
        a :class:`Report`. With fewer than 2 GPUs: "skipped", "needs 2 GPUs, found N".

    Note:
        The outputs are compared bit for bit: a function whose result depends on the order of
        atomics is reported as non-deterministic. A kernel launched outside Triton's Python launch
        path is compared by its outputs only.

    Example::

        >>> r = labkit.check.device_independence("mypkg.ops:fused_add", "mypkg.ops:inputs")  # doctest: +SKIP
        >>> print(r.summary())  # doctest: +SKIP
        device_independence(mypkg.ops:fused_add): FAILED: launches on the current device: ...
    """
    target = R.name_of(fn)
    fn_obj, inputs_obj = R.resolve(NAME, "fn", fn), R.resolve(NAME, "make_inputs", make_inputs)
    R.check_number(NAME, "timeout", timeout)
    if not isinstance(isolate, bool):
        raise R.UsageError(f"{NAME}: isolate={isolate!r}: expected a bool")
    if isolate:
        specs = R.importable(NAME, "fn", fn), R.importable(NAME, "make_inputs", make_inputs)
    skip = R.needs_gpus(NAME, target, 2, "one GPU to hold the data and another to be current")
    if skip is not None:
        return skip
    if not isolate:
        previous = torch.cuda.current_device()
        try:
            n = torch.cuda.device_count()
            return _report(
                target,
                [
                    {"data": d, "current": (d + 1) % n, **_pair(fn_obj, inputs_obj, d, (d + 1) % n, echo=False)}
                    for d in range(n)
                ],
            )
        finally:
            torch.cuda.set_device(previous)
    res = sandbox.run_isolated(_child, *specs, timeout=timeout)
    return _report(target, res.value) if res.ok else _crash_report(target, res)
