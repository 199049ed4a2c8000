"""The collectives bench's progress file: one JSON line per finished step, never through a link."""

import json

import pytest

from labkit.labs.collectives import messages
from labkit.workbench import gates


def test_progress_appends_one_line_per_step(tmp_path, monkeypatch):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("LABKIT_PROGRESS_FILE", str(path))
    messages.progress_main({"phase": "a"})
    messages.progress_main({"phase": "b"})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["phase"], line["world_size"]) for line in lines] == [("a", None), ("b", None)]


def test_progress_refuses_a_symbolic_link(tmp_path, monkeypatch):
    """N86: a link planted at the progress file's name would append to its target."""
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    link = tmp_path / "progress.jsonl"
    link.symlink_to(victim)
    monkeypatch.setenv("LABKIT_PROGRESS_FILE", str(link))
    with pytest.raises(gates.UnsafeFile, match="progress.jsonl: is a symbolic link"):
        messages.progress_main({"phase": "a"})
    assert victim.read_text() == "mine\n"
