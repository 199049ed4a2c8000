"""labkit.labs.grouped_gemm.staging: the PR's pinned staging buffer fills up and races, the
resetting fix breaks graph replay, an owned slot does neither; the CUDA-graph form on a GPU."""

import json
import threading

import pytest
import torch

import labkit  # noqa: F401  (sets the tier before anything defines a kernel)
from labkit.labs.grouped_gemm import staging, staging_plots
from labkit.workbench.errors import UsageError

# --- the PR's design: a global index that never resets ---------------------------------------------


@pytest.mark.parametrize("capacity,num_gemms", [(64, 4), (100, 3), (8, 4)])
def test_the_global_index_refuses_every_call_after_capacity_over_2_num_gemms(capacity, num_gemms):
    r = staging.overflow_scenario("global_index", capacity=capacity, num_gemms=num_gemms, calls=40)
    assert r["succeeded_calls"] == capacity // (2 * num_gemms)
    assert r["refused_calls"] == 40 - capacity // (2 * num_gemms)
    assert r["error"].startswith("Pinned host buffer out of bounds")
    assert "NVTE_CUTLASS_HOST_PINNED_U64_CAPACITY" in r["error"] and f"size: {capacity}" in r["error"]


def test_staged_slots_follow_each_other_and_hold_the_addresses():
    ws = staging.SharedWorkspace(32)
    a, b = staging.GlobalIndexStaging(ws), staging.GlobalIndexStaging(ws)  # two layers, one index
    assert a.stage([11, 12, 13]) == (0, 3)
    assert b.stage(torch.tensor([21, 22], dtype=torch.int64)) == (3, 5)
    assert ws.host[:5].tolist() == [11, 12, 13, 21, 22] and ws.index == 5


@pytest.mark.parametrize("design", ["resetting", "owned"])
def test_the_other_designs_never_fill_up(design):
    r = staging.overflow_scenario(design, capacity=16, num_gemms=4, calls=50)
    assert r["succeeded_calls"] == 50 and r["refused_calls"] == 0 and r["error"] is None


# --- two threads ----------------------------------------------------------------------------------


def test_forced_interleaving_gives_two_threads_one_slot_under_the_global_index():
    r = staging.thread_race_scenario("global_index", trials=10, forced=True)
    assert r["same_slot_trials"] == 10
    assert r["corrupted_calls"] == 10  # one call per trial: the later write wins the shared slot


def test_the_lost_update_leaves_the_index_one_call_short():
    ws = staging.SharedWorkspace(64)
    barrier = threading.Barrier(2, timeout=10)
    ops = [staging.GlobalIndexStaging(ws, between_read_and_write=barrier.wait) for _ in range(2)]
    slots = [None, None]
    threads = [threading.Thread(target=lambda i=i: slots.__setitem__(i, ops[i].stage([i] * 8))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slots[0] == slots[1] == (0, 8)
    assert ws.index == 8  # two calls of 8 words, the index advanced once
    assert ws.host[:8].tolist() in ([0] * 8, [1] * 8)  # one call's addresses, the other's are gone


def test_owned_slots_stay_clean_under_forced_interleaving():
    r = staging.thread_race_scenario("owned", trials=10, forced=True)
    assert r["corrupted_calls"] == 0 and r["same_slot_trials"] == 0


def test_free_running_threads_report_what_they_saw():
    r = staging.thread_race_scenario("global_index", trials=20, forced=False)
    assert 0 <= r["corrupted_calls"] <= r["same_slot_trials"] <= 20  # a corruption needs a shared slot
    assert f"{r['corrupted_calls']} of 40 calls" in r["detail"]
    assert staging.thread_race_scenario("owned", trials=20, forced=False)["corrupted_calls"] == 0
    resetting = staging.thread_race_scenario("resetting", trials=20, forced=False)
    assert resetting["corrupted_calls"] == 20  # every call takes slot 0: no luck needed


# --- graph replay -----------------------------------------------------------------------------------


def test_a_captured_copy_reads_the_slot_when_it_replays():
    slot = torch.tensor([1, 2, 3], dtype=torch.int64)
    dst = torch.zeros(3, dtype=torch.int64)
    copy = staging.capture_copy(slot, dst)
    assert dst.tolist() == [0, 0, 0]  # capturing moves nothing
    slot[:] = torch.tensor([7, 8, 9])
    copy.replay()
    assert dst.tolist() == [7, 8, 9]


def test_resetting_the_index_breaks_graph_replay():
    r = staging.graph_replay_scenario("resetting", "cpu")
    assert r["corrupted_calls"] == 1
    assert r["delivered"] == staging.call_addresses(1, 8)  # layer B's addresses reached layer A's kernel


@pytest.mark.parametrize("design", ["global_index", "owned"])
def test_graph_replay_delivers_the_captured_calls_addresses(design):
    r = staging.graph_replay_scenario(design, "cpu")
    assert r["corrupted_calls"] == 0 and r["delivered"] == staging.call_addresses(0, 8)


# Ran on 1x H100 (torch 2.11.0+cu130): resetting delivered B's addresses, the other two A's. The
# capture itself moves nothing, so B's addresses can only arrive if the replay read the host slot.
@pytest.mark.gpu
@pytest.mark.parametrize("design,corrupted", [("resetting", 1), ("global_index", 0), ("owned", 0)])
def test_a_real_cuda_graph_replays_from_the_rewritten_pinned_slot(design, corrupted):
    r = staging.graph_replay_scenario(design, "cuda")
    assert r["detail"].startswith("CUDA graph")
    assert r["corrupted_calls"] == corrupted, r
    assert r["delivered"] == staging.call_addresses(corrupted, 8)  # A's (0) or B's (1) addresses


# --- the design labkit's kernel uses: nothing staged -------------------------------------------------


def test_device_expert_addresses_are_base_plus_offsets():
    w = torch.zeros(4, 6, 5, dtype=torch.float16)
    out = staging.device_expert_addresses(w, torch.tensor([3, 0, 5, 2]))
    assert out[:, 0].tolist() == [w[e].data_ptr() for e in range(4)]
    assert out[:, 1].tolist() == [0, 3, 3, 8]


# --- records and the plot -----------------------------------------------------------------------------


def test_all_scenarios_are_json_records_with_the_common_fields():
    recs = staging.all_scenarios("cpu", trials=4, free_trials=4)
    assert len(recs) == 4 * len(staging.DESIGNS)
    for r in recs:
        assert r["kind"] == "staging" and r["design"] in staging.DESIGNS
        assert {"scenario", "calls", "corrupted_calls", "refused_calls", "detail"} <= r.keys()
    assert json.loads(json.dumps(recs)) == recs


def test_plot_staging_draws_a_bar_per_record():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = staging.all_scenarios("cpu", trials=2, free_trials=2)
    fig, ax = plt.subplots()
    staging_plots.plot_staging(recs, ax, "staging")
    assert len([p for p in ax.patches if p.get_width() > 0]) == len(recs)
    assert "% of calls" in ax.get_ylabel()
    plt.close(fig)
    with pytest.raises(UsageError, match="records"):
        staging_plots.plot_staging([{"kind": "race"}], ax, "x")


# --- bad input -------------------------------------------------------------------------------------


def test_bad_arguments_name_themselves():
    with pytest.raises(UsageError, match="capacity"):
        staging.SharedWorkspace(-8)
    with pytest.raises(TypeError, match="capacity"):
        staging.SharedWorkspace(8.0)
    op = staging.GlobalIndexStaging(staging.SharedWorkspace(8))
    with pytest.raises(UsageError, match="addresses"):
        op.stage([])
    with pytest.raises(TypeError, match="addresses"):
        op.stage(["0x1000"])
    with pytest.raises(TypeError, match="addresses"):
        op.stage(torch.zeros(2, dtype=torch.float32))
    with pytest.raises(UsageError, match="addresses"):
        staging.OwnedStaging(2).stage([1, 2, 3])
    with pytest.raises(TypeError, match="workspace"):
        staging.GlobalIndexStaging(64)
    with pytest.raises(TypeError, match="between_read_and_write"):
        staging.OwnedStaging(2, between_read_and_write=3)
    with pytest.raises(UsageError, match="design"):
        staging.overflow_scenario("atomic")
    with pytest.raises(UsageError, match="num_gemms"):
        staging.overflow_scenario("global_index", num_gemms=0)
    with pytest.raises(TypeError, match="forced"):
        staging.thread_race_scenario("owned", forced="yes")
    with pytest.raises(UsageError, match="device"):
        staging.graph_replay_scenario("owned", "meta")
    with pytest.raises(UsageError, match="dst"):
        staging.capture_copy(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(UsageError, match="m_splits"):
        staging.device_expert_addresses(torch.zeros(4, 2, 2), torch.tensor([1, 2]))
