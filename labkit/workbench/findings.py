"""What a lab's ``findings`` module builds on: the reference files read by name, and numbers written
the one way every document writes them.

A renderer (a lab's ``findings.<name>_table``, named by the lab's manifest under ``report``) takes a
:class:`Reference` and returns Markdown; ``labkit report`` (:mod:`labkit.app.report`) puts it
between its block's comments. A missing file, record or field is a :class:`ReportError` naming it, and
so is a file that :func:`results.load_results` refuses (a value of the wrong type or out of its range:
the file, the record's index and the field) and a field the renderer needs that holds ``null``.
"""

from __future__ import annotations

import math
from pathlib import Path

from labkit.workbench import results
from labkit.workbench.errors import UsageError


class ReportError(UsageError):
    """A block, renderer, reference file, record or field that a report needs is missing or bad."""


class Reference:
    """The reference files under ``root``, read by their path relative to it
    (``"h200x2/collectives.json"``); each is loaded once."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else results.REFERENCE_DIR
        self._loaded: dict[str, results.ResultSet] = {}

    def file(self, name: str) -> results.ResultSet:
        if not isinstance(name, str) or not name.endswith(".json"):
            raise ReportError(f"Reference.file: name must be a path like 'h200x2/collectives.json', got {name!r}")
        if name not in self._loaded:
            path = self.root / name
            if not path.is_file():
                raise ReportError(f"report: reference file reference/{name} is missing")
            try:
                self._loaded[name] = results.load_results(path, name=f"reference/{name}")
            except results.ResultsError as e:
                raise ReportError(f"report: {e}") from None
        return self._loaded[name]

    def records(self, name: str, **where) -> list[dict]:
        """The records of file ``name`` whose fields equal every value in ``where``; at least one."""
        found = self.file(name).select(**where)
        if not found:
            raise ReportError(f"report: reference/{name} has no record with {_where(where)}")
        return found

    def records_with(self, name: str, fields, **where) -> list[dict]:
        """``records(name, **where)``, each holding a value (not null) in every one of ``fields``: a
        record that lacks one is a ReportError naming the file, the record's index and the field."""
        found = self.records(name, **where)
        for record in found:
            for field in fields:
                self._need(name, record, field)
        return found

    def _need(self, name: str, record: dict, field: str):
        """``field_of`` a record of file ``name``, naming the record's index in its file."""
        if record.get(field) is not None:
            return record[field]
        index = next((i for i, r in enumerate(self.file(name).records) if r is record), None)
        return field_of(record, field, name, index)

    def one(self, name: str, **where) -> dict:
        """The one record of file ``name`` matching ``where``."""
        found = self.records(name, **where)
        if len(found) > 1:
            raise ReportError(f"report: reference/{name} has {len(found)} records with {_where(where)}, expected one")
        return found[0]

    def value(self, name: str, field: str, **where):
        """Field ``field`` of the one record of file ``name`` matching ``where``."""
        return self._need(name, self.one(name, **where), field)


def field_of(record: dict, field: str, name: str, index: int | None = None):
    """``record[field]``, or a ReportError naming the file and the field (and the record's ``index`` in
    its file, when given) where the record lacks it or holds null."""
    if record.get(field) is None:
        which = "a record" if index is None else f"record {index}"
        lacks = (
            f"holds null in field {field!r}, which the report needs" if field in record else f"lacks field {field!r}"
        )
        raise ReportError(f"report: reference/{name}: {which} {lacks} ({_where(record, 4)})")
    return record[field]


def _where(fields: dict, at_most: int | None = None) -> str:
    items = list(fields.items())[:at_most]
    return ", ".join(f"{k}={v!r}" for k, v in items) or "no condition"


def number(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, without an exponent: 4.3635 -> '4.36', 362.8 -> '363'.
    A boolean, NaN or inf is a ReportError (no document prints 'nan' or True as '1.00')."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ReportError(f"number: x must be a number, got {x!r}")
    if not math.isfinite(x):
        raise ReportError(f"number: x must be a finite number, got {x!r}")
    if x == 0:
        return "0"
    if abs(x) >= 10 ** (digits - 1):  # whole units: 362.8 -> '363', 1346.1 -> '1,346'
        return f"{x:,.0f}"
    return f"{x:#.{digits}g}"  # keeps trailing zeros: 6.80, 10.0
