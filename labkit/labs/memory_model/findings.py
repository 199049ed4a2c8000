"""Lab 06's findings rendered from the records they summarise (``labkit bench memory_model_litmus``,
``litmus_two_gpus`` and ``broken_barriers``), for the docs' generated blocks (``labkit report``) and
notebook 06's sentences."""

from __future__ import annotations

#: the litmus sweeps the docs summarise: within one GPU on two machines, and across two GPUs
LITMUS_FILES = (
    "h100x2/memory_model_litmus.json",
    "h200x2/memory_model_litmus.json",
    "h200x2/memory_model_litmus_two_gpus.json",
)
BARRIER_FILES = ("h100x2/memory_model_broken_barriers.json", "h200x2/memory_model_broken_barriers.json")


def litmus_summary(records: list[dict]) -> dict:
    """Counts over litmus rows that ran: rows, instances per row, rows where the weak outcome was seen
    (all, where the model forbids it, where the model and PTX both do), start-barrier timeouts and
    unwritten registers."""
    ran = [r for r in records if not r.get("skipped")]
    seen = [r for r in ran if r.get("weak_outcomes")]
    return {
        "rows": len(ran),
        "instances": sorted({r["runs"] for r in ran}),
        "weak_seen": len(seen),
        "forbidden_seen": sum(1 for r in seen if r.get("verdict") == "forbidden"),
        "forbidden_by_both_seen": sum(
            1 for r in seen if r.get("verdict") == "forbidden" and r.get("ptx_verdict", "forbidden") == "forbidden"
        ),
        "timeouts": sum(r.get("timeouts") or 0 for r in ran),
        "unwritten": sum(r.get("unwritten") or 0 for r in ran),
    }


def rows_table(reference) -> str:
    """docs block ``memory_model.litmus-rows``: per recorded sweep, how many rows ran at how many instances, in how many
    the weak outcome was seen, and the checks that should read 0."""
    out = [
        "| file | rows | instances per row | weak outcome seen | seen where the model forbids it "
        "| ... and PTX too | start barriers timed out | registers unwritten |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in LITMUS_FILES:
        s = litmus_summary(reference.file(name).records)
        instances = ", ".join(f"{n:.0e}".replace("e+0", "e") for n in s["instances"])
        out.append(
            f"| `reference/{name}` | {s['rows']} | {instances} | {s['weak_seen']} | {s['forbidden_seen']} | "
            f"{s['forbidden_by_both_seen']} | {s['timeouts']} | {s['unwritten']} |"
        )
    out.append("")
    out.append(
        "Fields: `runs` (instances), `weak_outcomes` (rows where it is above 0), `verdict` and `ptx_verdict` "
        "(`forbidden`), `timeouts`, `unwritten`. Rendered by `labkit report`."
    )
    return "\n".join(out)


def _delay_columns(records):
    return sorted({r["delay"] for r in records})


def broken_barriers_table(reference) -> str:
    """docs block ``memory_model.broken-barriers``: wrong results of trials per machine, barrier variant and delay
    (volatile loads on the slow rank), summed over the four forms; the variant without its end barrier
    form by form."""
    delays = sorted({d for name in BARRIER_FILES for d in _delay_columns(reference.file(name).records)})
    out = [
        "| machine | variant | form | " + " | ".join(f"delay {d:,}" for d in delays) + " |",
        "|---|---|---|" + "---|" * len(delays),
    ]
    for name in BARRIER_FILES:
        rs = reference.file(name)
        ran = [r for r in rs.records if not r.get("skipped")]
        groups = [(v, None) for v in dict.fromkeys(r["variant"] for r in ran) if v != "no_end_barrier"]
        groups += [("no_end_barrier", form) for form in dict.fromkeys(r["algorithm"] for r in ran)]
        for variant, form in groups:
            cells = []
            for d in delays:
                sel = [r for r in ran if r["variant"] == variant and r["delay"] == d and form in (None, r["algorithm"])]
                cells.append(
                    f"{sum(r['wrong_results'] for r in sel)} of {sum(r['trials'] for r in sel)}" if sel else "–"
                )
            out.append(f"| {rs.machine} | `{variant}` | {form or 'all four, summed'} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "Wrong results of trials: `reference/h100x2/memory_model_broken_barriers.json` and "
        "`reference/h200x2/memory_model_broken_barriers.json`, "
        "fields `wrong_results` and `trials` per `variant`, `algorithm` (form) and `delay`. "
        "Rendered by `labkit report`."
    )
    return "\n".join(out)


#: the accesses that promise no order: where the weak outcome is the hardware's to show
UNORDERED = ("plain", "volatile", "relaxed")


def _pct(rate: float) -> str:
    return f"{rate:.2g}%" if rate < 1 else f"{rate:.2f}".rstrip("0").rstrip(".") + "%"


def _most_often(rows: list[dict]) -> tuple[str, list[str]]:
    """'SB 2.9%, MP 2.7%, ...' (the highest weak rate per test, highest first) and the tests never seen."""
    best: dict[str, float] = {}
    for r in rows:
        best[r["test"]] = max(best.get(r["test"], 0.0), (r.get("weak_outcomes") or 0) / r["runs"])
    seen = sorted((t for t in best if best[t] > 0), key=lambda t: -best[t])
    return ", ".join(f"{t} {_pct(100 * best[t])}" for t in seen), sorted(t for t in best if best[t] == 0)


def litmus_in_words(records: list[dict], machine: str) -> str:
    """What one recorded litmus sweep saw, in sentences: its rows, the weak outcome's highest rate per
    test with unordered accesses, the checks that must read 0, and, within one GPU, the anchor's IRIW and
    the scope lesson of `.cta` against `.gpu` fences; across two GPUs, `gpu` against `sys` scope.
    "" without rows that ran."""
    ran = [r for r in records if not r.get("skipped") and r.get("runs")]
    if not ran:
        return ""
    s = litmus_summary(ran)
    n = "/".join(f"{x:.0e}".replace("e+0", "e") for x in s["instances"])
    two = all(r["placement"] == "two_gpus" for r in ran)
    cross = [r for r in ran if r["placement"] in ("cross_cta", "two_gpus") and r["semantics"] in UNORDERED]
    often, never = _most_often(cross)
    where = "Across two GPUs" if two else "Across two CTAs"
    out = [
        f"**{machine}**: {s['rows']} rows at {n} instances; the weak outcome seen in {s['weak_seen']}. "
        f"{where}, with plain, volatile or relaxed accesses, its highest rate per test: {often}"
        + (f"; never: {', '.join(never)}" if never else "")
        + "."
    ]

    def count(test, sem, scope, placement, stress=None):
        rows = [
            r
            for r in ran
            if (r["test"], r["semantics"], r["scope"], r["placement"]) == (test, sem, scope, placement)
            and stress in (None, r.get("stress_name"))
        ]
        return [r["weak_outcomes"] for r in rows]

    if not two:
        anchor = count("IRIW", "relaxed", "gpu", "cross_cta", "memory")
        fenced = count("IRIW", "fence_sc", "gpu", "cross_cta") + count("IRIW", "fence", "gpu", "cross_cta")
        narrow = count("IRIW", "fence_sc", "cta", "cross_cta", "memory") + count(
            "IRIW", "fence", "cta", "cross_cta", "memory"
        )
        if anchor and fenced and narrow:
            out.append(
                f"The anchor's IRIW (relaxed, `gpu` scope, memory stress): {anchor[0]:,} of {n}; with `fence.sc.gpu` "
                f"or `fence.acq_rel.gpu` in both readers, at most {max(fenced):,} under any stress; with the `.cta` "
                f"fences (too narrow), {min(narrow):,}-{max(narrow):,}."
            )
        within = sorted({r["test"] for r in ran if r["placement"] == "same_cta" and r.get("weak_outcomes")})
        out.append(f"Within one CTA the weak outcome was seen in: {', '.join(within) or 'no test'}.")
    else:
        twins = {(r["test"], r["semantics"], r.get("stress_name")): r for r in ran if r["scope"] == "sys"}
        lesson = [
            (r, twins[(r["test"], r["semantics"], r.get("stress_name"))])
            for r in ran
            if r["scope"] == "gpu"
            and r["verdict"] == "allowed"
            and twins.get((r["test"], r["semantics"], r.get("stress_name")), {}).get("verdict") == "forbidden"
        ]
        if lesson:
            at_gpu = [g for g, _ in lesson if g.get("weak_outcomes")]
            at_sys = [y for _, y in lesson if y.get("weak_outcomes")]
            named = "; ".join(
                f"{g['test']} {g['semantics']} ({g['stress_name']}) {g['weak_outcomes']:,}" for g in at_gpu
            )
            out.append(
                f"Of the {len(lesson)} rows where `sys` scope forbids the weak outcome and `gpu` scope (too narrow for "
                f"two GPUs) does not, it was seen at `gpu` in {len(at_gpu)}"
                + (f" ({named})" if named else "")
                + f" and at `sys` in {len(at_sys)}."
            )
    out.append(
        f"Seen where the model forbids it: {s['forbidden_seen']} rows; start barriers timed out: {s['timeouts']}; "
        f"registers unwritten: {s['unwritten']}."
    )
    return " ".join(out)


def broken_in_words(records: list[dict], machine: str) -> str:
    """Per delay, how many calls of each form went wrong without its end barrier, and the most any other
    variant gave. "" without rows that ran."""
    ran = [r for r in records if not r.get("skipped")]
    if not ran:
        return ""
    parts = []
    for d in _delay_columns(ran):
        rows = [r for r in ran if r["variant"] == "no_end_barrier" and r["delay"] == d]
        forms = ", ".join(f"{r['algorithm']} {r['wrong_results']}/{r['trials']}" for r in rows)
        parts.append(f"delay {d:,}: {forms}")
    others = [r for r in ran if r["variant"] != "no_end_barrier"]
    worst = max((r["wrong_results"] for r in others), default=0)
    names = ", ".join(f"`{v}`" for v in dict.fromkeys(r["variant"] for r in others))
    return (
        f"**{machine}**, wrong calls without the end barrier: "
        + "; ".join(parts)
        + f". {names}: at most {worst} wrong "
        "in any row."
    )


def cost_in_words(by_variant: list[tuple[str, float, float, float, int]], machine: str) -> str:
    """One sentence from ``plots.cost_by_variant``: the range of the semantics' medians and of the tests."""
    if not by_variant:
        return ""
    medians = [m for _, m, _, _, _ in by_variant]
    lo, hi = min(v[2] for v in by_variant), max(v[3] for v in by_variant)
    return (
        f"**{machine}**: the semantics' medians span {min(medians):.2g}-{max(medians):.2g} ns per instance, "
        f"the tests {lo:.2g}-{hi:.2g} ns."
    )
