"""``labkit bench collectives`` in parts: a machine whose calls cannot hold the whole benchmark
records it over several calls (``PARTS_ENV`` picks the parts, ``RESUME_ENV`` keeps the rest)."""

import datetime

import pytest

import labkit  # noqa: F401  (must precede kernel imports)
from labkit.labs.collectives import bench
from labkit.workbench import errors, gates, results


def _fake_part(name):
    def part(w):
        return [
            {
                "kind": name,
                "impl": f"fake_{name}",
                "op": "all_reduce",
                "world_size": w,
                "bytes": 1,
                "dtype": "bf16",
                "us": 1.0,
                "busbw_GBps": None,
                "correct": True,
            }
        ]

    return part


@pytest.fixture
def fake_bench(monkeypatch):
    """The benchmark with every part faked and the GPU gate open (2 GPUs)."""
    monkeypatch.setattr(bench, "PARTS", {name: _fake_part(name) for name in bench.PARTS})
    monkeypatch.setattr(gates, "requires", lambda **_: type("Open", (), {"check": lambda self: None})())
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.delenv(bench.PARTS_ENV, raising=False)
    monkeypatch.delenv(bench.RESUME_ENV, raising=False)


def _write(tmp_path, records, commit, monkeypatch):
    monkeypatch.setenv("LABKIT_GIT_COMMIT", commit)
    return results.write_results(
        tmp_path / f"{commit}.json", "collectives", records, generator="test", required=bench.REQUIRED
    )


def test_parts_to_run_orders_and_refuses_unknown():
    assert bench.parts_to_run(None) == list(bench.PARTS)
    assert bench.parts_to_run("crash, broken") == ["broken", "crash"]
    with pytest.raises(errors.UsageError, match=bench.PARTS_ENV):
        bench.parts_to_run("sweep,nonsense")


def test_all_parts_tagged_in_order(fake_bench):
    records = bench.benchmark("gpu")
    parts = [r.get("part") for r in records if r["kind"] != "crossover"]
    assert parts == list(bench.PARTS)
    assert all(r["world_size"] == 2 for r in records)
    assert [r["timing"] for r in records if r["kind"] == "crossover"] == ["us", "graph_us"]
    # each part's records say when it started (UTC) and how long it took
    for r in records:
        if r["kind"] != "crossover":
            assert datetime.datetime.fromisoformat(r["part_started"]).tzinfo is not None and r["part_s"] >= 0


def test_resume_keeps_other_parts_and_marks_their_commit(fake_bench, tmp_path, monkeypatch):
    first_parts = "sweep,host_cost"
    monkeypatch.setenv(bench.PARTS_ENV, first_parts)
    first = _write(tmp_path, bench.benchmark("gpu"), "commit-one", monkeypatch)
    # the next call, at another commit, runs the rest and keeps the first call's records
    monkeypatch.setenv(bench.PARTS_ENV, "host_cost,orders,push,into,broken,crash")
    monkeypatch.setenv(bench.RESUME_ENV, str(first))
    monkeypatch.setenv("LABKIT_GIT_COMMIT", "commit-two")
    records = [r for r in bench.benchmark("gpu") if r["kind"] != "crossover"]
    assert [r["part"] for r in records] == list(bench.PARTS)
    by_part = {r["part"]: r for r in records}
    assert by_part["sweep"]["resumed_from"] == "commit-one"  # kept from the first call
    assert "resumed_from" not in by_part["host_cost"]  # run again now: the newer measurement wins
    assert "resumed_from" not in by_part["crash"]


def test_resume_at_the_same_commit_leaves_no_mark(fake_bench, tmp_path, monkeypatch):
    monkeypatch.setenv(bench.PARTS_ENV, "sweep")
    first = _write(tmp_path, bench.benchmark("gpu"), "commit-three", monkeypatch)
    monkeypatch.setenv(bench.PARTS_ENV, "broken")
    monkeypatch.setenv(bench.RESUME_ENV, str(first))
    records = bench.benchmark("gpu")
    assert {r["part"] for r in records if "part" in r} == {"sweep", "broken"}
    assert not any("resumed_from" in r for r in records)


def test_resume_ignores_another_world_size(fake_bench, tmp_path, monkeypatch):
    monkeypatch.setenv(bench.PARTS_ENV, "sweep")
    first = _write(tmp_path, bench.benchmark("gpu"), "commit-four", monkeypatch)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    monkeypatch.setenv(bench.PARTS_ENV, "broken")
    monkeypatch.setenv(bench.RESUME_ENV, str(first))
    records = bench.benchmark("gpu")
    assert {r["part"] for r in records if "part" in r} == {"broken"}
