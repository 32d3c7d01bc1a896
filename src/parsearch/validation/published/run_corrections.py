"""Corrections to the bundled published runs, each read from the run's public recipe.

``published_runs.csv`` stays a byte-for-byte copy of the shared dataset; where a
row's table and its public recipe disagree, or the row cannot be read without
guessing, ``run_corrections.csv`` says which cell to read otherwise and why
(``id, field, value, reason``).  Only the cells named in
:data:`CORRECTABLE_FIELDS` can be corrected; the reason is appended to the row's
notes, so every reading that departs from the table says so.
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources

from parsearch.errors import SpecError

CORRECTIONS_FILE = "run_corrections.csv"
#: Cells a correction may replace: the layout facts tables leave out or misprint, and
#: whether a row is fit for validation.
CORRECTABLE_FIELDS = frozenset({"vpp", "micro_batch_size", "verified"})


@cache
def load_corrections() -> dict[str, tuple[tuple[str, str, str], ...]]:
    """``id -> ((field, value, reason), ...)`` from the packaged corrections file."""
    text = resources.files("parsearch.data").joinpath(CORRECTIONS_FILE).read_text(
        encoding="utf-8")
    out: dict[str, list[tuple[str, str, str]]] = {}
    for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        field = (row.get("field") or "").strip()
        if field not in CORRECTABLE_FIELDS:
            raise SpecError(f"{CORRECTIONS_FILE} line {line}: field {field!r} cannot be "
                            f"corrected; choose from {', '.join(sorted(CORRECTABLE_FIELDS))}")
        out.setdefault(row["id"].strip(), []).append(
            (field, (row.get("value") or "").strip(), (row.get("reason") or "").strip()))
    return {key: tuple(value) for key, value in out.items()}


def corrected(row: dict[str, str]) -> dict[str, str]:
    """``row`` with its corrections applied (a copy; unchanged when it has none)."""
    fixes = load_corrections().get((row.get("id") or "").strip())
    if not fixes:
        return row
    out = dict(row)
    for field, value, reason in fixes:
        was = out.get(field, "")
        out[field] = value
        note = f"corrected {field} {was or 'blank'} -> {value}: {reason}"
        out["notes"] = f"{out.get('notes') or ''}; {note}".lstrip("; ")
    return out


__all__ = ["CORRECTABLE_FIELDS", "corrected", "load_corrections"]
