"""Where the built-in data files (cluster files, cost-model profiles) live.

A wheel ships them inside the package as ``parsearch/_data/<kind>``
(hatch force-include, see ``pyproject.toml``); a source checkout keeps them
at the repository top level.  Both are looked up, packaged copy first.
"""

from __future__ import annotations

from pathlib import Path

from parsearch.errors import ParsearchError

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """Directory of the built-in ``kind`` files (``"topologies"`` or ``"cost_models"``)."""
    candidates = (
        _PACKAGE_DIR / "_data" / kind,
        _PACKAGE_DIR.parent.parent / kind,
    )
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    searched = ", ".join(str(c) for c in candidates)
    raise ParsearchError(
        f"built-in {kind} data not found (searched {searched}); reinstall parsearch"
    )
