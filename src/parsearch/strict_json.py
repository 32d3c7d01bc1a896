"""JSON without NaN or Infinity: one conversion for every document parsearch writes.

RFC 8259 has no spelling for NaN or Infinity; Python's ``json`` would print
bare ``NaN``.  :func:`strict_json` turns a document into plain JSON types and
replaces each such number by ``null``, naming it under ``"null_reasons"``.
"""

from __future__ import annotations

import math
from typing import Any


def strict_json(document: Any) -> Any:
    """``document`` in plain JSON types, each NaN/Infinity replaced by ``null`` with a reason.

    A number that cannot be computed (NaN) or is unbounded (Infinity) has no
    JSON spelling; it becomes ``null`` and, when the top level is a mapping,
    its path is listed under ``"null_reasons"`` with why, so no value goes
    missing silently.  numpy scalars and arrays become numbers and lists.
    """
    reasons: dict[str, str] = {}
    clean = _plain(document, "", reasons)
    if reasons and isinstance(clean, dict):
        clean["null_reasons"] = {**clean.get("null_reasons", {}), **reasons}
    return clean


def _plain(value: Any, path: str, reasons: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{path}.{k}" if path else str(k), reasons)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{path}[{i}]", reasons) for i, v in enumerate(value)]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalar or array
        return _plain(value.tolist(), path, reasons)
    if isinstance(value, float) and not math.isfinite(value):
        reasons[path or "value"] = ("cannot be computed from these inputs" if value != value
                                    else "unbounded: no finite value")
        return None
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)


__all__ = ["strict_json"]
