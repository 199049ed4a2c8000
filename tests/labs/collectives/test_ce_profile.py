"""The profile of one ``two_shot_ce`` call (records of kind "ce_profile"): the reduction of a
Chrome trace to GPU activities, on a synthetic trace shaped as torch.profiler exports it; the
verdict and table from records; the skipped record off GPUs; the profile itself on GPUs."""

import pytest
import torch

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm.ranks import run_ranks
from labkit.labs.collectives import bench, ce_profile
from labkit.workbench import tier


def _trace():
    """What kineto exports for one call on a rank: host ops and API calls, then the barrier kernel,
    the copy into the peer's workspace and the reduce kernel (out of order, as a trace may list them),
    an instant event and a legacy capitalised "Kernel" category."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 1000.0, "dur": 30.0, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 1010.0, "dur": 5.0, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamIsCapturing", "ts": 1009.0, "dur": 1.0, "args": {}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 1001.0, "dur": 4.0, "args": {}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 1020.0, "dur": 4.0, "args": {}},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "two_shot_ce_kernel",
            "ts": 1400.0,
            "dur": 380.0,
            "args": {"stream": 7, "device": 0, "grid": [132, 1, 1]},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy DtoD (Device -> Device)",
            "ts": 1020.5,
            "dur": 370.0,
            "args": {"stream": 7, "device": 0, "bytes": 134217728, "memory bandwidth (GB/s)": 362.7},
        },
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "barrier_kernel",
            "ts": 1010.5,
            "dur": 8.0,
            "args": {"stream": 7, "device": 0},
        },
        {"ph": "i", "cat": "kernel", "name": "an instant", "ts": 1000.0, "args": {}},
        {
            "ph": "X",
            "cat": "gpu_memset",
            "name": "Memset (Device)",
            "ts": 1900.0,
            "dur": 2.0,
            "args": {"stream": 9, "device": 0, "bytes": 64},
        },
    ]
    return {"traceEvents": ev, "deviceProperties": []}


def test_the_trace_is_reduced_to_its_gpu_activities_in_order():
    rows = ce_profile.summarize_trace(_trace())
    assert [(r["activity"], r["activity_kind"], r["name"]) for r in rows] == [
        ("kernel", "kernel", "barrier_kernel"),
        ("memcpy", "Memcpy DtoD", "Memcpy DtoD (Device -> Device)"),
        ("kernel", "kernel", "two_shot_ce_kernel"),
        ("memset", "Memset", "Memset (Device)"),
    ]
    assert [r["start_us"] for r in rows] == pytest.approx([0.0, 10.0, 389.5, 889.5])
    assert [r["us"] for r in rows] == [8.0, 370.0, 380.0, 2.0]
    assert [r["copy_bytes"] for r in rows] == [None, 134217728, None, 64]
    assert rows[1]["stream"] == 7 and rows[1]["device"] == 0
    assert not any(r["copy_kernel"] for r in rows)
    long_name = dict(
        next(e for e in _trace()["traceEvents"] if e["name"] == "two_shot_ce_kernel"),
        name="void at::native::elementwise_kernel<" + "x" * 150 + "direct_copy_kernel_cuda>",
    )
    (copy,) = ce_profile.summarize_trace([long_name])
    assert copy["copy_kernel"] and len(copy["name"]) == 120  # judged on the whole name, stored short
    assert ce_profile.summarize_trace(_trace()["traceEvents"]) == rows  # the event list alone
    assert ce_profile.summarize_trace({"traceEvents": []}) == []
    assert ce_profile.host_calls(_trace()) == "cuLaunchKernelEx x2, cudaMemcpyAsync x1"
    import json

    json.dumps(rows)  # JSON-able, as records must be


def test_a_bad_trace_is_refused():
    with pytest.raises(ValueError, match="'traceEvents'"):
        ce_profile.summarize_trace({"events": []})
    with pytest.raises(ValueError, match="expected a Chrome-trace dict"):
        ce_profile.summarize_trace("trace.json")
    with pytest.raises(ValueError, match="expected a Chrome-trace dict"):
        ce_profile.host_calls([1, 2])


def _records(world=2, kind="Memcpy DtoD"):
    """Records as ``profile_two_shot_ce`` writes them, for ``world`` ranks."""
    rows = ce_profile.summarize_trace(_trace())[:3]
    out = []
    for rank in range(world):
        for i, row in enumerate(rows):
            row = dict(row, activity_kind=kind if row["activity"] == "memcpy" else row["activity_kind"])
            out.append(
                {
                    "kind": "ce_profile",
                    "impl": "labkit_two_shot_ce_in_place",
                    "op": "all_reduce",
                    "world_size": world,
                    "bytes": 256 << 20,
                    "dtype": "bfloat16",
                    "busbw_GBps": None,
                    "rank": rank,
                    "index": i,
                    "correct": True,
                    "host_calls": "cudaMemcpyAsync x1",
                    **row,
                }
            )
    return out


def test_verdict_and_table_from_records():
    recs = _records()
    assert ce_profile.verdict(recs) == (
        "2 ranks, 256 MiB in place, one call: every rank: 2 kernels and 1 copy "
        "(Memcpy DtoD); no kernel named like a copy"
    )
    table = ce_profile.summary_markdown(recs).splitlines()
    assert len(table) == 2 + 3
    assert (
        "| 1 | memcpy | Memcpy DtoD | `Memcpy DtoD (Device -> Device)` | 7 | 10.0 | 370.0 | 134217728 | 363 |" in table
    )
    many = [dict(recs[0], index=i, start_us=float(i)) for i in range(20)]
    table = ce_profile.summary_markdown(many).splitlines()
    assert len(table) == 2 + ce_profile.MAX_ROWS + 1 and "5 more" in table[-1]
    assert ce_profile.summary_markdown(recs, rank=3) == ""
    odd = _records() + [dict(_records()[0], rank=1, index=3, name="elementwise_kernel<...>", copy_kernel=True)]
    assert "the ranks differ" in ce_profile.verdict(odd) and "kernels named like a copy" in ce_profile.verdict(odd)


def test_no_profile_says_why():
    assert ce_profile.verdict([]) == "no profile of two_shot_ce here (recorded before it)"
    skipped = [{"kind": "ce_profile", "us": None, "skipped": "needs GPUs"}]
    assert ce_profile.verdict(skipped) == "no profile of two_shot_ce here: needs GPUs"
    assert ce_profile.summary_markdown(skipped) == ""
    from labkit.workbench import results

    for rs in results.load_references("collectives").values():
        if not ce_profile.profile_records(rs.records):
            assert ce_profile.verdict(rs.records).startswith("no profile of two_shot_ce here")


@pytest.mark.skipif(not tier.interpreted() and torch.cuda.is_available(), reason="the CPU tier's skipped record")
def test_off_gpus_the_profile_is_a_skipped_record():
    (rec,) = run_ranks(ce_profile.profile_two_shot_ce, 2, 4096, timeout=120).unwrap()[0]
    assert set(bench.REQUIRED) <= set(rec)
    assert rec["kind"] == "ce_profile" and rec["us"] is None and "needs GPUs" in rec["skipped"]
    with pytest.raises(ValueError, match="nbytes: expected a positive int"):
        ce_profile.profile_two_shot_ce(None, 0)


@pytest.mark.multigpu
@pytest.mark.skipif(
    tier.interpreted() or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="the copy engines and CUPTI need 2 GPUs",
)
def test_one_profiled_call_on_gpus_shows_copies_between_two_kernels():
    recs = run_ranks(ce_profile.profile_two_shot_ce, 2, 16 << 20, timeout=300).unwrap()[0]
    assert all(r["correct"] is True for r in recs), recs[:1]
    for rank in (0, 1):
        rs = [r for r in recs if r.get("rank") == rank]
        kinds = [r["activity"] for r in rs]
        assert kinds.count("memcpy") == 1, rs  # W-1 copies
        assert [r["name"] for r in rs if r["activity"] == "kernel"][-1] == "two_shot_ce_kernel"
