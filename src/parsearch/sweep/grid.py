"""The grid of a sweep: models x clusters x GPU counts x global batches x sequence lengths.

A grid comes from a YAML, TOML or JSON file and/or command-line lists (a
list given on the command line replaces the file's).  Every cell asks one
question: the best layouts of that model on exactly that many GPUs of that
cluster, at that global batch and sequence length (``parsearch search``).

>>> grid = grid_from({"models": ["gpt-1.7b"], "clusters": ["dgx-h100"], "gpus": [8, 16],
...                   "global_batch": [64], "seq_len": [2048, 4096]})
>>> len(grid.cells()), grid.cells()[0].key()
(4, 'gpt-1.7b|dgx-h100|8|64|2048')
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from parsearch.errors import SpecError
from parsearch.files import is_file, path_exists
from parsearch.model.specs import PRECISIONS, RECOMPUTE_MODES

#: The grid's axes, in the order cells are listed.
AXES: tuple[str, ...] = ("models", "clusters", "gpus", "global_batch", "seq_len")
#: A sweep holds at most this many cells (each one is a trial in the storage, and a
#: worker looks through the waiting ones to claim one).
MAX_CELLS = 10_000
#: Upper bounds of the integer axes (the largest clusters parsearch models).
_INT_BOUNDS: dict[str, int] = {"gpus": 1 << 20, "global_batch": 1 << 24, "seq_len": 1 << 24,
                               "micro_batch_sizes": 1 << 16, "top": 100}
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Cell:
    """One question of the grid."""

    model: str
    cluster: str
    gpus: int
    global_batch: int
    seq_len: int

    def key(self) -> str:
        return f"{self.model}|{self.cluster}|{self.gpus}|{self.global_batch}|{self.seq_len}"


@dataclass(frozen=True)
class SweepGrid:
    """The axes of a sweep and the training options every cell shares."""

    models: tuple[str, ...]
    clusters: tuple[str, ...]
    gpus: tuple[int, ...]
    global_batch: tuple[int, ...]
    seq_len: tuple[int, ...]
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    precision: str = "bf16"
    top: int = 1

    def cells(self) -> tuple[Cell, ...]:
        """Every cell, models outermost, sequence lengths innermost."""
        return tuple(Cell(m, c, g, b, s) for m in self.models for c in self.clusters
                     for g in self.gpus for b in self.global_batch for s in self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def fingerprint(self) -> str:
        """A short stable digest of the grid (its default sweep name)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_grid_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON grid file."""
    target = Path(path)
    where = f"--grid {str(path)!r}"
    if not is_file(target):
        raise SpecError(f"{where}: no such file" if not path_exists(target) else
                        f"{where}: not a file")
    if target.stat().st_size > _MAX_FILE_BYTES:
        raise SpecError(f"{where}: larger than {_MAX_FILE_BYTES} bytes; a grid file lists "
                        "axes, not cells")
    try:
        text = target.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(f"{where}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise SpecError(f"{where}: cannot read it: {error.strerror or error}") from None
    suffix = target.suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise SpecError(f"{where}: the file name must end in .yaml, .yml, .toml or .json")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError,
            RecursionError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SpecError(f"{where}: cannot parse it: {detail}") from None
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping of axes (models, clusters, gpus, "
                        f"global_batch, seq_len), got {type(data).__name__}")
    return dict(data)


_KNOWN = {f.name for f in fields(SweepGrid)}
_ALIASES = {"model": "models", "cluster": "clusters", "global_batches": "global_batch",
            "batch": "global_batch", "seq_lens": "seq_len", "gpu_counts": "gpus"}


def grid_from(document: Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
              where: str = "grid") -> SweepGrid:
    """A checked :class:`SweepGrid` from a grid document and command-line overrides."""
    merged: dict[str, Any] = {}
    for key, value in document.items():
        name = _ALIASES.get(str(key).replace("-", "_"), str(key).replace("-", "_"))
        if name not in _KNOWN:
            raise SpecError(f"{where}: unknown field {key!r}; the fields are "
                            f"{', '.join(sorted(_KNOWN))}")
        merged[name] = value
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key] = value
    missing = [a for a in AXES if a not in merged]
    if missing:
        raise SpecError(f"{where}: give {', '.join(missing)} (a list each, in the grid file "
                        f"or as --{missing[0].replace('_', '-')})")
    values: dict[str, Any] = {}
    for axis in ("models", "clusters"):
        values[axis] = _names(where, axis, merged[axis])
    for axis in ("gpus", "global_batch", "seq_len", "micro_batch_sizes"):
        if axis in merged:
            values[axis] = _ints(where, axis, merged[axis])
    if "recompute" in merged:
        values["recompute"] = _choices(where, "recompute", merged["recompute"], RECOMPUTE_MODES)
    if "precision" in merged:
        precision = merged["precision"]
        if precision not in PRECISIONS:
            raise SpecError(f"{where}: precision {precision!r} must be one of "
                            f"{', '.join(PRECISIONS)}")
        values["precision"] = precision
    if "top" in merged:
        values["top"] = _ints(where, "top", [merged["top"]])[0]
    grid = SweepGrid(**values)
    count = 1
    for axis in AXES:
        count *= len(getattr(grid, axis))
    if count > MAX_CELLS:
        raise SpecError(f"{where}: {count:,} cells is more than the {MAX_CELLS:,} a sweep "
                        "holds; split it into several sweeps")
    return grid


def _as_list(where: str, axis: str, value: Any) -> list[Any]:
    if isinstance(value, str | int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise SpecError(f"{where}: {axis} must be a non-empty list, got {value!r}")
    return list(value)


def _names(where: str, axis: str, value: Any) -> tuple[str, ...]:
    items = _as_list(where, axis, value)
    for item in items:
        if not isinstance(item, str) or not item.strip() or "|" in item:
            raise SpecError(f"{where}: {axis} must be names or file paths (text without '|'), "
                            f"got {item!r}")
    return _distinct(where, axis, tuple(item.strip() for item in items))


def _ints(where: str, axis: str, value: Any) -> tuple[int, ...]:
    bound = _INT_BOUNDS[axis]
    out = []
    for item in _as_list(where, axis, value):
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= bound:
            raise SpecError(f"{where}: {axis} values must be integers from 1 to {bound:,}, "
                            f"got {item!r}")
        out.append(item)
    return _distinct(where, axis, tuple(out))


def _choices(where: str, axis: str, value: Any, allowed: Sequence[str]) -> tuple[str, ...]:
    items = _as_list(where, axis, value)
    bad = [i for i in items if i not in allowed]
    if bad:
        raise SpecError(f"{where}: {axis} value {bad[0]!r} must be one of {', '.join(allowed)}")
    return _distinct(where, axis, tuple(items))


def _distinct(where: str, axis: str, items: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(set(items)) != len(items):
        repeated = next(i for i in items if items.count(i) > 1)
        raise SpecError(f"{where}: {axis} lists {repeated!r} twice")
    return items


__all__ = ["AXES", "MAX_CELLS", "Cell", "SweepGrid", "grid_from", "load_grid_file"]
