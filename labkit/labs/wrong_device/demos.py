"""Lab 01's GPU demonstrations as benchmark records, so every tier can show what they did.

Three kinds of record (their ``pattern`` field names the kind; each run in a child process,
since each can crash):

* ``"launch blocking"``: the bad store, then innocent work, without and with
  ``CUDA_LAUNCH_BLOCKING=1``, and the line that reported the error (1 GPU).
* ``"sharded decode"``: a tiny Llama-shaped model sharded by accelerate over 2 GPUs, SC linears
  guarded (the baseline) and unguarded, and whether the unguarded run's tokens and logits are
  bit-identical to the guarded one's (2 GPUs).
* ``"regression test"``: the seed's test, on the story's five configurations: inputs on cuda:1
  while cuda:0 is current must give bit-identical results to the same call with cuda:1 current,
  the output on cuda:1, the current device left at cuda:0; for the guarded launcher (the fix)
  and the unguarded one (the bug) (2 GPUs).

On a machine without the GPUs a kind needs, it gives one record with ``outcome="skipped"`` and
the gate's reason in ``skipped``: never a made-up result.
"""

from __future__ import annotations

import math

import torch

from labkit.workbench import gates, sandbox

KINDS = ("launch blocking", "sharded decode", "regression test")

#: the story's five configurations: (shape of a, shape of b, options); tests/kernels/sc/test_sc.py has them too
STORY_CASES = (
    ((6, 96), (96, 10), dict(granularity="per_tensor")),
    ((6, 96), (96, 10), dict(granularity="per_row")),
    ((6, 300), (300, 10), dict(granularity="per_row", chunk_d=128)),
    ((3, 5, 64), (3, 64, 7), dict(granularity="per_row")),
    ((3, 5, 64), (3, 64, 7), dict(granularity="per_head")),
)


def base_record(kind: str, outcome: str, detail: str, **fields) -> dict:
    """A record with every field the device_guard file requires (None where it does not apply)."""
    return {
        "pattern": kind,
        "peer_access": None,
        "guarded": None,
        "outcome": outcome,
        "GBps": None,
        "detail": detail,
        "peer_enabled": None,
        **fields,
    }


def skipped_record(kind: str, reason: str, **fields) -> dict:
    return base_record(kind, "skipped", f"skipped: {reason}", skipped=reason, **fields)


def crash_outcome(res: sandbox.SandboxResult) -> str:
    """The outcome word of a child that did not return."""
    return {"timeout": "hang", "illegal_memory_access": "illegal memory access"}.get(res.status, "exception")


def _first_error_fields(res: sandbox.SandboxResult) -> dict:
    from labkit.labs.wrong_device.experiments import first_error

    first = first_error(res.traceback) if not res.ok else None
    return {"first_error": first[0] if first else None, "first_error_at": first[1] if first else None}


# --- CUDA_LAUNCH_BLOCKING ---------------------------------------------------------------------


def launch_blocking_records(timeout_s: float = 60.0) -> list[dict]:
    """The CUDA_LAUNCH_BLOCKING demonstration as records (1 GPU; two children)."""
    from labkit.labs.wrong_device.experiments import launch_blocking_demo

    kind = "launch blocking"
    gate = gates.requires(gpus=1, compiled=True)
    if not gate.ok:
        return [skipped_record(kind, gate.reason, CUDA_LAUNCH_BLOCKING=b, reported_at=None) for b in ("0", "1")]
    return [
        base_record(
            kind,
            r["status"].replace("_", " "),
            r["summary"],
            CUDA_LAUNCH_BLOCKING=r["CUDA_LAUNCH_BLOCKING"],
            reported_at=r["reported_at"],
        )
        for r in launch_blocking_demo(timeout_s=timeout_s)
    ]


def describe_launch_blocking(records: list[dict]) -> list[str]:
    """One line per CUDA_LAUNCH_BLOCKING setting: how the child ended and the line that reported it."""
    recs = [r for r in records if r.get("pattern") == "launch blocking"]
    if not recs:
        return ["none recorded yet"]
    return [
        f"CUDA_LAUNCH_BLOCKING={r['CUDA_LAUNCH_BLOCKING']}: "
        + (r["detail"] if r["outcome"] == "skipped" else f"{r['outcome']}, reported at {r['reported_at']}")
        for r in recs
    ]


# --- the sharded model, unguarded vs guarded --------------------------------------------------


def compare_decodes(baseline: dict, other: dict) -> dict:
    """How an unguarded decode's result compares with the guarded baseline's (pure)."""
    for name, v in (("baseline", baseline), ("other", other)):
        if not isinstance(v, dict) or "tokens" not in v or "logits" not in v:
            raise ValueError(f"{name}: expected a dict with 'tokens' and 'logits' (model.unguarded_decode's value)")
    a, b = torch.tensor(baseline["logits"]), torch.tensor(other["logits"])
    same_shape = a.shape == b.shape
    return {
        "tokens_match": list(baseline["tokens"]) == list(other["tokens"]),
        "bit_identical": bool(same_shape and torch.equal(a, b)),
        "max_abs_logit_diff": float((a - b).abs().nan_to_num(float("inf")).max()) if same_shape and a.numel() else None,
    }


def decode_record(guarded: bool, res: sandbox.SandboxResult, baseline: dict | None) -> dict:
    """One sharded-decode record from its child's result; ``baseline`` is the guarded run's value."""
    kind = "sharded decode"
    fields = {"guarded": guarded, **_first_error_fields(res), "seconds": res.seconds}
    if not res.ok:
        return base_record(kind, crash_outcome(res), res.summary(), tokens=None, **fields)
    v = res.value
    fields.update(
        tokens=v["tokens"],
        layers_on=v["layers_on"],
        finite=v["finite"],
        peer_enabled=v.get("peer_0_to_1"),
        peer_1_to_0=v.get("peer_1_to_0"),
    )
    if guarded:
        return base_record(kind, "ran (baseline)", f"tokens {v['tokens']}, logits finite: {v['finite']}", **fields)
    if baseline is None:
        return base_record(kind, "ran, no baseline", "the guarded run failed: nothing to compare with", **fields)
    cmp = compare_decodes(baseline, v)
    outcome = "correct" if cmp["bit_identical"] else "wrong result"
    diff = cmp["max_abs_logit_diff"]
    logits = (
        "logits not finite (NaN or inf): garbage, not a small drift"
        if diff is not None and not math.isfinite(diff)
        else f"logits differ by up to {diff:.3g}"
    )
    detail = (
        "tokens and logits bit-identical to the guarded run"
        if cmp["bit_identical"]
        else f"tokens {'match' if cmp['tokens_match'] else 'differ'}; {logits}"
    )
    return base_record(kind, outcome, detail, **fields, **cmp)


def sharded_decode_records(timeout_s: float = 180.0) -> list[dict]:
    """The unguarded SC kernel inside a model sharded over 2 GPUs, beside the guarded run."""
    from labkit.labs.wrong_device import model

    kind = "sharded decode"
    gate = gates.requires(gpus=2, compiled=True)
    if not gate.ok:
        return [skipped_record(kind, gate.reason, guarded=g) for g in (True, False)]
    guarded = sandbox.run_isolated(model.unguarded_decode, model.TINY, True, timeout=timeout_s)
    unguarded = sandbox.run_isolated(model.unguarded_decode, model.TINY, False, timeout=timeout_s)
    baseline = guarded.value if guarded.ok else None
    return [decode_record(True, guarded, None), decode_record(False, unguarded, baseline)]


def describe_decodes(records: list[dict]) -> list[str]:
    recs = [r for r in records if r.get("pattern") == "sharded decode"]
    if not recs:
        return ["none recorded yet"]
    out = []
    for r in recs:
        peers = (
            f" (peer access 0->1 {r.get('peer_enabled')}, 1->0 {r.get('peer_1_to_0')})"
            if r.get("peer_enabled") is not None or r.get("peer_1_to_0") is not None
            else ""
        )
        out.append(f"{'guarded  ' if r['guarded'] else 'unguarded'}: {r['outcome']}: {r['detail']}{peers}")
        if r.get("first_error"):
            out.append(f"           first error: {r['first_error']} (at {r['first_error_at']})")
    return out


# --- the seed's regression test ---------------------------------------------------------------


def regression_check(guarded: bool = True, seed: int = 0) -> list[dict]:
    """In a child: each story configuration with cuda:1 inputs, once with cuda:0 current and once
    with cuda:1 current; bit-identical, output device, current device after. Needs 2 GPUs."""
    from labkit.kernels.sc import prepare_b, sc_matmul_prepared

    if torch.cuda.device_count() < 2:
        raise RuntimeError("regression_check needs 2 CUDA GPUs")
    rows = []
    for i, (shape_a, shape_b, opts) in enumerate(STORY_CASES):
        g = torch.Generator().manual_seed(seed + i)
        a = (torch.randn(shape_a, generator=g) * 3).to(torch.bfloat16).to("cuda:1")
        b = torch.randn(shape_b, generator=g).to(torch.bfloat16).to("cuda:1")
        w = prepare_b(b, **opts)  # the weight's quantisation: guarded, not under test
        with torch.cuda.device(1):
            ref = sc_matmul_prepared(a, w)  # the right device current: what the answer must be
            torch.cuda.synchronize(1)
        torch.cuda.set_device(0)  # device_map="auto"'s state
        out = sc_matmul_prepared(a, w, guarded=guarded)
        for d in (0, 1):
            torch.cuda.synchronize(d)
        rows.append(
            {
                "case": case_name(shape_a, opts),
                "out_device": str(out.device),
                "current_after": f"cuda:{torch.cuda.current_device()}",
                "bit_identical": torch.equal(out.cpu(), ref.cpu()),
            }
        )
    return rows


def case_name(shape_a, opts: dict) -> str:
    return f"a {tuple(shape_a)}, " + ", ".join(f"{k}={v}" for k, v in opts.items())


def regression_records(timeout_s: float = 180.0) -> list[dict]:
    """The seed's regression test, guarded (must pass) and unguarded (the bug), each in a child."""
    kind = "regression test"
    gate = gates.requires(gpus=2, compiled=True)
    if not gate.ok:
        return [skipped_record(kind, gate.reason, guarded=g) for g in (True, False)]
    records = []
    for guarded in (True, False):
        res = sandbox.run_isolated(regression_check, guarded, timeout=timeout_s)
        records += regression_rows_to_records(guarded, res)
    return records


def regression_rows_to_records(guarded: bool, res: sandbox.SandboxResult) -> list[dict]:
    """One record per configuration, or one for the whole child if it did not return (pure)."""
    kind = "regression test"
    if not res.ok:
        return [
            base_record(
                kind, crash_outcome(res), res.summary(), guarded=guarded, case="(all)", **_first_error_fields(res)
            )
        ]
    out = []
    for row in res.value:
        ok = row["bit_identical"] and row["out_device"] == "cuda:1" and row["current_after"] == "cuda:0"
        outcome = "correct" if ok else ("wrong device" if row["out_device"] != "cuda:1" else "wrong result")
        detail = (
            f"bit-identical to cuda:1 current: {row['bit_identical']}; output on {row['out_device']}; "
            f"current device after: {row['current_after']}"
        )
        out.append(base_record(kind, outcome, detail, guarded=guarded, **row))
    return out


def describe_regression(records: list[dict]) -> list[str]:
    recs = [r for r in records if r.get("pattern") == "regression test"]
    if not recs:
        return ["none recorded yet"]
    out = []
    for guarded in (True, False):
        mine = [r for r in recs if r.get("guarded") is guarded]
        if not mine:
            continue
        label = "guarded (the fix)" if guarded else "unguarded (the bug)"
        if mine[0]["outcome"] == "skipped":
            out.append(f"{label}: {mine[0]['detail']}")
            continue
        if mine[0].get("case") == "(all)":  # the child did not return: its summary says how it ended
            out.append(f"{label}: the run did not finish: {mine[0]['detail']}")
            if mine[0].get("first_error") and mine[0]["first_error"].split(": ", 1)[-1] not in mine[0]["detail"]:
                out.append(f"    first error: {mine[0]['first_error']}")
            continue
        passed = sum(r["outcome"] == "correct" for r in mine)
        out.append(
            f"{label}: {passed} of {len(mine)} configurations pass"
            + "".join(
                f"\n    {r.get('case')}: {r['outcome']}: {r['detail']}" for r in mine if r["outcome"] != "correct"
            )
        )
    return out
