"""matplotlib helpers: byte-sized log axes, units, and a caption naming machine and versions.

Every labkit figure says where its numbers came from: ``caption(fig, yours=stamp, refs=...)``
writes one line per source under the axes ("your run: h100x1 (1x NVIDIA H100 ...); torch 2.11
..."), so a figure copied out of context still tells its reader which GPU made it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator

from labkit.workbench import env as _env
from labkit.workbench import results

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float) -> str:
    """1024 -> '1 KiB', 3 * 2**20 -> '3 MiB', 1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def bytes_axis(ax, axis: str = "x") -> None:
    """Log2 axis with tick labels in B / KiB / MiB / GiB."""
    set_scale = ax.set_xscale if axis == "x" else ax.set_yscale
    target = ax.xaxis if axis == "x" else ax.yaxis
    set_scale("log", base=2)
    target.set_major_locator(LogLocator(base=4, numticks=7))  # at most ~7 labels: they stay legible
    target.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))


def caption(fig, yours: dict | None = None, refs: dict | None = None, adjust: bool = True) -> str:
    """Write where the numbers came from under the figure; returns the text.

    yours: an environment stamp (``labkit.workbench.env.stamp()``) of the reader's run.
    refs:  {machine: ResultSet} of reference results plotted beside it.
    """
    lines = []
    if yours is not None:
        lines.append("your run: " + _env.short_description(yours))
    for machine, rs in (refs or {}).items():
        lines.append(
            f"reference {machine}: " + _env.short_description(rs.env) + f" ({rs.env.get('created', '?')[:10]})"
        )
    text = "\n".join(lines)
    if text:
        fig.text(0.01, 0.005, text, fontsize=7, va="bottom", ha="left", color="0.3")
    if text and adjust:  # adjust=False: the caller lays the axes out above caption_inches(lines)
        # the margin in inches (x-axis labels, then one line per source), whatever the figure's
        # height: a tall figure of many rows keeps a caption-sized margin, not a share of itself
        fig.subplots_adjust(bottom=min(0.5, (0.67 + 0.15 * len(lines)) / fig.get_figheight()))
    return text


def save(fig, name: str, folder: str | Path | None = None) -> Path:
    """Save a figure as PNG in the notebook's output folder (see labkit.workbench.results.output_dir).

    In a notebook the figure is also shown, once: the PNG just written (see :func:`show`). The
    PNG is written to a temporary file in the folder and renamed onto ``name``.png, so a symbolic
    link planted at that name is replaced, never written through."""
    folder = Path(folder) if folder else results.output_dir()
    path = folder / f"{name}.png"
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")  # beside it: one filesystem
    # O_EXCL | O_NOFOLLOW: a new file of this process's own (0666 less the umask, as savefig's)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, dpi=110, format="png")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    show(fig, path)
    return path


#: matplotlib's built-in backends that draw nothing on screen (nor in a notebook).
_NON_INTERACTIVE = {"agg", "cairo", "pdf", "pgf", "ps", "svg", "template"}
#: matplotlib-inline's backend, as ``matplotlib.get_backend()`` names it (lower case)
_INLINE = "module://matplotlib_inline.backend_inline"


def show(fig, png: str | Path | None = None) -> bool:
    """Make sure a figure appears in the notebook it was drawn in, once; returns True if shown here.

    In a notebook kernel under the inline backend (Jupyter's default, and what ``labkit run``
    gives every notebook) or a non-interactive one (a kernel that inherited MPLBACKEND=Agg, where
    nothing else would draw it), the PNG is displayed now (``png``: a file already written from
    this figure, else the figure drawn once) and the figure is closed: matplotlib-inline would
    otherwise draw every open figure again at the end of the cell (twice: once more for its tight
    bounding box), and the labs' figures of many panels take seconds per draw on a 2-core CPU.
    Interactive backends (``%matplotlib widget``, ...) show figures themselves. Outside a
    notebook kernel (scripts, tests): nothing."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    backend = str(matplotlib.get_backend()).lower()
    if backend not in _NON_INTERACTIVE and backend != _INLINE:
        return False
    from IPython.core.pylabtools import print_figure
    from IPython.display import Image, display

    display(Image(data=Path(png).read_bytes() if png is not None else print_figure(fig, "png")))
    plt.close(fig)
    return True


def beside(
    panels,
    draw,
    name: str,
    folder: str | Path | None = None,
    *,
    stamp: dict | None = None,
    ncols: int = 1,
    width: float = 6.4,
    height: float = 4.2,
    suptitle: str | None = None,
):
    """The reader's run beside the recorded references: one row of ``ncols`` axes per panel
    (``labkit.workbench.results.panels``), ``draw(axes, panel)`` fills a row (``axes`` is a list,
    or one axis when ncols == 1), the caption names the machine and versions of every source, and
    the figure is saved as ``name``.png and shown once. Returns the figure, or None without panels.

    stamp: the reader's environment (``labkit.workbench.env.stamp()``), captioned when a panel is live."""
    if not panels:
        return None
    fig, grid = plt.subplots(len(panels), ncols, figsize=(width * ncols, height * len(panels)), squeeze=False)
    for row, panel in zip(grid, panels):
        draw(list(row) if ncols > 1 else row[0], panel)
    if suptitle:
        # its top a fixed 0.1 in below the edge, wrapped to the figure's width: at matplotlib's
        # default (2% of the height) a figure of 3+ rows dropped it onto the first row's title
        # (tight_layout reserves the title's height, not that offset), and a long one ran off the sides
        fig.suptitle(suptitle, fontsize=10, y=1 - 0.1 / fig.get_figheight(), wrap=True)
    refs = {p.machine: p.result_set for p in panels if p.result_set is not None}
    text = caption(fig, stamp if any(p.live for p in panels) else None, refs, adjust=False)
    lines = len(text.splitlines())
    # every row laid out (titles, tick labels) above the caption's own band at the bottom
    fig.tight_layout(rect=(0, min(0.4, (0.1 + 0.14 * lines) / fig.get_figheight()), 1, 1))
    save(fig, name, folder)
    return fig


def new_figure(ncols: int = 1, width: float = 6.4, height: float = 4.2):
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])
