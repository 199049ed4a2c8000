"""The map of the workbook: every lab, the bug it teaches, the seed story, and what it needs.

This catalogue is the single source for the README's lab table (``labkit labs --markdown``) and
the wide one in docs/labs.md (``labkit labs --markdown --wide``), both checked by a test, for
``labkit doctor``'s "what can each lab do here", and for the start-here notebook. A lab whose
notebook is not written yet is listed with ``status="planned"``; one whose notebook runs but
whose parts or reference data are still missing is ``"draft"``. Each lab declares itself in its
package (``LAB``, :class:`labkit.workbench.lab.Lab`); the catalogue is the list of those packages.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from labkit.labs import collectives, fp8_dispatch, grouped_gemm, memory_model, start_here, stream_races, wrong_device
from labkit.workbench import gates, hardware
from labkit.workbench.errors import UsageError
from labkit.workbench.lab import Lab

#: every lab, in notebook order: each package's manifest (labkit.workbench.lab.Lab)
LABS: tuple[Lab, ...] = tuple(
    package.LAB
    for package in (start_here, wrong_device, collectives, stream_races, grouped_gemm, fp8_dispatch, memory_model)
)


def get(name: str) -> Lab:
    """The lab called ``name`` (``"stream_races"``); a UsageError naming the known ones otherwise."""
    for lab in LABS:
        if lab.name == name:
            return lab
    raise UsageError(f"no lab named {name!r}; known: {', '.join(lab.name for lab in LABS)}")


def by_number(number: str) -> Lab:
    """The lab whose notebook and exercises carry ``number`` (``"03"``)."""
    for lab in LABS:
        if lab.number == number:
            return lab
    raise UsageError(f"no lab numbered {number!r}; known: {', '.join(lab.number for lab in LABS)}")


def capability(lab: Lab, hw: hardware.Hardware | None = None) -> dict:
    """What the lab can do on this machine: 'full', 'partial' (with the parts skipped), 'planned'."""
    if lab.status not in ("ready", "draft"):
        return {"lab": lab.name, "can": "planned", "detail": "not written yet", "skipped": []}
    skipped = []
    for part in lab.parts:
        g = gates.requires(hw=hw, **part.needs)
        if not g.ok:
            skipped.append({"part": part.name, "reason": g.reason})
    can = "full" if not skipped else "partial"
    detail = (
        "every part runs here" if not skipped else "; ".join(f"{s['part']} skipped: {s['reason']}" for s in skipped)
    )
    return {"lab": lab.name, "can": can, "detail": detail, "skipped": skipped}


#: a code cell that draws a figure calls one of these (labkit's plotting helpers, or matplotlib's)
FIGURE_CALL = re.compile(r"\bbeside\(|\bplt\.subplots\(|\bnew_figure\(|\bplot_\w+\(")


def _text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


#: reading speed for the minutes column: words of Markdown a minute, plus a minute per figure
WORDS_PER_MINUTE = 150


def _cells(lab: Lab, root: str | Path | None, caller: str) -> list[dict]:
    if not isinstance(lab, Lab):
        raise UsageError(f"{caller}: lab must be a lab's manifest (labkit.workbench.lab.Lab), got {lab!r}")
    path = (Path(root) if root is not None else Path(__file__).resolve().parents[2]) / lab.notebook
    try:
        return json.loads(path.read_text())["cells"]
    except FileNotFoundError:
        raise UsageError(f"{caller}: {lab.name}'s notebook {path} is missing") from None


def _minutes(cells: list[dict]) -> int:
    words = sum(len(_text(c).split()) for c in cells if c["cell_type"] == "markdown")
    figures = sum(1 for c in cells if c["cell_type"] == "code" and FIGURE_CALL.search(_text(c)))
    return math.ceil(words / WORDS_PER_MINUTE + figures)


def reading_minutes(lab: Lab, root: str | Path | None = None) -> int:
    """Minutes to read a lab's notebook: its Markdown cells' words / WORDS_PER_MINUTE, plus one per
    code cell that draws a figure (FIGURE_CALL), rounded up."""
    return _minutes(_cells(lab, root, "reading_minutes"))


#: a Markdown cell that opens with this marks a section a first read skips (docs/workshop.md)
SKIP_MARK = "*Skip on first read"


def skipped_spans(cells: list[dict]) -> list[tuple[int, int]]:
    """(first, end) cell ranges a first read skips: each runs from a Markdown cell that opens with
    SKIP_MARK (placed just before a section's heading) to the next level-2 heading (``## ``), the
    next marker, or the end."""

    def opens(c: dict, prefix: str) -> bool:
        return c["cell_type"] == "markdown" and _text(c).lstrip().startswith(prefix)

    starts = [i for i, c in enumerate(cells) if opens(c, SKIP_MARK)]
    spans = []
    for i in starts:
        heading = i + 1 if i + 1 < len(cells) and opens(cells[i + 1], "#") else i
        end = next(
            (j for j in range(heading + 1, len(cells)) if opens(cells[j], "## ") or opens(cells[j], SKIP_MARK)),
            len(cells),
        )
        spans.append((i, end))
    return spans


def first_read_minutes(lab: Lab, root: str | Path | None = None) -> int:
    """reading_minutes of the notebook without the sections marked SKIP_MARK (skipped_spans)."""
    cells = _cells(lab, root, "first_read_minutes")
    skipped = {j for a, b in skipped_spans(cells) for j in range(a, b)}
    return _minutes([c for j, c in enumerate(cells) if j not in skipped])


def markdown_table(wide: bool = False, notebooks_at: str = "notebooks/") -> str:
    """The README's narrow lab table: the lab (linked to its notebook), the bug in a few words, GPUs,
    minutes to read, status. ``wide``: the notebook, the bug in full, the seed story, GPUs, what the
    CPU tier shows, status (the table in docs/labs.md). ``notebooks_at``: the notebooks' folder as a
    link from where the table is shown ("notebooks/" from the repository root, "" from a notebook)."""
    if not isinstance(notebooks_at, str) or (notebooks_at and not notebooks_at.endswith("/")):
        raise UsageError(f"markdown_table: notebooks_at must be '' or a folder ending in '/', got {notebooks_at!r}")
    columns = ("notebook", "the bug", "seed story", "GPUs", "CPU tier shows", "status")
    if not wide:
        columns = ("lab", "the bug", "GPUs", "minutes", "status")
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for lab in LABS:
        cell = {
            "lab": f"[{lab.name}]({notebooks_at}{lab.notebook_stem}.ipynb)",
            "minutes": str(reading_minutes(lab)) if not wide else "",
            "notebook": f"`{lab.notebook}`",
            "the bug": lab.bug if wide else lab.short,
            "seed story": lab.story,
            "GPUs": lab.gpus if wide else lab.gpu_count,
            "CPU tier shows": lab.cpu_tier,
            "status": lab.status,  # a status word only: issue numbers stay in the catalogue
        }
        rows.append("| " + " | ".join(cell[c] for c in columns) + " |")
    return "\n".join(rows)
