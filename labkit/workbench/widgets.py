"""What every lab's ipywidgets panels share: a text output, a button that reruns an experiment and
a figure view that a panel redraws.

A panel's button calls a plain function that returns text; the panel shows that text. Tests call
the same functions and press the same buttons, so a panel never holds logic of its own."""

from __future__ import annotations

import html
import io
from collections.abc import Callable

import ipywidgets as w
import matplotlib.pyplot as plt


def pre(text: str) -> str:
    """Text as preformatted HTML for a ``w.HTML`` output (monospace, escaped)."""
    return f"<pre style='font-size:12px'>{html.escape(text)}</pre>"


def run_button(
    description: str, out: w.HTML, report: Callable[[], str], *, icon: str = "play", busy: str | None = "running ..."
) -> w.Button:
    """A button that shows ``busy`` in ``out``, calls ``report()`` and shows what it returns.

    ``report`` reads the panel's controls when the button is pressed, e.g.
    ``lambda: crash_report(pick.value, timeout.value)``."""
    button = w.Button(description=description, icon=icon)

    def on_click(_=None):
        if busy:
            out.value = pre(busy)
        out.value = pre(report())

    button.on_click(on_click)
    return button


class FigureView(w.Image):
    """A matplotlib figure shown as a PNG in an ``Image`` widget: what a panel redraws into.

    Why not ``ipywidgets.Output`` (display the figure inside it): run by papermill, nbclient plays
    the front end's part for an Output widget and sends each output it captures back to the kernel
    on the shell socket, the socket on which it is at that moment awaiting the cell's reply. The
    cell can then wait for its whole timeout although the kernel has finished (why is a hypothesis:
    the reply, arriving while nbclient sends on that socket, goes unseen until the wait times out;
    jupyter/nbclient issue 312 reports such stalls with widgets). Measured on the CPU (nbclient
    0.11.0, pyzmq 27.3.0, ipykernel 6.31.0): ``tests/workbench/test_widget_stall.py`` with an Output in this
    view's place, 28 of 30 redraws of a three-panel figure took the whole 6 s cell timeout (in an
    earlier run, 66 of 78 took 10 s of 10, the kernel's reply stamped 18-27 ms after the cell
    began); with this view, none. An Image's value travels from the kernel only, so nbclient sends
    nothing on the shell socket. The GPU tier's notebook 05 once sat over 400 s in its panel's cell
    (1,800 s cell timeout), which takes 1.5 s when it runs through: this mechanism is the hypothesis
    there, not caught in the act.

    ``figure`` is the last figure shown (closed: drawn once, in the panel)."""

    def __init__(self, **kwargs):
        super().__init__(format="png", **kwargs)
        self.figure = None

    def show(self, fig) -> None:
        """Draw ``fig`` into the view and close it (so the cell does not show it again)."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        plt.close(fig)
        self.figure = fig
        self.value = buf.getvalue()
