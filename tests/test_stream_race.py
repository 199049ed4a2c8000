"""labkit.stream_race: the race itself on a GPU (the views path never corrupts; the raw path
does), the sanitizer harness, the allocator timeline; on the CPU the logic around them."""
import pytest
import torch

from labkit import stream_plots, stream_race
from labkit.errors import UsageError

GPU = torch.cuda.is_available()


def test_bad_arguments_are_refused():
    with pytest.raises(UsageError, match="allocator"):
        stream_race.race_trial("malloc")
    with pytest.raises(UsageError, match="allocator"):
        stream_race.wgrad_trial("pinned")
    if GPU:
        with pytest.raises(ValueError, match="numel"):
            stream_race.race_trial("raw", numel=0)
        with pytest.raises(ValueError, match="sleep_ms"):
            stream_race.race_trial("raw", sleep_ms=-1.0)
        with pytest.raises(ValueError, match="device"):
            stream_race.race_trial("raw", device="cpu")


@pytest.mark.skipif(GPU, reason="checks the message on a machine without CUDA")
def test_without_a_gpu_the_race_says_why():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        stream_race.race_trial("raw")


def test_trace_events_keeps_this_blocks_events_with_relative_times():
    snapshot = {"device_traces": [[
        {"action": "segment_alloc", "addr": 4096, "size": 1 << 24, "stream": 7, "time_us": 1000.0},
        {"action": "alloc", "addr": 4096, "size": 1 << 24, "stream": 7, "time_us": 1010.0},
        {"action": "alloc", "addr": 9999, "size": 512, "stream": 7, "time_us": 1011.0},  # another size
        {"action": "free_requested", "addr": 4096, "size": 1 << 24, "stream": 7, "time_us": 1050.0},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 1100.0},
    ]]}
    rows = stream_race.trace_events(snapshot, 0, 1 << 24, t0_us=1000.0)
    assert [r["action"] for r in rows] == ["segment_alloc", "alloc", "free_requested"]
    assert [r["t_us"] for r in rows] == [0.0, 10.0, 50.0]
    assert stream_race.trace_events(snapshot, 3, 1 << 24, 0.0) == []
    no_times = {"device_traces": [[{"action": "alloc", "addr": 1, "size": 8, "stream": 0}]]}
    assert stream_race.trace_events(no_times, 0, 8, 0.0)[0]["t_us"] is None


def test_race_summary_counts_trials_per_allocator_and_delay():
    recs = [{"kind": "race", "allocator": "raw", "sleep_ms": 5.0, "corrupted_elems": c, "numel": 4,
             "corrupted_fraction": c / 4, "block_reused": True} for c in (4, 4, 0)]
    recs.append({"kind": "race", "allocator": "views+record_stream", "sleep_ms": 5.0, "corrupted_elems": 0,
                 "numel": 4, "corrupted_fraction": 0.0, "block_reused": False})
    rows = {r["allocator"]: r for r in stream_plots.race_summary(recs)}
    assert rows["raw"]["corrupted_trials"] == 2 and rows["raw"]["trials"] == 3
    assert rows["raw"]["mean_corrupted_fraction"] == pytest.approx(2 / 3)
    assert rows["views+record_stream"]["reused"] == 0
    assert "2 of 3" in stream_plots.race_markdown(recs)


@pytest.mark.gpu
def test_views_with_record_stream_never_corrupt():
    for sleep in (0.0, 0.5, 25.0):
        for t in range(5):
            r = stream_race.race_trial("views+record_stream", sleep_ms=sleep, trial=t)
            assert r["corrupted_elems"] == 0, r
            if sleep >= 0.5:  # the side stream is still busy at free time: the block is held back
                assert not r["block_reused"], r


@pytest.mark.gpu
@pytest.mark.parametrize("allocator", ["raw", "views"])
def test_without_stream_tracking_the_block_is_reused_and_overwritten(allocator):
    for t in range(5):
        r = stream_race.race_trial(allocator, sleep_ms=25.0, trial=t)
        assert r["block_reused"], r
        assert r["corrupted_elems"] == r["numel"], r


@pytest.mark.gpu
def test_wgrad_pattern_raw_corrupts_views_do_not():
    for t in range(3):
        raw = stream_race.wgrad_trial("raw", sleep_ms=5.0, trial=t)
        safe = stream_race.wgrad_trial("views+record_stream", sleep_ms=5.0, trial=t)
        assert raw["block_reused"] and raw["corrupted_elems"] > 0, raw
        assert safe["corrupted_elems"] == 0, safe


@pytest.mark.gpu
def test_timeline_shows_the_reuse():
    tl = stream_race.timeline_trial("raw", numel=1 << 20, sleep_ms=5.0)
    assert tl["block_reused"] and tl["corrupted_elems"] == tl["numel"]
    allocs = [e for e in tl["events"] if e["action"] == "alloc"]
    assert len(allocs) >= 2 and allocs[-1]["addr"] == tl["owner_addr"]
    m = tl["marks_us"]
    # the fresh tensor was handed out on the host before the side write ran on the GPU
    assert m["fresh allocated (host)"] < m["side write starts (GPU)"] < m["side write ends (GPU)"]
    tl2 = stream_race.timeline_trial("views+record_stream", numel=1 << 20, sleep_ms=5.0)
    assert not tl2["block_reused"] and tl2["corrupted_elems"] == 0


@pytest.mark.gpu
def test_sanitizer_harness_reports_the_control():
    rows = stream_race.sanitizer_run(trials=1, numel=1 << 20, timeout=240)
    assert all(r.get("sanitizer") for r in rows), rows
    control = [r for r in rows if str(r["allocator"]).startswith("missing wait_stream")]
    assert control and all(r["reported"] for r in control), control
