"""A panel's figure must not stall a notebook run under papermill.

nbclient mimics a front end's ``ipywidgets.Output``: each output captured in one is sent back to
the kernel on the shell socket, where nbclient is awaiting the cell's reply, and the cell can then
wait out its whole timeout (``labkit.workbench.widgets.FigureView`` gives the measurement; why the
reply goes unseen is a hypothesis there).
labkit's panels draw into a ``FigureView`` (an ``Image`` widget) instead. These tests run a
notebook that redraws one many times and check that no cell waited for its timeout, and that no
panel has gone back to an Output widget."""

import re
import time
from pathlib import Path

import nbformat
import papermill

import labkit
from labkit.app.runner import notebooks as nbs

#: cells that redraw the view (with an Output in the view's place, 28 of 30 stalled)
REDRAWS = 30
#: the cell timeout; a stalled cell takes all of it, a redraw well under a second
TIMEOUT_S = 6
#: the set-up cell's: it imports, and redraws nothing
SETUP_TIMEOUT_S = 120

SETUP = """\
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display
from labkit.workbench.widgets import FigureView

view = FigureView()
display(view)

def figure(i):
    # noise compresses badly: a PNG of about 0.7 MB, each redraw a large message
    rng = np.random.default_rng(i)
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for ax in axes:
        ax.imshow(rng.random((200, 200)))
    return fig
"""


def test_redrawing_a_figure_view_never_waits_for_the_cell_timeout(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(SETUP)]
    nb.cells += [
        nbformat.v4.new_code_cell(f"view.show(figure({i}))\nassert bytes(view.value)[:4] == b'\\x89PNG'")
        for i in range(REDRAWS)
    ]
    path = tmp_path / "redraws.ipynb"
    nbformat.write(nb, path)
    start = time.monotonic()
    out = papermill.execute_notebook(
        str(path),
        str(tmp_path / "out.ipynb"),
        kernel_name="python3",
        progress_bar=False,
        execution_timeout=TIMEOUT_S,
        # the set-up cell imports matplotlib and labkit: seconds on a loaded machine, and no redraw
        timeout_func=lambda cell: SETUP_TIMEOUT_S if cell.source == SETUP else TIMEOUT_S,
        cwd=str(tmp_path),
    )
    took = [c.metadata.papermill.duration for c in out.cells[1:]]
    assert len(took) == REDRAWS and all(c.metadata.papermill.status == "completed" for c in out.cells)
    slow = [round(t, 2) for t in took if t > TIMEOUT_S / 2]
    assert not slow, f"{len(slow)} of {REDRAWS} redraws waited about the cell timeout ({TIMEOUT_S} s): {slow}"
    assert time.monotonic() - start < REDRAWS * TIMEOUT_S / 2


def test_no_panel_or_notebook_draws_into_an_output_widget():
    root = Path(labkit.__file__).parent
    sources = sorted(root.rglob("*.py")) + sorted(Path(p) for p in nbs.discover().values())
    assert len(sources) > 50 and any(p.suffix == ".ipynb" for p in sources)
    users = [p.name for p in sources if re.search(r"\b(w|widgets|ipywidgets)\.Output\(|\bOutput\(\)", p.read_text())]
    assert users == [], f"draw into labkit.workbench.widgets.FigureView instead of an Output widget: {users}"
