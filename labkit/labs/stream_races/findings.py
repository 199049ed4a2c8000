"""Lab 03's findings rendered from the records they summarise (``labkit bench stream_races``), for the docs'
generated blocks and the README's figure (``labkit report``) and for notebook 03's sentences."""

from __future__ import annotations

from labkit.labs.stream_races.plots import plot_race, race_markdown, race_summary

#: the one-GPU reference the docs and the README's figure are rendered from
DOCS_REFERENCE = "h200x1/stream_races.json"
#: what the race's summary reads of each race record: a null in one is refused, not counted as 0
RACE_FIELDS = ("allocator", "sleep_ms", "corrupted_elems", "block_reused", "corrupted_fraction")


def _race_records(reference) -> list[dict]:
    return reference.records_with(DOCS_REFERENCE, RACE_FIELDS, kind="race")


def race_table(reference) -> str:
    """docs block ``stream_races.race``: trials corrupted per allocator and side-stream delay."""
    records = _race_records(reference)
    return (
        race_markdown(records)
        + f"\n\nOne H200: `reference/{DOCS_REFERENCE}`, kind `race` (`allocator`, `sleep_ms`, `corrupted_elems`, "
        "`block_reused`, `corrupted_fraction`). Rendered by `labkit report`."
    )


def race_figure(reference):
    """The README's figure: the share of a fresh tensor the side stream overwrote, per allocator and delay.
    Returns (figure, the reference file it drew)."""
    import matplotlib.pyplot as plt

    records = _race_records(reference)
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    plot_race(records, ax, f"a side stream writes into freed, reused memory (RECORDED: reference/{DOCS_REFERENCE})")
    fig.subplots_adjust(bottom=0.24)
    return fig, DOCS_REFERENCE


def race_in_words(records: list[dict]) -> str:
    """One sentence on the race records: which allocators were corrupted with a delay, which never.
    "" without race records."""
    rows = race_summary(records)
    if not rows:
        return ""
    delayed = [r for r in rows if (r["sleep_ms"] or 0) > 0]
    hit = sorted({r["allocator"] for r in delayed if r["corrupted_trials"]})
    clean = sorted({r["allocator"] for r in rows} - set(hit))
    parts = []
    for allocator in hit:
        rs = [r for r in delayed if r["allocator"] == allocator]
        parts.append(
            f"{allocator}: {sum(r['corrupted_trials'] for r in rs)} of {sum(r['trials'] for r in rs)} delayed trials "
            "corrupted"
        )
    zero = [r for r in rows if not r["sleep_ms"]]
    text = "; ".join(parts) or "no trial corrupted"
    if zero:
        text += f"; at delay 0, {sum(r['corrupted_trials'] for r in zero)} of {sum(r['trials'] for r in zero)}"
    if clean:
        text += "; never: " + ", ".join(clean)
    return text + "."


def headline(reference) -> str:
    """Notebook 03's first screen: the recorded race in words, beside the README's figure of it."""
    words = race_in_words(_race_records(reference))
    return (
        f"Corrupted trials per allocator: {words}\n\n"
        "![the race, recorded on one H200](../docs/figures/stream_races.race.png)\n\n"
        "(`reference/h200x1/stream_races.json`, kind `race`; rendered by `labkit report`.)"
    )
