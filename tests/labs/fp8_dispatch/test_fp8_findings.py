"""labkit.labs.fp8_dispatch.findings: the two-GPU cells read into sentences, from records (the
recorded 2x H200 run and made-up ones for the outcomes it did not produce)."""

import json
from pathlib import Path

from labkit.labs.fp8_dispatch import findings
from labkit.labs.fp8_dispatch.naive import MECHANISMS

ROOT = Path(__file__).resolve().parents[3]
SAME_DEVICE = (
    "exception: RuntimeError: Expected all tensors to be on the same device, but got scale_a is on cuda:0, "
    "different from other tensors on cuda:1 (when checking argument in method wrapper_CUDA___scaled_mm_v2)"
)


def rec(placement, mode, outcome, kind="matrix", digest="d1", **extra):
    return {"kind": kind, "placement": placement, "mode": mode, "outcome": outcome, "output_digest": digest, **extra}


def story(outcomes: dict, blocking: dict | None = None) -> list[dict]:
    recs = [rec("one_gpu", "fp8_device_aware", "ok")]
    recs += [rec("two_gpus", m, o) for m, o in outcomes.items()]
    recs += [rec("two_gpus", m, o, kind="launch_blocking") for m, o in (blocking or {}).items()]
    return recs


def test_nothing_on_two_gpus_reads_as_nothing():
    recs = [rec("one_gpu", "fp8_naive", "ok"), rec("two_gpus", "fp8_naive", "skipped: needs 2 CUDA GPUs")]
    assert findings.reading(recs) == []
    assert findings.story_verdict(recs) is None


def test_a_mechanism_that_faults_alone_is_named():
    recs = story(
        {
            "fp8_naive": "illegal_memory_access",
            "lazy_meta_on_current_device": "illegal_memory_access",
            "global_reduction": "ok",
            "unguarded_launch": "ok",
        }
    )
    assert findings.story_verdict(recs).startswith("reproduced: lazy_meta_on_current_device alone")
    lines = findings.reading(recs)
    assert "the story's failure, reproduced" in lines[0] and "harmless on this machine" in lines[2]


def test_a_fault_only_together_says_so():
    recs = story({"fp8_naive": "illegal_memory_access", **{m: "ok" for m in MECHANISMS}})
    assert findings.story_verdict(recs).startswith("reproduced by the three mechanisms together, by none alone")


def test_refusals_silent_errors_and_the_timing_dependence():
    recs = story(
        {
            "fp8_naive": SAME_DEVICE,
            "lazy_meta_on_current_device": SAME_DEVICE,
            "global_reduction": "ok",
            "unguarded_launch": "wrong_scale",
            "fp8_device_aware": "ok",
        },
        blocking={"unguarded_launch": "ok", "global_reduction": "ok"},
    )
    next(r for r in recs if r["mode"] == "unguarded_launch" and r["kind"] == "matrix")["mismatches"] = [{}, {}]
    text = "\n".join(findings.reading(recs))
    assert "when checking argument" not in text  # torch's operator name is cut
    assert text.count("an exception, not a fault: refused by torch's device check") == 2
    assert "unguarded_launch: wrong_scale -> no error raised, yet 2 amax/scale value(s) differ" in text
    assert "with CUDA_LAUNCH_BLOCKING=1 the same cell is correct" in text and "Hypothesis (not isolated here)" in text
    assert "fp8_device_aware: ok -> correct; output bit-identical to the one-GPU run" in text
    verdict = findings.story_verdict(recs)
    assert verdict.startswith("not reproduced")
    assert "lazy_meta_on_current_device is stopped by torch's device check" in verdict and "Hypothesis" in verdict
    assert "unguarded_launch is worse than a crash here" in verdict


def test_a_different_digest_is_said():
    recs = story({"fp8_device_aware": "ok"})
    recs[-1]["output_digest"] = "other"
    assert findings.reading(recs) == ["fp8_device_aware: ok -> correct; output NOT bit-identical to the one-GPU run"]


def test_the_recorded_two_h200_run_reads_whole():
    path = ROOT / "reference" / "h200x2" / "fp8_dispatch.json"
    recs = json.loads(path.read_text())["records"]
    lines = findings.reading(recs)
    assert [line.split(":", 1)[0] for line in lines] == list(findings.MODES)  # every mode ran there
    assert findings.story_verdict(recs) is not None
    assert len(findings.reading(recs, "other_gpu")) == 2


def test_a_nan_output_is_called_nan_and_the_hypothesis_names_the_two_streams():
    recs = story({"unguarded_launch": "wrong_scale"}, blocking={"unguarded_launch": "ok"})
    next(r for r in recs if r["kind"] == "matrix" and r["placement"] == "two_gpus").update(
        mismatches=[{}], rel_err_vs_bf16=float("nan")
    )
    (line,) = findings.reading(recs)
    assert "(the output is NaN)" in line
    assert "the cast kernel runs on the current device's stream" in line and "nothing orders" in line


def test_the_benchmark_summary_counts_outcome_classes():
    from labkit.labs.fp8_dispatch import bench

    recs = story(
        {"fp8_naive": SAME_DEVICE, "global_reduction": "ok", "unguarded_launch": "wrong_scale"},
        blocking={"unguarded_launch": "ok"},
    ) + [{"kind": "speed", "outcome": "ok"}]
    assert bench.summary(recs) == "FP8 matrix: 5 cells: 3 ok, 1 exception, 1 wrong_scale"
