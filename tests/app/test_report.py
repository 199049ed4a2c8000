"""labkit report: the docs' generated blocks agree with the reference files, and the renderers say
what they read (and name what is missing) on small synthetic records."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from labkit.app import catalogue, report
from labkit.kernels import grouped_gemm as gg
from labkit.labs.collectives import findings as collectives_findings
from labkit.labs.grouped_gemm import findings as gemm_findings
from labkit.labs.memory_model import findings as memory_findings
from labkit.labs.stream_races import findings as stream_findings
from labkit.workbench import results

ROOT = Path(__file__).resolve().parents[2]


# --- the committed docs ------------------------------------------------------------------------


def test_every_block_in_the_docs_is_what_its_renderer_gives():
    assert report.stale(ROOT) == [], "run `labkit report --write`"


def test_every_renderer_has_a_block_and_every_block_a_renderer():
    used = [b.name for doc in report.documents(ROOT) for b in report.doc_blocks(doc)]
    assert set(used) == set(report.RENDERERS)
    assert len(used) == len(set(used)), "a block appears twice"


def test_the_readme_shows_each_figure_and_the_figure_is_committed():
    readme = (ROOT / "README.md").read_text()
    for name in report.FIGURES:
        path = ROOT / report.FIGURES_DIR / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({report.FIGURES_DIR}/{name}.png)" in readme


def test_the_readme_keeps_its_two_commands_on_the_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    first = "\n".join(lines[:25])
    assert "make workbook" in first and "make test" in first


def test_the_readme_lab_table_is_a_report_block():
    readme = (ROOT / "README.md").read_text()
    assert f"<!-- report:labs -->\n{catalogue.markdown_table()}\n<!-- /report -->" in readme


# --- the mechanism, on a synthetic tree ----------------------------------------------------------


def _write(root: Path, name: str, records: list[dict]) -> None:
    lab = name.split("/")[1].removesuffix(".json")
    results.write_results(root / name, lab, records, generator="tests.test_report")


def _push(nbytes, impl, us, ratio=1.0, w=2):
    return {
        "kind": "push",
        "timing": "graph",
        "world_size": w,
        "bytes": nbytes,
        "impl": impl,
        "us": us,
        "ratio_to_torch_best": ratio,
        "count_check_ratio": 1.05 if impl == "labkit_push_one_shot" else None,
    }


def _collectives_records(nbytes=4096, w=2):
    recs = [
        _push(nbytes, "labkit_fid_one_shot", 4.0, 0.45, w),
        _push(nbytes, "labkit_push_one_shot", 4.25, 0.5, w),
        _push(nbytes, "labkit_one_shot", 8.5, w=w),
        _push(nbytes, "labkit_all_reduce", 8.6, w=w),
        _push(nbytes, "torch_one_shot", 9.0, w=w),
        _push(nbytes, "torch_two_shot", 8.75, w=w),
    ]
    if nbytes == 4096:  # the count check's line reads 4 KiB and 1 MiB
        recs += _collectives_records(1 << 20, w)
    recs.append({"kind": "sweep", "op": "all_reduce", "impl": "nccl", "bytes": nbytes, "graph_us": 12.0})
    return recs


def test_a_renderer_reads_its_fields_from_the_file(tmp_path):
    for name, w in zip(collectives_findings.SMALL_REFERENCES, (2, 4)):
        _write(tmp_path, name, _collectives_records(w=w))
    text = collectives_findings.small_messages_table(report.Reference(tmp_path))
    rows = [line for line in text.splitlines() if "| 4 KiB |" in line]
    assert rows[0] == "| 2 | 4 KiB | 4.00 | 4.25 | 8.50 | 8.60 | 9.00 | 8.75 | 12.0 | 0.46x |"
    assert rows[1].startswith("| 4 | 4 KiB |")
    assert "`reference/h200x2/collectives.json`" in text and "W=4 1 MiB 1.05x" in text


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(report.ReportError, match=r"reference/h200x2/collectives\.json is missing"):
        collectives_findings.small_messages_table(report.Reference(tmp_path))


def test_a_missing_field_is_named_with_its_file(tmp_path):
    recs = _collectives_records()
    del recs[-1]["graph_us"]
    _write(tmp_path, collectives_findings.DOCS_REFERENCE, recs)
    with pytest.raises(report.ReportError, match=r"reference/h200x2/collectives\.json: .*field 'graph_us'"):
        collectives_findings.small_messages_table(report.Reference(tmp_path))


def test_a_missing_record_is_named_with_what_was_asked(tmp_path):
    _write(tmp_path, collectives_findings.DOCS_REFERENCE, _collectives_records()[:-1])  # no NCCL row
    with pytest.raises(report.ReportError, match=r"no record with kind='sweep', op='all_reduce', impl='nccl'"):
        collectives_findings.small_messages_table(report.Reference(tmp_path))


def test_two_records_where_one_is_asked_for_is_an_error(tmp_path):
    _write(tmp_path, "m/x.json", [{"kind": "a", "us": 1.0}, {"kind": "a", "us": 2.0}])
    with pytest.raises(report.ReportError, match="2 records with kind='a', expected one"):
        report.Reference(tmp_path).value("m/x.json", "us", kind="a")


def test_a_null_value_is_named_with_the_records_index(tmp_path):
    _write(tmp_path, "m/x.json", [{"kind": "a", "us": 1.0}, {"kind": "b", "us": None}])
    with pytest.raises(report.ReportError, match=r"reference/m/x\.json: record 1 holds null in field 'us'"):
        report.Reference(tmp_path).value("m/x.json", "us", kind="b")


def test_check_names_a_stale_block_and_write_renders_it(tmp_path, monkeypatch):
    for name, w in zip(collectives_findings.SMALL_REFERENCES, (2, 4)):
        _write(tmp_path / "reference", name, _collectives_records(w=w))
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "page.md"
    doc.write_text("before\n<!-- report:collectives.small-messages -->\nold numbers\n<!-- /report -->\nafter\n")
    ref = report.Reference(tmp_path / "reference")
    assert report.stale(tmp_path, ref) == ["docs/page.md: collectives.small-messages"]
    assert report.write(tmp_path, ref) == [doc]
    text = doc.read_text()
    assert text.startswith("before\n<!-- report:collectives.small-messages -->\n| W | size |")
    assert text.endswith("Rendered by `labkit report`.\n<!-- /report -->\nafter\n")
    assert report.stale(tmp_path, ref) == []


def test_an_unknown_block_is_named(tmp_path):
    with pytest.raises(report.ReportError, match="no renderer named 'no-such-table'"):
        report.render("no-such-table", report.Reference(tmp_path))


def test_reference_refuses_a_name_that_is_not_a_file_path(tmp_path):
    with pytest.raises(report.ReportError, match="Reference.file: name must be a path"):
        report.Reference(tmp_path).file("collectives")


@pytest.mark.parametrize(
    "x, text", [(4.3635, "4.36"), (6.8, "6.80"), (10.02, "10.0"), (362.8, "363"), (1346.1, "1,346"), (0, "0")]
)
def test_number_keeps_three_significant_figures(x, text):
    assert report.number(x) == text


def test_number_refuses_what_is_not_a_number():
    with pytest.raises(report.ReportError, match="number: x must be a number"):
        report.number("4.36")
    with pytest.raises(report.ReportError, match="number: x must be a number, got True"):
        report.number(True)
    for x in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(report.ReportError, match="number: x must be a finite number"):
            report.number(x)


def _race(sleep_ms, corrupted_elems, **extra):
    return {
        "kind": "race",
        "allocator": "raw",
        "sleep_ms": sleep_ms,
        "corrupted_elems": corrupted_elems,
        "block_reused": True,
        "corrupted_fraction": 0.5 if corrupted_elems else 0.0,
        **extra,
    }


def test_a_bad_value_is_refused_naming_file_record_and_field(tmp_path):
    name = stream_findings.DOCS_REFERENCE
    _write(tmp_path, name, [_race(0.0, 0), _race(5.0, 4)])
    assert "| raw | 5 | 1 of 1 |" in report.render("stream_races.race", report.Reference(tmp_path))
    for value, what in ((float("nan"), "is nan"), (-5, "is -5"), ("12", "is '12'")):
        _write(tmp_path, name, [_race(0.0, 0), _race(5.0, value)])
        with pytest.raises(
            report.ReportError, match=rf"reference/{name}: record 1 \(kind='race'\): field 'corrupted_elems' {what}"
        ):
            report.render("stream_races.race", report.Reference(tmp_path))


def test_a_null_the_renderer_needs_is_refused_not_counted_as_zero(tmp_path):
    """A null corrupted_elems in a race record, counted as 0, would make a corrupted trial a clean one.
    null passes the file's check (a record of another kind has none), not the renderer that needs it."""
    name = stream_findings.DOCS_REFERENCE
    _write(tmp_path, name, [_race(5.0, 4), _race(5.0, None), {"kind": "alloc_time", "corrupted_elems": None}])
    for block in ("stream_races.race", "stream_races.headline"):
        with pytest.raises(
            report.ReportError, match=rf"reference/{name}: record 1 holds null in field 'corrupted_elems'"
        ):
            report.render(block, report.Reference(tmp_path))


def test_write_refuses_a_bad_record_before_it_writes_any_document(tmp_path):
    for name, w in zip(collectives_findings.SMALL_REFERENCES, (2, 4)):
        _write(tmp_path / "reference", name, _collectives_records(w=w))
    _write(tmp_path / "reference", stream_findings.DOCS_REFERENCE, [_race(5.0, float("nan"))])
    (tmp_path / "docs").mkdir()
    a, b = tmp_path / "docs" / "a.md", tmp_path / "docs" / "b.md"  # a's block is good, b's file is bad
    a.write_text("<!-- report:collectives.small-messages -->\nold\n<!-- /report -->\n")
    b.write_text("<!-- report:stream_races.race -->\nold\n<!-- /report -->\n")
    with pytest.raises(report.ReportError, match="field 'corrupted_elems' is nan"):
        report.write(tmp_path, report.Reference(tmp_path / "reference"))
    assert a.read_text().endswith("\nold\n<!-- /report -->\n") and b.read_text().endswith("\nold\n<!-- /report -->\n")


@pytest.mark.parametrize("mode", ["--write", "--check"])
def test_the_cli_refuses_a_bad_file_in_one_line(tmp_path, monkeypatch, capsys, mode):
    from labkit.app import cli

    _write(tmp_path / "reference", stream_findings.DOCS_REFERENCE, [_race(5.0, -5)])
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "page.md"
    doc.write_text("<!-- report:stream_races.race -->\nold\n<!-- /report -->\n")
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path / "reference")
    monkeypatch.setattr(results, "REPO_ROOT", tmp_path)
    assert cli.main(["report", mode]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "labkit report: error: report: reference/h200x1/stream_races.json: record 0 (kind='race'): "
        "field 'corrupted_elems' is -5; expected a count (a whole number >= 0)"
    ]
    assert doc.read_text() == "<!-- report:stream_races.race -->\nold\n<!-- /report -->\n"


def test_the_cli_check_exits_1_naming_the_block(tmp_path, monkeypatch, capsys):
    from labkit.app import cli

    monkeypatch.setattr(report, "stale", lambda: ["README.md: labs"])
    assert cli.main(["report", "--check"]) == 1
    assert "stale: README.md: labs" in capsys.readouterr().out


# --- the labs' renderers on synthetic records ----------------------------------------------------


def test_litmus_summary_counts_rows_seen_and_the_checks_that_read_zero():
    rows = [
        {
            "runs": 100,
            "weak_outcomes": 3,
            "verdict": "allowed",
            "ptx_verdict": "allowed",
            "timeouts": 0,
            "unwritten": 0,
        },
        {"runs": 100, "weak_outcomes": 1, "verdict": "forbidden", "ptx_verdict": "allowed", "timeouts": 2},
        {"runs": 100, "weak_outcomes": 0, "verdict": "forbidden", "ptx_verdict": "forbidden", "unwritten": 1},
        {"runs": 100, "weak_outcomes": 9, "skipped": "needs a GPU"},
    ]
    assert memory_findings.litmus_summary(rows) == {
        "rows": 3,
        "instances": [100],
        "weak_seen": 2,
        "forbidden_seen": 1,
        "forbidden_by_both_seen": 0,
        "timeouts": 2,
        "unwritten": 1,
    }


def test_broken_barriers_table_sums_the_forms(tmp_path):
    recs = [
        {"algorithm": a, "variant": v, "delay": d, "trials": 10, "wrong_results": w}
        for a in ("one_shot", "tree")
        for v, d, w in (("correct", 0, 0), ("correct", 100, 0), ("no_end_barrier", 0, 0), ("no_end_barrier", 100, 7))
    ]
    for name in memory_findings.BARRIER_FILES:
        _write(tmp_path, name, recs)
    text = memory_findings.broken_barriers_table(report.Reference(tmp_path))
    lines = text.splitlines()
    assert lines[0] == "| machine | variant | form | delay 0 | delay 100 |"
    assert "| `correct` | all four, summed | 0 of 20 | 0 of 20 |" in lines[2]
    assert lines[3].endswith("| `no_end_barrier` | one_shot | 0 of 10 | 7 of 10 |")


def test_race_in_words_names_who_was_corrupted():
    recs = [
        {"kind": "race", "allocator": "raw", "sleep_ms": s, "corrupted_elems": c, "corrupted_fraction": c / 4}
        for s, c in ((0.0, 0), (5.0, 4), (5.0, 0))
    ] + [{"kind": "race", "allocator": "views+record_stream", "sleep_ms": 5.0, "corrupted_elems": 0}]
    assert stream_findings.race_in_words(recs) == (
        "raw: 1 of 2 delayed trials corrupted; at delay 0, 0 of 1; never: views+record_stream."
    )
    assert stream_findings.race_in_words([]) == ""


def test_moe_in_words_sets_the_graph_against_the_host_sync_layer():
    recs = [
        {"kind": "moe_layer", "impl": "host_sync", "method": "eager", "skew": 0.0, "ms_fwd_bwd": 20.0},
        {"kind": "moe_layer", "impl": "device", "method": "graph", "skew": 0.0, "ms_fwd_bwd": 5.0,
         "ratio_vs_host_sync": 0.25},
    ]  # fmt: skip
    assert gemm_findings.moe_in_words(recs) == (
        "forward + backward of the MoE layer as one CUDA graph: skew 0: 5.0 ms against 20.0 ms "
        "(x0.25 of the host-sync time)."
    )


def test_reading_minutes_counts_words_and_figures(tmp_path):
    lab = catalogue.get("stream_races")
    cells = [
        {"cell_type": "markdown", "source": ["word " * 300]},
        {"cell_type": "code", "source": "fig = plot.beside(panels, draw, 'x')"},
        {"cell_type": "code", "source": "x = 1"},
    ]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / lab.notebook).write_text(json.dumps({"cells": cells}))
    assert catalogue.reading_minutes(lab, tmp_path) == 3  # 300 words / 150 + one figure
    with pytest.raises(Exception, match="reading_minutes: stream_races's notebook .* is missing"):
        catalogue.reading_minutes(lab, tmp_path / "elsewhere")


def _litmus_row(test, semantics, scope, placement, weak, verdict="allowed", stress="memory"):
    return {
        "test": test, "semantics": semantics, "scope": scope, "placement": placement, "stress_name": stress,
        "runs": 1000, "weak_outcomes": weak, "verdict": verdict, "ptx_verdict": verdict, "timeouts": 0, "unwritten": 0,
    }  # fmt: skip


def test_litmus_in_words_across_two_gpus_names_the_scope_lesson():
    rows = [
        _litmus_row("MP", "plain", None, "two_gpus", 20),
        _litmus_row("CoRR", "plain", None, "two_gpus", 0),
        _litmus_row("2+2W", "acq_rel", "gpu", "two_gpus", 3),
        _litmus_row("2+2W", "acq_rel", "sys", "two_gpus", 0, verdict="forbidden"),
    ]
    text = memory_findings.litmus_in_words(rows, "m")
    assert "4 rows at 1e3 instances; the weak outcome seen in 2." in text
    assert (
        "Across two GPUs, with plain, volatile or relaxed accesses, its highest rate per test: MP 2%; never: CoRR."
        in text
    )
    assert "Of the 1 rows where `sys` scope forbids" in text and "seen at `gpu` in 1 (2+2W acq_rel (memory) 3)" in text
    assert "at `sys` in 0." in text
    assert memory_findings.litmus_in_words([], "m") == ""


def test_broken_in_words_lists_each_form_per_delay():
    rows = [
        {"algorithm": "one_shot", "variant": "no_end_barrier", "delay": d, "trials": 60, "wrong_results": w}
        for d, w in ((0, 0), (100, 58))
    ] + [{"algorithm": "one_shot", "variant": "correct", "delay": 100, "trials": 60, "wrong_results": 0}]
    assert memory_findings.broken_in_words(rows, "m") == (
        "**m**, wrong calls without the end barrier: delay 0: one_shot 0/60; delay 100: one_shot 58/60. "
        "`correct`: at most 0 wrong in any row."
    )


def test_cost_in_words_spans_medians_and_tests():
    rows = [("plain.-", 7.1, 2.4, 18.0, 7), ("acq_rel.gpu", 8.0, 3.0, 12.0, 7)]
    assert memory_findings.cost_in_words(rows, "m") == (
        "**m**: the semantics' medians span 7.1-8 ns per instance, the tests 2.4-18 ns."
    )


def _backward(op, method, gpu, ratio, **tile):
    cfg = dict(block_m=128, block_n=128, block_k=64, num_stages=4, tma=False) | tile
    return {
        "kind": "gemm_backward",
        "impl": "labkit",
        "op": op,
        "method": method,
        "experts": 8,
        "tokens": 16384,
        "skew": "uniform",
        "gpu": gpu,
        "ratio_vs_torch": ratio,
        "tflops": 400.0,
        **cfg,
    }


@pytest.mark.parametrize(("gpu", "h200"), [("NVIDIA H200", True), ("a GPU without a table", False)])
def test_the_backward_table_names_the_tables_pick_where_it_differs_from_the_recorded_tile(tmp_path, gpu, h200):
    pick = gg.TABLES[("NVIDIA H200", "wgrad")].pick(16384 // 8)  # at the records' shape: E=8, 16384 tokens
    second = f" / {gemm_findings._tile(dataclasses.asdict(pick))}" if h200 else ""
    recs = [_backward(op, m, gpu, r) for op, r in (("dgrad", 0.95), ("wgrad", 1.5)) for m in ("eager", "graph")]
    _write(tmp_path, gemm_findings.DOCS_REFERENCE, recs)
    text = gemm_findings.backward_table(report.Reference(tmp_path))
    row = next(line for line in text.splitlines() if line.startswith("| H200 | 8 | uniform"))
    assert row == f"| H200 | 8 | uniform | 0.95 | 0.95 | 400 | 1.50 | 1.50 | 400 | 128×128×64, 4{second} |"
    assert "reference/h100x1" not in text  # a GPU without a recorded file has no rows


def _tune(config, skew, ms, ratio, chosen=False, flat=False, ws=False, correct=True):
    return {
        "kind": "tune",
        "impl": "labkit",
        "op": "forward",
        "experts": 8,
        "tokens": 16384,
        "skew": skew,
        "config": config,
        "flat": flat,
        "warp_specialize": ws,
        "chosen": chosen,
        "correct": correct,
        "ms": ms,
        "tflops": 700.0 / ms,
        "ratio_vs_chosen": ratio,
        "ratio_vs_chosen_p25": ratio - 0.01,
        "ratio_vs_chosen_p75": ratio + 0.01,
    }


def test_the_tile_loops_table_shows_each_loops_fastest_and_says_what_beats_the_pick(tmp_path):
    """Per split, the fastest correct configuration of each tile loop beside the kernel's choice; the
    sentence under it names the splits where some configuration beat the pick, and a wrong
    configuration (correct False) is never shown however fast."""
    recs = [_tune("pick", s, 1.0, 1.0, chosen=True) for s in ("uniform", "skewed")]
    recs += [_tune("slow", s, 1.2, 1.2) for s in ("uniform", "skewed")]
    recs += [_tune("flat a", "uniform", 1.1, 1.1, flat=True), _tune("flat b", "uniform", 1.05, 1.05, flat=True)]
    recs += [
        _tune("ws", "uniform", 1.02, 1.02, flat=True, ws=True),
        _tune("ws", "skewed", 0.95, 0.95, flat=True, ws=True),
    ]
    recs += [_tune("wrong", "skewed", 0.5, 0.5, flat=True, correct=False)]
    _write(tmp_path, gemm_findings.TUNE_REFERENCE, recs)
    bench = [
        {"kind": "gemm", "impl": "labkit", "method": "graph", "experts": 8, "skew": s, "tflops": t}
        for s, t in (("uniform", 600.0), ("skewed", 590.0))
    ]
    _write(tmp_path, gemm_findings.DOCS_REFERENCE, bench)
    text = gemm_findings.tile_loops_table(report.Reference(tmp_path))
    rows = [line for line in text.splitlines() if line.startswith("| uniform") or line.startswith("| skewed")]
    assert rows == [
        "| uniform | a loop per expert | pick (the kernel's choice) | 700 | 1.00 [0.99, 1.01] |",
        "| uniform | one flat loop | flat b | 667 | 1.05 [1.04, 1.06] |",
        "| uniform | one flat loop, warp-specialised | ws | 686 | 1.02 [1.01, 1.03] |",
        "| skewed | a loop per expert | pick (the kernel's choice) | 700 | 1.00 [0.99, 1.01] |",
        "| skewed | one flat loop, warp-specialised | ws | 737 | 0.95 [0.94, 0.96] |",
    ]
    assert "Faster than the kernel's choice in the median at skewed counts." in text
    assert "600 TFLOP/s (uniform) and 590 TFLOP/s (skewed)" in text
    _write(tmp_path, gemm_findings.TUNE_REFERENCE, [r for r in recs if not (r["chosen"] and r["skew"] == "skewed")])
    with pytest.raises(report.ReportError, match="no timed record of the kernel's choice at skewed counts"):
        gemm_findings.tile_loops_table(report.Reference(tmp_path))
