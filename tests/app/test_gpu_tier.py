"""``labkit gpu-tier`` (and scripts/gpu_tier.sh, which runs it) on the CPU tier: its parts (each
fits one call on a GPU machine) are the benchmark registry's labs, a wrong argument is refused in
one line naming it, --dry-run shows what each selection runs, and a run of stand-in steps (a fake
Python that records how it was called) shows what each step gets, where its output goes and what
gpu_tier.json keeps. No step here runs pytest, a notebook or a benchmark."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from labkit.app import cli, gpu_tier
from labkit.app.benchmarks import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_tier.sh"
PARTS = ["all", "doctor", "tests", "notebooks", "bench"] + [f"bench:{lab}" for lab in BENCHMARKS]
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.fixture(autouse=True)
def _python(monkeypatch):
    """The steps' Python, shown in every dry-run line: python3 unless a test says otherwise."""
    monkeypatch.setenv("PYTHON", "python3")


def _tier(*args):
    """The exit status of ``labkit gpu-tier ARGS...``, run in this process."""
    try:
        return cli.main(["gpu-tier", *args])
    except SystemExit as e:  # argparse's own errors and --help
        return e.code


def test_list_parts_are_the_benchmark_registry(capsys):
    assert _tier("--list-parts") == 0
    assert capsys.readouterr().out.split() == PARTS == gpu_tier.parts()


def test_usage_names_every_benchmark_in_registry_order(capsys):
    assert _tier("--help") == 0
    text = capsys.readouterr().out
    m = re.search(r"bench:LAB .*?LAB one of(.*?)->", text, re.S)
    assert m, text
    assert m.group(1).split() == list(BENCHMARKS)
    for part in ("all", "doctor", "tests", "notebooks", "bench"):
        assert re.search(rf"^  {part}\s", text, re.M), f"usage does not describe the part {part}"
    for option in ("--out", "--part", "--only", "-k", "--shard", "--split-gpus", "--wheels", "--python", "--dry-run"):
        assert re.search(rf"^  {option} ", text, re.M), f"usage does not describe {option}"


def _refused(capsys, *args, says):
    """The call exits with 2 and one line of stderr that says ``says``."""
    assert _tier(*args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    return lines[0]


def test_unknown_part_is_refused_in_one_line_naming_the_valid_ones(tmp_path, capsys):
    out = tmp_path / "X"
    line = _refused(capsys, "--part", "nonsense", "--out", str(out), says="unknown part 'nonsense'")
    assert line.startswith("labkit gpu-tier: error: ")
    assert line.split("valid parts: ", 1)[1].split() == PARTS
    assert not out.exists(), "nothing is made before the arguments are checked"


def test_wrong_arguments_name_the_option(tmp_path, capsys):
    _refused(capsys, "--part", "tests", says="--out DIR is required")
    for option in ("--out", "--part", "--only", "-k", "--wheels", "--python", "--shard", "--split-gpus"):
        args = ["--out", str(tmp_path / "o")] if option != "--out" else []
        _refused(capsys, *args, "--dry-run", option, "", says=f"{option} needs a value")
        assert _tier(*args, option) == 2  # argparse: no value at all
        assert f"argument {option}: expected one argument" in capsys.readouterr().err
    assert _tier("--out", str(tmp_path / "o"), "--bogus") == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _steps(capsys, *args, out):
    assert _tier("--dry-run", "--out", str(out), *args) == 0, capsys.readouterr().err
    assert not out.exists(), "a dry run makes nothing"
    text = capsys.readouterr().out
    return [line.split(": ", 1)[0] for line in text.splitlines()], text


def test_dry_run_each_selection(tmp_path, capsys):
    out = tmp_path / "out"
    bench = [f"bench:{lab} bench-{lab.replace('_', '-')}" for lab in BENCHMARKS]
    everything = ["doctor doctor", "tests tests", "notebooks notebooks"] + bench
    assert _steps(capsys, out=out)[0] == everything
    assert _steps(capsys, "--part", "all", out=out)[0] == everything
    assert _steps(capsys, "--part", "bench", out=out)[0] == bench
    steps, text = _steps(capsys, "--part", "doctor", out=out)
    assert text == f"doctor doctor: python3 -m labkit doctor | tee {out}/doctor.txt\n"
    # several parts: in the tier's order, each once
    steps, text = _steps(
        capsys,
        *("--part", "bench:collectives_links", "--part", "tests", "--part", "bench:collectives_links"),
        *("-k", "a and b"),
        out=out,
    )
    assert steps == ["tests tests", "bench:collectives_links bench-collectives-links"]
    assert text.splitlines()[0] == (
        "tests tests: python3 -m pytest -ra -p no:cacheprovider -m 'not notebook' -k 'a and b' "
        f"--junitxml={out}/pytest.xml 2>&1 | tee {out}/pytest.log"
    )
    assert text.splitlines()[1] == (
        f"bench:collectives_links bench-collectives-links: python3 -m labkit bench collectives_links "
        f"--profile gpu --reference --out {out}/reference"
    )
    steps, text = _steps(capsys, "--part", "notebooks", "--only", "start_here", "--only", "collectives", out=out)
    assert steps == ["notebooks notebooks"]
    assert text == (
        f"notebooks notebooks: python3 -m labkit run --profile gpu --runs-dir {out}/runs --no-progress "
        "--only start_here collectives\n"
    )
    # the steps' Python: --python, else $PYTHON, else the Python running the command
    assert _steps(capsys, "--part", "doctor", "--python", "/opt/py 3/python", out=out)[1].startswith(
        "doctor doctor: '/opt/py 3/python' -m labkit doctor"
    )


def test_the_default_python_is_the_one_running_the_command(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PYTHON")
    text = _steps(capsys, "--part", "doctor", out=tmp_path / "out")[1]
    assert text.startswith(f"doctor doctor: {sys.executable} -m labkit doctor"), text


def test_shards_of_the_tests_part(tmp_path, capsys):
    steps, text = _steps(capsys, "--part", "tests", "--shard", "2/3", out=tmp_path / "out")
    assert steps == ["tests tests-2-of-3"]
    assert "--labkit-shard 2/3 --junitxml=" in text and "pytest-2-of-3.log" in text and "pytest-2-of-3.xml" in text
    for bad in ("0/3", "4/3", "a/3", "3", "1/3/4", "²/3"):
        _refused(
            capsys,
            "--dry-run",
            "--out",
            str(tmp_path / "out"),
            "--part",
            "tests",
            "--shard",
            bad,
            says="--shard needs K/N",
        )


def test_split_gpus_runs_one_pytest_per_gpu_then_their_skips_on_every_gpu(tmp_path, capsys):
    out = tmp_path / "out"
    steps, text = _steps(capsys, "--part", "tests", "--shard", "2/3", "--split-gpus", "2", out=out)
    assert steps == ["tests tests-2-of-3-gpu0", "tests tests-2-of-3-gpu1", "tests tests-2-of-3-all-gpus"]
    gpu0, gpu1, every = text.splitlines()
    # shard 2 of 3 dealt again over 2 GPUs: shards 2 and 5 of 6, each process seeing one GPU
    assert gpu0 == (
        "tests tests-2-of-3-gpu0: CUDA_VISIBLE_DEVICES=0 python3 -m pytest -ra -p no:cacheprovider -m 'not notebook' "
        f"--labkit-shard 2/6 --labkit-skips-to={out}/pytest-2-of-3.skipped.gpu0 "
        f"--junitxml={out}/pytest-2-of-3-gpu0.xml > {out}/pytest-2-of-3-gpu0.log 2>&1 (at once)"
    )
    assert "CUDA_VISIBLE_DEVICES=1 " in gpu1 and "--labkit-shard 5/6 " in gpu1
    assert "CUDA_VISIBLE_DEVICES" not in every and f"--labkit-nodeids={out}/pytest-2-of-3.skipped " in every
    assert every.endswith(f"2>&1 | tee {out}/pytest-2-of-3-all-gpus.log (after them: the tests they skipped)")
    steps, _ = _steps(capsys, "--part", "tests", "--split-gpus", "3", out=out)
    assert steps == ["tests tests-gpu0", "tests tests-gpu1", "tests tests-gpu2", "tests tests-all-gpus"]
    for bad in ("1", "0", "two", "-2"):
        _refused(
            capsys,
            "--dry-run",
            "--out",
            str(out),
            "--part",
            "tests",
            f"--split-gpus={bad}",
            says="--split-gpus needs a number of GPUs",
        )


# ---- scripts/gpu_tier.sh runs the command


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_runs_the_command_with_its_arguments(tmp_path):
    """The wrapper hands every argument on as given (spaces kept), in the Python of --python (else
    $PYTHON, else python3), with this checkout first on PYTHONPATH, from any folder."""
    fake = tmp_path / "py"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$PYTHONPATH" "$@"\n')
    fake.chmod(0o755)
    args = ["--out", "o ut", "-k", "a and b", "--part", "tests", "--python", str(fake), "--dry-run"]
    env = {**os.environ, "PYTHONPATH": "/elsewhere"}
    p = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"{ROOT}:/elsewhere", "-m", "labkit", "gpu-tier", *args]
    p = subprocess.run(
        ["bash", str(SCRIPT), "--list-parts"],
        capture_output=True,
        text=True,
        env={**env, "PYTHON": str(fake)},
        timeout=60,
    )
    assert p.stdout.splitlines()[1:] == ["-m", "labkit", "gpu-tier", "--list-parts"]
    p = subprocess.run(
        ["bash", str(SCRIPT), f"--python={fake}", "-k", "x"], capture_output=True, text=True, env=env, timeout=60
    )
    assert p.stdout.splitlines()[1:] == ["-m", "labkit", "gpu-tier", f"--python={fake}", "-k", "x"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_prints_what_the_command_prints(tmp_path, capsys, monkeypatch):
    args = ["--dry-run", "--out", str(tmp_path / "o"), "--part", "tests", "--shard", "1/4", "--split-gpus", "2"]
    env = {**os.environ, "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    monkeypatch.setenv("PYTHON", sys.executable)
    assert _tier(*args) == 0
    assert p.stdout == capsys.readouterr().out


# ---- runs, with a fake Python standing in for every step

FAKE = """\
import json, os, sys
args = sys.argv[1:]
keys = ["CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PYTHONUNBUFFERED", "TRITON_INTERPRET", *{multicast}]
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({{"argv": args, "cwd": os.getcwd(), "env": {{k: os.environ.get(k) for k in keys}}}}) + "\\n")
if args[:2] == ["-m", "pip"]:
    os.makedirs(os.path.join(args[args.index("--target") + 1], "pkg"), exist_ok=True)
    sys.exit(int(os.environ.get("FAKE_PIP_RC", "0")))
for a in args:
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    if a.startswith("--labkit-skips-to=") and gpu in os.environ.get("FAKE_SKIP_ON", "").split(","):
        with open(a.split("=", 1)[1], "a") as f:
            f.write(f"tests/test_x.py::test_on_{{gpu}}[*]\\n")
print("stdout of", " ".join(args[1:4]), flush=True)
print("stderr of", " ".join(args[1:4]), file=sys.stderr, flush=True)
sys.exit(3 if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in " ".join(args) else 0)
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A stand-in Python for the steps; ``fake.calls()`` lists how each was started."""
    py = tmp_path / "bin" / "python"
    py.parent.mkdir()
    py.write_text(f"#!{sys.executable}\n" + FAKE.format(multicast=sorted(MULTICAST_OFF)))
    py.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setenv("PYTHON", str(py))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the steps run without it
    monkeypatch.setenv("LABKIT_GIT_COMMIT", "run-one")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.chdir(tmp_path)
    return SimpleNamespace(
        python=py, calls=lambda: [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    )


def _record(out: Path) -> dict:
    return json.loads((out / "gpu_tier.json").read_text())


def test_a_run_streams_each_step_logs_it_and_records_it(fake, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "bench collectives_links")
    rc = _tier(
        "--out", "out", "--part", "bench:collectives_links", "--part", "doctor", "--part", "tests", "-k", "a and b"
    )
    assert rc == 1, "a step failed"
    out = tmp_path / "out"
    calls = fake.calls()
    assert [c["argv"][:3] for c in calls] == [
        ["-m", "labkit", "doctor"],
        ["-m", "pytest", "-ra"],
        ["-m", "labkit", "bench"],
    ]
    assert calls[1]["argv"][-3:] == ["-k", "a and b", f"--junitxml={out}/pytest.xml"], "the folder made absolute"
    assert calls[2]["argv"][-2:] == ["--out", f"{out}/reference"]
    for c in calls:
        assert c["cwd"] == str(ROOT)
        assert c["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
        assert c["env"]["TRITON_INTERPRET"] is None and c["env"]["PYTHONUNBUFFERED"] == "1"
        assert all(c["env"][k] == v for k, v in MULTICAST_OFF.items())
    # the doctor's log holds its stdout, the tests' log both streams; the console has all of it
    assert (out / "doctor.txt").read_text() == "stdout of labkit doctor\n"
    assert (out / "pytest.log").read_text().splitlines() == ["stdout of pytest -ra -p", "stderr of pytest -ra -p"]
    console = capfd.readouterr()
    for line in (
        "stdout of labkit doctor",
        "stdout of pytest -ra -p",
        "stderr of pytest -ra -p",
        "stdout of labkit bench collectives_links",
    ):
        assert line in console.out + console.err
    assert "stderr of labkit doctor" in console.err, "the doctor's stderr: on the console, not in doctor.txt"
    assert "=== gpu_tier: bench-collectives-links: exit 3 after " in console.out
    record = _record(out)
    assert record["parts"] == ["bench:collectives_links", "doctor", "tests"]
    assert [(s["part"], s["step"], s["rc"], s["git_commit"]) for s in record["steps"]] == [
        ("doctor", "doctor", 0, "run-one"),
        ("tests", "tests", 0, "run-one"),
        ("bench:collectives_links", "bench-collectives-links", 3, "run-one"),
    ]
    assert all(isinstance(s["seconds"], int) for s in record["steps"])
    assert console.out.rstrip().endswith(
        '"rc": 3, "seconds": ' + str(record["steps"][2]["seconds"]) + ', "git_commit": "run-one"}]}'
    )

    # a second call with the same folder: its steps replace theirs, the others stay
    monkeypatch.delenv("FAKE_FAIL")
    monkeypatch.setenv("LABKIT_GIT_COMMIT", "run-two")
    assert (
        _tier("--out", "out", "--part", "bench:collectives_links", "--part", "notebooks", "--only", "collectives") == 0
    )
    record = _record(out)
    assert record["parts"] == ["bench:collectives_links", "doctor", "tests", "notebooks"]
    assert [(s["step"], s["rc"], s["git_commit"]) for s in record["steps"]] == [
        ("doctor", 0, "run-one"),
        ("tests", 0, "run-one"),
        ("notebooks", 0, "run-two"),
        ("bench-collectives-links", 0, "run-two"),
    ]
    assert fake.calls()[-2]["argv"][-2:] == ["--only", "collectives"]

    # a record that cannot be read is replaced by this call's, saying so
    (out / "gpu_tier.json").write_text("{not json")
    assert _tier("--out", "out", "--part", "doctor") == 0
    assert "could not merge with the earlier gpu_tier.json" in capfd.readouterr().err
    assert [s["step"] for s in _record(out)["steps"]] == ["doctor"]


def test_a_python_that_cannot_start_fails_its_steps(fake, tmp_path, capfd):
    assert (
        _tier("--out", "out", "--part", "doctor", "--part", "bench:fp8_dispatch", "--python", str(tmp_path / "absent"))
        == 1
    )
    assert [(s["step"], s["rc"]) for s in _record(tmp_path / "out")["steps"]] == [
        ("doctor", 127),
        ("bench-fp8-dispatch", 127),
    ]
    assert "doctor: cannot start" in capfd.readouterr().err


def test_split_gpus_runs_at_once_then_hands_the_skips_on(fake, tmp_path, capfd, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_SKIP_ON", "1")
    assert _tier("--out", "out", "--part", "tests", "--shard", "1/4", "--split-gpus", "2") == 0
    calls = fake.calls()
    calls[:2] = sorted(calls[:2], key=lambda c: c["env"]["CUDA_VISIBLE_DEVICES"])  # started at once
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in calls] == ["0", "1", None]
    assert [c["argv"][c["argv"].index("--labkit-shard") + 1] for c in calls[:2]] == ["1/8", "5/8"]
    assert calls[2]["argv"][-2:] == [
        f"--labkit-nodeids={out}/pytest-1-of-4.skipped",
        f"--junitxml={out}/pytest-1-of-4-all-gpus.xml",
    ]
    assert (out / "pytest-1-of-4.skipped").read_text() == "tests/test_x.py::test_on_1[*]\n"
    assert "stdout of pytest" in (out / "pytest-1-of-4-gpu0.log").read_text()
    assert (out / "pytest-1-of-4-all-gpus.log").read_text().startswith("stdout of pytest")
    console = capfd.readouterr().out
    assert "tests-1-of-4-gpu1: exit 0 after" in console and "its summary:\nstdout of pytest" in console
    assert "the per-GPU runs skipped 1 tests; now on every GPU" in console
    assert [s["step"] for s in _record(out)["steps"]] == [
        "tests-1-of-4-gpu0",
        "tests-1-of-4-gpu1",
        "tests-1-of-4-all-gpus",
    ]

    # none skipped: no run on every GPU (and last call's list is not handed on again)
    monkeypatch.setenv("FAKE_SKIP_ON", "")
    monkeypatch.setenv("FAKE_FAIL", "--labkit-shard 5/8")
    assert _tier("--out", "out", "--part", "tests", "--shard", "1/4", "--split-gpus", "2") == 1
    assert len(fake.calls()) == 5
    assert "tests-1-of-4-all-gpus: no test was skipped, nothing to run" in capfd.readouterr().out
    assert [(s["step"], s["rc"]) for s in _record(out)["steps"]] == [
        ("tests-1-of-4-all-gpus", 0),
        ("tests-1-of-4-gpu0", 0),
        ("tests-1-of-4-gpu1", 3),
    ]


def test_wheels_go_into_the_output_folder_and_are_removed_after(fake, tmp_path, capfd, monkeypatch):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "papermill-2.6-py3-none-any.whl").write_bytes(b"")
    assert _tier("--out", "out", "--part", "doctor", "--wheels", "whl") == 0
    pip, doctor = fake.calls()
    site = str(tmp_path / "out" / ".site")
    assert pip["argv"][:4] == ["-m", "pip", "install", "-q"] and pip["argv"][-3:] == [
        "--target",
        site,
        str(wheels / "papermill-2.6-py3-none-any.whl"),
    ]
    assert doctor["env"]["PYTHONPATH"].split(os.pathsep)[:2] == [str(ROOT), site]
    assert not (tmp_path / "out" / ".site").exists()
    monkeypatch.setenv("FAKE_PIP_RC", "1")
    assert _tier("--out", "out", "--part", "doctor", "--wheels", "whl") == 1
    assert "installing wheels from whl failed" in capfd.readouterr().err and len(fake.calls()) == 3, "no step ran"
    assert _tier("--out", "out", "--part", "doctor", "--wheels", "out") == 1
    assert "no wheels (*.whl) in" in capfd.readouterr().err


# ---- the commit the results name


def test_the_command_warns_once_when_the_commit_is_unsure(fake, tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("LABKIT_GIT_COMMIT")
    monkeypatch.setattr(gpu_tier, "commit_check", lambda root, out: (None, "the tree differs from its git HEAD"))
    assert _tier("--out", "out", "--part", "doctor") == 0
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["labkit gpu-tier: warning: the tree differs from its git HEAD"]
    assert _record(tmp_path / "out")["steps"][0]["git_commit"] is None


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_commit_is_head_only_where_the_tree_is_head(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_GIT_COMMIT", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    (repo / "out").mkdir()
    (repo / "out" / "gpu_tier.json").write_text("{}")
    assert gpu_tier.commit_check(repo, repo / "out") == (head, None), "the output folder is not the tree"
    (repo / "a.py").write_text("x = 2\n")  # a tree copied over a stale .git
    commit, warning = gpu_tier.commit_check(repo, repo / "out")
    assert commit is None and f"differs from its git HEAD {head}" in warning and "a.py" in warning
    assert "LABKIT_GIT_COMMIT" in warning and "\n" not in warning
    monkeypatch.setenv("LABKIT_GIT_COMMIT", "from-env")
    assert gpu_tier.commit_check(repo, repo / "out") == ("from-env", None)
    monkeypatch.delenv("LABKIT_GIT_COMMIT")
    commit, warning = gpu_tier.commit_check(repo, None, git=str(tmp_path / "no-git"))
    assert commit is None and "git is not installed" in warning
    shutil.rmtree(repo / ".git")
    commit, warning = gpu_tier.commit_check(repo, None)
    assert commit is None and "no readable git HEAD" in warning and "\n" not in warning


# ---- the sharding plugin (tests/sharding.py) that --shard and --split-gpus use


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
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\npytest_plugins = ['sharding']\n"
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
