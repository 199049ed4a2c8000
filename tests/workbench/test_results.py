"""Results files: schema, required fields, field types and ranges, atomic writes, references, output
folders."""

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
    """Every file under reference/ loads (its fields pass FIELD_RULES), names its generator, and was
    made on a GPU machine."""
    files = sorted(results.REFERENCE_DIR.glob("*/*.json"))
    for path in files:
        rs = results.load_results(path)
        assert rs.generator.startswith("labkit."), path
        assert rs.env["gpus"], f"{path}: reference results must come from a GPU machine"
        assert path.parent.name == rs.env["machine"], path


def _doc(records, lab="demo", **extra) -> dict:
    return {"schema": results.SCHEMA, "lab": lab, "generator": "t", "env": {}, "records": records, **extra}


def _load(tmp_path, doc):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    return results.load_results(p)


@pytest.mark.parametrize(
    "doc, match",
    [
        ([1], "expected a JSON object at the top, got list"),
        (_doc({"a": {}}), "'records' must be a list of objects, got dict"),
        (_doc("abc"), "'records' must be a list of objects, got str"),
        (_doc([1, 2]), "record 0 must be an object, got int 1"),
        (_doc([{}], required="us"), "'required' must be a list of field names"),
        ({**_doc([]), "env": []}, "'env' must be an object, got list"),
        ({**_doc([]), "lab": 3}, "'lab' must be a string, got int"),
    ],
)
def test_a_document_of_the_wrong_shape_is_refused(tmp_path, doc, match):
    with pytest.raises(ResultsError, match=match):
        _load(tmp_path, doc)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("corrupted_elems", float("nan"), r"is nan; expected a count \(a whole number >= 0\)"),
        ("corrupted_elems", -5, "is -5; expected a count"),
        ("corrupted_elems", "12", "is '12'; expected a count"),
        ("corrupted_elems", True, "is True; expected a count"),
        ("corrupted_elems", 12.0, "is 12.0; expected a count"),
        ("world_size", 0, r"expected a whole number >= 1"),
        ("corrupted_fraction", 7.5, r"expected a fraction in \[0, 1\]"),
        ("us", float("inf"), "is inf; expected a finite number >= 0"),
        ("us", -1.0, "expected a finite number >= 0"),
        ("sleep_ms", "fast", "expected a finite number >= 0"),
        ("rel_err_vs_bf16", -0.1, "expected a number >= 0"),
        ("impl", 3, "expected a string"),
        ("correct", 1, "expected true or false"),
        ("no_rule_for_me", float("nan"), "expected a finite number"),
    ],
)
def test_a_field_of_the_wrong_type_or_range_is_refused_naming_file_record_and_field(tmp_path, field, value, expected):
    records = [{"kind": "race", "impl": "raw", "us": 1.0}, {"kind": "race", "impl": "raw", field: value}]
    with pytest.raises(ResultsError, match=rf"bad\.json: record 1 \(kind='race'.*\): field '{field}' .*{expected}"):
        _load(tmp_path, _doc(records))


def test_null_measured_nans_and_a_labs_own_kinds_pass(tmp_path):
    """null is a field that does not apply to the record's kind (a renderer refuses it where it needs
    the value); a measured error may be NaN or inf (the output was); wrong_device's tokens are ids."""
    records = [{"corrupted_elems": None, "us": None, "rel_err_vs_bf16": float("nan"), "err_x": float("inf")}]
    assert _load(tmp_path, _doc(records)).records[0]["corrupted_elems"] is None
    assert _load(tmp_path, _doc([{"tokens": [26, 89]}], lab="wrong_device")).records[0]["tokens"] == [26, 89]
    with pytest.raises(ResultsError, match="field 'tokens'"):
        _load(tmp_path, _doc([{"tokens": [26, 89]}], lab="grouped_gemm"))


def test_a_file_is_named_relative_to_the_repository_or_as_asked(tmp_path):
    assert (
        results._shown(results.REFERENCE_DIR / "h200x1" / "stream_races.json") == "reference/h200x1/stream_races.json"
    )
    p = tmp_path / "x.json"
    p.write_text("[]")
    with pytest.raises(ResultsError, match=r"^reference/h200x1/x\.json: expected a JSON object"):
        results.load_results(p, name="reference/h200x1/x.json")
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(ResultsError, match="not UTF-8 text"):
        results.load_results(p)
    p.write_text("[" * 100_000)
    with pytest.raises(ResultsError, match="not valid JSON"):
        results.load_results(p)
    with pytest.raises(ResultsError, match="cannot read it"):
        results.load_results(tmp_path)


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
