"""Profiles: which parameters and timeouts each notebook gets on each kind of machine.

``notebooks/profiles.yml`` holds, per profile (``cpu``, ``gpu``), a default timeout and per
notebook its parameter overrides and optionally its own timeout. A reader's own overrides come
from ``--params FILE`` (YAML: ``{notebook: {NAME: value}}``) and ``--set notebook.NAME=value``,
applied in that order on top of the profile.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from labkit.app.runner.notebooks import NOTEBOOKS_DIR, RunError

PROFILES_FILE = NOTEBOOKS_DIR / "profiles.yml"
PROFILES = ("cpu", "gpu")


def _read_yaml(path: Path, what: str):
    """Parsed YAML, or a RunError that names the file and says what is wrong with it."""
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RunError(f"{what}: no file at {path}") from None
    except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, not text, ...
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise RunError(f"{what}: cannot read {path}: {reason}") from None
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
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise RunError(f"--set {item!r}: value does not parse: {yaml_problem(e)}") from None
    return notebook, name, value
