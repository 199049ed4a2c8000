"""``labkit report``: every measured number in README.md, docs/*.md and the notebooks' Markdown, rendered from data.

A document holds each generated block between two HTML comments (invisible once rendered)::

    <!-- report:collectives-small-messages -->
    ...what the renderer of that name returns...
    <!-- /report -->

``labkit report --write`` rewrites every block from ``reference/<machine>/<lab>.json``; ``--check``
names each block whose text differs from what its renderer gives now and exits 1; ``--figures``
draws the figures in ``FIGURES`` into ``docs/figures/``. A renderer takes a :class:`Reference` and
returns Markdown; a missing file, record or field is a :class:`ReportError` naming it.

In a notebook the blocks live in Markdown cells (JupyterLab hides the comments too).

Renderers are named by ``"module:function"`` strings (``"module:function:arg"`` passes ``arg`` after
the reference), as ``labkit.workbench.benchmarks`` names the
labs' benchmarks: the workbench names lab modules without importing them at module level.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

from labkit.workbench import results
from labkit.workbench.errors import UsageError

DOCS = ("README.md", "docs/*.md", "notebooks/*.ipynb")
FIGURES_DIR = "docs/figures"
BLOCK = re.compile(r"<!-- report:(?P<name>[a-z0-9_-]+) -->\n(?P<body>.*?)<!-- /report -->", re.S)

#: block name -> "module:function(reference) -> Markdown"
RENDERERS = {
    "labs": "labkit.workbench.report:labs_table",
    "labs-wide": "labkit.workbench.report:labs_table_wide",
    "collectives-small-messages": "labkit.labs.collectives.findings:small_messages_table",
    "collectives-large-messages": "labkit.labs.collectives.findings:large_messages_table",
    "collectives-eager-calls": "labkit.labs.collectives.findings:eager_calls_table",
    "stream-race": "labkit.labs.stream_races.findings:race_table",
    "grouped-gemm-vs-torch": "labkit.labs.grouped_gemm.findings:versus_torch_table",
    "grouped-gemm-backward": "labkit.labs.grouped_gemm.findings:backward_table",
    "grouped-gemm-tile-loops": "labkit.labs.grouped_gemm.findings:tile_loops_table",
    "checker-verdicts": "labkit.workbench.catch_record:verdicts_table",
    "fp8-speed": "labkit.labs.fp8_dispatch.findings:speed_table",
    "litmus-rows": "labkit.labs.memory_model.findings:rows_table",
    "broken-barriers": "labkit.labs.memory_model.findings:broken_barriers_table",
    "l2-recorded": "labkit.labs.start_here.findings:recorded_l2",
    "headline-02": "labkit.labs.collectives.findings:headline",
    "headline-03": "labkit.labs.stream_races.findings:headline",
    "workshop-objectives": "labkit.workbench.workshop:objectives_list",
    "workshop-minutes": "labkit.workbench.workshop:minutes_table",
    "workshop-agenda-3h": "labkit.workbench.workshop:agenda_3h",
    "workshop-agenda-day": "labkit.workbench.workshop:agenda_day",
    **{
        f"minutes-{n}": f"labkit.workbench.workshop:minutes_line:{n}"
        for n in (
            "00_start_here",
            "01_wrong_device",
            "02_collectives",
            "03_stream_races",
            "04_grouped_gemm",
            "05_fp8_dispatch",
            "06_memory_model",
        )
    },  # fmt: skip
}

#: figure name (docs/figures/NAME.png) -> "module:function(reference) -> (matplotlib figure, file it drew)"
FIGURES = {
    "stream-race": "labkit.labs.stream_races.findings:race_figure",
}


class ReportError(UsageError):
    """A block, renderer, reference file, record or field that a report needs is missing."""


class Reference:
    """The reference files under ``root``, read by their path relative to it
    (``"h200x2/collectives.json"``); each is loaded once."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else results.REFERENCE_DIR
        self._loaded: dict[str, results.ResultSet] = {}

    def file(self, name: str) -> results.ResultSet:
        if not isinstance(name, str) or not name.endswith(".json"):
            raise ReportError(f"Reference.file: name must be a path like 'h200x2/collectives.json', got {name!r}")
        if name not in self._loaded:
            path = self.root / name
            if not path.is_file():
                raise ReportError(f"report: reference file reference/{name} is missing")
            self._loaded[name] = results.load_results(path)
        return self._loaded[name]

    def records(self, name: str, **where) -> list[dict]:
        """The records of file ``name`` whose fields equal every value in ``where``; at least one."""
        found = self.file(name).select(**where)
        if not found:
            raise ReportError(f"report: reference/{name} has no record with {_where(where)}")
        return found

    def one(self, name: str, **where) -> dict:
        """The one record of file ``name`` matching ``where``."""
        found = self.records(name, **where)
        if len(found) > 1:
            raise ReportError(f"report: reference/{name} has {len(found)} records with {_where(where)}, expected one")
        return found[0]

    def value(self, name: str, field: str, **where):
        """Field ``field`` of the one record of file ``name`` matching ``where``."""
        return field_of(self.one(name, **where), field, name)


def field_of(record: dict, field: str, name: str):
    """``record[field]``, or a ReportError naming the file and the field."""
    if record.get(field) is None:
        raise ReportError(f"report: reference/{name}: a record lacks field {field!r} ({_where(record, 4)})")
    return record[field]


def _where(fields: dict, at_most: int | None = None) -> str:
    items = list(fields.items())[:at_most]
    return ", ".join(f"{k}={v!r}" for k, v in items) or "no condition"


def number(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, without an exponent: 4.3635 -> '4.36', 362.8 -> '363'."""
    if not isinstance(x, (int, float)):
        raise ReportError(f"number: x must be a number, got {x!r}")
    if x == 0:
        return "0"
    if abs(x) >= 10 ** (digits - 1):  # whole units: 362.8 -> '363', 1346.1 -> '1,346'
        return f"{x:,.0f}"
    return f"{x:#.{digits}g}"  # keeps trailing zeros: 6.80, 10.0


def _function(target: str):
    module, _, fn = target.partition(":")
    fn, _, arg = fn.partition(":")
    f = getattr(importlib.import_module(module), fn)
    return (lambda reference: f(reference, arg)) if arg else f


def render(name: str, reference: Reference | None = None) -> str:
    """The Markdown of block ``name`` (a key of RENDERERS), ending in a newline."""
    if name not in RENDERERS:
        raise ReportError(f"report: no renderer named {name!r}; known: {', '.join(RENDERERS)}")
    text = _function(RENDERERS[name])(reference or Reference())
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
    changed = []
    for doc in documents(root):
        if doc.suffix == ".ipynb":
            if _rewrite_notebook(doc, reference):
                changed.append(doc)
            continue
        text = doc.read_text()
        new = rewrite(text, reference)
        if new != text:
            results.atomic_write_text(doc, new)
            changed.append(doc)
    return changed


def _rewrite_notebook(doc: Path, reference: Reference) -> bool:
    """Re-render the blocks of a notebook's Markdown cells, touching nothing else; True if any changed."""
    import nbformat

    nb = nbformat.read(doc, as_version=4)
    changed = False
    for c in nb.cells:
        if c.cell_type == "markdown" and BLOCK.search(c.source):
            new = rewrite(c.source, reference)
            changed |= new != c.source
            c.source = new
    if changed:
        results.atomic_write_text(doc, nbformat.writes(nb) + "\n")
    return changed


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
        fig, source = _function(target)(reference)
        rs = reference.file(source)
        plot.caption(fig, refs={rs.machine: rs})
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: redraws compare equal
        plt.close(fig)
        written.append(path)
    return written


def labs_table(reference: Reference) -> str:
    """The README's narrow lab table (``labkit labs --markdown``)."""
    from labkit.workbench import catalogue

    return catalogue.markdown_table()


def labs_table_wide(reference: Reference) -> str:
    """docs/labs.md's lab table (``labkit labs --markdown --wide``)."""
    from labkit.workbench import catalogue

    return catalogue.markdown_table(wide=True)
