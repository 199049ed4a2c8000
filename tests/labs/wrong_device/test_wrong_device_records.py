"""Lab 01's device_guard records: kernel timing from CUDA events (launch device per pattern, the
record fields, old host-clock files told apart), the first error of a failed graph capture, the
GPU demonstrations as records (skipped without GPUs), and the search for the seed's crash. The
pure parts run on every tier; the GPU paths are marked gpu / multigpu."""

import pytest
import torch

from labkit.labs.wrong_device import crash_search as cs
from labkit.labs.wrong_device import demos, timing
from labkit.labs.wrong_device import experiments as wd
from labkit.workbench import gates, results
from labkit.workbench.sandbox import SandboxResult

CHAINED_TB = (
    "Traceback (most recent call last):\n"
    '  File "/r/labkit/labs/wrong_device/experiments.py", line 120, in __init__\n'
    "    self.out = add_one(x, guarded=guarded)\n"
    '  File "/r/labkit/labs/wrong_device/experiments.py", line 64, in add_one\n'
    "    out = torch.empty_like(x)  # on x's device\n"
    "              ^^^^^^^^^^^^^^^\n"
    "torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    "\n"
    "During handling of the above exception, another exception occurred:\n"
    "\n"
    "Traceback (most recent call last):\n"
    '  File "/r/labkit/workbench/sandbox.py", line 230, in _child_main\n'
    '    payload = {"status": "ok", "value": obj(*call["args"], **call["kwargs"])}\n'
    '  File "/r/labkit/labs/wrong_device/experiments.py", line 118, in __init__\n'
    "    with _capture(self.graph):\n"
    '  File "/t/torch/cuda/graphs.py", line 260, in __exit__\n'
    "    self.cuda_graph.capture_end()\n"
    "torch.AcceleratorError: CUDA error: operation failed due to a previous error during capture\n"
)


# --- timing: pure parts ---------------------------------------------------------------------


@pytest.mark.parametrize("pattern", wd.PATTERNS)
def test_launch_device_is_the_current_one_unguarded_and_the_datas_guarded(pattern):
    assert timing.expected_launch_device(pattern, guarded=False) == 0
    assert timing.expected_launch_device(pattern, guarded=True) == 1
    assert timing.expected_launch_device(pattern, True, data_device=3, current_device=2) == 3


def test_launch_device_checks_its_arguments():
    with pytest.raises(ValueError, match="pattern: 'nope'"):
        timing.expected_launch_device("nope", True)
    with pytest.raises(TypeError, match="guarded: expected a bool"):
        timing.expected_launch_device("triton_launch", 1)


def test_kernel_timing_takes_the_median_and_names_the_device():
    spans = [(1, 0.030), (1, 0.028), (1, 0.100), (1, 0.029), (1, 0.031)]  # ms; one slow outlier
    got = timing.kernel_timing(spans, nbytes=64 << 20)
    assert got["us"] == pytest.approx(30.0)
    assert got["GBps"] == pytest.approx(2 * (64 << 20) / 30e-6 / 1e9)
    assert got["launch_device"] == "cuda:1" and got["timed_launches"] == 5 and got["timing"] == "cuda_events"
    assert timing.kernel_timing([(0, 1.0), (1, 1.0)], 4)["launch_device"] == "mixed: cuda:0, cuda:1"
    with pytest.raises(ValueError, match="spans: no timed launch"):
        timing.kernel_timing([], 4)
    with pytest.raises(ValueError, match="nbytes"):
        timing.kernel_timing(spans, 0)
    with pytest.raises(ValueError, match="spans: expected"):
        timing.kernel_timing([(0, -1.0)], 4)


def test_launch_sites_report_only_to_an_active_timer():
    class Fake:
        def __init__(self):
            self.calls = 0

        def around_launch(self):
            import contextlib

            self.calls += 1
            return contextlib.nullcontext()

    with timing.around_launch():  # no timer: nothing happens
        pass
    fake = Fake()
    with timing.timing(fake):
        x = torch.zeros(8, device=wd.tier.kernel_device())
        wd.add_one(x)  # the launch site calls the timer
        with pytest.raises(RuntimeError, match="do not nest"):
            with timing.timing(Fake()):
                pass
    assert fake.calls == 1 and timing.ACTIVE is None
    with pytest.raises(ValueError, match="sleep_cycles"):
        timing.KernelTimer(sleep_cycles=-1)


def test_timing_note_tells_old_files_from_new():
    assert "host-clock" in timing.timing_note([{"GBps": 500.0}])  # a file from before this change
    assert "CUDA events" in timing.timing_note([{"GBps": 500.0, "timing": "cuda_events"}])
    assert "mix" in timing.timing_note([{"GBps": 1.0}, {"GBps": 1.0, "timing": "cuda_events"}])
    assert "no cell ran" in timing.timing_note([{"GBps": None}])


# --- graph capture: the first error ---------------------------------------------------------


def test_first_error_is_the_oldest_in_the_chain_and_where_it_was_raised():
    error, where = wd.first_error(CHAINED_TB)
    assert error == "torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing"
    assert where.startswith("add_one: out = torch.empty_like(x)")
    one = 'Traceback (most recent call last):\n  File "/r/labkit/x.py", line 1, in f\n    g()\nValueError: bad\n'
    assert wd.first_error(one) == ("ValueError: bad", "f: g()")
    assert wd.first_error(None) is None and wd.first_error("no traceback") is None


def test_capture_kwargs_falls_back_where_torch_lacks_the_keyword():
    def new(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        pass

    def old(self, cuda_graph, pool=None, stream=None):
        pass

    assert wd.capture_kwargs(new) == {"capture_error_mode": "thread_local"}
    assert wd.capture_kwargs(old) == {}
    assert wd.capture_kwargs() == {"capture_error_mode": "thread_local"}  # the torch installed here


def test_cell_record_carries_timing_launch_device_and_first_error():
    ok = SandboxResult(
        "ok",
        value={
            "correct": True,
            "out_device": "cuda:1",
            "GBps": 4000.0,
            "us": 33.5,
            "launch_device": "cuda:1",
            "timed_launches": 10,
            "timing": "cuda_events",
        },
        stdout=f"{wd._PEER_LINE}True\n",
    )
    r = wd.cell_record("triton_launch", True, True, 64 << 20, ok)
    assert (r["outcome"], r["GBps"], r["us"], r["timing"]) == ("correct", 4000.0, 33.5, "cuda_events")
    assert r["launch_device"] == r["expected_launch_device"] == "cuda:1" and r["first_error"] is None
    failed = SandboxResult(
        "cuda_error",
        error_type="torch.AcceleratorError",
        traceback=CHAINED_TB,
        message="CUDA error: operation failed due to a previous error during capture",
        stdout=f"{wd._PEER_LINE}True\n{wd._CAPTURE_LINE}thread_local\n",
    )
    r = wd.cell_record("graph_wrong_device", True, False, 64 << 20, failed)
    assert r["outcome"] == "exception" and "previous error during capture" in r["detail"]
    assert "not permitted when stream is capturing" in r["first_error"]
    assert r["first_error_at"].startswith("add_one:") and r["capture_error_mode"] == "thread_local"
    assert r["GBps"] is None and r["expected_launch_device"] == "cuda:0" and r["peer_enabled"] is True
    assert all(k in r for k in wd.REQUIRED)


def test_old_matrix_records_still_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recorded = results.load_results(results.REFERENCE_DIR / "h200x2" / "wrong_device.json").records
    cells = [r for r in recorded if r["pattern"] in wd.PATTERNS]
    assert timing.timing_note(cells).startswith("GB/s: kernel time, CUDA events")
    # files made before the CUDA-event timing hold the same cells without `timing` (and the
    # fields added with it): they still plot, and are labelled host-clock
    added = (
        "timing",
        "launch_device",
        "expected_launch_device",
        "timed_launches",
        "first_error",
        "first_error_at",
        "capture_error_mode",
        "seconds",
        "nbytes",
        "us",
    )
    old = [{k: v for k, v in r.items() if k not in added} for r in cells]
    fig, ax = plt.subplots()
    wd.plot_matrix(old, ax, "old")
    assert len(ax.patches) == len(old)
    assert "host-clock" in timing.timing_note(old)
    plt.close(fig)


# --- the demonstrations as records ----------------------------------------------------------


def test_demonstrations_without_gpus_are_skipped_records_that_a_results_file_accepts(tmp_path):
    if gates.requires(gpus=1, compiled=True).ok:
        # one GPU is enough for the launch-blocking demonstration to run for real
        pytest.skip("this machine has a GPU: some records would be real runs")
    recs = (
        demos.launch_blocking_records()
        + demos.sharded_decode_records()
        + demos.regression_records()
        + cs.crash_search()
    )
    assert {r["pattern"] for r in recs} == {*demos.KINDS, cs.KIND}
    assert all(r["outcome"] == "skipped" and r["skipped"] for r in recs)
    path = results.write_results(tmp_path / "d.json", "device_guard", recs, generator="test", required=wd.REQUIRED)
    assert len(results.load_results(path).records) == len(recs)
    for describe in (demos.describe_launch_blocking, demos.describe_decodes, demos.describe_regression, cs.describe):
        lines = describe(recs)
        assert lines and all("skipped" in line for line in lines if "first error" not in line)
    assert cs.seed_crash_verdict(recs) == "none recorded yet"


def test_describes_say_when_nothing_is_recorded():
    for describe in (demos.describe_launch_blocking, demos.describe_decodes, demos.describe_regression, cs.describe):
        assert describe([{"pattern": "triton_launch"}]) == ["none recorded yet"]


def test_launch_blocking_lines():
    recs = [
        demos.base_record("launch blocking", "illegal memory access", "s", CUDA_LAUNCH_BLOCKING=b, reported_at=at)
        for b, at in (("0", "fault_then_later_work: total = x"), ("1", "write_out_of_bounds: _store_at_kernel[(1,)]"))
    ]
    lines = demos.describe_launch_blocking(recs)
    assert lines[0] == "CUDA_LAUNCH_BLOCKING=0: illegal memory access, reported at fault_then_later_work: total = x"
    assert "_store_at_kernel" in lines[1]


def test_sharded_decode_compares_the_unguarded_run_with_the_guarded_one():
    base = {"tokens": [1, 2], "logits": [[0.5, 1.0], [2.0, 3.0]], "layers_on": ["cuda:0", "cuda:1"], "finite": True}
    same = dict(base)
    off = dict(base, tokens=[1, 3], logits=[[0.5, 1.0], [2.0, 3.25]])
    assert demos.compare_decodes(base, same) == {"tokens_match": True, "bit_identical": True, "max_abs_logit_diff": 0.0}
    assert demos.compare_decodes(base, off) == {
        "tokens_match": False,
        "bit_identical": False,
        "max_abs_logit_diff": 0.25,
    }
    with pytest.raises(ValueError, match="other: expected a dict"):
        demos.compare_decodes(base, {"tokens": []})
    g = demos.decode_record(True, SandboxResult("ok", value=base), None)
    u = demos.decode_record(False, SandboxResult("ok", value=off), base)
    c = demos.decode_record(False, SandboxResult("ok", value=same), base)
    crash = demos.decode_record(
        False,
        SandboxResult("illegal_memory_access", error_type="E", message="illegal memory access", traceback=CHAINED_TB),
        base,
    )
    assert (g["outcome"], u["outcome"], c["outcome"], crash["outcome"]) == (
        "ran (baseline)",
        "wrong result",
        "correct",
        "illegal memory access",
    )
    assert "logits differ by up to 0.25" in u["detail"] and "bit-identical" in c["detail"]
    assert crash["first_error"].startswith("torch.AcceleratorError")
    lines = demos.describe_decodes([g, u, crash])
    assert lines[0].startswith("guarded  : ran (baseline)") and any("first error" in line for line in lines)


def test_regression_rows_become_records():
    rows = [
        {
            "case": "a (6, 96), granularity=per_tensor",
            "out_device": "cuda:1",
            "current_after": "cuda:0",
            "bit_identical": True,
        },
        {"case": "b", "out_device": "cuda:1", "current_after": "cuda:0", "bit_identical": False},
        {"case": "c", "out_device": "cuda:0", "current_after": "cuda:0", "bit_identical": False},
    ]
    recs = demos.regression_rows_to_records(True, SandboxResult("ok", value=rows))
    assert [r["outcome"] for r in recs] == ["correct", "wrong result", "wrong device"]
    crashed = demos.regression_rows_to_records(
        False,
        SandboxResult(
            "exception", error_type="builtins.ValueError", message="Pointer argument (at 0) cannot be accessed"
        ),
    )
    assert len(crashed) == 1 and crashed[0]["outcome"] == "exception" and crashed[0]["case"] == "(all)"
    lines = demos.describe_regression(recs + crashed)
    assert lines[0].startswith("guarded (the fix): 1 of 3 configurations pass")
    assert lines[-1] == (
        "unguarded (the bug): the run did not finish: exception: builtins.ValueError: "
        "Pointer argument (at 0) cannot be accessed (0.0 s)"
    )
    assert demos.case_name((6, 96), {"chunk_d": 128}) == "a (6, 96), chunk_d=128"


# --- the crash search -----------------------------------------------------------------------


def test_crash_search_classifies_what_happened():
    peer = f"{wd._PEER_LINE}True\n{cs._REVERSE_LINE}False\n"
    cases = [
        (
            SandboxResult("illegal_memory_access", message="an illegal memory access was encountered"),
            "illegal memory access",
        ),
        (SandboxResult("ok", value={"correct": False, "read_reused": 1.0}, stdout=peer), "wrong result"),
        (SandboxResult("ok", value={"correct": True, "read_reused": 0.0}, stdout=peer), "correct"),
        (SandboxResult("exception", error_type="builtins.ValueError", message="Pointer argument"), "other error"),
        (SandboxResult("timeout", seconds=60), "hang"),
    ]
    for res, outcome in cases:
        r = cs.config_record("freed and reused", res)
        assert r["outcome"] == outcome and r["outcome"] in cs.OUTCOMES
        assert all(k in r for k in wd.REQUIRED)
    r = cs.config_record("freed and reused", cases[1][0])
    assert "100% of the output is the reused block's value + 1" in r["detail"]
    assert (r["peer_enabled"], r["peer_1_to_0"]) == (True, False)
    gone = cs.config_record(
        "freed and released",
        SandboxResult(
            "illegal_memory_access",
            message="an illegal memory access was encountered",
            stdout=f"{cs._RELEASED_LINE}{64 << 20}\n",
        ),
    )
    assert gone["released_bytes"] == 64 << 20 and "returned 64 MiB of cuda:1's memory" in gone["detail"]
    assert cs.config_record("expandable segments", cases[2][0])["env"] == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"
    }
    with pytest.raises(ValueError, match="configs: 'nope'"):
        cs.crash_search(["nope"])
    with pytest.raises(ValueError, match="name: 'nope'"):
        cs.run_config("nope")


def test_seed_crash_verdict():
    def rec(outcome, config="peer 0->1 only"):
        return demos.base_record(cs.KIND, outcome, "d", config=config)

    assert cs.seed_crash_verdict([]) == "none recorded yet"
    assert cs.seed_crash_verdict([rec("skipped")]) == "none recorded yet"
    got = cs.seed_crash_verdict([rec("correct"), rec("wrong result", "freed and reused")])
    assert got == "not reproduced: no illegal memory access in 2 search configuration(s) (correct, wrong result)"
    got = cs.seed_crash_verdict([rec("correct"), rec("illegal memory access", "expandable segments")])
    assert got == "reproduced: an illegal memory access in expandable segments"
    cell = {"pattern": "triton_launch", "guarded": False, "peer_access": True, "outcome": "illegal memory access"}
    assert "matrix cell triton_launch, peer on" in cs.seed_crash_verdict([cell])
    recorded = results.load_results(results.REFERENCE_DIR / "h200x2" / "wrong_device.json").records
    assert cs.seed_crash_verdict(recorded) == (
        "not reproduced: no illegal memory access in 6 search configuration(s) (correct, other error, wrong result) "
        "nor in 8 unguarded matrix cell(s)"
    )
    old = [r for r in recorded if r["pattern"] in wd.PATTERNS]  # a file made before the crash search
    assert cs.seed_crash_verdict(old) == (
        "not reproduced: no illegal memory access in 8 unguarded matrix cell(s); crash search: none recorded yet"
    )
    both = cs.seed_crash_verdict(old + [rec("correct")])
    assert both == (
        "not reproduced: no illegal memory access in 1 search configuration(s) (correct) "
        "nor in 8 unguarded matrix cell(s)"
    )


# --- on GPUs --------------------------------------------------------------------------------


@pytest.mark.multigpu
def test_cells_are_timed_with_events_on_the_expected_launch_device():
    for pattern in wd.PATTERNS:
        r = wd.device_matrix([pattern], nbytes=16 << 20, guarded=(True,), peers=(True,), progress=False)[0]
        assert r["outcome"] == "correct" and r["timing"] == "cuda_events", r
        assert r["launch_device"] == r["expected_launch_device"] == "cuda:1", r
        assert r["timed_launches"] == 10 and r["us"] > 0 and r["GBps"] > 0, r
    r = wd.device_matrix(["triton_launch"], nbytes=16 << 20, guarded=(False,), peers=(True,), progress=False)[0]
    if r["GBps"] is not None:  # it ran (silently, on the wrong GPU): timed on cuda:0's stream
        assert r["launch_device"] == "cuda:0", r


@pytest.mark.multigpu
def test_unguarded_graph_cell_records_its_first_error():
    r = wd.device_matrix(["graph_wrong_device"], nbytes=16 << 20, guarded=(False,), peers=(True,), progress=False)[0]
    assert r["capture_error_mode"] in ("thread_local", "default"), r
    if r["outcome"] != "correct":
        assert r["first_error"], r


@pytest.mark.multigpu
def test_demonstrations_record_on_two_gpus():
    reg = demos.regression_records()
    assert all(r["outcome"] == "correct" for r in reg if r["guarded"]), reg
    assert len([r for r in reg if r["guarded"]]) == len(demos.STORY_CASES)
    dec = demos.sharded_decode_records()
    assert dec[0]["outcome"] == "ran (baseline)" and dec[0]["finite"], dec
    assert dec[1]["outcome"] in ("correct", "wrong result", "exception", "illegal memory access", "hang"), dec
    found = cs.crash_search(["freed and reused", "expandable segments"], nbytes=16 << 20)
    assert all(r["outcome"] in cs.OUTCOMES and r["outcome"] != "skipped" for r in found), found


@pytest.mark.gpu
def test_launch_blocking_records_on_a_gpu():
    recs = demos.launch_blocking_records()
    assert [r["CUDA_LAUNCH_BLOCKING"] for r in recs] == ["0", "1"]
    assert all(r["outcome"] == "illegal memory access" and r["reported_at"] for r in recs), recs


def test_graph_error_lines_for_old_and_new_files():
    old = {
        "pattern": "graph_wrong_device",
        "peer_access": True,
        "guarded": False,
        "outcome": "exception",
        "detail": "cuda_error: torch.AcceleratorError: CUDA error: "
        "operation failed due to a previous error during capture",
    }
    lines = wd.describe_graph_errors([old, dict(old, outcome="correct", guarded=True)])
    assert lines[0].startswith("peer on, unguarded: cuda_error: torch.AcceleratorError") and "predates" in lines[1]
    assert len(lines) == 2
    wrong = wd.describe_graph_errors([dict(old, outcome="wrong result", detail="output on cuda:1: not x + 1")])
    assert wrong[0] == "peer on, unguarded: wrong result: output on cuda:1: not x + 1"
    new = dict(
        old,
        first_error="torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing",
        first_error_at="add_one: out = torch.empty_like(x)",
        capture_error_mode="thread_local",
    )
    lines = wd.describe_graph_errors([new])
    assert "not permitted" in lines[1] and "nothing before it" not in lines[1]
    assert lines[2] == "    raised under: add_one: out = torch.empty_like(x)" and "thread_local" in lines[3]
    same = dict(
        new, first_error="torch.AcceleratorError: CUDA error: operation failed due to a previous error during capture"
    )
    assert "nothing before it" in wd.describe_graph_errors([same])[1]
    assert "none (the cell raised" in wd.describe_graph_errors([dict(new, first_error=None)])[1]
    assert wd.describe_graph_errors([]) == ["no graph cell failed"]
