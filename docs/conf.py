"""Sphinx configuration of the labkit site (``make site``; docs/site.md says how it is built).

The source folder Sphinx reads is not docs/: ``scripts/build_site.py`` stages the README (as the
landing page), docs/*.md, every notebook as a CPU run executed it and the API pages into a
temporary folder and runs ``sphinx-build -c docs`` on it, so this file is the one configuration.
"""

import os

from docutils import nodes

project = "labkit"
author = "the labkit authors"
copyright = "the labkit authors"

extensions = [
    "myst_nb",  # Markdown (MyST) pages and executed notebooks
    "sphinx.ext.autodoc",  # the API reference, from the docstrings
    "sphinx.ext.napoleon",  # docstrings with "Args:"/"Returns:" sections
    "sphinx.ext.viewcode",  # each documented module's source, linked from its reference
]

root_doc = "index"
# _repo holds copies of repository files that pages link to (build_site.py): downloads, never
# pages, even where one is a .md or .ipynb file.
exclude_patterns = ["_build", "**.ipynb_checkpoints", "jupyter_execute", "_repo"]

# The notebooks are shown as the CPU run executed them: never run here.
nb_execution_mode = "off"
# Widget outputs need a live kernel; build_site.py replaces them with a note, and a widget view
# left behind would be an empty box: leave it out rather than show its text fallback.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_merge_streams = True

# GitHub-style anchors for headings, so README and docs links such as `labs.md#lab-02` resolve.
myst_heading_anchors = 4
# No math extension: the pages hold no formulas, and without one no page loads MathJax from a CDN
# (the site works offline; a `$` in prose stays text).
myst_enable_extensions = ["colon_fence"]

# A package page documents what the package itself defines; what it re-exports (its __all__) is
# documented once, on the page of the module that defines it.
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
# A subclass of torch.autograd.Function would show torch's docstrings (and their broken labels).
autodoc_inherit_docstrings = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Torch and Triton are imported for real (the CPU tier: Triton's interpreter), as a user would.
os.environ.setdefault("TRITON_INTERPRET", "1")

html_theme = "furo"
html_title = "labkit"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False

# Warnings that mean a broken page (a missing document, reference, image or heading) fail the build
# (sphinx-build -W --keep-going). What is left out here is other packages' noise, not ours:
suppress_warnings = [
    # docutils' markup notes: labkit's docstrings are plain text (``literals`` aside), not
    # reStructuredText; an indented continuation or |x| is shown as written, and is no broken page
    "docutils",
    "myst.header",  # a notebook or page that starts below level 1 (notebooks' own structure)
    "mystnb.unknown_mime_type",  # an output type no HTML renderer takes: shown as its text instead
]


def _markup_as_written(app, doctree):
    """Docstring text docutils could not parse as markup (an ``|x|``, a lone ``*``) is shown as
    written: plain inline text, not a "problematic" node linking to a message the site leaves out."""
    for node in list(doctree.findall(nodes.problematic)):
        node.replace_self(nodes.inline(node.astext(), node.astext()))


def setup(app):
    app.connect("doctree-read", _markup_as_written)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
