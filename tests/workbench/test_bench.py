"""The timing harness: paired comparisons order candidates correctly; bad arguments refused."""

import time

import pytest
import torch

from labkit.workbench import bench


def test_paired_ratio_orders_candidates_on_cpu():
    cmp = bench.compare(
        {"1ms": lambda: time.sleep(0.001), "3ms": lambda: time.sleep(0.003)}, baseline="1ms", reps=9, warmup=1
    )
    assert cmp.timings["1ms"].method == "cpu_clock"
    assert len(cmp.timings["3ms"].samples_us) == 9
    r = cmp.ratio("3ms")
    assert 1.8 < r < 4.0, r  # sleep overshoots a little; 3x nominal
    lo, hi = cmp.ratio_iqr("3ms")
    assert lo <= r <= hi
    assert cmp.ratio("1ms") == 1.0


def test_timing_statistics():
    t = bench.Timing("cpu_clock", [5.0, 1.0, 3.0, 2.0, 4.0], inner=1)
    assert (t.median_us, t.min_us, t.p25_us, t.p75_us) == (3.0, 1.0, 2.0, 4.0)
    d = t.as_dict()
    assert d["us"] == 3.0 and d["samples"] == 5 and d["method"] == "cpu_clock"


def test_inner_divides_sample_time():
    calls = []
    t = bench.time_fn(lambda: calls.append(1), warmup=2, reps=4, inner=5)
    assert len(calls) == 2 + 4 * 5 and t.inner == 5


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"reps": 0}, "reps"),
        ({"warmup": -1}, "warmup"),
        ({"inner": 0}, "inner"),
        ({"method": "stopwatch"}, "method"),
        ({"method": "cuda_events"}, "CUDA device"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench.time_fn(lambda: None, **kwargs)


def test_baseline_must_be_a_candidate():
    with pytest.raises(ValueError, match="baseline"):
        bench.compare({"a": lambda: None}, baseline="b")


def test_gbps():
    assert bench.gbps(2e9, 1e6) == 2.0  # 2 GB in 1 s


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["cuda_events", "cuda_graph"])
def test_cuda_timers_order_candidates(method):
    a = torch.randn(2048, 2048, device="cuda")
    cmp = bench.compare(
        {"1x": lambda: a @ a, "4x": lambda: [a @ a for _ in range(4)]},
        baseline="1x",
        device=a.device,
        reps=20,
        inner=3,
        method=method,
    )
    assert cmp.timings["1x"].method == method
    assert 3.0 < cmp.ratio("4x") < 5.0, cmp.ratio("4x")
