"""The all-gather's two read orders (labkit's peer-rotated one and the naive 0, 1, ...): both right
on fresh inputs for every world size the machine allows, the naive one a constexpr the default
compiles away, the benchmark's order comparison (records of kind "gather_order") on the emulated
world, and its verdicts and plot from records, old reference files included."""

import secrets

import pytest
import torch
from worlds import skip_without_a_world

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm import collectives as C
from labkit.kernels.comm.ranks import run_ranks
from labkit.labs.collectives import bench, experiments, gather_order
from labkit.workbench import tier
from labkit.workbench.errors import UsageError


def _world_sizes():
    if tier.interpreted() or not torch.cuda.is_available():
        return [2, 3, 4]
    return [w for w in (2, 3, 4, 8) if w <= torch.cuda.device_count()]


@pytest.mark.parametrize("w", _world_sizes())
def test_both_orders_gather_right_on_fresh_inputs(w):
    """Odd shards (the tail path), two fresh inputs, eager and through a held plan, bf16."""
    seed = secrets.randbelow(2**20)
    shard = 4096 + 2 * w + 1 if tier.interpreted() else (1 << 20) + 2 * w + 1
    rows = [
        r
        for rs in run_ranks(experiments.check_all_gather_orders, w, shard, "bfloat16", seed, 2, timeout=300).unwrap()
        for r in rs
    ]
    bad = [r for r in rows if not (r["correct"] and r["pads_zero"])]
    assert not bad, f"seed {seed}: {bad}"
    assert {(r["order"], r["how"]) for r in rows} == {(o, h) for o in C.ALL_GATHER_ORDERS for h in ("eager", "plan")}
    assert len(rows) == w * 2 * 2 * 2


def test_the_order_is_checked():
    with pytest.raises(UsageError, match="order: 'bogus' is not one of"):
        C.make_shards_plan("all_gather", None, order="bogus")
    with pytest.raises(UsageError, match="order: 'naive' exists only for the all-gather"):
        C.make_shards_plan("reduce_scatter", None, order="naive")


def test_the_naive_order_is_a_constexpr_of_the_same_kernel():
    """Compiled for sm_90 in a child with TRITON_INTERPRET=0 (no GPU needed): both orders compile,
    and ROTATE=False changes the code (the default's own code was compared byte for byte with the
    kernel before ROTATE existed when it was added: identical PTX and cubin without line info)."""
    from labkit.labs.collectives import ptx
    from labkit.workbench import sandbox

    res = sandbox.run_isolated(
        "labkit.labs.collectives.ptx:all_gather_orders", 4, timeout=300, env={"TRITON_INTERPRET": "0"}
    )
    found = res.unwrap()
    assert set(found) == {"rotated", "naive"}
    assert found["rotated"] != found["naive"]
    assert all("atom.global.release.sys.cas.b32" in text for text in found.values())
    with pytest.raises(ValueError, match="rotate: only the all-gather"):
        ptx.compile_collective("one_shot", rotate=False)


def test_compare_orders_records_both_orders_in_the_emulated_world():
    """The benchmark's comparison on 2 emulated ranks (CPU clock, tiny shards): both orders checked
    and timed in the same rounds, records with the benchmark's fields, the rotated order the baseline."""
    skip_without_a_world()
    shard_bytes = 4 * (4096 + 3)
    recs = run_ranks(
        gather_order.compare_orders, 2, (shard_bytes,), "float32", 3, 1, secrets.randbelow(2**20), 1, timeout=300
    ).unwrap()[0]
    assert [r["order"] for r in recs] == list(gather_order.ORDERS)
    for r in recs:
        assert set(bench.REQUIRED) <= set(r), r
        assert r["kind"] == gather_order.KIND and r["op"] == "all_gather" and r["world_size"] == 2
        assert r["correct"] is True and r["pads_zero"] is True
        assert r["shard_bytes"] == shard_bytes and r["bytes"] == 2 * shard_bytes
        assert r["method"] == ("cpu_clock" if tier.interpreted() else "cuda_graph")
        assert r["samples"] == 3 and r["inner"] == 1
        assert r["us_p25"] <= r["us"] <= r["us_p75"] and r["busbw_GBps"] > 0
        assert r["ratio_p25"] <= r["ratio_to_rotated"] <= r["ratio_p75"]
    assert recs[0]["ratio_to_rotated"] == 1.0
    (line,) = gather_order.order_verdicts(recs)
    assert line.startswith("W=2, 16 KiB per rank: naive/rotated x")


def _records(world, shard, naive_ratio, us_rotated=100.0):
    """A pair of records as ``compare_orders`` writes them."""
    out = []
    for order, ratio in (("rotated", (1.0, 1.0, 1.0)), ("naive", naive_ratio)):
        us = us_rotated * ratio[1]
        out.append(
            {
                "kind": "gather_order",
                "impl": "labkit",
                "op": "all_gather",
                "order": order,
                "world_size": world,
                "bytes": world * shard,
                "shard_bytes": shard,
                "dtype": "bfloat16",
                "correct": True,
                "pads_zero": True,
                "us": us,
                "us_p25": us * 0.98,
                "us_p75": us * 1.03,
                "us_min": us * 0.97,
                "samples": 15,
                "inner": 5,
                "method": "cuda_graph",
                "busbw_GBps": world * shard / us / 1e3 * (world - 1) / world,
                "ratio_to_rotated": ratio[1],
                "ratio_p25": ratio[0],
                "ratio_p75": ratio[2],
            }
        )
    return out


def test_verdicts_read_the_quartiles_of_the_paired_ratio():
    recs = (
        _records(2, 1 << 20, (0.99, 1.001, 1.02))
        + _records(4, 1 << 28, (1.5, 1.6, 1.7))
        + _records(4, 1 << 20, (0.8, 0.9, 0.95))
    )
    lines = gather_order.order_verdicts(recs)
    assert len(lines) == 3
    assert lines[0].startswith("W=2, 1 MiB per rank: naive/rotated x1.001 (quartiles 0.990..1.020, 15 paired rounds")
    assert lines[0].endswith("no difference beyond the round-to-round spread")
    assert lines[1].startswith("W=4, 1 MiB") and lines[1].endswith(
        "naive faster in most rounds (its upper quartile below 1)"
    )
    assert lines[2].startswith("W=4, 256 MiB") and lines[2].endswith(
        "naive slower in most rounds (its lower quartile above 1)"
    )
    one = [r for r in recs if r["order"] == "rotated"][:1]
    assert gather_order.order_verdicts(one) == ["W=2, 1 MiB per rank: only ['rotated'] timed"]


def test_the_plot_draws_both_orders_and_the_ratio_or_says_there_is_none():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    recs = _records(2, 1 << 20, (0.99, 1.0, 1.02)) + _records(2, 1 << 28, (0.99, 1.01, 1.02))
    assert gather_order.plot_gather_order(recs, list(axes), "t") == 4
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert labels == ["W=2, rotated", "W=2, naive"]
    assert "no difference" in [t.get_text() for t in axes[1].get_legend().get_texts()]
    plt.close(fig)
    fig, axes = plt.subplots(1, 2)
    assert gather_order.plot_gather_order(_records(2, 1 << 20, (1, 1, 1))[:0], list(axes), "old") == 0
    assert "no all-gather order records here" in axes[0].texts[0].get_text()
    plt.close(fig)


def test_old_reference_files_lack_the_comparison_and_still_plot():
    """The committed references predate the comparison: no verdict, the plot says so; a failed run's
    record (no timing) is not drawn either."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.workbench import results

    for machine, rs in results.load_references("collectives").items():
        if not gather_order.order_records(rs.records):
            assert gather_order.order_verdicts(rs.records) == []
            fig, axes = plt.subplots(1, 2)
            assert gather_order.plot_gather_order(rs.records, list(axes), machine) == 0
            plt.close(fig)
    failed = [
        {
            "kind": "gather_order",
            "impl": "labkit",
            "op": "all_gather",
            "world_size": 2,
            "bytes": None,
            "dtype": "bfloat16",
            "us": None,
            "busbw_GBps": None,
            "correct": False,
            "outcome": "rank 0 timeout",
        }
    ]
    assert gather_order.order_records(failed) == [] and gather_order.order_verdicts(failed) == []


def test_compare_orders_checks_its_arguments():
    with pytest.raises(ValueError, match="shard_bytes: expected positive ints"):
        gather_order.compare_orders(None, shard_bytes=(0,))
    with pytest.raises(ValueError, match="reps, warmup"):
        gather_order.compare_orders(None, shard_bytes=(16,), reps=0)


def test_read_order_is_the_kernels_and_counts_the_readers_per_gpu():
    """``read_order`` restates the kernel's ``s`` (exercise 02.order is judged by it): every rank
    reads every shard once; naive puts W-1 peers on one GPU per step, rotated one."""
    import inspect

    from labkit.kernels.comm import scatter_gather

    src = inspect.getsource(scatter_gather.all_gather_kernel.fn)
    assert "s = (rank + k) % WORLD" in src and "s = k" in src, "the kernel's order changed: update read_order"
    for w in (1, 2, 3, 4, 8):
        for order in gather_order.ORDERS:
            assert all(sorted(gather_order.read_order(r, w, order)) == list(range(w)) for r in range(w))
        assert gather_order.most_readers(w, "naive") == w - 1
        assert gather_order.most_readers(w, "rotated") == (1 if w > 1 else 0)
    assert gather_order.read_order(1, 4, "rotated") == [1, 2, 3, 0]
    with pytest.raises(ValueError, match="read_order: order"):
        gather_order.read_order(0, 4, "sideways")
    with pytest.raises(ValueError, match="read_order: expected"):
        gather_order.read_order(4, 4, "naive")
