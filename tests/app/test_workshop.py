"""The workshop path: every notebook's first screen, the skip markers and first-read minutes, the
glossary the notebooks link, the recorded CPU-tier run, and report blocks inside notebooks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from labkit.app import catalogue, report, workshop

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("lab", catalogue.LABS, ids=lambda lab: lab.name)
def test_first_screen_has_question_hardware_objectives_minutes_and_headline(lab):
    first = nbformat.read(ROOT / lab.notebook, as_version=4).cells[0].source
    for part in ("**The question:**", "**Hardware:**", "**You will be able to:**", "**Headline"):
        assert part in first, f"{lab.name}: the first cell lacks {part}"
    assert f"<!-- report:minutes-{lab.name} -->" in first
    assert 3 <= len(workshop.objectives(lab)) <= 4
    prose = re.sub(r"<!-- report:.*?<!-- /report -->", "", first, flags=re.S)
    assert len(prose.splitlines()) <= 30, f"{lab.name}: the first cell is longer than a screen"


def test_skipped_spans_run_from_a_marker_to_the_next_section():
    md = lambda s: {"cell_type": "markdown", "source": s}  # noqa: E731
    code = {"cell_type": "code", "source": "x = 1"}
    cells = [
        md("## 1 · a"),
        code,
        md("*Skip on first read: section 2.*"),
        md("## 2 · b"),
        code,
        md("### 2.1"),
        md("## 3 · c"),
        md("*Skip on first read: the appendix.*"),
        md("## Appendix"),
        code,
    ]
    assert catalogue.skipped_spans(cells) == [(2, 6), (7, 10)]


def test_marked_notebooks_read_shorter_on_a_first_read():
    lab = catalogue.get("wrong_device")
    assert catalogue.first_read_minutes(lab) < catalogue.reading_minutes(lab)


def test_every_glossary_link_in_a_notebook_names_a_term():
    slug = lambda h: re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")  # noqa: E731
    terms = {slug(h) for h in re.findall(r"^#+ (.+)$", (ROOT / "docs/glossary.md").read_text(), re.M)}
    for lab in catalogue.LABS:
        text = (ROOT / lab.notebook).read_text()
        for anchor in re.findall(r"glossary\.md#([\w-]+)", text):
            assert anchor in terms, f"{lab.name} links glossary.md#{anchor}, which is no term"


def test_record_adds_a_run_and_minutes_come_from_the_last_that_completed(tmp_path):
    for i, (status, seconds) in enumerate((("ran", 61.0), ("failed", 900.0))):
        run = tmp_path / f"run{i}"
        run.mkdir()
        (run / "summary.json").write_text(
            json.dumps(
                {
                    "profile": "cpu",
                    "complete": True,
                    "results": [{"name": "start_here", "status": status, "seconds": seconds, "detail": ""}],
                }
            )
        )
        log = tmp_path / "load.log"
        log.write_text("1 3.5 3.0 2.0\n2 5.25 3.0 2.0\n")
        workshop.record(run, log, root=tmp_path)
    doc = workshop.load_run(tmp_path)
    assert len(doc["runs"]) == 2
    assert workshop.run_minutes("start_here", doc) == 2  # 61 s, the failed run skipped
    assert "3.5 to 5.2" in workshop.machine_words(doc)
    with pytest.raises(Exception, match="no completed run of wrong_device"):
        workshop.run_minutes("wrong_device", doc)


def test_report_rewrites_a_block_in_a_notebook_cell_and_nothing_else(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# t\n\n<!-- report:labs -->\nstale\n<!-- /report -->\n\nkept"),
        nbformat.v4.new_code_cell("x = 1"),
    ]
    for i, c in enumerate(nb.cells):
        c.id = f"cell-{i}"
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "t.ipynb"
    nbformat.write(nb, path)
    assert report.stale(tmp_path) == ["notebooks/t.ipynb: labs"]
    assert report.write(tmp_path) == [path]
    assert report.stale(tmp_path) == []
    cells = nbformat.read(path, as_version=4).cells
    assert catalogue.markdown_table() in cells[0].source and cells[0].source.endswith("kept")
    assert cells[1].source == "x = 1" and [c.id for c in cells] == ["cell-0", "cell-1"]
