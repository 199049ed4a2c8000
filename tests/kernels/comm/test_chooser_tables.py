"""The chooser's tables against the recordings they are read from: every ``tables.TABLES`` entry
(GPU, world size) equal to what ``crossovers_from``, ``fid_limits_from``, ``ce_from_bytes_from``
and ``launch_table_from`` compute from the files it names, and every recorded file's GPU and world
size a table; ``CE_FROM_BYTES`` (from which size the in-place ``auto`` hands the first shot to the
copy engines) between the sweep's last loss and first lasting win; ``LAUNCH_TABLE`` (the default
launches) against the recorded launch search. The product reads none of these files: labkit/kernels
imports no results reader, and a copy of the package installed into a fresh virtualenv, with no
reference/ beside it, chooses as the checkout does."""

import inspect
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import pip_installed_copy

import labkit  # noqa: F401  (must precede kernel imports)
from labkit.kernels.comm import collectives as C
from labkit.kernels.comm import tables as T
from labkit.workbench import results

ROOT = Path(__file__).resolve().parents[3]

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


# --- the typed tables, each against the file it names ------------------------------------------


def _gpu(rs) -> str:
    return rs.env["gpus"][0]["name"]


def _recorded(name: str) -> dict:
    """machine -> its ResultSet of ``name`` (collectives or collectives_tune)."""
    return dict(sorted(results.load_references(name).items()))


def test_every_table_is_what_its_recordings_give():
    from labkit.labs.collectives.bench import launch_table_from

    assert T.TABLES, "no chooser table"
    for (gpu, w), table in T.TABLES.items():
        assert (table.gpu, table.world_size) == (gpu, w)
        assert table.source and table.launch_source, f"{table.describe()}: a table names its recordings"
        rs = results.load_results(ROOT / table.source)
        assert _gpu(rs) == gpu, f"{table.source} was recorded on {_gpu(rs)}, not {gpu}"
        records = rs.records
        assert table.one_shot_up_to == T.crossovers_from(records)[w], (gpu, w)
        fid = T.fid_limits_from(records)
        assert (table.fid_out_of_place, table.fid_in_place) == (fid.get((w, False)), fid.get((w, True))), (gpu, w)
        assert table.ce_from == T.ce_from_bytes_from(records).get(w), (gpu, w)
        tune = results.load_results(ROOT / table.launch_source)
        assert _gpu(tune) == gpu, f"{table.launch_source} was recorded on {_gpu(tune)}, not {gpu}"
        searched = launch_table_from(tune.records)
        assert table.launches == {(k, size): v for (k, ww, size), v in searched.items() if ww == w}, (gpu, w)


def test_every_recording_has_its_table():
    """Each reference collectives.json is the table of its GPU and every world size it records a
    crossover for; two files of one GPU and world size would both claim one table (and fail)."""
    from labkit.labs.collectives.bench import launch_table_from

    for machine, rs in _recorded("collectives").items():
        for w in T.crossovers_from(rs.records):
            table = T.TABLES.get((_gpu(rs), w))
            assert table is not None, f"{machine}: no table for {_gpu(rs)} x{w}"
            assert table.source == f"reference/{machine}/collectives.json", (machine, w, table.source)
    for machine, rs in _recorded("collectives_tune").items():
        for w in {w for _, w, _ in launch_table_from(rs.records)}:
            assert (_gpu(rs), w) in T.TABLES, f"{machine}: a launch search at W={w}, no table"


def test_ce_from_bytes_from_is_the_geometric_middle():
    def sweep(w, impl, size, us):
        return {"kind": "sweep", "impl": impl, "world_size": w, "bytes": size, "graph_us": us}

    ce, pushed = T.CE_COMPARED
    sizes = (1 << 20, 4 << 20, 16 << 20, 64 << 20)
    recs = []
    for size, (a, b) in zip(sizes, ((1, 2), (3, 2), (1, 2), (1, 2))):  # a win, a loss, then wins
        recs += [sweep(2, ce, size, a), sweep(2, pushed, size, b)]
    recs += [sweep(4, ce, size, 1) for size in sizes] + [sweep(4, pushed, size, 2) for size in sizes]
    recs += [sweep(8, ce, sizes[0], 3), sweep(8, pushed, sizes[0], 2)]  # never wins: no entry
    assert T.ce_from_bytes_from(recs) == {2: 8 << 20, 4: 1 << 20}


def test_a_gpu_without_a_table_takes_the_defaults_and_says_so():
    h100 = "NVIDIA H100 80GB HBM3"
    assert all(gpu != h100 for gpu, _ in T.TABLES)
    table = T.table_for(h100, 4)
    assert table == T.defaults(h100, 4) and table.describe() == f"defaults (no table for {h100} x4)"
    assert (table.fid_out_of_place, table.fid_in_place, table.ce_from, table.launches) == (None, None, None, {})
    assert T.table_for(h100, 2).one_shot_up_to == T.ALWAYS
    assert table.one_shot_up_to == T.DEFAULT_CROSSOVER_ABOVE_2
    # the choices follow: no flag-in-data, no copy engines, the rule's launches
    assert C.auto_choice(4096, 4, h100, in_place=False, inbox=True) == "one_shot"
    assert C.auto_choice(1 << 30, 4, h100, in_place=True, workspace=True) == "two_shot"
    assert C.launch_for("one_shot", 1 << 20, 4, h100) == C.rule_config(1 << 20, 4)
    assert C.auto_choice(4096, 4, T.H200, in_place=False, inbox=True) == "flag_in_data"
    assert C.launch_for("one_shot", 1 << 20, 4, T.H200) == T.TABLES[(T.H200, 4)].launches[("one_shot", 1 << 20)]
    assert T.table_for(T.H200, 4).describe().startswith("NVIDIA H200 x4: reference/h200x4/collectives.json")
    with pytest.raises(TypeError, match="gpu: expected the name a GPU reports"):
        T.table_for(None, 2)
    with pytest.raises(ValueError, match="world_size: expected a positive int"):
        T.table_for(T.H200, 0)


def test_the_product_imports_no_reader_of_recordings():
    """labkit/kernels chooses from its typed tables: no module there imports the results reader or
    names the reference folder in code (docstrings may name the file a table was read off)."""
    import ast

    for path in sorted((ROOT / "labkit" / "kernels").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
                assert "labkit.workbench.results" not in names, f"{path}: imports the results reader"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("load_references", "REFERENCE_DIR", "load_results"), f"{path}: {node.attr}"


# --- an installed copy, away from the checkout -------------------------------------------------


def _answers() -> dict:
    """What the chooser answers for the recorded machines' keys, and a GPU without a table: run
    here and, by its source, in the installed copy."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import tables as T

    gpus = sorted({gpu for gpu, _ in T.TABLES} | {"NVIDIA H100 80GB HBM3"})
    kernels = sorted({k for t in T.TABLES.values() for k, _ in t.launches} | {"tree"})
    out = {}
    for gpu in gpus:
        for w in (2, 3, 4, 8):
            out[f"{gpu} x{w}"] = T.table_for(gpu, w).describe()
            for size in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20, 256 << 20):
                row = [C.choose(size, w, gpu=gpu), C.choose_in_place(size, w, True, gpu=gpu)]
                for in_place in (False, True):
                    row.append(C.auto_choice(size, w, gpu, in_place=in_place, inbox=True, workspace=True))
                row += [list(C.launch_for(k, size, w, gpu)) for k in kernels]
                out[f"{gpu} x{w} {size}"] = row
    return out


@pytest.mark.timeout(180)
def test_an_installed_copy_without_the_recordings_chooses_as_the_checkout(tmp_path):
    """The package copied without reference/, pip-installed (no dependencies: torch and triton
    come from this environment through a .pth file) and asked from a folder outside the checkout."""
    python, site, src = pip_installed_copy(tmp_path, timeout=150)
    shutil.rmtree(src)
    away = tmp_path / "elsewhere"
    away.mkdir()
    code = (
        "import json, pathlib, labkit\n"
        + inspect.getsource(_answers)
        + "home = pathlib.Path(labkit.__file__).resolve().parents[1]\n"
        + "print(json.dumps({'file': labkit.__file__, 'reference': (home / 'reference').exists(),"
        + " 'answers': _answers()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    res = subprocess.run([str(python), "-c", code], cwd=away, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    installed = json.loads(res.stdout.strip().splitlines()[-1])
    assert installed["file"].startswith(site), installed["file"]  # the installed copy, not the checkout
    assert installed["reference"] is False
    assert installed["answers"] == json.loads(json.dumps(_answers()))
