"""scripts/gpu_tier.sh on the CPU tier: its parts (each fits one call on a GPU machine) are the
benchmark registry's labs, a wrong part is refused in one line, and --dry-run shows what each
selection runs. Nothing here runs a step."""
import re
import shutil
import subprocess
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
    steps, text = _steps("--part", "bench:links", "--part", "tests", "--part", "bench:links", "-k", "a and b",
                         tmp_path=tmp_path)
    assert steps == ["tests tests", "bench:links bench-links"]
    assert re.search(r"-m not\\ notebook .*-k a\\ and\\ b --junitxml=\S*/pytest.xml$", text.splitlines()[0]), text
    steps, text = _steps("--part", "notebooks", "--only", "00_start_here", "--only", "02_collectives",
                         tmp_path=tmp_path)
    assert steps == ["notebooks notebooks"]
    assert "labkit run --profile gpu" in text and text.rstrip().endswith("--only 00_start_here 02_collectives")


def test_shards_of_the_tests_part(tmp_path):
    steps, text = _steps("--part", "tests", "--shard", "2/3", tmp_path=tmp_path)
    assert steps == ["tests tests-2-of-3"]
    assert "--labkit-shard 2/3 --junitxml=" in text and "pytest-2-of-3.log" in text and "pytest-2-of-3.xml" in text
    for bad in ("0/3", "4/3", "a/3", "3"):
        p = _tier("--dry-run", "--out", str(tmp_path / "out"), "--part", "tests", "--shard", bad)
        assert p.returncode == 2 and "--shard needs K/N" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_shards_deal_every_test_to_exactly_one_shard():
    from conftest import parse_shard, shard_of

    items = list(range(10))
    shards = [shard_of(items, k, 3) for k in (1, 2, 3)]
    assert [kept for kept, _ in shards] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert all(sorted(kept + dropped) == items for kept, dropped in shards)
    assert parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "x/3", "3"):
        with pytest.raises(pytest.UsageError, match="--labkit-shard"):
            parse_shard(bad)
