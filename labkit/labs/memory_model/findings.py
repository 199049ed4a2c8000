"""Lab 06's findings rendered from the records they summarise (``labkit bench litmus``,
``litmus_two_gpus`` and ``broken_barriers``), for the docs' generated blocks (``labkit report``) and
notebook 06's sentences."""

from __future__ import annotations

#: the litmus sweeps the docs summarise: within one GPU on two machines, and across two GPUs
LITMUS_FILES = ("h100x2/litmus.json", "h200x2/litmus.json", "h200x2/litmus_two_gpus.json")
BARRIER_FILES = ("h100x2/broken_barriers.json", "h200x2/broken_barriers.json")


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
    """docs block ``litmus-rows``: per recorded sweep, how many rows ran at how many instances, in how many
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
    """docs block ``broken-barriers``: wrong results of trials per machine, barrier variant and delay
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
        "Wrong results of trials: `reference/h100x2/broken_barriers.json` and `reference/h200x2/broken_barriers.json`, "
        "fields `wrong_results` and `trials` per `variant`, `algorithm` (form) and `delay`. "
        "Rendered by `labkit report`."
    )
    return "\n".join(out)
