"""The house rules the folders promise, checked from the code itself.

Four floors, from the top: ``labkit.app`` (the command, runner, report, catalogue: it knows every
lab) -> ``labkit.labs.<lab>`` (one package of story code per lab) -> the product a user imports
(``labkit.check`` on ``labkit.kernels``) -> ``labkit.workbench`` (tools). A module imports modules
of its own floor or below, never above; a lab may import a lab it builds on, never in a cycle.
Every import counts, module-level or inside a function, and so does a string naming a module
(``"labkit.labs.x:fn"`` targets for the sandbox or the rank launcher, which a child process
imports by name): a string may name a module on its own floor or below, never above.

The top package (``labkit/__init__.py``) is the door, not a floor: importing it sets up the tier
(``workbench.tier``), so any module may import it, and it exposes two things from above, lazily:
``labkit.exercises`` (:mod:`labkit.app.exercises`) and ``labkit.check``.

Then every lab marked ready or draft has everything docs/adding-a-lab.md lists, declared once in
its manifest.

The tests mirror the package: a test of ``labkit/<floor>/<folder>/X.py`` is
``tests/<floor>/<folder>/test_X.py`` (``tests/labs/<lab>/`` for a lab, named as the lab is), and two
folders stand outside the floors: ``tests/notebooks/`` (the workbook executed, in the browser, as a
site) and ``tests/project/`` (promises of the repository as a whole). The modules that tests and
their child processes import by name (``rank_fns``, ``helpers``, ...) sit in ``tests/`` itself,
which conftest.py puts on sys.path; with no ``__init__.py`` in the tree, pytest imports every test
file by its basename, so no two may share one.
"""

import ast
import re
from pathlib import Path

import pytest
import yaml

from labkit.app import benchmarks, catalogue, report

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "labkit"
TESTS = ROOT / "tests"
#: test folders outside the floors: the workbook as a reader runs it, and the repository's promises
TESTS_OUTSIDE_FLOORS = ("notebooks", "project")
#: the floors, lowest first; the top package and ``__main__`` stand outside them
FLOORS = ("workbench", "kernels", "check", "labs", "app")
#: the imports that reach up from the top package: its two exposures, and ``__main__``'s command
TOP_EXPOSES = {
    ("labkit", "labkit.app.exercises"),
    ("labkit", "labkit.check"),
    ("labkit.__main__", "labkit.app.cli"),
}
MODULE_STRING = re.compile(r"^(labkit(?:\.\w+)+)(?::\w+)?$")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _references(path: Path) -> list[tuple[int, str, str]]:
    """(line, kind, labkit module) for every import and every module-naming string in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    refs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            refs += [(node.lineno, "import", a.name) for a in node.names if a.name.startswith("labkit")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("labkit"):
            # `from labkit.labs import x` imports labkit.labs.x: name the submodule where one exists
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    ROOT / Path(*sub.split("."))
                ).is_dir()
                refs.append((node.lineno, "import", sub if is_module else node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = MODULE_STRING.match(node.value)
            if m and m.group(1).split(".")[1] in (*FLOORS, "__main__"):  # "labkit.alloc_time": a tag, no module
                refs.append((node.lineno, "string", m.group(1)))
    return refs


def _layer(module: str) -> str:
    """'workbench', 'kernels', 'check', 'labs', 'labs.<lab>', 'app' or 'top' (labkit, its __main__)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "top"
    if parts[1] == "labs":
        return "labs" if len(parts) == 2 else f"labs.{parts[2]}"
    return parts[1]


def _floor(layer: str) -> int:
    """The layer's floor, 0 the lowest; the top package's is -1 (everyone may import it)."""
    if layer == "top":
        return -1
    return FLOORS.index(layer.split(".")[0])


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_floors_are_the_package():
    """Modules and packages only: a copied tree may carry folders Python or a tool left behind."""
    top = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert top == {"__init__.py", "__main__.py", *FLOORS}, "labkit/ holds the floors and nothing else"


def _violations(modules=MODULES):
    found = []
    for module, path in modules.items():
        src = _layer(module)
        for line, kind, target in _references(path):
            dst = _layer(target)
            if dst == "top" or (module, target) in TOP_EXPOSES:
                continue
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            where = f"{shown}:{line} ({kind}) -> {target}"
            if src == "top":
                if dst != "workbench":
                    found.append(f"the top package reaches up beyond its exposures: {where}")
            elif _floor(dst) > _floor(src):
                found.append(f"{src.split('.')[0]} reaches up to {dst.split('.')[0]}: {where}")
    return found


def test_imports_point_down_the_layers():
    assert _violations() == []


def _lab_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        src = _layer(module)
        if not src.startswith("labs."):
            continue
        graph.setdefault(src, set())
        for _, _, target in _references(path):
            dst = _layer(target)
            if dst.startswith("labs.") and dst != src:
                graph[src].add(dst)
    return graph


def test_labs_import_each_other_without_cycles():
    graph = _lab_graph()
    state: dict[str, str] = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                pytest.fail("labs import each other in a cycle: " + " -> ".join(stack + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_checker_sees_a_crossing(tmp_path):
    """The rule is not vacuous: an import or a string naming a module above is found, on every floor."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from labkit.labs.stream_races import race\n    return 'labkit.app.cli:main'\n")
    refs = _references(bad)
    assert [(k, t) for _, k, t in refs] == [("import", "labkit.labs.stream_races.race"), ("string", "labkit.app.cli")]
    assert _layer("labkit.labs.stream_races.race") == "labs.stream_races"
    assert _layer("labkit.kernels.comm.symm") == "kernels"
    assert len(_violations({"labkit.kernels.bad": bad})) == 2
    assert len(_violations({"labkit.check.bad": bad})) == 2
    assert len(_violations({"labkit.workbench.bad": bad})) == 2
    assert len(_violations({"labkit.labs.other.bad": bad})) == 1  # the string naming the app
    assert _violations({"labkit.app.bad": bad}) == []


def test_a_string_naming_a_module_names_one_that_exists():
    """Strings are imports a child process makes later: a typo there is a failure at run time."""
    missing = []
    for path in MODULES.values():
        for line, kind, target in _references(path):
            named = target if target in MODULES else target.rsplit(".", 1)[0]  # a module, or one's attribute
            if kind == "string" and named not in MODULES and not (ROOT / Path(*target.split("."))).is_dir():
                missing.append(f"{path.relative_to(ROOT)}:{line} names {target}")
    assert missing == []


# --- every lab has what a lab is made of -------------------------------------------------------

WRITTEN = [lab for lab in catalogue.LABS if lab.status in ("ready", "draft")]


def test_the_catalogue_is_every_lab_package():
    """A lab is one package plus one notebook: every package under labkit/labs/ is in the catalogue."""
    packages = {p.name for p in (PACKAGE / "labs").iterdir() if (p / "__init__.py").exists()}
    assert packages == {lab.name for lab in catalogue.LABS}
    assert [lab.number for lab in catalogue.LABS] == sorted({lab.number for lab in catalogue.LABS})


@pytest.mark.parametrize("lab", catalogue.LABS, ids=lambda lab: lab.name)
def test_every_target_a_manifest_names_exists(lab):
    """The manifest names the lab's own modules relative to its package: each one imports and holds
    what it says."""
    targets = [b.run for b in lab.benchmarks.values()] + [
        f"{b.run.split(':')[0]}:{b.required}" for b in lab.benchmarks.values()
    ]
    targets += list(lab.report.values()) + list(lab.figures.values())
    targets += [t for t in (lab.exercises, lab.catch, lab.parameters) if t is not None]
    for target in targets:
        assert lab.load(target) is not None, target


@pytest.mark.parametrize("lab", WRITTEN, ids=[lab.name for lab in WRITTEN])
def test_a_written_lab_has_every_part(lab):
    pkg_dir = ROOT / Path(*lab.package.split("."))
    missing = []
    if not (ROOT / lab.notebook).exists():
        missing.append(f"notebook {lab.notebook}")
    if not (pkg_dir / "widgets.py").exists():
        missing.append(f"{pkg_dir.relative_to(ROOT)}/widgets.py")
    if lab.parameters is None:
        missing.append("its parameter rules (manifest: parameters)")
    profiles = yaml.safe_load((ROOT / "notebooks" / "profiles.yml").read_text())
    for profile in ("cpu", "gpu"):
        if lab.name not in (profiles[profile].get("notebooks") or {}):
            missing.append(f"profiles.yml {profile}.notebooks.{lab.name}")
    if not lab.benchmarks:
        missing.append("a `labkit bench` entry (manifest: benchmarks)")
    for name in lab.benchmarks:
        if lab.status == "ready" and not list((ROOT / "reference").glob(f"*/{name}.json")):
            missing.append(f"reference/<machine>/{name}.json")  # a draft's are reported below
    if not _tests_importing(lab):
        missing.append(f"a test file in tests/labs/{lab.name}/ importing {lab.package}")
    if f"]({lab.notebook})" not in (ROOT / "README.md").read_text():
        missing.append("its README row (labkit labs --markdown)")
    assert missing == [], f"{lab.name} lacks: " + "; ".join(missing)


@pytest.mark.parametrize("lab", [lab for lab in catalogue.LABS if lab.status == "draft"], ids=lambda lab: lab.name)
def test_a_draft_lab_has_recorded_its_references(lab):
    """A draft lab (its notebook runs, parts or data still missing) may lack GPU reference data:
    reported as a skip naming the files, never hidden; a ready lab without them fails the test above."""
    absent = [
        f"reference/<machine>/{name}.json"
        for name in lab.benchmarks
        if not list((ROOT / "reference").glob(f"*/{name}.json"))
    ]
    if absent:
        pytest.skip(f"{lab.name} is a draft without recorded GPU results: {', '.join(absent)}")


def test_every_benchmark_is_a_labs_or_the_apps():
    """One name per lab: a lab's benchmarks are named for it (the manifest checks the prefix); the
    rest are the application's own (the doctor's report, the checkers' verdicts)."""
    owned = {name for lab in catalogue.LABS for name in lab.benchmarks}
    assert set(benchmarks.BENCHMARKS) - owned == {"doctor", "checkers"}
    recorded = {p.stem for p in (ROOT / "reference").glob("*/*.json")}
    assert recorded <= set(benchmarks.BENCHMARKS), (
        f"reference files no benchmark writes: {recorded - set(benchmarks.BENCHMARKS)}"
    )


def test_every_report_block_is_named_for_its_lab_or_the_app():
    for name in report.RENDERERS:
        lab, dot, _ = name.partition(".")
        if dot:
            assert lab in {lab.name for lab in catalogue.LABS}, name


def test_every_package_folder_is_drawn_in_the_layout_doc():
    """docs/layout.md draws the tree as it is: every package folder of labkit/ is named there."""
    text = (ROOT / "docs" / "layout.md").read_text()
    folders = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
    absent = [str(f.relative_to(PACKAGE)) for f in folders if f != PACKAGE and f"{f.name}/" not in text]
    assert absent == [], f"docs/layout.md does not name: {absent}"


def test_paths_into_the_repository_survive_the_layout():
    """Modules that find the repository from their own path."""
    from labkit.app.runner import notebooks
    from labkit.workbench import results

    assert (results.REPO_ROOT / "pyproject.toml").exists()
    assert results.REFERENCE_DIR == ROOT / "reference"
    assert notebooks.NOTEBOOKS_DIR == ROOT / "notebooks"


def _tests_importing(lab) -> list[Path]:
    """The test files of ``tests/labs/<lab>/`` that import the lab's package or one of its modules."""
    return [
        p
        for p in sorted((TESTS / "labs" / lab.name).glob("test_*.py"))
        if any(m == lab.package or m.startswith(lab.package + ".") for _, kind, m in _references(p) if kind == "import")
    ]


@pytest.mark.parametrize("lab", catalogue.LABS, ids=lambda lab: lab.name)
def test_every_lab_has_a_test_folder_named_as_it_is(lab):
    """One name per lab: package, manifest id and test folder; the folder holds a test importing it."""
    assert lab.package == f"labkit.labs.{lab.name}"
    assert (TESTS / "labs" / lab.name).is_dir(), f"tests/labs/{lab.name}/ is missing"
    assert _tests_importing(lab), f"no test file in tests/labs/{lab.name}/ imports {lab.package}"


def test_every_test_folder_of_the_labs_is_a_lab():
    folders = {p.name for p in (TESTS / "labs").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= {lab.name for lab in catalogue.LABS}, folders - {lab.name for lab in catalogue.LABS}


def _misplaced(path: Path) -> str | None:
    """Why the test file ``path`` is not where the layout puts it, or None."""
    folder = path.parent.relative_to(TESTS).parts
    if not folder:
        return "a test file at the top of tests/ (only the shared helper modules live there)"
    if folder[0] in TESTS_OUTSIDE_FLOORS:
        return None if len(folder) == 1 else f"tests/{folder[0]}/ has no subfolders"
    if folder[0] not in FLOORS:
        return f"tests/{folder[0]}/ mirrors no floor of labkit ({', '.join(FLOORS)})"
    if not (PACKAGE / Path(*folder) / "__init__.py").exists():
        return f"labkit/{'/'.join(folder)}/ is not a package for tests/{'/'.join(folder)}/ to mirror"
    return None


def test_every_test_file_lives_in_a_folder_mirroring_the_package():
    wrong = {str(p.relative_to(TESTS)): _misplaced(p) for p in sorted(TESTS.rglob("test_*.py")) if _misplaced(p)}
    assert wrong == {}, wrong


def test_no_two_test_files_share_a_basename():
    """No ``__init__.py`` in tests/: pytest imports each test file as a top-level module by its basename."""
    assert not list(TESTS.rglob("__init__.py"))
    seen: dict[str, list[str]] = {}
    for p in TESTS.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(TESTS)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def _is_kernel(fn: ast.FunctionDef) -> bool:
    """A ``@triton.jit`` function (kernels and their helpers are exempt from the length rule)."""
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def _body_lines(fn: ast.FunctionDef) -> int:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring does not count
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_modules_and_functions_are_a_sitting_long():
    """docs/layout.md, convention 9: no module over 600 lines, no function body over 80 (docstring
    excluded; Triton kernels exempt)."""
    long_modules = [
        f"{p.relative_to(ROOT)}: {n}" for p in MODULES.values() if (n := len(p.read_text().splitlines())) > 600
    ]
    long_functions = []
    for path in MODULES.values():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_kernel(fn) and _body_lines(fn) > 80:
                long_functions.append(f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}: {_body_lines(fn)} lines")
    assert long_modules == [] and long_functions == []


#: a recorded file asked for by its benchmark's name: results.panels("stream_races", ...)
_RESULTS_NAME = re.compile(r"""\b(?:panels|load_references)\(\\?["']([a-z0-9_]+)\\?["']""")


def test_every_recorded_file_asked_for_is_a_benchmarks():
    """A name no benchmark writes finds no file and shows "nothing recorded", silently: every name a
    notebook or module asks ``results.panels`` / ``load_references`` for is a ``labkit bench`` name."""
    asked = {}
    for path in [*MODULES.values(), *sorted((ROOT / "notebooks").glob("*.ipynb"))]:
        for name in _RESULTS_NAME.findall(path.read_text()):
            asked.setdefault(name, path.relative_to(ROOT))
    assert asked, "the pattern finds the notebooks' calls"
    unknown = {name: str(where) for name, where in asked.items() if name not in benchmarks.BENCHMARKS}
    assert unknown == {}
