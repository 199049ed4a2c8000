"""``labkit report``: every measured number in README.md, docs/*.md and the notebooks' Markdown, rendered from data.

A document holds each generated block between two HTML comments (invisible once rendered)::

    <!-- report:collectives.small-messages -->
    ...what the renderer of that name returns...
    <!-- /report -->

``labkit report --write`` rewrites every block from ``reference/<machine>/<bench>.json``; ``--check``
names each block whose text differs from what its renderer gives now and exits 1; ``--figures``
draws the figures in ``FIGURES`` into ``docs/figures/``. A renderer takes a
:class:`~labkit.workbench.findings.Reference` and returns Markdown; a missing file, record or field
is a :class:`~labkit.workbench.findings.ReportError` naming it, and so is a bad value (a number of the
wrong type, NaN, a negative count, a fraction outside [0, 1], a null the renderer needs): the file, the
record's index and the field. ``--write`` renders every block before it writes any document, so a bad
record leaves every document as it was; the command prints that one line and exits 2.

In a notebook the blocks live in Markdown cells (JupyterLab hides the comments too).

A lab's blocks come from its manifest (``Lab.report``), named ``<lab>.<block>``; the application's
own (the lab tables, the checkers' verdicts, the workshop's minutes and agendas) are named here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

from labkit.app import catalogue, catch_record, workshop
from labkit.workbench import results
from labkit.workbench.findings import Reference, ReportError, field_of, number

__all__ = ["Reference", "ReportError", "field_of", "number", "render", "stale", "write", "draw_figures"]

DOCS = ("README.md", "docs/*.md", "notebooks/*.ipynb")
FIGURES_DIR = "docs/figures"
BLOCK = re.compile(r"<!-- report:(?P<name>[a-z0-9_.-]+) -->\n(?P<body>.*?)<!-- /report -->", re.S)


def _lab_target(lab, target: str, reference):
    """A lab's renderer or figure (``"findings:race_table"`` in the lab's package), called."""
    return lab.load(target)(reference)


#: block name -> function(reference) -> Markdown: the application's own, then every lab's
#: (``Lab.report``, named ``<lab>.<block>``), imported when the block is rendered
RENDERERS = {
    "labs": lambda reference: catalogue.markdown_table(),
    "labs-wide": lambda reference: catalogue.markdown_table(wide=True),
    "checker-verdicts": catch_record.verdicts_table,
    "workshop-objectives": workshop.objectives_list,
    "workshop-minutes": workshop.minutes_table,
    "workshop-agenda-3h": workshop.agenda_3h,
    "workshop-agenda-day": workshop.agenda_day,
    **{f"minutes-{lab.name}": functools.partial(workshop.minutes_line, name=lab.name) for lab in catalogue.LABS},
    **{
        block: functools.partial(_lab_target, lab, target)
        for lab in catalogue.LABS
        for block, target in lab.blocks().items()
    },
}

#: figure name (docs/figures/NAME.png) -> function(reference) -> (matplotlib figure, file it drew)
FIGURES = {
    f"{lab.name}.{figure}": functools.partial(_lab_target, lab, target)
    for lab in catalogue.LABS
    for figure, target in lab.figures.items()
}


def render(name: str, reference: Reference | None = None) -> str:
    """The Markdown of block ``name`` (a key of RENDERERS), ending in a newline."""
    if name not in RENDERERS:
        raise ReportError(f"report: no renderer named {name!r}; known: {', '.join(RENDERERS)}")
    try:
        text = RENDERERS[name](reference or Reference())
    except results.ResultsError as e:  # a file a renderer read through results itself (load_references)
        raise ReportError(f"report: {e}") from None
    return text.rstrip("\n") + "\n"


@dataclasses.dataclass
class Block:
    doc: Path
    name: str
    body: str


def blocks(text: str, doc: Path) -> list[Block]:
    """The generated blocks of a document's text, in order."""
    return [Block(doc, m["name"], m["body"]) for m in BLOCK.finditer(text)]


def documents(root: str | Path | None = None) -> list[Path]:
    """README.md, docs/*.md and notebooks/*.ipynb under the repository ``root``."""
    root = Path(root) if root is not None else results.REPO_ROOT
    return sorted(p for pattern in DOCS for p in root.glob(pattern))


def texts(doc: Path) -> list[str]:
    """The text a document's blocks live in: the whole file, or a notebook's Markdown cells."""
    if doc.suffix != ".ipynb":
        return [doc.read_text()]
    import nbformat

    return [c.source for c in nbformat.read(doc, as_version=4).cells if c.cell_type == "markdown"]


def doc_blocks(doc: Path) -> list[Block]:
    """Every generated block of a document, in order."""
    return [b for text in texts(doc) for b in blocks(text, doc)]


def rewrite(text: str, reference: Reference) -> str:
    """``text`` with every block rendered afresh."""
    return BLOCK.sub(lambda m: f"<!-- report:{m['name']} -->\n{render(m['name'], reference)}<!-- /report -->", text)


def stale(root: str | Path | None = None, reference: Reference | None = None) -> list[str]:
    """'<doc>: <block>' for every block whose text differs from its renderer's."""
    reference = reference or Reference()
    root = Path(root) if root is not None else results.REPO_ROOT
    out = []
    for doc in documents(root):
        for b in doc_blocks(doc):
            if b.body != render(b.name, reference):
                out.append(f"{doc.relative_to(root)}: {b.name}")
    return out


def write(root: str | Path | None = None, reference: Reference | None = None) -> list[Path]:
    """Rewrite every block of every document until none changes (a block that counts a notebook's
    words can change the count); returns the documents that changed."""
    changed: list[Path] = []
    for _ in range(4):
        now = _write_once(root, reference or Reference())
        if not now:
            return changed
        changed += [d for d in now if d not in changed]
    raise ReportError(f"report: blocks still change after 4 passes: {', '.join(map(str, now))}")


def _write_once(root: str | Path | None, reference: Reference) -> list[Path]:
    """Render every document's blocks, then write those that changed: a bad reference record stops the
    pass before any document is written."""
    pending = []
    for doc in documents(root):
        text = _rewritten_notebook(doc, reference) if doc.suffix == ".ipynb" else _rewritten_text(doc, reference)
        if text is not None:
            pending.append((doc, text))
    for doc, text in pending:
        results.atomic_write_text(doc, text)
    return [doc for doc, _ in pending]


def _rewritten_text(doc: Path, reference: Reference) -> str | None:
    """The text of a Markdown document with its blocks rendered afresh; None if that changes nothing."""
    text = doc.read_text()
    new = rewrite(text, reference)
    return new if new != text else None


def _rewritten_notebook(doc: Path, reference: Reference) -> str | None:
    """A notebook with the blocks of its Markdown cells rendered afresh, nothing else touched; None if
    that changes nothing."""
    import nbformat

    nb = nbformat.read(doc, as_version=4)
    changed = False
    for c in nb.cells:
        if c.cell_type == "markdown" and BLOCK.search(c.source):
            new = rewrite(c.source, reference)
            changed |= new != c.source
            c.source = new
    return nbformat.writes(nb) + "\n" if changed else None


def draw_figures(root: str | Path | None = None, reference: Reference | None = None) -> list[Path]:
    """Draw every figure of FIGURES into ``docs/figures/NAME.png``, captioned with the machine and versions
    of the reference file it came from (the figure's title names the file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.workbench import plot

    reference = reference or Reference()
    folder = (Path(root) if root is not None else results.REPO_ROOT) / FIGURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, target in FIGURES.items():
        fig, source = target(reference)
        rs = reference.file(source)
        plot.caption(fig, refs={rs.machine: rs})
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: redraws compare equal
        plt.close(fig)
        written.append(path)
    return written
