"""labkit.labs.start_here.copy_trace: the profiler's view of a 1 GiB copy, eager and under graph
replay. The reduction and the verdict on synthetic Chrome-trace events and on a real CPU trace;
the records on this tier (a ``skipped`` reason); the trace itself on a GPU."""

import pytest
import torch

from labkit.labs.start_here import copy_bandwidth, copy_trace
from labkit.workbench import gates, results

GPU = torch.cuda.is_available()


def ev(cat, name, dur, ph="X"):
    return {"ph": ph, "cat": cat, "name": name, "dur": dur, "ts": 0.0, "pid": 0, "tid": 0}


MEMCPY = "Memcpy DtoD (Device -> Device)"
EAGER = [
    ev("cpu_op", "aten::copy_", 30.0),
    ev("cuda_runtime", "cudaMemcpyAsync", 8.0),
    ev("gpu_memcpy", MEMCPY, 506.0),
    ev("cuda_runtime", "cudaDeviceSynchronize", 510.0),
    ev("ac2g", "flow", 0.0, ph="s"),
    {"ph": "M", "name": "process_name", "args": {}},
]


def graph(device_event):
    return [
        ev("cuda_runtime", "cudaGraphLaunch", 12.0),
        device_event,
        ev("cuda_runtime", "cudaDeviceSynchronize", 790.0),
    ]


def test_summary_keeps_gpu_work_and_host_calls_per_name():
    rows = copy_trace.summarize_trace(EAGER + [ev("gpu_memcpy", MEMCPY, 494.0)])
    assert rows[0] == {"activity": "gpu_memcpy", "name": MEMCPY, "count": 2, "us": 1000.0, "us_max": 506.0}
    assert [(r["activity"], r["name"]) for r in rows[1:]] == [
        ("cuda_runtime", "cudaDeviceSynchronize"),
        ("cuda_runtime", "cudaMemcpyAsync"),
    ]  # by time
    assert copy_trace.device_work(rows) == rows[:1]
    assert copy_trace.summarize_trace(EAGER, kinds=("cpu_op",)) == [
        {"activity": "cpu_op", "name": "aten::copy_", "count": 1, "us": 30.0, "us_max": 30.0}
    ]
    assert copy_trace.summarize_trace([]) == []


@pytest.mark.parametrize(
    "events, kinds, match",
    [
        ("trace.json", copy_trace.DEVICE_ACTIVITIES, "events"),
        ({"traceEvents": []}, copy_trace.DEVICE_ACTIVITIES, "events"),
        ([3], copy_trace.DEVICE_ACTIVITIES, "item 0"),
        ([ev("kernel", "k", None)], copy_trace.DEVICE_ACTIVITIES, "no duration"),
        ([], (), "kinds"),
    ],
)
def test_summary_refuses_bad_input(events, kinds, match):
    with pytest.raises(ValueError, match=match):
        copy_trace.summarize_trace(events, kinds)


def test_verdict_settles_only_what_the_device_work_shows():
    eager = copy_trace.summarize_trace(EAGER)
    kernel = copy_trace.compare_paths(eager, copy_trace.summarize_trace(graph(ev("kernel", "copy_kernel", 780.0))))
    assert kernel["settled"] and "different work" in kernel["verdict"] and "copy_kernel" in kernel["verdict"]
    slower = copy_trace.compare_paths(eager, copy_trace.summarize_trace(graph(ev("gpu_memcpy", MEMCPY, 780.0))))
    assert slower["settled"] and "780 us in the graph against 506 us" in slower["verdict"]
    same = copy_trace.compare_paths(eager, copy_trace.summarize_trace(graph(ev("gpu_memcpy", MEMCPY, 510.0))))
    assert not same["settled"] and "not the memcpy node" in same["verdict"]
    blind = copy_trace.compare_paths(eager, copy_trace.summarize_trace(graph(ev("cpu_op", "x", 1.0))))
    assert not blind["settled"] and "graph replay trace holds no GPU activity" in blind["verdict"]
    with pytest.raises(ValueError, match="slower_by"):
        copy_trace.compare_paths(eager, eager, slower_by=-1)


def test_a_real_cpu_trace_reduces_to_the_copy_op():
    x = torch.randn(1 << 16)
    y = torch.empty_like(x)
    events = copy_trace.profiled_events(lambda: y.copy_(x))
    rows = copy_trace.summarize_trace(events, kinds=("cpu_op",))
    copies = [r for r in rows if r["name"] == "aten::copy_"]
    assert len(copies) == 1 and copies[0]["count"] == 1 and copies[0]["us"] > 0
    assert copy_trace.device_work(copy_trace.summarize_trace(events)) == []  # no GPU, no device rows


def _flat(path_rows: dict) -> list[dict]:
    return [copy_trace._record(1 << 30, path, row, True) for path, rows in path_rows.items() for row in rows]


def test_records_round_trip_and_report(tmp_path):
    recs = _flat(
        {
            "eager copy_": copy_trace.summarize_trace(EAGER),
            "graph replay": copy_trace.summarize_trace(graph(ev("gpu_memcpy", MEMCPY, 780.0))),
        }
    )
    # they carry the workbench benchmark's required fields, so its results file takes them
    path = results.write_results(
        tmp_path / "start_here.json", "workbench", recs, generator="t", required=copy_bandwidth.REQUIRED
    )
    back = results.load_results(path).records
    assert copy_trace.summaries(back)["graph replay"][0]["name"] == MEMCPY
    text = copy_trace.report(back, "reference h200x2 (RECORDED, not this machine)")
    assert text.startswith("reference h200x2 (RECORDED, not this machine): torch.profiler, one 1 GiB")
    assert "SETTLED: the same work" in text and "NOT SETTLED" not in text
    # the sweep's readers ignore them: no kind, no graph timing, no HBM figure from a trace
    assert copy_bandwidth.graph_vs_events(back) == [] and copy_bandwidth.hbm_reached(back) is None


@pytest.mark.skipif(GPU, reason="checks the record made on a machine without a GPU")
def test_without_a_gpu_the_record_says_why():
    (rec,) = copy_trace.records("cpu")
    assert rec["kind"] == copy_trace.KIND and rec["skipped"] == gates.requires(gpus=1, compiled=True).reason
    assert all(k in rec for k in copy_bandwidth.REQUIRED)
    assert "no profiler trace of the 1 GiB copy" in copy_trace.report([rec], "your run (live)")
    assert copy_trace.report([], "reference x") == "reference x: no profiler trace of the 1 GiB copy"
    with pytest.raises(ValueError, match="CUDA device"):
        copy_trace.trace_copy(1 << 12, device="cpu")
    with pytest.raises(ValueError, match="nbytes"):
        copy_trace.trace_copy(6)


def test_the_workbench_benchmark_ends_with_the_trace(monkeypatch):
    monkeypatch.setattr(copy_bandwidth, "copy_sweep", lambda sizes, reps: [{"impl": "torch.copy_"}])
    recs = copy_bandwidth.benchmark("cpu")
    assert recs[0] == {"impl": "torch.copy_"} and recs[1]["kind"] == copy_trace.KIND


@pytest.mark.gpu
def test_the_trace_shows_gpu_work_for_both_paths():
    recs = copy_trace.trace_copy(1 << 26)
    s = copy_trace.summaries(recs)
    assert all(r["correct"] for r in recs)
    assert copy_trace.device_work(s["eager copy_"]) and copy_trace.device_work(s["graph replay"]), s
    assert any("GraphLaunch" in r["name"] for r in s["graph replay"]), s["graph replay"]  # cudaGraphLaunch(_ptsz)
