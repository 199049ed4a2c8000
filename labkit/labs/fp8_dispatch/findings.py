"""What lab 05's two-GPU cells say, in words computed from their records (a live run's or a
recorded one's): per mechanism of the story, what happened, and a reading of why, labelled as a
hypothesis wherever this lab did not isolate the cause.

The words come from the outcome classes of ``labkit.labs.fp8_dispatch.model`` (``ok``,
``wrong_scale``, ``wrong_output``, ``illegal_memory_access``, ``exception: ...``, the sandbox's
``timeout``/``signal``/``cuda_error``), the output digests (bit-identical to the one-GPU run or
not) and the ``CUDA_LAUNCH_BLOCKING=1`` rerun of the same cell. Nothing here is typed from a
particular run: a new record gives new sentences.
"""

from __future__ import annotations

import math

from labkit.labs.fp8_dispatch.naive import MECHANISMS

IMA = "illegal_memory_access"
#: the modes read, in the order the notebook prints them
MODES = ("fp8_naive", *MECHANISMS, "fp8_device_aware")
#: substrings of an exception's message -> what refused the run (the check that stopped it)
REFUSALS = {
    "Expected all tensors to be on the same device": "torch's device check in the FP8 GEMM, which compares its "
    "operands' devices before any kernel runs",
    "cannot be accessed from Triton": "Triton's launcher, which asks CUDA whether the current device can reach each "
    "pointer argument before the launch",
}


def _cell(records, placement: str, mode: str, kind: str = "matrix") -> dict | None:
    return next(
        (
            r
            for r in records or []
            if r.get("kind") == kind and r.get("placement") == placement and r.get("mode") == mode
        ),
        None,
    )


def _ran(r: dict | None) -> bool:
    return r is not None and not str(r.get("outcome")).startswith("skipped")


def _short(outcome: str) -> str:
    """An outcome without the operator's name torch appends ("(when checking argument in ...)")."""
    return outcome.split(" (when checking argument")[0]


def _is_nan(value) -> bool:
    """True for a NaN error (a record's JSON may hold it as a float or as the string "nan")."""
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def refused_by(outcome: str | None) -> str | None:
    """What refused the run, for an ``exception: ...`` outcome whose message names a known check."""
    text = str(outcome or "")
    if not text.startswith("exception"):
        return None
    return next((who for key, who in REFUSALS.items() if key in text), None)


def reading(records, placement: str = "two_gpus") -> list[str]:
    """One line per mode that ran at ``placement``: its outcome and what it means. Empty when
    nothing ran there."""
    one = _cell(records, "one_gpu", "fp8_device_aware")
    one_digest = one.get("output_digest") if _ran(one) else None
    lines = []
    for mode in MODES:
        r = _cell(records, placement, mode)
        if not _ran(r):
            continue
        outcome = str(r["outcome"])
        blocking = _cell(records, placement, mode, kind="launch_blocking")
        blocking_outcome = str(blocking["outcome"]) if _ran(blocking) else None
        same = one_digest is not None and r.get("output_digest") == one_digest
        head = f"{mode}: {_short(outcome)}"
        if outcome == IMA:
            why = "an illegal memory access: the story's failure, reproduced"
        elif who := refused_by(outcome):
            why = f"an exception, not a fault: refused by {who}" + (
                f" (first reported at {r['reported_at']})" if r.get("reported_at") else ""
            )
        elif outcome == "wrong_scale":
            n = len(r.get("mismatches") or [])
            err = r.get("rel_err_vs_bf16")
            error = "the output is NaN" if _is_nan(err) else f"max rel. error vs bf16: {err}"
            why = (
                f"no error raised, yet {n} amax/scale value(s) differ from the independent model of delayed "
                f"scaling ({error}): a silent wrong answer"
            )
            if blocking_outcome == "ok":
                why += (
                    "; with CUDA_LAUNCH_BLOCKING=1 the same cell is correct, so the wrong values depend on "
                    "timing. Hypothesis (not isolated here): the cast kernel runs on the current device's "
                    "stream, but its FP8 output and scale_inv are read, and their memory freed and reused, "
                    "on the data's device's stream; nothing orders two devices' streams"
                )
        elif outcome == "ok":
            why = "correct" + (
                "; output bit-identical to the one-GPU run"
                if same
                else "; output NOT bit-identical to the one-GPU run"
                if one_digest
                else ""
            )
            if mode in MECHANISMS:
                why += ": harmless on this machine"
        else:
            why = outcome
        if blocking_outcome is not None and outcome != "wrong_scale" and blocking_outcome != outcome:
            why += f"; with CUDA_LAUNCH_BLOCKING=1: {_short(blocking_outcome)}"
        lines.append(f"{head} -> {why}")
    return lines


def story_verdict(records) -> str | None:
    """Which mechanism (if any) reproduces the story's illegal memory access on two GPUs, in one
    sentence; None when no two-GPU cell ran."""
    alone = {m: _cell(records, "two_gpus", m) for m in MECHANISMS}
    together = _cell(records, "two_gpus", "fp8_naive")
    if not any(_ran(r) for r in [*alone.values(), together]):
        return None
    crash = [m for m, r in alone.items() if _ran(r) and r["outcome"] == IMA]
    if crash:
        return f"reproduced: {', '.join(crash)} alone gives the story's illegal memory access on two GPUs"
    if _ran(together) and together["outcome"] == IMA:
        return "reproduced by the three mechanisms together, by none alone (whether a pair suffices is not measured)"
    refused = [m for m, r in alone.items() if _ran(r) and refused_by(r["outcome"])]
    silent = [m for m, r in alone.items() if _ran(r) and r["outcome"] in ("wrong_scale", "wrong_output")]
    parts = ["not reproduced: no mechanism, alone or together, gives an illegal memory access on this stack"]
    if refused:
        parts.append(
            f"{', '.join(refused)} is stopped by "
            f"{'; '.join(sorted({refused_by(alone[m]['outcome']) for m in refused}))}. "
            "Hypothesis for the story's crash (TransformerEngine is not on these machines, so it is not "
            "tested): its GEMM hands cuBLAS raw pointers with no such check, so a kernel on one GPU reads "
            "the state on the other, which faults unless peer access between the two is enabled"
        )
    if silent:
        parts.append(f"{', '.join(silent)} is worse than a crash here: a silent wrong answer")
    return "; ".join(parts)


#: the reference the docs' speed table is rendered from (one GPU of a 2×H200 machine)
DOCS_REFERENCE = "h200x2/fp8_dispatch.json"
SPEED_IMPLS = (
    ("fp8_gemm", "FP8 GEMM"),
    ("fp8_quantize_gemm", "input quantise + FP8 GEMM"),
    ("fp8_weight_cast", "weight cast"),
)


def speed_table(reference) -> str:
    """docs block ``fp8_dispatch.speed``: at the story's MLP shapes, bf16's ms and each FP8 step's time over it."""
    from labkit.workbench.findings import field_of, number

    name = DOCS_REFERENCE
    rows = reference.records(name, kind="speed")
    out = ["| shape (M x K x N) | bf16 ms | " + " | ".join(f"{label} / bf16" for _, label in SPEED_IMPLS) + " |"]
    out.append("|---" * (2 + len(SPEED_IMPLS)) + "|")
    for shape in dict.fromkeys(r["shape"] for r in rows):
        bf16 = reference.one(name, kind="speed", shape=shape, impl="bf16")
        ratios = [
            f"{reference.value(name, 'ratio_vs_bf16', kind='speed', shape=shape, impl=impl):.2f}"
            for impl, _ in SPEED_IMPLS
        ]
        dims = f"{bf16['M']} x {bf16['K']} x {bf16['N']}"
        out.append(f"| {shape} ({dims}) | {number(field_of(bf16, 'ms', name))} | " + " | ".join(ratios) + " |")
    out.append("")
    out.append(
        f"One H200 of two: `reference/{name}`, kind `speed` (field `ms`; the ratios `ratio_vs_bf16`, time over "
        "bf16's in the same rounds). Rendered by `labkit report`."
    )
    return "\n".join(out)
