"""The exact search: score every valid layout of one GPU count and rank them.

This is the oracle the other strategies are tested against.  Two things
keep it fast without giving up exactness:

* memory first: a layout that does not fit can never be in the answer, and
  the memory model is a fraction of the full cost, so the step-time model
  only runs on layouts that fit (:func:`fitting_mask`, the same
  :func:`~parsearch.cost.memory.memory_arrays` call the scorer makes);
* chunks: rows are scored in blocks, so memory stays bounded and a
  progress bar can advance; only the two columns the ranking needs are kept;
* bounds (:func:`scan_bounded`): every (tp, pp, cp, ep, etp) shape's ``(mbs, sp)``
  combinations get an upper bound on their throughput from cheap terms
  (:func:`parsearch.search.bounds.combo_bounds`); combinations are scored best bound
  first, and once the next bound is below the ``top``-th best throughput found, no
  remaining layout can enter the answer, so the rest is skipped (counted as
  ``pruned``) -- the answer is the full scan's.

Ranking is by predicted tokens/s, best first, with stable tie-breaks: less
memory first, then the layout degrees in ``RANK_TIE_BREAK`` order, so two
runs always return the same list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import numpy as np

from parsearch.cost.analytic import (
    CostModel,
    Estimate,
    estimate_from_row,
    score_columns,
    usable_memory_bytes,
    wide_columns,
)
from parsearch.cost.memory import MemoryOptions, memory_arrays
from parsearch.cost.memory_bounds import least_memory_models
from parsearch.cost.memory_features import searches_memory_features
from parsearch.errors import SpecError
from parsearch.layout.rules import rule_context
from parsearch.layout.space import AXIS_ORDER, LayoutTable, axis_candidates
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.search.bounds import combo_bounds, under_memory_floor
from parsearch.search.feature_memory import (
    full_memory_choice,
    memory_and_tokens,
    quick_memory_choice,
)

#: Columns that break ties between layouts of equal throughput and memory.
RANK_TIE_BREAK: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp",
                                   "recompute")
#: The axes that make a layout's "shape" for the diverse shortlist.
SHAPE_AXES: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp")
#: Rows scored at once: a block's time scores (every feature set's parts) hold about 550
#: bytes a row beside the whole table, so the largest block sets a search's peak memory
#: (DeepSeek-V3 on 1,024 H100: a 65,484-row block added 36 MB; at 1 << 15 the traced peak
#: is 182 MB instead of 187, the same rows are examined, CPU about 1% more).
DEFAULT_CHUNK_ROWS = 1 << 15
#: Tables from this many rows get the memory floor pass (:func:`under_memory_floor`) first.
FLOOR_MIN_ROWS = 1 << 17
#: Layouts priced for memory at once, fastest first (doubling), in a bounded scan.
MEMORY_BATCH = 64


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
    examined: int | None = None  # rows checked; None: every row (no pruning)

    @property
    def valid(self) -> int:
        """Layouts that satisfy the layout rules (rows of the table)."""
        return len(self.table)

    @property
    def feasible(self) -> int:
        """Valid layouts that fit in GPU memory, among those examined."""
        return len(self.feasible_rows)

    @property
    def checked(self) -> int:
        """Valid layouts whose memory (and, where they fit, time) was computed."""
        return self.valid if self.examined is None else self.examined

    @property
    def pruned(self) -> int:
        """Valid layouts skipped because their bound is below the answer."""
        return self.valid - self.checked


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
    c = wide_columns(columns)
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
        if rows is None:  # under the setting holding the least (searched memory features)
            fit_any = np.zeros(stop - start, dtype=bool)
            for least in least_memory_models(cm):
                fit_any |= fitting_mask(least.model, least.training, least.options.memory,
                                        hbm, chunk)
            fits = np.nonzero(fit_any)[0]
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


def _threshold(tokens: list[np.ndarray], shapes: list[np.ndarray], top: int,
               diverse: bool, tie_band: float | None = None) -> float:
    """The ``top``-th best throughput so far (per shape when ``diverse``); -inf if fewer.

    With ``tie_band``, never above the best so far times ``1 - tie_band``: every layout
    that may tie with the final best is kept, so the tie order cannot depend on ``top``
    (the best only grows, so a row below this bar is below the final one too).
    """
    values = np.concatenate(tokens) if tokens else np.zeros(0)
    if tie_band is not None and len(values):
        floor = float(values.max()) * (1.0 - tie_band)
        return min(floor, _threshold(tokens, shapes, top, diverse))
    if diverse and len(values):
        codes = np.concatenate(shapes)
        unique, inverse = np.unique(codes, return_inverse=True)
        best = np.full(len(unique), -np.inf)
        np.maximum.at(best, inverse.reshape(-1), values)
        values = best
    if len(values) < top:
        return -np.inf
    return float(np.partition(values, len(values) - top)[len(values) - top])


def scan_bounded(cm: CostModel, table: LayoutTable, *, top: int = 1, diverse: bool = False,
                 tie_band: float | None = None,
                 considered: int | None = None, first_rows: int = 1 << 12,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 on_rows: Callable[[int], None] | None = None) -> ScanResult:
    """Like :func:`scan_table` for the best ``top`` layouts, skipping layouts that cannot enter.

    The ``(shape, mbs, sp)`` combinations are scored in order of their throughput bound
    (:func:`~parsearch.search.bounds.combo_bounds`), in growing blocks
    (``first_rows`` rows, doubling up to ``chunk_rows``); a combination whose
    bound is below the ``top``-th best throughput found so far (per shape
    with ``diverse``) is never scored, nor any after it.  Within a block,
    time is scored first and memory checked only for the layouts fast enough
    to enter the answer.  The ranking of the result (:func:`rank_feasible`
    with the same ``top`` and ``diverse``) is that of :func:`scan_table`;
    ``feasible`` counts the layouts found to fit (those whose memory was
    checked), ``examined`` the layouts scored.  ``tie_band`` (relative width of the
    prediction's error band) also keeps every layout within that share of the best, so
    :func:`rank_feasible` can order the ties the same way whatever ``top`` is.
    """
    if top < 1:
        raise SpecError(f"search: top must be >= 1, got {top}")
    if table.num_gpus != cm.fabric.num_gpus:
        raise SpecError(f"scan: the table is for {table.num_gpus} GPUs but the cost model's "
                        f"fabric has {cm.fabric.num_gpus}")
    n = len(table)
    considered = considered if considered is not None else n
    empty_f = np.zeros(0, dtype=np.float64)
    if n == 0:
        return ScanResult(table, np.zeros(0, dtype=np.int64), empty_f, empty_f, considered, 0)
    hbm = usable_memory_bytes(cm.fabric.gpu, cm.options)
    # (shape, vpp) groups whose model state alone exceeds the memory cannot fit: never scored
    # (worth its one pass over every pipeline split on large tables only)
    index_type = np.int32 if n < 2**31 else np.int64  # row numbers, kept narrow
    candidates = (under_memory_floor(cm, table.columns, hbm)
                  if n >= FLOOR_MIN_ROWS else np.arange(n, dtype=index_type))
    if len(candidates) == 0:
        return ScanResult(table, np.zeros(0, dtype=np.int64), empty_f, empty_f, considered, n)
    # (shape, mbs, sp) combinations, scored best bound first
    # (the diverse bar groups the rows kept by their shape codes, not by these shapes)
    _, combo, bound = combo_bounds(cm, table.columns, candidates, keep_shape=False)
    order = np.argsort(-bound, kind="stable")
    rank = np.empty(len(order), dtype=index_type)
    rank[order] = np.arange(len(order), dtype=index_type)
    row_rank = rank[combo]
    del combo
    ends = np.cumsum(np.bincount(row_rank, minlength=len(order)))
    skipped = n - len(candidates)
    radices = shape_radices(table.columns)
    if on_rows is not None and skipped:
        on_rows(skipped)
    rows_out: list[np.ndarray] = []
    tokens_out: list[np.ndarray] = []
    memory_out: list[np.ndarray] = []
    shapes_out: list[np.ndarray] = []
    k, start, block, threshold = 0, 0, max(1, first_rows), -np.inf
    memory_features = searches_memory_features(cm)
    deferred: list[np.ndarray] = []
    while k < len(order) and bound[order[k]] >= threshold:
        # combinations k..j-1: about `block` rows, none whose bound is already below the answer
        j = max(k + 1, int(np.searchsorted(ends, start + block, side="left")))
        j = min(j, len(order))
        j = k + max(1, int(np.sum(bound[order[k:j]] >= threshold)))
        rows = ranked_rows(candidates, row_rank, k, j)
        chunk = {name: v[rows] for name, v in table.columns.items()}
        # time first, then memory only where the throughput can still enter the answer
        timed = score_columns(cm, chunk, with_memory=False) if len(rows) else {}
        # an upper bound where memory features may still change the time (memory_features.py)
        tokens = (np.asarray(timed.get("tokens_per_s_bound", timed["tokens_per_s"]))
                  if len(rows) else np.zeros(0))
        variant = timed.get("feature_variant")
        choice_keys = ("tokens_per_s", "step_time_s", "time_dp_comm", "time_optimizer")
        # fastest first, in small batches, so the answer's bar rises before most memory is priced
        keep = np.nonzero(tokens >= threshold)[0]
        keep = keep[np.argsort(-tokens[keep], kind="stable")]
        done, batch = 0, MEMORY_BATCH * top
        while done < len(keep):
            part = keep[done:done + batch]
            part = part[tokens[part] >= threshold]
            done += batch
            batch *= 2
            if not len(part):
                break  # sorted: the rest are slower still
            sub = {name: v[part] for name, v in chunk.items()}
            part_variant = None if variant is None else np.asarray(variant)[part]
            if memory_features:  # the rows needing the full choice wait for the block's end,
                # when the bar is higher (memory_features.py)
                total, priced, full = quick_memory_choice(
                    cm, sub, {key: np.asarray(timed[key])[part] for key in choice_keys},
                    part_variant)
                deferred.append(part[full])
            else:
                total, priced = memory_and_tokens(cm, sub, tokens[part], part_variant)
            ok = (total <= hbm) & (priced >= threshold)
            fits = part[ok]
            if len(fits):
                rows_out.append(rows[fits])
                tokens_out.append(priced[ok])
                memory_out.append(total[ok])
                shapes_out.append(shape_codes(table.columns, rows[fits], radices))
                threshold = _threshold(tokens_out, shapes_out, top, diverse, tie_band)
        late = np.concatenate(deferred) if deferred else np.zeros(0, dtype=np.int64)
        late = late[tokens[late] >= threshold]
        deferred = []
        if len(late):
            total, priced = full_memory_choice(cm, {name: v[late] for name, v in chunk.items()})
            ok = (total <= hbm) & (priced >= threshold)
            if np.any(ok):
                rows_out.append(rows[late[ok]])
                tokens_out.append(priced[ok])
                memory_out.append(total[ok])
                shapes_out.append(shape_codes(table.columns, rows[late[ok]], radices))
                threshold = _threshold(tokens_out, shapes_out, top, diverse, tie_band)
        # the block's scores go before the next block is priced (the scan's peak memory)
        del rows, chunk, timed, tokens, variant, keep, late
        if on_rows is not None:
            on_rows(int(ends[j - 1]) - start)
        start = int(ends[j - 1])
        k = j
        block = min(2 * block, chunk_rows)
    feasible = (np.concatenate(rows_out).astype(np.int64) if rows_out
                else np.zeros(0, dtype=np.int64))
    return ScanResult(
        table=table, feasible_rows=feasible,
        tokens_per_s=np.concatenate(tokens_out) if tokens_out else empty_f,
        memory_bytes=np.concatenate(memory_out) if memory_out else empty_f,
        considered=considered, examined=skipped + start)


def ranked_rows(rows: np.ndarray, rank: np.ndarray, first: int, stop: int) -> np.ndarray:
    """The ``rows`` whose ``rank`` is in ``first..stop-1``, by rank, then in their order.

    The scan's blocks one at a time: a bounded scan reads the best-ranked few of the rows
    (DeepSeek-V3 on 1,024 H100: 83k of 1.95M), so the rows are not sorted all at once (a
    stable argsort of every row and its buffers: ~30 MB beside the table at the search's
    memory peak, and 0.09 s)."""
    picked = np.flatnonzero((rank >= first) & (rank < stop))
    return rows[picked[np.argsort(rank[picked], kind="stable")]]


def _order(scan: ScanResult, subset: np.ndarray) -> np.ndarray:
    """``subset`` (positions into the scan's feasible arrays) sorted best first."""
    cols = scan.table.columns
    rows = scan.feasible_rows[subset]
    keys = [cols[name][rows].astype(np.int64) for name in reversed(RANK_TIE_BREAK)]
    keys += [scan.memory_bytes[subset], -scan.tokens_per_s[subset]]
    return subset[np.lexsort(tuple(keys))]


def shape_codes(columns: dict[str, np.ndarray], rows: np.ndarray,
                radices: tuple[int, ...] | None = None) -> np.ndarray:
    """One integer per row for its (tp, pp, cp, ep, etp) shape (``radices``: the table's
    :func:`shape_radices`, when known)."""
    radices = radices or shape_radices(columns)
    code = np.zeros(len(rows), dtype=np.int64)
    for name, radix in zip(SHAPE_AXES, radices, strict=True):
        code = code * radix + columns[name][rows].astype(np.int64)
    return code


def shape_radices(columns: dict[str, np.ndarray]) -> tuple[int, ...]:
    """Each shape axis's largest value plus one: the mixed radix of :func:`shape_codes`."""
    return tuple(int(columns[name].max(initial=1)) + 1 for name in SHAPE_AXES)


def rank_feasible(scan: ScanResult, *, top: int, diverse: bool = False) -> np.ndarray:
    """Positions (into the scan's feasible arrays) of the best ``top`` layouts, best first.

    Best is the most predicted tokens/s, then less memory, then :data:`RANK_TIE_BREAK`: a
    total order fixed before the first ``top`` are cut, so a larger ``top`` only appends.
    Layouts closer to the best than the prediction can tell (the error band) keep this
    order too: on the published expert layouts the point estimate names the experts' pick
    first more often than any reordering of the band (``benchmarks/rank_published_layouts.py``;
    by memory headroom the first of the list was the experts' shape in 14% of the jobs,
    by throughput in 33%).  ``diverse``: at most one layout per (tp, pp, cp, ep, etp)
    shape, the fastest of each, so the list is not ten variants of one layout and its
    first entry is the first of the full ranking.
    """
    if top < 1:
        raise SpecError(f"search: top must be >= 1, got {top}")
    n = scan.feasible
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    tokens = scan.tokens_per_s
    if diverse:
        codes = shape_codes(scan.table.columns, scan.feasible_rows)
        ordered = _order(scan, np.nonzero(_shape_best(codes, tokens))[0])
        _, first = np.unique(codes[ordered], return_index=True)
        return ordered[np.sort(first)][:top]
    if n > top:
        threshold = np.partition(tokens, n - top)[n - top]
        candidates = np.nonzero(tokens >= threshold)[0]
    else:
        candidates = np.arange(n)
    return _order(scan, candidates)[:top]


def _shape_best(codes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Whether each layout is the fastest of its shape."""
    unique, inverse = np.unique(codes, return_inverse=True)
    best = np.full(len(unique), -np.inf)
    np.maximum.at(best, inverse, tokens)
    return tokens >= best[inverse]


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
    "ranked_rows",
    "scan_bounded",
    "scan_table",
    "shape_codes",
    "shape_radices",
]
