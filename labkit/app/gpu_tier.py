"""``labkit gpu-tier``: the GPU tier. The same tests and notebooks as CI, at full size, plus the
reference benchmarks, in parts that each fit one call of a machine lent for a few minutes.

Each step is one child process (``PY -m labkit doctor``, ``PY -m pytest``, ``PY -m labkit run``,
``PY -m labkit bench LAB``), started from the repository root with an argument list, its output
shown on the console and, for the doctor and the tests, written to a log as well. Every step runs
even if an earlier one failed. ``DIR/gpu_tier.json`` gathers each step's part, exit code, seconds
and commit over the calls made with the same DIR (a step run again replaces its entry).
``scripts/gpu_tier.sh`` runs this command with the same arguments.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from labkit import MULTICAST_OFF
from labkit.app.benchmarks import BENCHMARKS
from labkit.workbench.errors import UsageError
from labkit.workbench.results import REPO_ROOT

#: The parts that are not one benchmark, in the order they run.
MAIN_PARTS = ("all", "doctor", "tests", "notebooks", "bench")
#: What every child process gets on top of this process's environment (TRITON_INTERPRET is
#: removed: the steps run compiled kernels on the GPUs).
CHILD_ENV = {**MULTICAST_OFF, "PYTHONUNBUFFERED": "1"}
#: The tests part's pytest options before -k, the shard and the junit file. No MPLBACKEND is set:
#: ``labkit run`` gives each notebook's kernel the inline backend itself (so figures appear in
#: the executed notebooks), and the tests that draw choose Agg themselves.
PYTEST_ARGS = ("-ra", "-p", "no:cacheprovider", "-m", "not notebook")


def parts() -> list[str]:
    """Every valid ``--part``, in the order the parts run."""
    return [*MAIN_PARTS, *(f"bench:{lab}" for lab in BENCHMARKS)]


def description() -> str:
    """The text of ``labkit gpu-tier --help`` above the options: the parts and what they write."""
    labs = textwrap.fill(" ".join(BENCHMARKS), width=96, initial_indent=" " * 19, subsequent_indent=" " * 19)
    return f"""\
The GPU tier: the same tests and notebooks as CI, at full size, plus the reference benchmarks.
Run it on a GPU node from a checkout of the repository (scripts/gpu_tier.sh runs it too).

--part: what to run (default: all). Give it several times for several parts; they run in the
        order of this list, each once. Parts that fit one call of a few minutes each:
  all              everything below (the whole tier, as one long call)
  doctor           labkit doctor                                  -> doctor.txt
  tests            pytest without the notebook tests (-m "not notebook"; the notebooks run in
                   the part 'notebooks' instead, once)            -> pytest.log, pytest.xml
                   (with --shard K/N: pytest-K-of-N.log, .xml)
  notebooks        every notebook with the gpu profile (labkit run) -> runs/
  bench            every reference benchmark below
  bench:LAB        one reference benchmark, labkit bench LAB --profile gpu --reference, LAB one of
{labs}
                                                               -> reference/<machine>/LAB.json
                   (litmus, litmus_two_gpus, broken_barriers and collectives run in budgeted,
                   resumable calls: docs/gpu-tier.md, "Resumable benchmarks")

Writes into DIR: doctor.txt, pytest.log + pytest.xml, runs/ (executed notebooks, summary,
index), reference/<machine>/<lab>.json (to be committed), and gpu_tier.json (each step's part,
exit code, seconds and commit). Calls with the same DIR add to gpu_tier.json: a step run again
replaces its earlier entry. Where the tree was copied, set LABKIT_GIT_COMMIT to the commit it was
copied from, so the results name it (without it the command warns when the checkout's HEAD may
not be the tree). Every step runs even if an earlier one failed; the exit status is 1 if a step
of this call failed, 2 if the arguments are wrong."""


def add_arguments(p) -> None:
    """The options of ``labkit gpu-tier`` (those of scripts/gpu_tier.sh)."""
    p.add_argument("--out", metavar="DIR", help="where everything goes (required)")
    p.add_argument(
        "--part", dest="parts", action="append", metavar="PART", help="a part to run (repeatable; default all)"
    )
    p.add_argument(
        "--only", action="append", metavar="NOTEBOOK", help="the part 'notebooks' runs only these (repeatable)"
    )
    p.add_argument("-k", dest="kexpr", metavar="EXPR", help="the part 'tests' runs only what pytest -k EXPR selects")
    p.add_argument(
        "--shard",
        metavar="K/N",
        help="the part 'tests' runs only the K-th of N shards (a test's shard: its node id's CRC-32 mod N; "
        "step tests-K-of-N)",
    )
    p.add_argument(
        "--split-gpus",
        metavar="G",
        help="the part 'tests' as G pytest processes at once, process i seeing GPU i alone "
        "(CUDA_VISIBLE_DEVICES=i), then one pytest seeing every GPU for the tests they skipped",
    )
    p.add_argument(
        "--wheels",
        metavar="DIR",
        help="install the wheels in DIR (scripts/prepare_wheels.sh) into the output's own site folder first",
    )
    p.add_argument("--python", metavar="PY", help="the Python every step runs (default: $PYTHON, else this Python)")
    p.add_argument("--dry-run", action="store_true", help="print the steps the parts select, one a line; run nothing")
    p.add_argument("--list-parts", action="store_true", help="print the valid parts, one a line, and exit")


# ---- the plan: which steps the options select


@dataclass(frozen=True)
class Options:
    out: str
    parts: tuple[str, ...]
    only: tuple[str, ...] = ()
    kexpr: str | None = None
    shard: tuple[int, int] | None = None
    split: int | None = None
    wheels: str | None = None
    python: str = "python3"
    dry_run: bool = False

    def wanted(self, part: str) -> bool:
        """Was PART asked for, itself or through 'all' or 'bench'?"""
        return any(p in ("all", part) or (p == "bench" and part.startswith("bench:")) for p in self.parts)


def options(args) -> Options:
    """The checked options of a parsed command line; a ``UsageError`` naming the option if wrong."""
    for flag, value in (
        ("--out", args.out),
        ("--wheels", args.wheels),
        ("--python", args.python),
        ("-k", args.kexpr),
        ("--shard", args.shard),
        ("--split-gpus", args.split_gpus),
        *(("--part", v) for v in args.parts or ()),
        *(("--only", v) for v in args.only or ()),
    ):
        if value is not None and not value:
            raise UsageError(f"{flag} needs a value")
    chosen = tuple(args.parts or ["all"])
    valid = parts()
    for p in chosen:
        if p not in valid:
            raise UsageError(f"unknown part {p!r}; valid parts: {' '.join(valid)}")
    if not args.out:
        raise UsageError("--out DIR is required")
    shard = None
    if args.shard is not None:
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit() and k.isascii() and n.isascii() and 1 <= int(k) <= int(n)):
            raise UsageError(f"--shard needs K/N with 1 <= K <= N, e.g. 1/3 (got {args.shard!r})")
        shard = (int(k), int(n))
    split = None
    if args.split_gpus is not None:
        g = args.split_gpus
        if not (g.isdigit() and g.isascii() and int(g) >= 2):
            raise UsageError(f"--split-gpus needs a number of GPUs G >= 2 (got {g!r})")
        split = int(g)
    return Options(
        out=args.out,
        parts=chosen,
        only=tuple(args.only or ()),
        kexpr=args.kexpr,
        shard=shard,
        split=split,
        wheels=args.wheels,
        python=args.python or os.environ.get("PYTHON") or sys.executable,
        dry_run=args.dry_run,
    )


@dataclass(frozen=True)
class Step:
    """One child process: its part, its name in gpu_tier.json, its argument list, and where its
    output goes besides the console (``log``; ``both``: stderr as well as stdout)."""

    part: str
    name: str
    argv: tuple[str, ...]
    log: str | None = None
    both: bool = False

    def shown(self) -> str:
        cmd = shlex.join(self.argv)
        if self.log is None:
            return cmd
        return f"{cmd}{' 2>&1' if self.both else ''} | tee {shlex.quote(self.log)}"


@dataclass(frozen=True)
class SplitTests:
    """The part 'tests' over G GPUs: one pytest per GPU at once (``per_gpu[i]`` sees GPU i alone,
    its output only in its log), then ``every_gpu`` on the tests they skipped (``skipped``)."""

    per_gpu: tuple[Step, ...]
    every_gpu: Step
    skipped: str


def plan(o: Options, out: str) -> list[Step | SplitTests]:
    """The steps the options select, in the order they run, writing into ``out``."""
    py = o.python
    steps: list[Step | SplitTests] = []
    if o.wanted("doctor"):
        steps.append(Step("doctor", "doctor", (py, "-m", "labkit", "doctor"), log=f"{out}/doctor.txt"))
    if o.wanted("tests"):
        steps.append(_tests(o, out))
    if o.wanted("notebooks"):
        run = [py, "-m", "labkit", "run", "--profile", "gpu", "--runs-dir", f"{out}/runs", "--no-progress"]
        if o.only:
            run += ["--only", *o.only]
        steps.append(Step("notebooks", "notebooks", tuple(run)))
    for lab in BENCHMARKS:
        if o.wanted(f"bench:{lab}"):
            argv = (py, "-m", "labkit", "bench", lab, "--profile", "gpu", "--reference", "--out", f"{out}/reference")
            steps.append(Step(f"bench:{lab}", f"bench-{lab.replace('_', '-')}", argv))
    return steps


def _tests(o: Options, out: str) -> Step | SplitTests:
    pytest = [o.python, "-m", "pytest", *PYTEST_ARGS] + (["-k", o.kexpr] if o.kexpr is not None else [])
    name, log = "tests", "pytest"
    k, n = o.shard or (1, 1)
    if o.shard:
        name, log = f"tests-{k}-of-{n}", f"pytest-{k}-of-{n}"
    if not o.split:
        shard = ["--labkit-shard", f"{k}/{n}"] if o.shard else []
        return Step("tests", name, (*pytest, *shard, f"--junitxml={out}/{log}.xml"), log=f"{out}/{log}.log", both=True)
    skipped = f"{out}/{log}.skipped"
    per_gpu = []
    for i in range(o.split):
        # shard K of N dealt again over the GPUs: GPU i runs shard K + N i of N G (a test's shard
        # is its node id's CRC-32 mod N G: the G of them together are shard K of N)
        argv = (
            *pytest,
            "--labkit-shard",
            f"{k + n * i}/{n * o.split}",
            f"--labkit-skips-to={skipped}.gpu{i}",
            f"--junitxml={out}/{log}-gpu{i}.xml",
        )
        per_gpu.append(Step("tests", f"{name}-gpu{i}", argv, log=f"{out}/{log}-gpu{i}.log", both=True))
    every = (*pytest, f"--labkit-nodeids={skipped}", f"--junitxml={out}/{log}-all-gpus.xml")
    return SplitTests(
        per_gpu=tuple(per_gpu),
        every_gpu=Step("tests", f"{name}-all-gpus", every, log=f"{out}/{log}-all-gpus.log", both=True),
        skipped=skipped,
    )


def dry_run_lines(steps: list[Step | SplitTests]) -> list[str]:
    """What ``--dry-run`` prints: ``PART NAME: COMMAND`` for each step, in order."""
    lines = []
    for s in steps:
        if isinstance(s, Step):
            lines.append(f"{s.part} {s.name}: {s.shown()}")
            continue
        for i, g in enumerate(s.per_gpu):
            lines.append(f"{g.part} {g.name}: CUDA_VISIBLE_DEVICES={i} {_to_log(g)} (at once)")
        e = s.every_gpu
        lines.append(f"{e.part} {e.name}: {e.shown()} (after them: the tests they skipped)")
    return lines


def _to_log(s: Step) -> str:
    """A per-GPU run's command line: its output goes to its log alone."""
    return f"{shlex.join(s.argv)} > {shlex.quote(s.log)} 2>&1"


# ---- the commit the results name


def commit_check(root: Path, out: Path | None = None, git: str = "git") -> tuple[str | None, str | None]:
    """(the commit this call's steps run at, a one-line warning or None).

    LABKIT_GIT_COMMIT wins when set. Otherwise the checkout's HEAD, only when ``git status`` finds
    the tree equal to it (the output folder ``out`` left out): a tree copied with a stale .git
    carries a HEAD that is not its state, and every results file would name that HEAD."""
    if os.environ.get("LABKIT_GIT_COMMIT"):
        return os.environ["LABKIT_GIT_COMMIT"], None
    hint = "set LABKIT_GIT_COMMIT to the commit this tree was copied from"

    def _git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True, timeout=60)

    try:
        head = _git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            why = (head.stderr.strip().splitlines() or ["git rev-parse HEAD failed"])[-1]
            return None, f"LABKIT_GIT_COMMIT is not set and {root} has no readable git HEAD ({why}): {hint}"
        exclude = []
        if out is not None and out.resolve().is_relative_to(root.resolve()) and out.resolve() != root.resolve():
            exclude = [f":(exclude){out.resolve().relative_to(root.resolve()).as_posix()}"]
        status = _git("status", "--porcelain", "--", ".", *exclude)
    except FileNotFoundError:
        return None, f"LABKIT_GIT_COMMIT is not set and git is not installed: the commit is unknown; {hint}"
    except subprocess.TimeoutExpired:
        return None, f"LABKIT_GIT_COMMIT is not set and git did not answer in 60 s: {hint}"
    commit = head.stdout.strip()
    if status.returncode != 0:
        why = (status.stderr.strip().splitlines() or ["git status failed"])[-1]
        return (
            None,
            f"LABKIT_GIT_COMMIT is not set and git status failed ({why}): HEAD {commit} may not be this tree; {hint}",
        )
    changed = [line for line in status.stdout.splitlines() if line.strip()]
    if changed:
        return None, (
            f"LABKIT_GIT_COMMIT is not set and the tree differs from its git HEAD {commit} "
            f"({len(changed)} paths in git status --porcelain, e.g. {changed[0][3:]}): the results "
            f"will name {commit}, which may not be this tree; {hint}"
        )
    return commit, None


# ---- running


def child_env(root: Path, site: str | None = None) -> dict[str, str]:
    """This process's environment for the steps: multicast off, unbuffered output, no Triton
    interpreter, and PYTHONPATH with the repository root first (then the wheels' site folder)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CHILD_ENV)
    paths = [str(root)] + ([site] if site else [])
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _say(text: str) -> None:
    print(f"=== gpu_tier: {text}", flush=True)


def _exit_code(rc: int) -> int:
    """A child killed by signal S counts as 128 + S, as a shell reports it."""
    return 128 - rc if rc < 0 else rc


def _console_write(chunk: bytes) -> None:
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        buffer.write(chunk)
        buffer.flush()
    else:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()


def run_step(s: Step, env: dict[str, str], cwd: Path) -> int:
    """Run one step; its output on the console, and in ``s.log`` as it comes; the exit code."""
    sys.stdout.flush()
    try:
        if s.log is None:
            return _exit_code(subprocess.run(list(s.argv), env=env, cwd=cwd).returncode)
        with open(s.log, "wb") as log:
            p = subprocess.Popen(
                list(s.argv), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if s.both else None
            )
            with p.stdout:
                while chunk := p.stdout.read1(65536):
                    _console_write(chunk)
                    log.write(chunk)
                    log.flush()
            return _exit_code(p.wait())
    except OSError as e:  # the Python is missing, or not executable: as a shell, 127
        print(f"labkit gpu-tier: {s.name}: cannot start {s.argv[0]}: {e}", file=sys.stderr, flush=True)
        return 127


def _timed(s: Step, env, cwd, record) -> None:
    _say(f"{s.name}: {s.shown()}")
    t0 = time.monotonic()
    rc = run_step(s, env, cwd)
    secs = round(time.monotonic() - t0)
    record(s.part, s.name, rc, secs)
    _say(f"{s.name}: exit {rc} after {secs} s")


def _split(s: SplitTests, env, cwd, record) -> None:
    """One pytest per GPU at once, then the tests they skipped on every GPU."""
    for path in (s.skipped, *glob.glob(glob.escape(s.skipped) + ".gpu*")):
        Path(path).unlink(missing_ok=True)
    t0 = time.monotonic()
    running = []
    for i, g in enumerate(s.per_gpu):
        _say(f"{g.name}: CUDA_VISIBLE_DEVICES={i} {_to_log(g)}")
        with open(g.log, "wb") as log:
            try:
                p = subprocess.Popen(
                    list(g.argv), env={**env, "CUDA_VISIBLE_DEVICES": str(i)}, cwd=cwd, stdout=log, stderr=log
                )
            except OSError as e:
                log.write(f"cannot start {g.argv[0]}: {e}\n".encode())
                p = None
        running.append(p)
    ended: dict[int, tuple[int, int]] = {}
    while len(ended) < len(running):
        for i, p in enumerate(running):
            if i in ended:
                continue
            rc = 127 if p is None else p.poll()
            if rc is not None:
                ended[i] = (_exit_code(rc), round(time.monotonic() - t0))
        if len(ended) < len(running):
            time.sleep(0.2)
    for i, g in enumerate(s.per_gpu):
        rc, secs = ended[i]
        record(g.part, g.name, rc, secs)
        _say(f"{g.name}: exit {rc} after {secs} s; its summary:")
        lines = Path(g.log).read_bytes().splitlines(keepends=True)[-3:]
        _console_write(b"".join(lines))
    with open(s.skipped, "wb") as joined:
        for path in sorted(glob.glob(glob.escape(s.skipped) + ".gpu*")):
            joined.write(Path(path).read_bytes())
    text = Path(s.skipped).read_text()
    if not text:
        _say(f"{s.every_gpu.name}: no test was skipped, nothing to run")
        return
    n = text.count("\n")
    _say(f"the per-GPU runs skipped {n} tests; now on every GPU")
    _timed(s.every_gpu, env, cwd, record)


def install_wheels(python: str, wheels: Path, site: Path, env: dict[str, str], cwd: Path) -> bool:
    """pip-install every wheel in ``wheels`` into ``site`` (nothing else on the node changes)."""
    found = sorted(glob.glob(str(wheels / "*.whl")))
    if not found:
        print(f"labkit gpu-tier: no wheels (*.whl) in {wheels}", file=sys.stderr)
        return False
    pip = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    pip += ["--upgrade", "--target", str(site), *found]
    sys.stdout.flush()
    try:
        return subprocess.run(pip, env=env, cwd=cwd).returncode == 0
    except OSError as e:
        print(f"labkit gpu-tier: cannot start {python}: {e}", file=sys.stderr)
        return False


def merge_record(path: Path, this: dict) -> None:
    """Add this call's parts and steps to gpu_tier.json; a step run again replaces its entry."""
    try:
        old = json.loads(path.read_text()) if path.exists() else {"parts": [], "steps": []}
        ran = {s["step"] for s in this["steps"]}
        doc = {
            "parts": list(dict.fromkeys([*old.get("parts", []), *this["parts"]])),
            "steps": [s for s in old.get("steps", []) if s["step"] not in ran] + this["steps"],
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        print(
            f"labkit gpu-tier: could not merge with the earlier {path.name}; it now holds this call only",
            file=sys.stderr,
        )
        doc = this
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def run(o: Options, root: Path = REPO_ROOT) -> int:
    """Run (or, with ``o.dry_run``, print) the steps; the exit status: 1 if a step failed."""
    if not (root / "tests").is_dir() or not (root / "notebooks").is_dir():
        raise UsageError(f"the GPU tier runs from a checkout of the repository (tests/, notebooks/); {root} is not one")
    if o.dry_run:
        for line in dry_run_lines(plan(o, o.out)):
            print(line)
        return 0
    out = Path(os.path.abspath(o.out))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {o.out}: cannot make the folder ({e.strerror or e})") from e
    commit, warning = commit_check(root, out)
    if warning:
        print(f"labkit gpu-tier: warning: {warning}", file=sys.stderr, flush=True)
    site = None
    if o.wheels:
        site = str(out / ".site")
        if not install_wheels(o.python, Path(os.path.abspath(o.wheels)), Path(site), child_env(root), root):
            print(f"labkit gpu-tier: installing wheels from {o.wheels} failed", file=sys.stderr)
            return 1
    env = child_env(root, site)
    done: list[dict] = []

    def record(part: str, name: str, rc: int, secs: int) -> None:
        done.append({"part": part, "step": name, "rc": rc, "seconds": secs, "git_commit": commit})

    try:
        for s in plan(o, str(out)):
            if isinstance(s, Step):
                _timed(s, env, root, record)
            else:
                _split(s, env, root, record)
    finally:
        shutil.rmtree(out / ".site", ignore_errors=True)
    this = {"parts": list(o.parts), "steps": done}
    path = out / "gpu_tier.json"
    merge_record(path, this)
    print(path.read_text(), end="")
    _say(f"this call: {json.dumps(this)}")
    return 1 if any(s["rc"] != 0 for s in done) else 0
