"""Profiles: which parameters and timeouts each notebook gets on each kind of machine.

``notebooks/profiles.yml`` holds, per profile (``cpu``, ``gpu``), a default timeout and per
notebook its parameter overrides and optionally its own timeout. A reader's own overrides come
from ``--params FILE`` (YAML: ``{notebook: {NAME: value}}``) and ``--set notebook.NAME=value``,
applied in that order on top of the profile. A key given twice (in one file, or in two
``--set``) keeps its last value.

All three are read by one YAML reader (:func:`parse`), stricter than PyYAML's YAML 1.1:

- no anchors or aliases (``&a``, ``*a``): a parameter never needs one, and aliases expand into
  shared references, so 257 bytes of them make a list of 43 million items;
- at most :data:`MAX_NODES` values in a document, nested at most :data:`MAX_DEPTH` deep, from a
  file of at most :data:`MAX_BYTES`;
- an int with a leading zero (``010``, YAML 1.1's octal 8) is refused: write 10 (or 8);
- a number with an exponent reads as a float with or without a dot or a sign (``1e9``,
  ``1e-300``, ``2.5E+3``; YAML 1.1 reads ``1e9`` as a string);
- ``1:30`` (YAML 1.1's base 60) is a string.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from labkit.app.runner.notebooks import NOTEBOOKS_DIR, RunError

PROFILES_FILE = NOTEBOOKS_DIR / "profiles.yml"
PROFILES = ("cpu", "gpu")
MAX_BYTES = 1 << 20  # profiles.yml: 2 KiB
MAX_NODES = 10_000  # every scalar, list and mapping counts one; profiles.yml: about 100
MAX_DEPTH = 32  # a parameter is a list of scalars at most; PyYAML's composer recurses per level

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_LEADING_ZERO = "tag:labkit,leading-zero-int"


class Refused(yaml.MarkedYAMLError):
    """Valid YAML that breaks one of the reader's rules (an alias, too many values, ``010``)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader with the bounds and number forms of the module docstring."""

    def __init__(self, stream):
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            what = f"alias *{event.anchor}" if isinstance(event, yaml.AliasEvent) else f"anchor &{event.anchor}"
            raise Refused(
                None, None, f"{what}: anchors and aliases are not accepted here (write the value out)", event.start_mark
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise Refused(None, None, f"more than {MAX_NODES} values: too large for parameters", event.start_mark)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise Refused(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_leading_zero(self, node):
        text = node.value
        sign = text[: len(text) - len(text.lstrip("+-"))]
        digits = text[len(sign) :].replace("_", "")
        write = f"{sign}{int(digits)}"
        if set(digits) <= set("01234567") and int(digits) != int(digits, 8):  # YAML 1.1's octal
            write += f" or {sign}{int(digits, 8)} (YAML 1.1 reads {text} as octal)"
        raise Refused(None, None, f"{text}: a leading zero: write {write}", node.start_mark)


# the number resolvers, replaced: first a leading-zero int (refused), then decimal, hex and binary
# ints, then floats with the exponent forms added; the others (bool, null, timestamp, ...) are kept
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_LEADING_ZERO, re.compile(r"^[-+]?0[0-9_]+$"), list("-+0"))
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)
_Loader.add_constructor(_LEADING_ZERO, _Loader.construct_leading_zero)


def parse(text: str):
    """``text`` parsed as YAML by the rules of the module docstring; yaml.YAMLError if it breaks one."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _read_yaml(path: Path, what: str):
    """Parsed YAML, or a RunError that names the file and says what is wrong with it."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)  # read no more than the bound: the path may be /dev/zero
        if len(data) > MAX_BYTES:
            raise RunError(f"{what}: {path} is larger than {MAX_BYTES >> 10} KiB: too large for parameters")
        return parse(data.decode())
    except FileNotFoundError:
        raise RunError(f"{what}: no file at {path}") from None
    except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, not text, ...
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise RunError(f"{what}: cannot read {path}: {reason}") from None
    except Refused as e:
        raise RunError(f"{what}: {path}: {yaml_problem(e)}") from None
    except yaml.YAMLError as e:
        raise RunError(f"{what}: {path} is not valid YAML: {yaml_problem(e)}") from None


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's own text spans several lines,
    with a caret under the spot; the CLI promises one line)."""
    problem = getattr(e, "problem", None)
    if not problem:
        return " ".join(str(e).split())
    context = getattr(e, "context", None)
    mark = getattr(e, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{context + ': ' if context else ''}{problem}{where}"


def load(path: str | Path | None = None) -> dict:
    path = Path(path) if path else PROFILES_FILE
    doc = _read_yaml(path, "profiles")
    if not isinstance(doc, dict) or set(doc) - set(PROFILES):
        raise RunError(f"{path}: top level must be the profiles {PROFILES}, got {list(doc or [])}")
    for name, prof in doc.items():
        if not isinstance(prof.get("timeout_s"), (int, float)):
            raise RunError(f"{path}: profile {name} needs a numeric timeout_s")
        for nb, entry in (prof.get("notebooks") or {}).items():
            extra = set(entry) - {"parameters", "timeout_s"}
            if extra:
                raise RunError(f"{path}: {name}.{nb} has unknown keys {sorted(extra)} (allowed: parameters, timeout_s)")
    return doc


def read_params_file(path: str | Path) -> dict:
    path = Path(path)
    doc = _read_yaml(path, "--params")
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise RunError(f"--params: {path} must map notebook names to {{parameter: value}} tables")
    return doc


def parse_set(item: str) -> tuple[str, str, object]:
    """'start_here.REPS=10' -> ('start_here', 'REPS', 10); the value is read as YAML."""
    if "=" not in item or "." not in item.split("=", 1)[0]:
        raise RunError(f"--set {item!r}: expected NOTEBOOK.NAME=VALUE, e.g. start_here.REPS=10")
    key, raw = item.split("=", 1)
    notebook, name = key.rsplit(".", 1)
    try:
        value = parse(raw)
    except Refused as e:
        raise RunError(f"--set {item!r}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise RunError(f"--set {item!r}: value does not parse: {yaml_problem(e)}") from None
    return notebook, name, value
