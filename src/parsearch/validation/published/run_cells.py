"""Reading the cells of a published-runs CSV row: text, integers, numbers.

A malformed cell is a :class:`~parsearch.errors.SpecError` naming the row id,
the column and the rule it breaks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from parsearch.errors import SpecError
from parsearch.model.specs import short_repr

#: One CSV row, as ``csv.DictReader`` yields it.
Row = Mapping[str, str]


def cell_text(row: Row, column: str) -> str:
    """The cell's text, stripped (``""`` when blank or absent)."""
    return (row.get(column) or "").strip()


#: Largest integer cell (GPU counts, degrees, sizes); larger ones are typos.
MAX_INT_CELL = 2**31 - 1


def _parsed(row: Row, column: str, kind: type[int] | type[float], what: str) -> Any:
    text = cell_text(row, column)
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise SpecError(
            f"published run {row.get('id')}: {column}={short_repr(text)} is not {what}"
        ) from None
    if kind is int and not 0 <= value <= MAX_INT_CELL:
        raise SpecError(f"published run {row.get('id')}: {column}={short_repr(text)} is not "
                        f"an integer between 0 and {MAX_INT_CELL:,}")
    if kind is float and not (math.isfinite(value) and value >= 0):
        raise SpecError(f"published run {row.get('id')}: {column}={short_repr(text)} is not "
                        "a finite number >= 0")
    return value


def cell_int(row: Row, column: str) -> int | None:
    """The cell as an integer in 0..:data:`MAX_INT_CELL`, or ``None`` when blank."""
    return _parsed(row, column, int, "an integer")


def cell_float(row: Row, column: str) -> float | None:
    """The cell as a finite number >= 0, or ``None`` when blank."""
    return _parsed(row, column, float, "a number")


def required_int(row: Row, column: str) -> int:
    """The cell as an integer (as :func:`cell_int`); a blank cell is an error."""
    value = cell_int(row, column)
    if value is None:
        raise SpecError(f"published run {row.get('id')}: {column} is blank")
    return value
