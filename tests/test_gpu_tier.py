"""scripts/gpu_tier.sh on the CPU tier: its parts (each fits one call on a GPU machine) are the
benchmark registry's labs, a wrong part is refused in one line, and --dry-run shows what each
selection runs. Nothing here runs a step."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.workbench.benchmarks import BENCHMARKS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_tier.sh"
PARTS = ["all", "doctor", "tests", "notebooks", "bench"] + [f"bench:{lab}" for lab in BENCHMARKS]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _tier(*args, cwd=ROOT):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_list_parts_are_the_benchmark_registry():
    p = _tier("--list-parts")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == PARTS


def test_usage_names_every_benchmark_in_registry_order():
    p = _tier("--help")
    assert p.returncode == 0, p.stderr
    m = re.search(r"bench:LAB .*?LAB one of(.*?)->", p.stdout, re.S)
    assert m, p.stdout
    assert m.group(1).split() == list(BENCHMARKS)
    for part in ("all", "doctor", "tests", "notebooks", "bench"):
        assert re.search(rf"^  {part}\s", p.stdout, re.M), f"usage does not describe the part {part}"


def test_unknown_part_is_refused_in_one_line_naming_the_valid_ones(tmp_path):
    out = tmp_path / "X"
    p = _tier("--part", "nonsense", "--out", str(out))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown part 'nonsense'" in lines[0], p.stderr
    assert lines[0].split("valid parts: ", 1)[1].split() == PARTS
    assert not out.exists(), "nothing is made before the arguments are checked"


def _steps(*args, tmp_path):
    p = _tier("--dry-run", "--out", str(tmp_path / "out"), *args)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "out").exists()
    return [line.split(": ", 1)[0] for line in p.stdout.splitlines()], p.stdout


def test_dry_run_each_selection(tmp_path):
    bench = [f"bench:{lab} bench-{lab.replace('_', '-')}" for lab in BENCHMARKS]
    everything = ["doctor doctor", "tests tests", "notebooks notebooks"] + bench
    assert _steps(tmp_path=tmp_path)[0] == everything
    assert _steps("--part", "all", tmp_path=tmp_path)[0] == everything
    assert _steps("--part", "bench", tmp_path=tmp_path)[0] == bench
    # several parts: in the tier's order, each once
    steps, text = _steps(
        "--part", "bench:links", "--part", "tests", "--part", "bench:links", "-k", "a and b", tmp_path=tmp_path
    )
    assert steps == ["tests tests", "bench:links bench-links"]
    assert re.search(r"-m not\\ notebook .*-k a\\ and\\ b --junitxml=\S*/pytest.xml$", text.splitlines()[0]), text
    steps, text = _steps(
        "--part", "notebooks", "--only", "00_start_here", "--only", "02_collectives", tmp_path=tmp_path
    )
    assert steps == ["notebooks notebooks"]
    assert "labkit run --profile gpu" in text and text.rstrip().endswith("--only 00_start_here 02_collectives")


def test_shards_of_the_tests_part(tmp_path):
    steps, text = _steps("--part", "tests", "--shard", "2/3", tmp_path=tmp_path)
    assert steps == ["tests tests-2-of-3"]
    assert "--labkit-shard 2/3 --junitxml=" in text and "pytest-2-of-3.log" in text and "pytest-2-of-3.xml" in text
    for bad in ("0/3", "4/3", "a/3", "3"):
        p = _tier("--dry-run", "--out", str(tmp_path / "out"), "--part", "tests", "--shard", bad)
        assert p.returncode == 2 and "--shard needs K/N" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_split_gpus_runs_one_pytest_per_gpu_then_their_skips_on_every_gpu(tmp_path):
    steps, text = _steps("--part", "tests", "--shard", "2/3", "--split-gpus", "2", tmp_path=tmp_path)
    assert steps == ["tests tests-2-of-3-gpu0", "tests tests-2-of-3-gpu1", "tests tests-2-of-3-all-gpus"]
    gpu0, gpu1, every = text.splitlines()
    # shard 2 of 3 dealt again over 2 GPUs: shards 2 and 5 of 6, each process seeing one GPU
    assert (
        "CUDA_VISIBLE_DEVICES=0 " in gpu0
        and "--labkit-shard 2/6 " in gpu0
        and "--labkit-skips-to=" in gpu0
        and "pytest-2-of-3.skipped.gpu0" in gpu0
    )
    assert "CUDA_VISIBLE_DEVICES=1 " in gpu1 and "--labkit-shard 5/6 " in gpu1
    assert "CUDA_VISIBLE_DEVICES" not in every and "--labkit-nodeids=" in every and "pytest-2-of-3.skipped " in every
    for bad in ("1", "0", "two"):
        p = _tier("--dry-run", "--out", str(tmp_path / "out"), "--part", "tests", "--split-gpus", bad)
        assert p.returncode == 2 and "--split-gpus needs a number of GPUs" in p.stderr


def test_the_split_deals_each_test_of_a_shard_to_exactly_one_gpu():
    """Shard K of N dealt again over G GPUs is shard K + N i of N G for GPU i: together the GPUs'
    shards are the shard."""
    from sharding import shard_of

    items = [f"tests/test_{i % 7}.py::test_{i}" for i in range(230)]
    for n, g in ((3, 2), (4, 2), (1, 2), (2, 4)):
        for k in range(1, n + 1):
            shard = shard_of(items, k, n, str)[0]
            per_gpu = [shard_of(items, k + n * i, n * g, str)[0] for i in range(g)]
            assert sorted(sum(per_gpu, [])) == sorted(shard) and sum(map(len, per_gpu)) == len(shard)


def test_skipped_tests_are_handed_on_by_node_id_or_for_every_parametrisation(tmp_path):
    from sharding import listed, read_nodeids

    path = tmp_path / "ids"
    path.write_text("t.py::a\nt.py::b[*]\n\n")
    wanted = read_nodeids(str(path))
    assert wanted == {"t.py::a", "t.py::b[*]"}
    assert listed("t.py::a", wanted) and listed("t.py::b[2]", wanted) and listed("t.py::b[4-x]", wanted)
    assert not listed("t.py::a[1]", wanted) and not listed("t.py::c", wanted) and not listed("t.py::bb[2]", wanted)
    # an empty parametrisation beside others: handed on as test[True-NOTSET], such a test would
    # match nothing in the second process and run in neither
    from sharding import handed_on, unmatched

    assert handed_on("t.py::b[NOTSET]") == "t.py::b[*]" and handed_on("t.py::b[True-NOTSET]") == "t.py::b[True-*]"
    assert handed_on("t.py::b[NOTSET-x]") == "t.py::b[*-x]" and handed_on("t.py::b[2]") == "t.py::b[2]"
    assert handed_on("t.py::a") == "t.py::a"
    mixed = {"t.py::b[True-*]"}
    assert listed("t.py::b[True-2]", mixed) and listed("t.py::b[True-4]", mixed)
    assert not listed("t.py::b[False-2]", mixed) and not listed("t.py::b[True]", mixed)
    assert unmatched(["t.py::a", "t.py::b[True-2]"], {"t.py::a", "t.py::b[True-*]"}) == []
    assert unmatched(["t.py::a"], {"t.py::a", "t.py::b[True-*]", "t.py::z"}) == ["t.py::b[True-*]", "t.py::z"]
    with pytest.raises(pytest.UsageError, match="--labkit-nodeids: cannot read"):
        read_nodeids(str(tmp_path / "absent"))


def test_the_recorder_writes_skips_and_marks_an_empty_parametrisation(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\npytest_plugins = ['sharding']\n"
    )
    (tmp_path / "test_some.py").write_text(
        "import os, pytest\n"
        "W = [2, 4] if os.environ.get('MORE') else []\n"
        "@pytest.mark.parametrize('w', W)\n"
        "def test_by_gpus(w):\n    pass\n"
        "@pytest.mark.parametrize('w', W)\n"
        "@pytest.mark.parametrize('flag', [False, True])\n"
        "def test_mixed(flag, w):\n    pass\n"
        "def test_skips():\n    pytest.skip('needs more')\n"
        "def test_runs():\n    pass\n"
    )
    skips = tmp_path / "skipped"

    def pytest_run(*args, **env):
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )

    first = pytest_run("--labkit-skips-to", str(skips))
    assert first.returncode == 0, first.stdout
    assert sorted(skips.read_text().split()) == [
        "test_some.py::test_by_gpus[*]",
        "test_some.py::test_mixed[False-*]",
        "test_some.py::test_mixed[True-*]",
        "test_some.py::test_skips",
    ]
    again = pytest_run("--labkit-nodeids", str(skips), "-vv", MORE="1")
    assert "test_by_gpus[2] PASSED" in again.stdout and "test_by_gpus[4] PASSED" in again.stdout
    assert all(f"test_mixed[{f}-{w}] PASSED" in again.stdout for f in ("False", "True") for w in (2, 4))
    assert "test_skips SKIPPED" in again.stdout and "test_runs" not in again.stdout
    assert "6 passed, 1 skipped, 1 deselected" in again.stdout
    # a handed-on id that the run on every GPU does not collect is refused, not dropped
    with open(skips, "a") as f:
        f.write("test_some.py::test_gone\n")
    lost = pytest_run("--labkit-nodeids", str(skips), MORE="1")
    assert lost.returncode == 4 and "1 listed test(s) match no collected test" in lost.stderr + lost.stdout
    assert "test_some.py::test_gone" in lost.stderr + lost.stdout


def test_shards_deal_every_test_to_exactly_one_shard():
    from sharding import parse_shard, shard_of

    items = [f"tests/test_a.py::test_{i}[p{i % 3}]" for i in range(600)]
    shards = [shard_of(items, k, 3, str) for k in (1, 2, 3)]
    assert sorted(sum((kept for kept, _ in shards), [])) == sorted(items)  # every test in one shard
    assert all(sorted(kept + dropped) == sorted(items) for kept, dropped in shards)
    assert all(150 <= len(kept) <= 250 for kept, _ in shards), [len(k) for k, _ in shards]  # about 200 each
    # a test's shard is its own: adding tests anywhere moves none of the others
    more = items[:300] + ["tests/test_a.py::test_new", "tests/test_0.py::test_first"] + items[300:]
    for k in (1, 2, 3):
        assert [t for t in shard_of(more, k, 3, str)[0] if t in items] == shards[k - 1][0]
    assert parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "x/3", "3"):
        with pytest.raises(pytest.UsageError, match="--labkit-shard"):
            parse_shard(bad)
