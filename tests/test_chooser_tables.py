"""The chooser's tables against the recorded sweeps they are read from: ``CE_FROM_BYTES`` (from
which size the in-place ``auto`` hands the first shot to the copy engines) for every world size
that a reference file of H200s records, and ``LAUNCH_TABLE`` (the default launches) against the
recorded launch search."""

import pytest

import labkit  # noqa: F401  (must precede kernel imports)
from labkit.kernels.comm import collectives as C
from labkit.workbench import results

CE, PUSHED = "labkit_two_shot_ce_in_place", "labkit_two_shot_in_place"


def _graph_times(records, impl, w):
    return {
        r["bytes"]: r["graph_us"]
        for r in records
        if r.get("kind") == "sweep" and r["impl"] == impl and r["world_size"] == w and r.get("graph_us")
    }


def _h200_sweeps():
    out = []
    for machine, rs in sorted(results.load_references("collectives").items()):
        if not machine.startswith("h200"):
            continue
        for w in sorted({r["world_size"] for r in rs.records if r.get("kind") == "sweep"}):
            out.append((machine, w, rs.records))
    return out


@pytest.mark.parametrize(
    ("machine", "w", "records"), _h200_sweeps(), ids=lambda v: v if isinstance(v, str | int) else ""
)
def test_ce_from_bytes_sits_between_the_last_loss_and_the_first_lasting_win(machine, w, records):
    ce, pushed = _graph_times(records, CE, w), _graph_times(records, PUSHED, w)
    sizes = sorted(set(ce) & set(pushed))
    assert sizes, f"{machine}: no {CE} / {PUSHED} pair at W={w}"
    wins = [ce[b] < pushed[b] for b in sizes]
    first_lasting = next((i for i in range(len(sizes)) if all(wins[i:])), None)
    if first_lasting is None:  # two_shot_ce never wins to the end: the chooser must not take it
        assert w not in C.CE_FROM_BYTES, f"{machine}: CE_FROM_BYTES[{w}] set, but two_shot_ce never wins for good"
        return
    assert w in C.CE_FROM_BYTES, f"{machine}: two_shot_ce wins from {sizes[first_lasting]} bytes at W={w}, no entry"
    lower = sizes[first_lasting - 1] if first_lasting else 0
    assert lower < C.CE_FROM_BYTES[w] <= sizes[first_lasting], (
        f"{machine}: CE_FROM_BYTES[{w}] = {C.CE_FROM_BYTES[w]} outside ({lower}, {sizes[first_lasting]}]"
    )


def test_every_table_entry_has_a_recorded_sweep():
    recorded = {w for _, w, _ in _h200_sweeps()}
    assert set(C.CE_FROM_BYTES) <= recorded, f"entries without a recorded H200 sweep: {set(C.CE_FROM_BYTES) - recorded}"


def test_launch_table_is_the_recorded_search():
    from labkit.labs.collectives.tune_bench import launch_table_from

    search = results.load_references("collectives_tune")["h200x4"].records
    assert C.LAUNCH_TABLE == launch_table_from(search)
    assert {nbytes for _, _, nbytes in C.LAUNCH_TABLE} <= set(C.TUNED_BYTES)


def test_launch_table_from_keeps_the_rule_unless_clearly_beaten():
    from labkit.labs.collectives.tune_bench import launch_table_from

    def rec(v, w, us, programs=132):
        return {
            "kind": "tune",
            "impl": "labkit_one_shot",
            "op": "all_reduce",
            "world_size": 4,
            "bytes": 1 << 20,
            "vectors": v,
            "num_warps": w,
            "programs": programs,
            "multiprocessors": 132,
            "correct": True,
            "us": us,
        }

    rule = C.rule_config(1 << 20, 4)
    assert launch_table_from([rec(*rule, 10.0), rec(4, 4, 9.8)]) == {}  # 2% faster: within the margin
    assert launch_table_from([rec(*rule, 10.0), rec(4, 4, 9.0)]) == {("one_shot", 4, 1 << 20): (4, 4)}
    assert launch_table_from([rec(*rule, 10.0), rec(4, 4, 5.0, programs=264)]) == {}  # two per SM: not a candidate
    assert launch_table_from([rec(*rule, 10.0), dict(rec(4, 4, 5.0), correct=False)]) == {}
