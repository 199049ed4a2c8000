"""The house rules the folders promise, checked from the code itself.

Three layers: ``labkit.workbench`` (tools every lab uses), ``labkit.kernels`` (the product a user
imports) and ``labkit.labs.<lab>`` (one package of story code per lab). Imports point one way:
labs -> kernels -> workbench, and labs -> workbench. A lab may import a lab it builds on, never in
a cycle. Every import counts, module-level or inside a function, and so does a string naming a
module (``"labkit.labs.x:fn"`` targets for the sandbox or the rank launcher): the only strings
allowed to cross are the ``labkit bench`` registry's.

Then every lab marked ready or draft has everything docs/adding-a-lab.md lists.
"""

import ast
import re
from pathlib import Path

import pytest
import yaml

from labkit.workbench import benchmarks, catalogue

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "labkit"
#: Modules whose strings may name lab modules: the registries behind ``labkit bench``, ``labkit
#: report`` and the exercises' checks.
REGISTRY = {
    "labkit.workbench.benchmarks",
    "labkit.workbench.report",
    "labkit.workbench.exercises",
    "labkit.workbench.catch_record",
}
#: The one import that reaches up from the top of the package: ``labkit.check`` (a lazy
#: ``__getattr__`` in labkit/__init__.py) is the product's checkers, exposed at the top.
TOP_EXPOSES = {("labkit", "labkit.kernels.check")}
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
            if m:
                refs.append((node.lineno, "string", m.group(1)))
    return refs


def _layer(module: str) -> str:
    """'workbench', 'kernels', 'labs.<lab>' or 'top' (labkit/__init__ and __main__)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "top"
    if parts[1] == "labs":
        return "labs" if len(parts) == 2 else f"labs.{parts[2]}"
    return parts[1]


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_three_layers_are_the_package():
    """Modules and packages only: a copied tree may carry folders Python or a tool left behind."""
    top = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert top == {"__init__.py", "__main__.py", "workbench", "kernels", "labs"}, (
        "labkit/ holds the three layers and nothing else"
    )


def _violations(modules=MODULES):
    found = []
    for module, path in modules.items():
        src = _layer(module)
        for line, kind, target in _references(path):
            dst = _layer(target)
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            where = f"{shown}:{line} ({kind}) -> {target}"
            if src in ("workbench", "top"):
                if dst in ("kernels", "labs") or dst.startswith("labs."):
                    if (module, target) in TOP_EXPOSES and kind == "import":
                        continue
                    if not (kind == "string" and module in REGISTRY):
                        found.append(f"the workbench reaches up: {where}")
            elif src == "kernels":
                if dst == "labs" or dst.startswith("labs."):
                    found.append(f"a kernel imports a lab: {where}")
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
    """The rule is not vacuous: a kernel module that imports a lab is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from labkit.labs.stream_races import race\n    return 'labkit.labs.x:fn'\n")
    refs = _references(bad)
    assert [(k, t) for _, k, t in refs] == [("import", "labkit.labs.stream_races.race"), ("string", "labkit.labs.x")]
    assert _layer("labkit.labs.stream_races.race") == "labs.stream_races"
    assert _layer("labkit.kernels.comm.symm") == "kernels"
    assert len(_violations({"labkit.kernels.bad": bad})) == 2
    assert len(_violations({"labkit.workbench.bad": bad})) == 2
    assert _violations({"labkit.labs.other.bad": bad}) == []


# --- every lab has what a lab is made of -------------------------------------------------------

WRITTEN = [lab for lab in catalogue.LABS if lab.status in ("ready", "draft")]


@pytest.mark.parametrize("lab", WRITTEN, ids=[lab.id for lab in WRITTEN])
def test_a_written_lab_has_every_part(lab):
    pkg_dir = ROOT / Path(*lab.package.split("."))
    missing = []
    if not (ROOT / lab.notebook).exists():
        missing.append(f"notebook {lab.notebook}")
    for f in ("__init__.py", "widgets.py"):
        if not (pkg_dir / f).exists():
            missing.append(f"{pkg_dir.relative_to(ROOT)}/{f}")
    profiles = yaml.safe_load((ROOT / "notebooks" / "profiles.yml").read_text())
    for profile in ("cpu", "gpu"):
        if lab.id not in (profiles[profile].get("notebooks") or {}):
            missing.append(f"profiles.yml {profile}.notebooks.{lab.id}")
    if not lab.benchmarks:
        missing.append("a `labkit bench` entry (catalogue: benchmarks)")
    for name in lab.benchmarks:
        if name not in benchmarks.BENCHMARKS:
            missing.append(f"`labkit bench {name}` in labkit/workbench/benchmarks.py")
            continue
        module = benchmarks.BENCHMARKS[name][0]
        if not (module.startswith(lab.package + ".") or module.startswith("labkit.workbench.")):
            missing.append(f"`labkit bench {name}` runs {module}, outside {lab.package}")
        if lab.status == "ready" and not list((ROOT / "reference").glob(f"*/{name}.json")):
            missing.append(f"reference/<machine>/{name}.json")  # a draft's are reported below
    tests = [p for p in (ROOT / "tests").glob("test_*.py") if lab.package in p.read_text()]
    if not tests:
        missing.append(f"a test file importing {lab.package}")
    if f"]({lab.notebook})" not in (ROOT / "README.md").read_text():
        missing.append("its README row (labkit labs --markdown)")
    assert missing == [], f"{lab.id} lacks: " + "; ".join(missing)


@pytest.mark.parametrize("lab", [lab for lab in catalogue.LABS if lab.status == "draft"], ids=lambda lab: lab.id)
def test_a_draft_lab_has_recorded_its_references(lab):
    """A draft lab (notebook runs, its issue open) may still lack GPU reference data: reported as
    a skip naming the files, never hidden; a ready lab without them fails the test above."""
    absent = [
        f"reference/<machine>/{name}.json"
        for name in lab.benchmarks
        if not list((ROOT / "reference").glob(f"*/{name}.json"))
    ]
    if absent:
        pytest.skip(f"{lab.id} is a draft without recorded GPU results: {', '.join(absent)}")


def test_every_registered_benchmark_belongs_to_a_lab():
    owned = {name for lab in catalogue.LABS for name in lab.benchmarks}
    assert set(benchmarks.BENCHMARKS) == owned


def test_paths_into_the_repository_survive_the_layout():
    """Modules that find the repository from their own path (one level deeper since the split)."""
    from labkit.workbench import results
    from labkit.workbench.runner import notebooks

    assert (results.REPO_ROOT / "pyproject.toml").exists()
    assert results.REFERENCE_DIR == ROOT / "reference"
    assert notebooks.NOTEBOOKS_DIR == ROOT / "notebooks"
