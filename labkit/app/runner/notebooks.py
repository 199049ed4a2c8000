"""Reading notebooks: discovery, the ``parameters`` cell, and hardware requirements.

papermill only *warns* about a parameter the notebook does not define, and injects it anyway;
a misspelt override then silently changes nothing. labkit reads each notebook's parameters cell
itself and refuses unknown names and values of the wrong type before anything runs.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
import sys
from pathlib import Path

# nbformat validates notebooks with jsonschema, which, where the package rfc3987-syntax is
# installed (Jupyter's event schemas pull it in), imports it to check the "iri" string format;
# that import builds a grammar and takes 2 to 3 s of CPU, in every process that reads a notebook
# (each notebook's child under ``labkit run``). A notebook's schema names no such format: jsonschema
# is left to do without it (it skips the format when the import fails). A process that imported the
# package before keeps it.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402  (after the line above)

from labkit.workbench.errors import UsageError  # noqa: E402

NOTEBOOKS_DIR = Path(__file__).resolve().parents[3] / "notebooks"  # labkit/app/runner/ -> the repository


class RunError(UsageError):
    """A request ``labkit run`` refuses: unknown notebook, unknown parameter, bad value, ..."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    name: str
    default: object
    type: str  # "int", "float", "str", "bool", "list", "dict", "NoneType" or "any"
    help: str


#: a workbook notebook's file stem: its lab's number, an underscore, the lab's name
NUMBERED = re.compile(r"^\d\d_(?P<name>[a-z][a-z0-9_]*)$")


def notebook_name(path: str | Path) -> str:
    """The name ``labkit run`` knows a notebook by: its lab's (``notebooks/03_stream_races.ipynb`` is
    ``stream_races``), or the file stem for a notebook without a number (a reader's own)."""
    stem = Path(path).stem
    m = NUMBERED.match(stem)
    return m["name"] if m else stem


def discover(folder: str | Path | None = None) -> dict[str, Path]:
    """Notebooks of the workbook, by name (:func:`notebook_name`), in file order."""
    folder = Path(folder) if folder else NOTEBOOKS_DIR
    found: dict[str, Path] = {}
    for path in sorted(folder.glob("*.ipynb")):
        name = notebook_name(path)
        if name in found:
            raise RunError(f"notebooks {found[name].name} and {path.name} share the name {name!r}: rename one")
        found[name] = path
    return found


def read(path: str | Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def parameters_cell(nb) -> nbformat.NotebookNode | None:
    """The first code cell, if it is tagged ``parameters`` (labkit's rule); else None."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    if code and "parameters" in code[0].get("metadata", {}).get("tags", []):
        return code[0]
    return None


_ANNOTATIONS = {"int", "float", "str", "bool", "list", "dict"}


def parameters(nb_or_path) -> dict[str, Parameter]:
    """The names a notebook's parameters cell assigns, with defaults, types and comments."""
    nb = read(nb_or_path) if isinstance(nb_or_path, (str, Path)) else nb_or_path
    cell = parameters_cell(nb)
    if cell is None:
        raise RunError("the first code cell is not tagged 'parameters'")
    src = cell.source
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise RunError(f"the parameters cell does not parse: {e}") from None
    lines = src.splitlines()
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value, ann = node.targets[0].id, node.value, None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value, ann = node.target.id, node.value, ast.unparse(node.annotation)
        else:
            continue
        try:
            default = _constant(value)
            kind = ann if ann in _ANNOTATIONS else type(default).__name__
        except ValueError:
            default, kind = None, "any"
        # the comment on the first line, or on the last of a value written over several
        line = next((x for x in (lines[node.lineno - 1], lines[node.end_lineno - 1]) if "#" in x), "")
        help_text = line.split("#", 1)[1].strip() if "#" in line else ""
        found[name] = Parameter(name, default, kind, help_text)
    return found


_ARITHMETIC = {ast.LShift: operator.lshift, ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub}


def _constant(node: ast.expr):
    """A literal's value, or a list, tuple or dict of literals and integer arithmetic on them
    (``[4 << 10, 16 << 20]``: bytes written as the notebook's reader thinks of them). ValueError
    for anything else (a name, a call): the parameter's type is then unknown ("any")."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_constant(x) for x in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _constant(node.left), _constant(node.right)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right)):
            return _ARITHMETIC[type(node.op)](left, right)
    raise ValueError(f"not a constant: {ast.unparse(node)}")


def _short(value) -> str:
    """``repr(value)`` cut to a line: a refused value may be a list of thousands."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_value(notebook: str, p: Parameter, value) -> None:
    """Raise RunError unless ``value`` has the parameter's type (an int is a valid float)."""
    ok = {
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "list": lambda v: isinstance(v, (list, tuple)),
        "dict": lambda v: isinstance(v, dict),
    }.get(p.type, lambda v: True)
    if not ok(value):
        raise RunError(
            f"notebook {notebook}: parameter {p.name} expects {p.type} "
            f"(default {p.default!r}), got {type(value).__name__} {_short(value)}"
        )


def validate(notebook: str, params: dict, declared: dict[str, Parameter]) -> None:
    for name, value in params.items():
        if name not in declared:
            known = ", ".join(declared) or "(none)"
            raise RunError(f"notebook {notebook} has no parameter {name!r}; its parameters cell defines: {known}")
        check_value(notebook, declared[name], value)


def requirements(nb, name: str = "notebook") -> dict:
    """Hardware the whole notebook needs (``metadata.labkit.requires``), as gates.requires kwargs."""
    from labkit.workbench.gates import REQUIRES_KEYS

    req = nb.metadata.get("labkit", {}).get("requires", {})
    if not isinstance(req, dict) or set(req) - set(REQUIRES_KEYS):
        raise RunError(
            f"notebook {name}: metadata.labkit.requires must be a mapping with keys from "
            f"{', '.join(REQUIRES_KEYS)}; got {req!r}"
        )
    return dict(req)
