"""``labkit bench checkers``: every lab's catch cases, their roles, one lab run through its checker
on this tier, and the recorded verdicts shown labelled where a check could not look in full."""

import pytest

from labkit.app import benchmarks, catch_record
from labkit.check.report import Report
from labkit.workbench import results


@pytest.mark.parametrize("lab", sorted(catch_record.CATCH_LABS))
def test_every_lab_lists_a_seed_and_its_fix_for_a_known_checker(lab):
    from labkit import check

    cases = catch_record.cases(lab)
    roles = [catch_record.role(fn) for _, fn, _, _ in cases]
    assert roles.count("seed") == roles.count("fix") >= 1, roles
    for checker, fn, make_inputs, kwargs in cases:
        assert checker in check.CHECKERS and callable(fn) and callable(make_inputs) and isinstance(kwargs, dict)


def test_the_registry_writes_reference_checkers_json():
    generator, fn, required = benchmarks.BENCHMARKS["checkers"]
    assert (generator, fn) == ("labkit.app.catch_record.benchmark", catch_record.benchmark)
    assert required() == catch_record.REQUIRED


def test_a_lab_run_on_this_tier_flags_the_seed_and_passes_the_fix():
    rows = [catch_record.run_case("stream_races", case) for case in catch_record.cases("stream_races")]
    assert {r["role"]: r["status"] for r in rows} == {"seed": "failed", "fix": "passed"}, rows
    assert all(set(catch_record.REQUIRED) <= set(r) for r in rows)


def test_bad_lab_and_unnamed_function_are_refused():
    with pytest.raises(ValueError, match="lab='nope'"):
        catch_record.cases("nope")
    with pytest.raises(ValueError, match="fn='helper'"):

        def helper():
            pass

        catch_record.role(helper)


def _reference_dir(tmp_path):
    row = dict(lab="fp8_dispatch", checker="device_independence", target="m:forward_seed", role="seed")
    row.update(
        status="failed", outcome="launches on the current device", message="out differs", tier="gpu", seconds=1.0
    )
    rows = [row]
    results.write_results(
        tmp_path / "h200x2" / "checkers.json", "checkers", rows, generator="test", required=catch_record.REQUIRED
    )
    return tmp_path


def test_recorded_lines_name_the_machine_and_file_or_say_nothing_was_recorded(tmp_path):
    ref = _reference_dir(tmp_path)
    (line,) = catch_record.recorded_lines("fp8_dispatch", ref)
    assert line.startswith("RECORDED on h200x2 (reference/h200x2/checkers.json, not this machine)")
    assert "FAILED: launches on the current device" in line
    (none,) = catch_record.recorded_lines("stream_races", ref)
    assert (
        "no machine has recorded a verdict on lab stream_races" in none and "labkit bench checkers --reference" in none
    )


def test_show_adds_the_recording_only_where_a_check_could_not_look_in_full(tmp_path, capsys):
    ref = _reference_dir(tmp_path)
    full = Report("device_independence", "m:forward_seed", "failed", "launches", "x", tier="gpu")
    catch_record.show("fp8_dispatch", [full], ref)
    assert "RECORDED" not in capsys.readouterr().out
    skipped = Report("device_independence", "m:forward_seed", "skipped", "needs 2 GPUs", "x", tier="gpu")
    catch_record.show("fp8_dispatch", [skipped], ref)
    out = capsys.readouterr().out
    assert out.startswith("device_independence(m:forward_seed): SKIPPED") and "RECORDED on h200x2" in out
    cpu = Report("device_independence", "m:forward_seed", "failed", "launches", "x", tier="cpu")
    assert [catch_record.needs_recording(r) for r in ([full], [skipped], [cpu], [full, cpu])] == [
        False,
        True,
        True,
        True,
    ]


def test_a_case_this_machine_cannot_run_is_recorded_as_skipped_with_the_checkers_words():
    from labkit.labs.collectives import catch

    row = catch_record.run_case("collectives", ("collective", catch.one_shot_fixed, catch.inputs, {"world_size": 1}))
    assert row["status"] == "skipped" and row["outcome"] == "cannot run here"
    assert row["message"].startswith("collective: world_size=1") and row["role"] == "fix"


def test_a_machine_that_skipped_every_case_of_a_lab_shows_no_verdict(tmp_path):
    row = dict(lab="fp8_dispatch", checker="device_independence", target="m:forward_seed", role="seed")
    row.update(status="skipped", outcome="needs 2 GPUs", message="found 1", tier="gpu", seconds=0.0)
    path = tmp_path / "h200x1" / "checkers.json"
    results.write_results(path, "checkers", [row], generator="test", required=catch_record.REQUIRED)
    (line,) = catch_record.recorded_lines("fp8_dispatch", tmp_path)
    assert line.startswith("(no machine has recorded a verdict on lab fp8_dispatch's checks")


def test_the_docs_table_puts_each_machines_verdicts_beside_the_others(tmp_path):
    from labkit.app import report

    def rec(lab, role, status):
        return {"lab": lab, "checker": "stream_safety", "target": f"m:{role}", "role": role, "status": status}

    one, two = catch_record.DOCS_REFERENCES
    results.write_results(tmp_path / one, "checkers", [rec("stream_races", "seed", "failed")], generator="t")
    results.write_results(
        tmp_path / two,
        "checkers",
        [rec("stream_races", "seed", "failed"), rec("stream_races", "fix", "passed")],
        generator="t",
    )
    text = catch_record.verdicts_table(report.Reference(tmp_path))
    assert "| stream_races | `stream_safety` | failed | – | failed | passed |" in text.splitlines()
