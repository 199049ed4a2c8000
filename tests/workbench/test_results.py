"""Results files: schema, required fields, atomic writes, references, output folders."""

import json
import os

import pytest

from labkit.workbench import results
from labkit.workbench.results import ResultsError


def test_round_trip_with_stamp(tmp_path):
    path = results.write_results(
        tmp_path / "x.json",
        "demo",
        [{"impl": "a", "us": 1.5}],
        generator="tests.demo",
        required=("impl", "us"),
        command="labkit bench demo",
    )
    rs = results.load_results(path)
    assert rs.lab == "demo" and rs.generator == "tests.demo" and rs.records == [{"impl": "a", "us": 1.5}]
    assert rs.env["command"] == "labkit bench demo"
    assert {"machine", "versions", "gpus", "created", "git_commit"} <= set(rs.env)
    assert rs.env["versions"]["torch"]
    assert rs.select(impl="a") == rs.records and rs.select(impl="b") == []


def test_missing_required_field_is_refused(tmp_path):
    with pytest.raises(ResultsError, match=r"record 1 of lab 'demo' lacks required fields \['us'\]"):
        results.write_results(tmp_path / "x.json", "demo", [{"us": 1}, {"impl": "b"}], generator="t", required=("us",))
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(ResultsError, match="no records"):
        results.write_results(tmp_path / "x.json", "demo", [], generator="t")


@pytest.mark.parametrize(
    "content,match",
    [
        ("{not json", "not valid JSON"),
        ('{"schema": "other/9"}', "schema is 'other/9'"),
        ('{"schema": "labkit.results/1", "lab": "x"}', "missing 'generator'"),
        (
            '{"schema": "labkit.results/1", "lab": "x", "generator": "g", "env": {}, '
            '"required": ["us"], "records": [{}]}',
            "record 0 lacks required fields",
        ),
    ],
)
def test_malformed_files_are_refused(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(ResultsError, match=match):
        results.load_results(p)
    with pytest.raises(ResultsError, match="no results file"):
        results.load_results(tmp_path / "missing.json")


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    results.atomic_write_json(p, {"v": 1})

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        results.atomic_write_json(p, {"v": 2})
    assert json.loads(p.read_text()) == {"v": 1}
    assert [f.name for f in tmp_path.iterdir()] == ["r.json"]


def test_references_are_found_per_machine(tmp_path):
    for machine in ("h200x2", "h100x1"):
        results.write_results(tmp_path / machine / "lab.json", "lab", [{"v": 1}], generator="t")
    refs = results.load_references("lab", tmp_path)
    assert sorted(refs) == ["h100x1", "h200x2"]
    assert results.load_references("other", tmp_path) == {}
    assert results.reference_path("lab", "h200x2") == results.REFERENCE_DIR / "h200x2" / "lab.json"


def test_committed_reference_files_are_valid():
    """Every file under reference/ loads, names its generator, and was made on a GPU machine."""
    files = sorted(results.REFERENCE_DIR.glob("*/*.json"))
    for path in files:
        rs = results.load_results(path)
        assert rs.generator.startswith("labkit."), path
        assert rs.env["gpus"], f"{path}: reference results must come from a GPU machine"
        assert path.parent.name == rs.env["machine"], path


def test_output_dir_follows_the_runner(monkeypatch, tmp_path):
    monkeypatch.setenv(results.OUTPUT_ENV, str(tmp_path / "nb"))
    assert results.output_dir() == tmp_path / "nb" and (tmp_path / "nb").is_dir()
    monkeypatch.delenv(results.OUTPUT_ENV)
    monkeypatch.setattr(results, "RUNS_DIR", tmp_path / "runs")  # never write into the checkout
    assert results.output_dir("lab") == tmp_path / "runs" / "interactive" / "lab"
    assert (tmp_path / "runs" / "interactive" / "lab").is_dir()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_users_default_mode(tmp_path, umask, mode):
    """summary.json and the run's index were written 0600 (mkstemp's mode), unreadable by the
    group a run folder is shared with; a new file gets what open() would give: 0666 & ~umask."""
    old = os.umask(umask)
    try:
        p = results.atomic_write_text(tmp_path / "index.md", "x\n")
        j = results.atomic_write_json(tmp_path / "summary.json", {"a": 1})
    finally:
        os.umask(old)
    assert oct(p.stat().st_mode & 0o777) == oct(mode) and oct(j.stat().st_mode & 0o777) == oct(mode)


def test_rewriting_a_file_keeps_its_mode(tmp_path):
    p = tmp_path / "index.md"
    p.write_text("old\n")
    p.chmod(0o640)
    results.atomic_write_text(p, "new\n")
    assert p.read_text() == "new\n" and oct(p.stat().st_mode & 0o777) == oct(0o640)
