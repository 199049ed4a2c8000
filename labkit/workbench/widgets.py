"""What every lab's ipywidgets panels share: a text output and a button that reruns an experiment.

A panel's button calls a plain function that returns text; the panel shows that text. Tests call
the same functions and press the same buttons, so a panel never holds logic of its own."""
from __future__ import annotations

import html
from typing import Callable

import ipywidgets as w


def pre(text: str) -> str:
    """Text as preformatted HTML for a ``w.HTML`` output (monospace, escaped)."""
    return f"<pre style='font-size:12px'>{html.escape(text)}</pre>"


def run_button(description: str, out: w.HTML, report: Callable[[], str], *, icon: str = "play",
               busy: str | None = "running ...") -> w.Button:
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
