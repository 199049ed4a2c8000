"""Every exercise's check is held to three things, on the CPU tier:

* the solution (``labkit/labs/<lab>/solutions/<word>.py``) passes;
* the starter (the notebook's answer cell as the learner finds it) fails;
* every wrong answer in ``tests/exercise_mutants/<name>/`` fails (at least two each: plausible
  mistakes, not noise).

And the parts around them: every exercise has one answer cell and a check cell in its lab's
notebook, every lab 01-06 has at least three exercises of at least two kinds, a failed check never
raises, and ``labkit run --solutions`` runs the solutions in place of the starters.
"""

import functools
import json
import linecache
import zlib
from pathlib import Path

import nbformat
import pytest
import torch
from helpers import make_notebook

import labkit
from labkit.app import catalogue, exercises
from labkit.app.runner import run

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = Path(__file__).resolve().parents[1] / "exercise_mutants"
EXERCISES = exercises.all_exercises()


def _notebook_of(name: str) -> Path:
    lab = catalogue.by_number(name.split(".")[0])
    return ROOT / lab.notebook


def _starter(name: str) -> str:
    nb = nbformat.read(_notebook_of(name), as_version=4)
    return exercises.answer_cells(nb)[name].source


def _answer(name: str, source: str):
    """What the answer cell defines when it runs alone (answer cells import what they use). Its
    source goes into linecache under the name it is compiled with, as IPython does for a cell:
    ``@triton.jit`` reads a function's source back (inspect), which a bare ``exec`` would refuse
    outside the interpreter ("@jit functions should be defined in a Python file")."""
    filename = f"<answer {name} {zlib.crc32(source.encode()):08x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict = {"__name__": "__answer__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[EXERCISES[name].answer]


@functools.cache
def _verdict(name: str, source: str) -> tuple[bool, str]:
    """The verdict on an answer cell's text, computed once per test session (a check that runs a
    checker, such as 02.barrier's emulated world, takes seconds)."""
    return exercises.verdict(name, _answer(name, source))


def _mutants():
    return [(p.parent.name, p) for p in sorted(MUTANTS.glob("*/*.py"))]


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_solution_passes(name):
    passed, line = _verdict(name, exercises.solution(name))
    assert passed, line


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_starter_fails(name):
    passed, line = exercises.verdict(name, _answer(name, _starter(name)))
    assert not passed and line.startswith(f"FAIL {name}: ") and EXERCISES[name].hint in line, line


@pytest.mark.parametrize(("name", "path"), _mutants(), ids=[f"{n}-{p.stem}" for n, p in _mutants()])
def test_a_wrong_answer_fails(name, path):
    assert name in EXERCISES, f"{path}: no exercise {name}"
    passed, line = _verdict(name, path.read_text())
    assert not passed, f"{path.name} passed the check of {name}: {line}"


def test_02_barrier_catches_a_wait_that_does_not_wait_without_a_race():
    """A wait that is one compare-and-swap, not a loop, has the right atomics (the probe with the
    peer's signal passes it); the probe without the signal fails it, every time, whatever the
    machine's load (a race in the emulated world showed it only sometimes)."""
    from labkit.labs.collectives import atomics_probe

    source = (MUTANTS / "02.barrier" / "wait_once.py").read_text()
    rec = atomics_probe.run_recorded(
        _answer("02.barrier", source), {"peer_slot": 0, "my_slot": 1}, "peer_slot", "my_slot"
    )
    assert rec.memory == {"peer_slot": 1, "my_slot": 0}, "the probe with the signal should see the right protocol"
    for _ in range(3):
        passed, line = exercises.verdict("02.barrier", _answer("02.barrier", source))
        assert not passed and "the peer has not signalled yet" in line and "a loop" in line, line


@pytest.mark.skipif(
    labkit.TIER == "gpu" and torch.cuda.device_count() < 2,
    reason="02.barrier's collective needs two GPUs on the GPU tier (the CPU tier emulates them)",
)
def test_02_barrier_runs_labkit_check_collective_and_its_failure_reaches_the_learner(monkeypatch):
    """The solution's line says the checker passed; when labkit.check.collective fails an answer
    (here: a stand-in report), the learner reads its outcome and message."""
    import labkit.check as check
    from labkit.check import report as check_report

    passed, line = _verdict("02.barrier", exercises.solution("02.barrier"))
    assert passed and "labkit.check.collective passes" in line, line
    seen = []

    def failing(fn, world_size, make_inputs, **kwargs):
        seen.append((fn, world_size, make_inputs))
        return check_report.Report(
            "collective", fn, "failed", "wrong", "round 3, late rank 1: 17 of 4096 elements wrong", []
        )

    monkeypatch.setattr(check, "collective", failing)
    passed, line = exercises.verdict("02.barrier", _answer("02.barrier", exercises.solution("02.barrier")))
    assert seen == [
        ("labkit.labs.collectives.catch:peers_with_your_barrier", 2, "labkit.labs.collectives.catch:inputs")
    ]
    assert not passed and "labkit.check.collective says: wrong: round 3, late rank 1: 17 of 4096" in line, line


@pytest.mark.gpu
def test_03_record_runs_labkit_check_stream_safety_on_a_gpu():
    """On a GPU the check's second half is labkit.check.stream_safety on catch.backward_with: it
    passes the solution and fails every wrong answer by itself (not only through the recording
    streams of the first half)."""
    from labkit.check import stream_safety
    from labkit.labs.stream_races import catch

    passed, line = _verdict("03.record", exercises.solution("03.record"))
    assert passed and "labkit.check.stream_safety also passes" in line, line
    for path in sorted((MUTANTS / "03.record").glob("*.py")):
        r = stream_safety(catch.backward_with(_answer("03.record", path.read_text())), catch.inputs)
        assert r.status == "failed", f"{path.name}: {r.text()}"


@pytest.mark.multigpu
def test_05_state_runs_labkit_check_device_independence_on_two_gpus():
    """With two GPUs the check also runs labkit.check.device_independence on catch.forward_with_state:
    it passes the solution and fails every wrong answer by itself."""
    from labkit.check import device_independence
    from labkit.labs.fp8_dispatch import catch

    passed, line = _verdict("05.state", exercises.solution("05.state"))
    assert passed and "labkit.check.device_independence passes" in line, line
    for path in sorted((MUTANTS / "05.state").glob("*.py")):
        r = device_independence(
            catch.forward_with_state(_answer("05.state", path.read_text())), catch.inputs, isolate=False
        )
        assert not r.ok, f"{path.name}: {r.text()}"


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_each_exercise_has_two_wrong_answers_and_no_solution_text_in_its_hint(name):
    assert len(list((MUTANTS / name).glob("*.py"))) >= 2, f"tests/exercise_mutants/{name}/ needs two wrong answers"
    code = [ln.strip() for ln in exercises.solution(name).splitlines() if ln.strip() and not ln.startswith("#")]
    assert not any(ln in EXERCISES[name].hint for ln in code), "the hint gives the solution away"


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_each_exercise_has_its_cells_in_its_notebook(name):
    """One answer cell (metadata names the exercise) and, after it, a cell calling its check."""
    nb = nbformat.read(_notebook_of(name), as_version=4)
    cells = nb.cells
    (at,) = [i for i, c in enumerate(cells) if c.get("metadata", {}).get("labkit", {}).get("answer") == name]
    call = f'labkit.exercises.check("{name}", {EXERCISES[name].answer})'
    assert any(call in c.source for c in cells[at + 1 : at + 3] if c.cell_type == "code"), f"no `{call}` after it"
    assert "...Your turn" not in cells[at].source


@pytest.mark.parametrize("lab", ["01", "02", "03", "04", "05", "06"])
def test_every_lab_has_three_exercises_of_two_kinds(lab):
    mine = [e for e in EXERCISES.values() if e.lab == lab]
    assert len(mine) >= 3, f"lab {lab}: {len(mine)} exercises"
    assert len({e.kind for e in mine}) >= 2, f"lab {lab}: one kind only"


def test_a_check_that_breaks_is_a_failure_not_a_raise(capsys):
    """An answer the judge cannot handle, an unknown name, an unanswered cell: a FAIL line each."""
    some = sorted(EXERCISES)[0]
    assert exercises.check(some, ...) is False
    assert exercises.check("99.nothing", 1) is False
    assert exercises.check(some, object()) is False
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(line.startswith("FAIL ") for line in out), out
    assert "not answered yet" in out[0] and "99.nothing" in out[1]


def test_bad_registrations_are_refused():
    from labkit.workbench.exercises import exercise

    with pytest.raises(exercises.UsageError, match="NN.word"):
        exercise("1.x", kind="fix", question="q", answer="a", hint="h")
    with pytest.raises(exercises.UsageError, match="kind"):
        exercise("06.x", kind="guess", question="q", answer="a", hint="h")
    with pytest.raises(exercises.UsageError, match="answer"):
        exercise("06.x", kind="fix", question="q", answer="not a name", hint="h")


def test_solutions_are_injected_into_a_copy(tmp_path):
    """``labkit run --solutions``: the answer cell runs the solution, the check passes and its
    verdict reaches the run summary; the notebook on disk keeps its starter."""
    name = "06.forbid"
    folder = tmp_path / "notebooks"
    folder.mkdir()
    path = folder / "ex.ipynb"
    make_notebook(path, "N = 1", "import labkit", _starter(name), f'labkit.exercises.check("{name}", choice)')
    nb = nbformat.read(path, as_version=4)
    nb.cells[3].metadata["labkit"] = {"answer": name}
    nbformat.write(nb, path)
    profiles = folder / "profiles.yml"
    profiles.write_text("cpu:\n  timeout_s: 120\n  notebooks: {}\ngpu:\n  timeout_s: 120\n  notebooks: {}\n")
    for solutions, only, passed in ((False, False, False), (True, False, True), (True, True, True)):
        report = run(
            profile="cpu",
            runs_dir=tmp_path / f"runs-{solutions}-{only}",
            notebooks_dir=folder,
            profiles_file=profiles,
            progress=False,
            solutions=solutions,
            exercises_only=only,
        )
        (result,) = report.results
        assert result.status == "ran", result.detail
        assert [v["passed"] for v in result.exercises] == [passed]
        summary = json.loads((report.run_dir / "summary.json").read_text())
        assert summary["solutions"] is solutions and summary["exercises_only"] is only
        assert summary["results"][0]["exercises"][0]["exercise"] == name
        assert not (report.run_dir / ".solved").exists()
        assert report.exit_code == 0
    assert nbformat.read(path, as_version=4).cells[3].source == _starter(name)


@pytest.mark.parametrize("lab", ["01", "02", "03", "04", "05", "06"])
def test_exercises_only_keeps_every_exercise_and_drops_the_story(lab):
    """``labkit run --exercises-only``: the title, the parameters, ``import labkit``, and each
    exercise's statement, answer and check cells; nothing of the story between them."""
    names = [n for n in EXERCISES if n.startswith(lab + ".")]
    nb = nbformat.read(_notebook_of(names[0]), as_version=4)
    kept = exercises.exercise_cells(nb)
    assert "parameters" in kept[1].metadata.get("tags", []) and kept[2].source.startswith("import labkit")
    assert set(exercises.answer_cells(nbformat.v4.new_notebook(cells=kept))) == set(names)
    calls = [c for c in kept if "exercises.check(" in c.source]
    assert len(calls) >= len(names) and len(kept) < len(nb.cells)


def test_check_appends_its_verdict_and_read_verdicts_leaves_bad_lines_out(output_dir, capsys):
    """A check's verdict goes to exercises.jsonl; lines that are not verdicts (a notebook can write
    anything there) are left out and named, never a crash of the run (N115)."""
    some = sorted(EXERCISES)[0]
    output_dir.mkdir()
    (output_dir / exercises.VERDICTS_FILE).write_text('garbage\n{"exercise": 1, "passed": true}\n')
    assert exercises.check(some, ...) is False
    bad = []
    (got,) = exercises.read_verdicts(output_dir, bad)
    assert got["exercise"] == some and got["passed"] is False and got["line"].startswith("FAIL ")
    assert bad == ["exercises.jsonl line 1: not JSON (Expecting value)", "exercises.jsonl line 2: not a verdict"]
    assert exercises.read_verdicts(output_dir / "none") == []


def test_check_never_writes_its_verdict_through_a_symbolic_link(output_dir, tmp_path, capsys):
    """A link planted at exercises.jsonl (N86): the victim is untouched, the check still answers
    on stdout, and one line on stderr names the file."""
    some = sorted(EXERCISES)[0]
    output_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (output_dir / exercises.VERDICTS_FILE).symlink_to(victim)
    assert exercises.check(some, ...) is False
    out, err = capsys.readouterr()
    assert out.startswith(f"FAIL {some}: ") and victim.read_text() == "mine\n"
    assert err.strip().splitlines() == [
        f"labkit: verdict of {some} not recorded: {output_dir / exercises.VERDICTS_FILE}: is a symbolic link;"
        " labkit appends only to a plain file there"
    ]
    bad = []
    assert exercises.read_verdicts(output_dir, bad) == [] and bad == ["exercises.jsonl: not read (a symbolic link)"]
