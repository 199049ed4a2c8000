"""The project's own promises: environment.yml == pyproject.toml, the lab tables of the README
and docs/labs.md and the README's commands match the code, the public API in docs/api.md
imports, and every notebook is a lab of the catalogue."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from labkit.app import catalogue
from labkit.app.runner import notebooks as nbs
from labkit.workbench.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
CONDA_TO_PYPI = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's


def _split(req: str) -> tuple[str, str]:
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(.*)", req.strip())
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def test_environment_yml_lists_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # an extra may include another of labkit's own (labkit[site] in test): compare what it names
    test = [x for r in extras["test"] for x in (extras[r[7:-1]] if r.startswith("labkit[") else [r])]
    pip_side = dict(_split(r) for r in project["dependencies"] + test)
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    conda_side = {}
    for item in conda:
        assert isinstance(item, str), f"environment.yml: unexpected entry {item!r}"
        name, spec = _split(item)
        if name in ("python", "pip"):
            continue
        conda_side[CONDA_TO_PYPI.get(name, name)] = spec
    assert conda_side == pip_side


def test_python_floor_agrees():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert f"python{project['requires-python']}" in conda


def test_readme_lab_table_is_the_catalogue():
    assert catalogue.markdown_table() in (ROOT / "README.md").read_text()


def test_docs_lab_table_is_the_catalogue():
    assert catalogue.markdown_table(wide=True) in (ROOT / "docs" / "labs.md").read_text()


def _slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_doc_links_resolve():
    """Every relative link in README.md and docs/*.md names an existing file (and heading)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: detail goes to docs/"
    head = "\n".join(lines[:25])
    assert "make workbook" in head and "make test" in head


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make workbook" in readme
    env = r"^\s*(?:\w+=\S+\s+)*"  # a command line, after any VAR=value
    assert re.search(env + r"make test\b", ci, re.M), ".ci/run must run the README's test command"
    # every notebook executes once: make workbook, then the tests read that run
    workbook = re.search(env + r"make workbook\b", ci, re.M)
    test = re.search(r"^\s*LABKIT_EXECUTED_RUN=\S+\s+(?:\w+=\S+\s+)*make test\b", ci, re.M)
    assert workbook and test and workbook.start() < test.start(), (
        ".ci/run must run make workbook, then make test with LABKIT_EXECUTED_RUN naming that run"
    )


def test_every_notebook_is_a_ready_lab_and_every_ready_lab_has_a_notebook():
    notebooks = set(nbs.discover())
    ready = {lab.name for lab in catalogue.LABS if lab.status in ("ready", "draft")}
    assert notebooks == ready
    for lab in catalogue.LABS:
        assert (ROOT / lab.notebook).is_file(), lab.notebook


def _resolve(dotted: str):
    """What `dotted` names as a user reads it: an attribute wins over a submodule of that name
    (``labkit.kernels.copy`` is the function the package exports)."""
    import importlib

    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], start=2):
        if not hasattr(obj, attr):
            importlib.import_module(".".join(parts[:i]))
        obj = getattr(obj, attr)
    return obj


def test_public_api_names_exist():
    """Every name in the Public API table of docs/api.md imports (module moves update the page)."""
    page = (ROOT / "docs" / "api.md").read_text()
    section = page.split("# Public API", 1)[1].split("\n## ", 1)[0]
    checked = []
    for cell in re.findall(r"^\| `([^|]+?)` \|", section, re.M):
        for entry in re.findall(r"`?([\w.]+)(?:\([^`]*?\))?`?", cell.replace("`, `", " / ")):
            if not entry:
                continue
            if entry.startswith("labkit."):
                module = entry.rsplit(".", 1)[0]
                obj = _resolve(entry)
            else:  # a sibling of the previous entry: `labkit.x.f / g`
                obj = _resolve(f"{module}.{entry}")
            assert callable(obj), entry
            checked.append(entry)
    assert len(checked) >= 20, checked


def test_the_labs_table_links_resolve_from_where_it_is_shown():
    """README (repository root) and notebook 00 (notebooks/) show the same table: each link names a
    notebook that exists from there; a prefix that is not a folder is refused."""
    for where, prefix in ((ROOT, "notebooks/"), (ROOT / "notebooks", "")):
        links = re.findall(r"\]\(([^)]+\.ipynb)\)", catalogue.markdown_table(notebooks_at=prefix))
        assert len(links) == len(catalogue.LABS) and all((where / link).is_file() for link in links), links
    with pytest.raises(UsageError, match="notebooks_at"):
        catalogue.markdown_table(notebooks_at="notebooks")
