"""Docs and code say what is, not what was: no commit ids, dates or history phrases in the authored
files. History lives in git; provenance (commit, date, machine of a recording) in ``reference/*.json``.

Checked: every git-tracked authored file outside ``reference/``: README.md, docs/, the notebooks'
markdown and code cells (never their outputs), labkit/**/*.py, tests/**/*.py, scripts/*,
Makefile, .ci/run, pyproject.toml and the YAML files. A root CHANGELOG.md is exempt, and so is
this file (its examples below are the very lines it forbids).

Forbidden, each reported as ``file:line`` (a notebook's as ``file:cell N line M``) with the text:

* ``hex``: a word-bounded hex token of 7-40 characters holding a digit and a letter (a commit id);
  a ``0x`` constant is never one (its ``x`` joins it to the word), nor a longer token (a sha256)
  or a UUID's group; data that must carry such a token goes in ``ALLOWED``;
* ``date``: an ISO date, YYYY-MM-DD (a timestamp's date part too);
* ``used to``: always. Its technical sense ("is used to compute") reads the same as its history
  sense to a matcher; write "serves to", "computes", "is how" instead;
* ``history``: "until", "before", "since", "at" or "as of" followed by a commit (the word
  "commit", or a 7-40 character hex token, digits alone included: a short id can be all digits)
  or, except after "at", by a date (ISO, "<Month> [day,] year", or a bare year 1900-2039):
  plain "spin until the flag is set" and "happens-before" stay legal;
* ``retest``: "not yet retested" (or re-measured).

A bare number of 7 or more digits after "at" reads as a commit: write sizes with a unit, a power
or separators ("at 1 MiB", "at 2**20", "at 1,048,576").
"""

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

_HEX = r"[0-9a-f]{7,40}"
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_ISO = r"(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?!\d)"
_YEAR = r"(?:19\d\d|20[0-3]\d)(?!\d)"
_DATE = rf"(?:{_ISO}|{_MONTH}\.?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?{_YEAR}|{_YEAR})"
_COMMIT = rf"(?:commits?\b|{_HEX}(?!\w))"

#: (rule, pattern), all matched case-insensitively.
RULES = (
    # not inside a word (so never the digits of a 0x constant or a longer hash) nor after a dot (a
    # version's local part); not a UUID's first or last group (8-4-4-4-12 hex digits)
    (
        "hex",
        re.compile(
            rf"(?<![\w.])(?<![0-9a-f]{{4}}-)(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f]){_HEX}(?!\w)(?!-[0-9a-f]{{4}}-)",
            re.I,
        ),
    ),
    ("date", re.compile(rf"(?<!\d){_ISO}", re.I)),
    ("used to", re.compile(r"\bused\s+to\b", re.I)),
    (
        "history",
        re.compile(
            rf"\b(?:(?:until|before|since)\s+(?:{_COMMIT}|{_DATE})|at\s+{_COMMIT}|as\s+of\s+{_DATE})",
            re.I,
        ),
    ),
    ("retest", re.compile(r"\bnot\s+yet\s+re-?(?:tested|measured)\b", re.I)),
)

#: Tokens that are data, not history: (file, token) -> why. Keep it small and say why.
ALLOWED = {
    # a results file's env.created in a test's fixture: the plot's label reads it
    ("tests/workbench/test_plot_widgets.py", "2026-11-23"): "fixture data: a recording's date",
    # a run folder's name from a fixed clock: the name's format is what the test checks
    ("tests/app/runner/test_runner.py", "2026-01-02"): "fixture data: a run folder's timestamp",
}


def offences(line: str) -> list[tuple[str, str]]:
    """(rule, matched text) for every forbidden token or phrase in one line."""
    return [(rule, m.group(0)) for rule, rx in RULES for m in rx.finditer(line)]


# ---- the matcher, on examples: a broken pattern fails here, not silently in the tree

FORBIDDEN = [
    ("measured on 2x H200 at d1a81ee: 4.36 us", {"hex", "history"}),
    ("the file at 8179912, all 588 rows", {"history"}),  # an all-digit short id
    ("(a1ce386, then a3af501)", {"hex"}),
    ("rows from a1ce386-a3af501 and a1ce386..a3af501", {"hex"}),
    ("git_commit f9847f2e5d432779ab2397cd624862a36373dcbe", {"hex"}),
    ("read 2026-11-17", {"date"}),
    ("created 2026-11-26T03:18:10+00:00", {"date"}),
    ("the call used to spend tens of microseconds", {"used to"}),
    ("a buffer is used to hold the flags", {"used to"}),
    ("kept until 2026-12-01", {"date", "history"}),
    ("open until September 2026", {"history"}),
    ("slow before commit 1234567", {"history"}),
    ("since 2025 the kernel", {"history"}),
    ("As of September 2026 the issue was open", {"history"}),
    ("as of Nov 3, 2026", {"history"}),
    ("a candidate not yet retested", {"retest"}),
    ("not yet re-measured on H100", {"retest"}),
]
ALLOWED_LINES = [
    "spin until the flag is set",
    "ordered by happens-before; wait until 4096 programs arrive",
    "before the barrier, at 2048 bytes and at 4096",
    "since 1024 elements fit",
    "MASK = 0x7fffffff  # and 0xdeadbeef01",
    "sha256 0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "id 123e4567-e89b-12d3-a456-42661417400f",
    "1234567 and 7777777 and deadbeef and facade",  # digits alone, letters alone: not a hex id
    "torch 2.11.0+cu130, version 0.1.0a1b2c3d",
    "the fp8e4m3 and bf16 formats, e4m3fn, float8e4nv",
    "bytes used, to be freed; used tokens",
    "until May, as of now, at the end",
]


@pytest.mark.parametrize("line, rules", FORBIDDEN, ids=[f[0][:40] for f in FORBIDDEN])
def test_the_matcher_flags_history(line, rules):
    assert {rule for rule, _ in offences(line)} == rules


@pytest.mark.parametrize("line", ALLOWED_LINES, ids=[a[:40] for a in ALLOWED_LINES])
def test_the_matcher_leaves_present_tense_alone(line):
    assert offences(line) == []


# ---- the tree


def _authored(path: str) -> bool:
    if path.startswith("reference/") or path in ("CHANGELOG.md", SELF):
        return False
    top = path.split("/", 1)[0]
    return (
        path in ("README.md", "Makefile", ".ci/run", "pyproject.toml")
        or (top == "docs" and not path.endswith((".png", ".jpg", ".svg")))  # docs/figures: drawn, not written
        or path.endswith((".ipynb", ".yml", ".yaml"))
        or (top in ("labkit", "tests") and path.endswith(".py"))
        or (top == "scripts" and path.count("/") == 1)
    )


def _tracked() -> list[str]:
    try:
        got = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    if got.returncode != 0:
        pytest.skip(f"not a git checkout ({got.stderr.strip() or 'git ls-files failed'}): nothing to list")
    return sorted(p for p in got.stdout.split("\0") if p and _authored(p))


def _lines(path: str):
    """(where, text) for every line a reader sees: a notebook's cell sources, a file's lines."""
    text = (ROOT / path).read_text(encoding="utf-8")
    if path.endswith(".ipynb"):
        for n, cell in enumerate(json.loads(text)["cells"]):
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else source
            for k, line in enumerate(source.split("\n"), 1):
                yield f"{path}:cell {n} line {k}", line
    else:
        for k, line in enumerate(text.split("\n"), 1):
            yield f"{path}:{k}", line


def test_the_tree_lists_the_authored_files():
    files = _tracked()
    assert "pyproject.toml" in files and SELF not in files
    assert any(f.startswith("labkit/") for f in files) and any(f.endswith(".ipynb") for f in files)
    assert not any(f.startswith("reference/") for f in files)


def test_no_history_in_the_authored_files():
    found = []
    for path in _tracked():
        for where, line in _lines(path):
            for rule, text in offences(line):
                if (path, text) not in ALLOWED:
                    found.append(f"{where}: {rule}: {text!r} in: {line.strip()[:160]}")
    assert not found, f"{len(found)} lines say what was, not what is:\n" + "\n".join(found)
