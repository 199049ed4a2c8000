"""labkit.kernels.comm.into: the out-of-place all-reduce into a symmetric output against an fp64
sum on fresh inputs every call, back to back, with a late rank; the input left as it was; bad
input refused by name."""

import secrets

import pytest
import torch

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm import collectives as C
from labkit.kernels.comm.ranks import run_ranks
from labkit.labs.collectives import experiments
from labkit.workbench import tier


def _world_sizes():
    if tier.interpreted() or not torch.cuda.is_available():
        return [2, 3]
    return [w for w in (2, 4, 8) if w <= torch.cuda.device_count()]


def _gpu_or_emulated():
    return tier.interpreted() or (torch.cuda.is_available() and torch.cuda.device_count() >= 2)


pytestmark = pytest.mark.skipif(
    not _gpu_or_emulated(), reason="needs 2 CUDA GPUs (or the interpreter's emulated world)"
)


@pytest.mark.parametrize("w", _world_sizes())
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("algorithm", ["two_shot", "two_shot_ce", "auto"])
def test_every_call_sums_right_and_leaves_the_input(w, dtype_name, algorithm):
    # odd sizes: the last shard is short; on GPUs auto gets a size past the world's copy-engine
    # threshold (collectives.CE_FROM_BYTES; a world without one takes two_shot at any size)
    itemsize = getattr(torch, dtype_name).itemsize
    if tier.interpreted():
        n = 1000 * w + 7
    elif algorithm == "auto":
        n = C.CE_FROM_BYTES.get(w, 32 << 20) // itemsize + 8 * 1024 + 7
    else:
        n = (1 << 20) // itemsize + 7
    seed = secrets.randbelow(2**20)  # fresh inputs every run; printed on failure
    parts = run_ranks(
        experiments.into_trials,
        w,
        n,
        dtype_name,
        seed,
        4,
        late_rank=w - 1,
        late_s=0.2,
        algorithm=algorithm,
        timeout=300,
    ).unwrap()
    for part in parts:
        assert part["wrong"] == [], (seed, part)
        assert part["input_changed"] == [], (seed, part)
        assert part["returned_out"] and part["pads_zero"], (seed, part)
        # the launches are kept per output buffer: the second buffer got its own, and summed right
        assert part["second_out_right"] and part["kept"] == 2, (seed, part)


def test_bad_input_is_refused_naming_the_argument():
    for found in run_ranks(experiments.into_errors, 2, timeout=120).unwrap():
        assert found["plain tensor out"].startswith("TypeError: out: a plain tensor is not in symmetric memory")
        assert found["out is buf"].startswith("ValueError: out: shares memory with this rank's symmetric buffer")
        assert found["no workspace"].startswith("UsageError: buf: has no workspace")
        assert found["algorithm"].startswith("UsageError: algorithm: 'one_shot' is not one of")
        assert found["shape"].startswith("ValueError: out: shape (32,), expected (64,)")
        assert found["dtype"].startswith("TypeError: out: dtype torch.bfloat16 differs from the buffer's torch.float32")
        assert found["not a buffer"].startswith("TypeError: buf: expected a labkit.kernels.comm.symm.SymmBuffer")
        assert found["blocks"] == "ValueError: blocks: expected a positive int, got [2]"
        assert found["config"].startswith("TypeError: config: expected a labkit.kernels.comm.collectives.LaunchConfig")


def _records():
    def rec(impl, nbytes, gbps, out="plain", timing="graph"):
        return {
            "kind": "into",
            "impl": impl,
            "bytes": nbytes,
            "busbw_GBps": gbps,
            "busbw_p25": gbps - 2,
            "busbw_p75": gbps + 3,
            "out": out,
            "us": 1.0,
            "world_size": 2,
            "correct": True,
            "timing": timing,
            "ratio_to_baseline": 0.9,
            "ratio_p25": 0.88,
            "ratio_p75": 0.93,
        }

    return [
        rec("labkit_into", 16 << 20, 300.0, "symmetric"),
        rec("labkit_into", 256 << 20, 350.0, "symmetric"),
        rec("labkit_one_shot", 16 << 20, 290.0),
        rec("labkit_one_shot", 256 << 20, 325.0),
        dict(rec("labkit_two_shot_ce_in_place", 256 << 20, 345.0, "in place"), us=1.25),
        dict(rec("torch_two_shot", 256 << 20, 330.0, "in place"), us=1.5),
        rec("labkit_into", 256 << 20, 320.0, "symmetric", timing="eager"),
        {"kind": "sweep", "impl": "labkit_into", "bytes": 256 << 20, "busbw_GBps": 1.0},
    ]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_summary_and_figure_read_the_records_and_compare_with_the_peers():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.labs.collectives import into_bench

    recs = _records()
    assert into_bench.timings_in(recs) == ["graph", "eager"]
    assert into_bench.summary(recs) == [
        "graph: labkit_into (symmetric out): 16 MiB 300 GB/s, 256 MiB 350 GB/s",
        "graph: labkit_one_shot (plain out): 16 MiB 290 GB/s, 256 MiB 325 GB/s",
        "graph: labkit_two_shot_ce_in_place (in place out): 256 MiB 345 GB/s",
        "graph: torch_two_shot (in place out): 256 MiB 330 GB/s",
        "eager: labkit_into (symmetric out): 256 MiB 320 GB/s",
        "out of place at 256 MiB into a symmetric output (graph): 350 GB/s busbw (quartiles 348-353); "
        "one-shot (out of place) 325 GB/s, 0.90x its time (paired, quartiles 0.88-0.93); "
        "two_shot_ce (in place) 345 GB/s, 0.80x its time (medians); "
        "torch two_shot (in place) 330 GB/s, 0.67x its time (medians)",
    ]
    assert not any("target" in line for line in into_bench.summary(recs))
    # the peers are named only where the same timing holds them: the eager timing has none
    eager_only = [dict(r, timing="eager", iters=5) for r in recs if r.get("timing") == "eager"]
    assert into_bench.summary(eager_only)[-1] == (
        "out of place at 256 MiB into a symmetric output (eager): 320 GB/s busbw (quartiles 318-323); "
        "one-shot (out of place), 0.90x its time (paired, quartiles 0.88-0.93)"
    )
    # files recorded before the graph timing hold single eager calls only: judged on those, labelled
    old = [dict(r, timing="eager") for r in recs if r.get("impl") == "labkit_into" and r["bytes"] == 256 << 20]
    assert into_bench.summary(old)[-1].startswith("out of place at 256 MiB into a symmetric output (eager): 350 GB/s")
    assert "time single calls" in into_bench.summary(old)[-2]
    assert not any("single calls" in line for line in into_bench.summary([dict(r, iters=5) for r in old]))
    assert into_bench.summary([]) == []
    fig, (a, b) = plt.subplots(1, 2)
    assert into_bench.plot_into(recs, a, "t") == 4  # the graph timing: into, the one-shot and the two in place
    assert "CUDA-graph replay" in a.get_ylabel()
    labels = [t.get_text() for t in a.get_legend().get_texts()]
    assert len(labels) == 4 and not any("target" in lb for lb in labels)
    assert not any("target" in line.get_label() for line in a.get_lines())
    assert (
        into_bench.plot_into([{"kind": "sweep"}], b, "old") == 0
        and "no out-of-place-into records" in b.texts[0].get_text()
    )
    plt.close(fig)
