"""labkit.labs.stream_races.reuse_probe: record_stream heard for views, ignored for raw pieces.
The record, its verdict and its place in ``labkit bench stream_races`` on any tier; the probe on a GPU."""

import inspect

import pytest
import torch

from labkit.labs.stream_races import bench as streams_bench
from labkit.labs.stream_races import race, reuse_probe
from labkit.workbench import gates, results

GPU = torch.cuda.is_available()


def _rec(style, reused, fresh_at, write=(20_000.0, 20_010.0)):
    return {
        "kind": reuse_probe.KIND,
        "allocator": style,
        "trial": 0,
        "numel": 1 << 20,
        "sleep_ms": 20.0,
        "record_stream_called": True,
        "owner_addr": 4096,
        "fresh_addr": 4096 if reused else 8192,
        "block_reused": reused,
        "owner_freed_host_us": fresh_at - 20.0,
        "fresh_allocated_host_us": fresh_at,
        "side_write_starts_gpu_us": write[0],
        "side_write_ends_gpu_us": write[1],
        "fresh_before_write_ends": fresh_at < write[1],
        "skipped": None,
    }


def test_verdict_reads_the_records_own_pointers_and_times():
    raw = [_rec("raw", True, 250.0), _rec("raw", True, 260.0), _rec("raw", True, 30_000.0)]
    assert reuse_probe.verdict(raw) == (
        "same block in 3 of 3 (record_stream ignored); fresh tensor made at 260 µs (host), side write into the "
        "old piece 20,000-20,010 µs (GPU), medians; the same block was handed out before that write ended in 2 of 3"
    )
    views = [_rec("views", False, 240.0)]
    assert reuse_probe.verdict(views).startswith(
        "same block in 0 of 1 (held back for the side stream: record_stream heard)"
    )
    assert "the outcome varied" in reuse_probe.verdict(views + raw[:1])
    text = reuse_probe.report(raw + views + [{"kind": "race"}], "reference h200x1 (RECORDED, not this machine)")
    lines = text.splitlines()
    assert lines[0] == "reference h200x1 (RECORDED, not this machine):" and len(lines) == 3
    assert lines[1].startswith("    raw pieces, side stream busy 20 ms: same block in 3 of 3")
    assert lines[2].startswith("  views pieces, side stream busy 20 ms: same block in 0 of 1")
    assert reuse_probe.report([{"kind": "race"}], "x") == "x: no allocator-reuse probe"
    with pytest.raises(ValueError, match="rs"):
        reuse_probe.verdict([])


def test_records_fit_the_streams_results_file(tmp_path):
    recs = [race._blank(dict(r)) for r in (_rec("raw", True, 250.0), _rec("views", False, 240.0))]
    path = results.write_results(tmp_path / "stream_races.json", "streams", recs, generator="t", required=race.REQUIRED)
    assert reuse_probe.report(results.load_results(path).records, "r").count("same block in") == 2


@pytest.mark.skipif(GPU, reason="checks the record made on a machine without a GPU")
def test_without_a_gpu_one_record_says_why():
    (rec,) = reuse_probe.probe_records()
    assert rec["kind"] == reuse_probe.KIND and rec["skipped"] == gates.requires(gpus=1, compiled=True).reason
    assert reuse_probe.report([rec], "your run (live)") == f"your run (live):\n  skipped: {rec['skipped']}"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        reuse_probe.probe("raw")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="style"):
        reuse_probe.probe("malloc")
    with pytest.raises(ValueError, match="numel"):
        reuse_probe.probe("raw", numel=0)
    with pytest.raises(ValueError, match="sleep_ms"):
        reuse_probe.probe("views", sleep_ms=0.0)
    with pytest.raises(ValueError, match="trials"):
        reuse_probe.probe_records(trials=0)


def test_the_streams_benchmark_records_the_probe_and_loads_kernels_first():
    """Read from the source: both run only on a GPU."""
    assert "reuse_probe.probe_records(" in inspect.getsource(streams_bench.benchmark)
    src = inspect.getsource(reuse_probe.probe)
    assert "load_trial_kernels(" in src and src.index("load_trial_kernels(") < src.index("alloc.allocate(")


@pytest.mark.gpu
def test_raw_pieces_are_handed_out_again_before_the_side_write_views_are_held_back():
    for t in range(3):
        raw = reuse_probe.probe("raw", trial=t)
        assert raw["block_reused"] and raw["fresh_before_write_ends"], raw
        assert raw["fresh_allocated_host_us"] < raw["side_write_starts_gpu_us"] < raw["side_write_ends_gpu_us"], raw
        views = reuse_probe.probe("views", trial=t)
        assert not views["block_reused"], views
