"""Plots of lab 04's pinned staging buffer (records of labkit.labs.grouped_gemm.staging), drawn
from a live run or from the reference files alike."""

from __future__ import annotations

from labkit.workbench.errors import UsageError

# --- the pinned staging buffer (records of labkit.labs.grouped_gemm.staging) ----------------------

STAGING_COLORS = {"global_index": "tab:orange", "resetting": "tab:red", "owned": "tab:green"}
STAGING_LABELS = {
    "global_index": "global index (the PR)",
    "resetting": "index reset each call",
    "owned": "slot owned per operator",
}


def _staging_case(r: dict) -> str:
    """The x-axis group of a record: its scenario, with the thread race split by how it ran."""
    if r["scenario"] == "thread_race":
        how = "forced interleaving" if r.get("forced") else "free-running"
        return f"two threads, {how}\n(calls corrupted)"
    return {
        "overflow": "one operator, many calls\n(calls refused: buffer full)",
        "graph_replay": "graph replayed after a\nlater call (corrupted)",
    }.get(r["scenario"], r["scenario"])


def plot_staging(records: list[dict], ax, title: str) -> None:
    """Share of calls that went wrong per design and scenario: refused (the buffer was full,
    hatched) or corrupted (the copy read another call's addresses), each bar annotated k/n calls."""
    if not isinstance(records, (list, tuple)):
        raise TypeError(f"records: expected a list of dicts, got {type(records).__name__}")
    recs = [r for r in records if isinstance(r, dict) and r.get("kind") == "staging"]
    if not recs:
        raise UsageError("records: no record has kind 'staging' (see labkit.labs.grouped_gemm.staging)")
    cases = list(dict.fromkeys(_staging_case(r) for r in recs))  # first-seen order
    designs = [d for d in STAGING_COLORS if any(r["design"] == d for r in recs)]
    designs += sorted({r["design"] for r in recs} - set(designs))
    width = 0.8 / len(designs)
    for j, design in enumerate(designs):
        for r in (r for r in recs if r["design"] == design):
            x = cases.index(_staging_case(r)) + (j - (len(designs) - 1) / 2) * width
            refused, corrupted = r.get("refused_calls", 0), r.get("corrupted_calls", 0)
            share = 100 * (refused + corrupted) / r["calls"]
            ax.bar(
                x,
                share,
                width,
                color=STAGING_COLORS.get(design, "tab:gray"),
                hatch="//" if refused else None,
                edgecolor="black",
                linewidth=0.5,
            )
            ax.annotate(
                f"{refused + corrupted}/{r['calls']}",
                (x, share),
                textcoords="offset points",
                xytext=(0, 2),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    for design in designs:  # one legend entry per design, whatever it scored
        ax.bar(0, 0, 0, color=STAGING_COLORS.get(design, "tab:gray"), label=STAGING_LABELS.get(design, design))
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, fontsize=8)
    ax.set_ylabel("calls that went wrong (% of calls)\nhatched: refused, buffer full")
    ax.set_ylim(0, 125)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
