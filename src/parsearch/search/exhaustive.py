"""The exact search: score every valid layout of one GPU count and rank them.

This is the oracle the other strategies are tested against.  Two things
keep it fast without giving up exactness:

* memory first: a layout that does not fit can never be in the answer, and
  the memory model is a fraction of the full cost, so the step-time model
  only runs on layouts that fit (:func:`fitting_mask`, the same
  :func:`~parsearch.cost.memory.memory_arrays` call the scorer makes);
* chunks: rows are scored in blocks, so memory stays bounded and a
  progress bar can advance; only the two columns the ranking needs are kept.

Ranking is by predicted tokens/s, best first, with stable tie-breaks: less
memory first, then the layout degrees in ``RANK_TIE_BREAK`` order, so two
runs always return the same list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import numpy as np

from parsearch.constraints import rule_context
from parsearch.cost.analytic import (
    CostModel,
    Estimate,
    estimate_from_row,
    score_columns,
    usable_memory_bytes,
)
from parsearch.cost.memory import MemoryOptions, memory_arrays
from parsearch.errors import SpecError
from parsearch.space import AXIS_ORDER, LayoutTable, axis_candidates
from parsearch.workload import ModelSpec, TrainingSpec

#: Columns that break ties between layouts of equal throughput and memory.
RANK_TIE_BREAK: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp",
                                   "recompute")
#: The axes that make a layout's "shape" for the diverse shortlist.
SHAPE_AXES: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp")
DEFAULT_CHUNK_ROWS = 1 << 18


@dataclass(frozen=True)
class ScanResult:
    """Throughput and memory of every layout of a table that fits.

    ``feasible_rows`` index into ``table``; ``tokens_per_s`` and
    ``memory_bytes`` (peak per GPU) are aligned with them.
    """

    table: LayoutTable
    feasible_rows: np.ndarray
    tokens_per_s: np.ndarray
    memory_bytes: np.ndarray
    considered: int

    @property
    def valid(self) -> int:
        """Layouts that satisfy the layout rules (rows of the table)."""
        return len(self.table)

    @property
    def feasible(self) -> int:
        """Valid layouts that also fit in GPU memory."""
        return len(self.feasible_rows)


def considered_count(model: ModelSpec, training: TrainingSpec, num_gpus: int) -> int:
    """Size of the unpruned grid: every combination of every axis's candidates.

    The enumerator prunes this grid rule by rule; the number says how much
    ground the exact search covers.
    """
    ctx = rule_context(model, training, num_gpus)
    return int(prod(len(axis_candidates(ctx, axis)) for axis in AXIS_ORDER))


def fitting_mask(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                 hbm_bytes: float, columns: dict[str, np.ndarray]) -> np.ndarray:
    """Which layouts fit in ``hbm_bytes`` per GPU.

    The same :func:`~parsearch.cost.memory.memory_arrays` call as
    ``score_columns(...)["fits"]``, without needing a fabric: a GPU count
    where nothing fits costs no topology build.
    """
    c = columns
    mem = memory_arrays(model, training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"],
                        c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"], memory)
    return np.asarray(mem.total) <= hbm_bytes


def fitting_rows(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                 hbm_bytes: float, table: LayoutTable, *,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS) -> np.ndarray:
    """Indices of the rows of ``table`` that fit in memory (chunked)."""
    out = [np.zeros(0, dtype=np.int64)]
    for start in range(0, len(table), chunk_rows):
        chunk = {k: v[start:start + chunk_rows] for k, v in table.columns.items()}
        out.append(np.nonzero(fitting_mask(model, training, memory, hbm_bytes, chunk))[0]
                   + start)
    return np.concatenate(out)


def scan_table(cm: CostModel, table: LayoutTable, *, considered: int | None = None,
               rows: np.ndarray | None = None, chunk_rows: int = DEFAULT_CHUNK_ROWS,
               on_rows: Callable[[int], None] | None = None) -> ScanResult:
    """Score every layout of ``table`` that fits; ``on_rows(k)`` reports progress.

    ``rows``: the rows already known to fit (from :func:`fitting_rows`);
    when omitted, memory is checked here first.
    """
    if chunk_rows < 1:
        raise SpecError(f"scan: chunk_rows must be >= 1, got {chunk_rows}")
    if table.num_gpus != cm.fabric.num_gpus:
        raise SpecError(f"scan: the table is for {table.num_gpus} GPUs but the cost model's "
                        f"fabric has {cm.fabric.num_gpus}")
    rows_out: list[np.ndarray] = []
    tokens_out: list[np.ndarray] = []
    memory_out: list[np.ndarray] = []
    hbm = usable_memory_bytes(cm.fabric.gpu, cm.options)
    for start in range(0, len(table), chunk_rows):
        stop = min(start + chunk_rows, len(table))
        chunk = {k: v[start:stop] for k, v in table.columns.items()}
        if rows is None:
            fits = np.nonzero(fitting_mask(cm.model, cm.training, cm.options.memory, hbm,
                                           chunk))[0]
        else:
            fits = rows[(rows >= start) & (rows < stop)] - start
        if len(fits):
            scores = score_columns(cm, {k: v[fits] for k, v in chunk.items()})
            ok = np.asarray(scores["fits"], dtype=bool)
            rows_out.append(fits[ok] + start)
            tokens_out.append(np.asarray(scores["tokens_per_s"])[ok])
            memory_out.append(np.asarray(scores["mem_total"])[ok])
        if on_rows is not None:
            on_rows(stop - start)
    empty_f = np.zeros(0, dtype=np.float64)
    return ScanResult(
        table=table,
        feasible_rows=np.concatenate(rows_out) if rows_out else np.zeros(0, dtype=np.int64),
        tokens_per_s=np.concatenate(tokens_out) if tokens_out else empty_f,
        memory_bytes=np.concatenate(memory_out) if memory_out else empty_f,
        considered=considered if considered is not None else len(table),
    )


def _order(scan: ScanResult, subset: np.ndarray) -> np.ndarray:
    """``subset`` (positions into the scan's feasible arrays) sorted best first."""
    cols = scan.table.columns
    rows = scan.feasible_rows[subset]
    keys = [cols[name][rows].astype(np.int64) for name in reversed(RANK_TIE_BREAK)]
    keys += [scan.memory_bytes[subset], -scan.tokens_per_s[subset]]
    return subset[np.lexsort(tuple(keys))]


def shape_codes(columns: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """One integer per row for its (tp, pp, cp, ep, etp) shape."""
    code = np.zeros(len(rows), dtype=np.int64)
    for name in SHAPE_AXES:
        values = columns[name][rows].astype(np.int64)
        code = code * (int(columns[name].max(initial=1)) + 1) + values
    return code


def rank_feasible(scan: ScanResult, *, top: int, diverse: bool = False) -> np.ndarray:
    """Positions (into the scan's feasible arrays) of the best ``top`` layouts, best first.

    ``diverse``: at most one layout per (tp, pp, cp, ep, etp) shape -- the best
    of each -- so the list is not ten variants of one layout.
    """
    if top < 1:
        raise SpecError(f"search: top must be >= 1, got {top}")
    n = scan.feasible
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    tokens = scan.tokens_per_s
    if diverse:
        codes = shape_codes(scan.table.columns, scan.feasible_rows)
        unique, inverse = np.unique(codes, return_inverse=True)
        best = np.full(len(unique), -np.inf)
        np.maximum.at(best, inverse, tokens)
        candidates = np.nonzero(tokens >= best[inverse])[0]
        ordered = _order(scan, candidates)
        _, first = np.unique(codes[ordered], return_index=True)
        ordered = ordered[np.sort(first)]
        return ordered[:top]
    if n > top:
        threshold = np.partition(tokens, n - top)[n - top]
        candidates = np.nonzero(tokens >= threshold)[0]
    else:
        candidates = np.arange(n)
    return _order(scan, candidates)[:top]


def estimates_for_rows(cm: CostModel, table: LayoutTable, rows: np.ndarray) -> list[Estimate]:
    """Full :class:`Estimate` (time and memory breakdowns) of some rows of ``table``."""
    if len(rows) == 0:
        return []
    scores = score_columns(cm, {k: v[rows] for k, v in table.columns.items()})
    return [estimate_from_row(cm, scores, i, table.layout(int(r))) for i, r in enumerate(rows)]


__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "RANK_TIE_BREAK",
    "SHAPE_AXES",
    "ScanResult",
    "considered_count",
    "estimates_for_rows",
    "fitting_mask",
    "fitting_rows",
    "rank_feasible",
    "scan_table",
    "shape_codes",
]
