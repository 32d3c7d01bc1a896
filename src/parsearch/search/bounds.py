"""An upper bound on the throughput of every layout of one shape, from cheap terms.

A *shape* is a layout's ``(tp, pp, cp, ep, etp)``; the layouts of a shape
differ in ``vpp``, ``mbs``, ``sp`` and ``recompute``.  The exact search
(:mod:`parsearch.search.exhaustive`) scores the shapes in order of this
bound and stops when the next bound is below the answer it already has, so
the answer is the same as a full scan (the bound is never below the true
best of its shape) while most shapes are never scored.

The bound follows the cost model's own structure (:mod:`parsearch.cost.analytic`):

* a unit's (layer's) per-micro-batch time is ``paced + C - (1 - s) H``:
  ``paced`` its compute (``compute.total``), ``C`` its TP+CP+EP traffic,
  ``H <= min(C, paced)`` the part of the traffic hidden behind compute and
  ``s`` the SM share that hiding costs; so it is at least
  ``max(paced, C) + min(s, 0) * min(paced, C)``;
* recompute only adds work and traffic (every recompute share is >= 0 and
  enters ``paced`` and ``C`` with a positive sign), so both are taken with
  recompute off;
* the step is ``m * max_r t_r + (sum_r t_r - max_r t_r) / v`` plus the
  data-parallel, optimizer and fixed terms (all >= 0;
  :mod:`parsearch.cost.schedule`), which is at least
  ``S * (m / pp + (pp - 1) / (pp * v))`` with ``S`` the summed stage time
  (``max_r t_r >= S / pp`` and ``m >= 1 >= 1/v``) and ``v`` the largest
  ``vpp`` of the shape; ``S`` is the unit times weighted by how many of each
  unit the model has, whatever the split;
* ``mbs`` and ``sp`` change the per-unit times and ``m``, so the bound is the
  smallest over the ``(mbs, sp)`` pairs the shape has.

Everything is computed on one row per ``(shape, mbs, sp)``, a small fraction
of the table.  :func:`combo_bounds` keeps that bound per ``(shape, mbs, sp)``
combination (``v`` its own largest ``vpp``); the exact search is ordered by it,
so a strong shape's weak ``(mbs, sp)`` pairs are skipped too.

:func:`memory_floor` is the memory counterpart: the model state of a stage
(weights, gradients, optimizer state) and the fixed framework share do not
depend on ``mbs``, ``sp`` or ``recompute``, and activations only add to them,
so one layout per ``(shape, vpp)`` gives a floor for all of them; a group
whose floor exceeds the GPU's memory cannot fit and is never scored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from parsearch.cost.analytic import UNITS, CostModel, group_rows, wide_columns
from parsearch.cost.communication import unit_comm
from parsearch.cost.compute import UnitCompute, is_moe_unit
from parsearch.cost.feature_search import graph_rank
from parsearch.cost.memory import memory_arrays
from parsearch.cost.memory_bounds import least_memory
from parsearch.cost.recompute import recompute_shares
from parsearch.cost.stages import effective_split
from parsearch.cost.unit_prices import (
    cached_unit_compute,
    flex_rates,
    process_groups,
    stage_features,
)
from parsearch.layout.rules import RECOMPUTE_CODES

#: Relative slack on the bound: its sums run in another order than the scorer's.
BOUND_SLACK = 1e-9
SHAPE_AXES: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp")


def shape_index(columns: Mapping[str, np.ndarray], rows: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(first_row, inverse)``: one representative row per shape and each row's shape.

    Shapes are numbered in the order of their codes; ``first_row[k]`` is a
    row of shape ``k`` and ``inverse[i]`` the shape of row ``i`` (of
    ``rows`` when given).
    """
    cols = columns if rows is None else _Rows(columns, rows)  # gathered a column at a time
    return _groups(cols, SHAPE_AXES)


def _groups(cols: Mapping[str, np.ndarray],
            keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """One representative row per distinct value of ``keys``, and each row's group."""
    starts = run_starts(cols, keys)
    if starts is not None:  # grouped run by run: the same groups, numbers and representatives
        grouped = group_rows({name: _rows_of(cols, name, starts) for name in keys}, keys)
        if grouped is not None:
            first_run, run_group = grouped
            n = len(cols[keys[0]])
            last_row = np.append(starts[1:], n) - 1  # a group's last row ends its last run
            narrow = run_group.astype(np.int32 if len(first_run) < 2**31 else np.int64)
            return last_row[first_run], np.repeat(narrow, np.diff(np.append(starts, n)))
    grouped = group_rows(cols, keys)
    if grouped is not None:
        return grouped
    code = _shape_code(cols, None) if keys == SHAPE_AXES else None
    if code is None:
        code = np.zeros(len(cols[keys[0]]), dtype=np.int64)
        for name in keys:
            code = code * (int(cols[name].max(initial=1)) + 1) + cols[name].astype(np.int64)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def run_starts(cols: Mapping[str, np.ndarray], keys: tuple[str, ...],
               min_rows: int = 1 << 16) -> np.ndarray | None:
    """Where each run of equal ``keys`` values starts, in row order; ``None`` for small
    tables or runs too short to pay (more than a quarter as many runs as rows).

    An enumerated table is sorted by :data:`~parsearch.layout.space.AXIS_ORDER`, so a
    shape's layouts sit in a few long runs: grouping one row per run is grouping the table.
    """
    n = len(cols[keys[0]])
    if n < min_rows:
        return None
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for name in keys:
        values = np.asarray(cols[name])
        change[1:] |= values[1:] != values[:-1]
    starts = np.flatnonzero(change)
    return starts if len(starts) <= n // 4 else None


class _Rows(Mapping[str, np.ndarray]):
    """Some rows of a table's columns, each column gathered when read (not all at once)."""

    def __init__(self, columns: Mapping[str, np.ndarray], rows: np.ndarray) -> None:
        self._columns, self._rows = columns, rows

    def __getitem__(self, name: str) -> np.ndarray:
        return self._columns[name][self._rows]

    def at(self, name: str, index: np.ndarray) -> np.ndarray:
        """Column ``name`` at positions ``index`` of these rows (only those gathered)."""
        return self._columns[name][self._rows[index]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)


def _rows_of(cols: Mapping[str, np.ndarray], name: str, index: np.ndarray) -> np.ndarray:
    """``cols[name][index]``, gathering only those rows of a :class:`_Rows`."""
    return cols.at(name, index) if isinstance(cols, _Rows) else np.asarray(cols[name])[index]


def _shape_code(columns: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray:
    code = np.zeros(len(columns["tp"]) if rows is None else len(rows), dtype=np.int64)
    for name in SHAPE_AXES:
        values = columns[name] if rows is None else columns[name][rows]
        code = code * (int(columns[name].max(initial=1)) + 1) + values.astype(np.int64)
    return code


def unit_time_floor(cm: CostModel, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per unit, a floor on its per-micro-batch time on one GPU with any recompute.

    ``cols`` are layouts (any ``vpp`` and ``recompute``: both are ignored).  With feature
    sets to choose from (``cm.variants``), the smallest floor over them: whichever a layout
    keeps, its time is above it.
    """
    n = len(cols["tp"])
    none = np.full(n, RECOMPUTE_CODES["none"], dtype=np.int64)
    cols = {**cols, "recompute": none, "vpp": np.ones(n, dtype=np.int64)}
    # the groups and recompute shares depend on the layouts only: one of each for every
    # feature set
    shares = recompute_shares(cm.model, cm.training, none, pp=cols["pp"], vpp=cols["vpp"],
                              tp=cols["tp"], sp=cols["sp"])
    groups = process_groups(cm.fabric, cols, cm.training.experts_follow_tp)
    if cm.variants:
        cache: dict[tuple[object, ...], Any] = {}  # compute differs by dispatcher only
        # with no compute beside it nothing is hidden, so the overlaps leave the floor as
        # it is: one feature set per dispatcher gives every distinct floor
        # (with CUDA graphs searched, the most captured level: graphs only remove host
        # time, and the floor max(work, traffic) grows with the work; feature_search.py)
        per_dispatcher = {v.moe_dispatcher: v for v in reversed(cm.variants)
                          if graph_rank(v) == min(graph_rank(w) for w in cm.variants
                                                  if w.moe_dispatcher == v.moe_dispatcher)}
        floors = [_unit_time_floor(replace(cm, options=v, variants=()), cols, cache,
                                   shares, groups)
                  for v in per_dispatcher.values()]
        return {unit: np.minimum.reduce([f[unit] for f in floors]) for unit in floors[0]}
    return _unit_time_floor(cm, cols, None, shares, groups)


def _unit_time_floor(cm: CostModel, cols: dict[str, np.ndarray],
                     cache: dict[tuple[object, ...], Any] | None, shares: Any, groups: Any
                     ) -> dict[str, np.ndarray]:
    model, training, opt = cm.model, cm.training, cm.options
    n = len(cols["tp"])
    forward, rdma_share = flex_rates(cm)
    share = float(cm.profile.comm_sm_share)
    zero = np.zeros(n)
    idle = UnitCompute(gemm=zero, routed=zero, attention=zero, logits=zero,
                       memory_bound=zero, overhead=zero, tp_gemm=zero)
    out: dict[str, np.ndarray] = {}
    for unit in UNITS:
        layer = unit in ("dense", "moe", "mtp")
        recompute = shares.of(is_moe_unit(model, unit)) if layer else shares.dense
        compute = cached_unit_compute(cm, cols, unit, recompute, cache)
        work = np.broadcast_to(compute.total, (n,))
        # with no compute to hide behind, the exposed traffic is all of it
        comm = unit_comm(model, training, cm.profile, opt, cols, groups, unit, idle,
                         recompute, forward_Bps=forward, rdma_share=rdma_share)
        traffic = np.broadcast_to(comm.tp + comm.cp + comm.ep, (n,))
        out[unit] = (np.maximum(work, traffic)
                     + min(share, 0.0) * np.minimum(work, traffic))
    return out


def _unit_totals(cm: CostModel, pp: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """How many of each unit the model holds over all stages: ``(rows, len(UNITS))``.

    The smallest count over the splits of the rows' ``(pp, vpp)`` (every split
    places every unit once, so they agree; the minimum keeps the floor safe).
    """
    out = np.zeros((len(pp), len(UNITS)))
    for p in np.unique(pp):
        sums = None
        for v in np.unique(vpp[pp == p]):
            s = stage_features(cm.model, int(p), int(v),
                               effective_split(cm.model, cm.training, int(p), int(v))).sum(axis=0)
            sums = s if sums is None else np.minimum(sums, s)
        out[pp == p] = sums
    return out


def shape_bounds(cm: CostModel, columns: dict[str, np.ndarray],
                 rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(inverse, bound)``: each row's shape and, per shape, a tokens/s it cannot beat.

    ``rows`` restricts the table to those rows (``inverse`` is then aligned
    with them).  ``bound[k]`` is at least the predicted tokens/s of every
    layout of shape ``k`` among the rows, whatever its memory.
    """
    shape, combo, combo_bound = combo_bounds(cm, columns, rows, per_combo_vpp=False)
    assert shape is not None
    bound = np.zeros(int(shape.max()) + 1 if len(shape) else 0)
    if len(shape):
        first = np.zeros(len(combo_bound), dtype=np.int64)
        first[combo] = shape  # every row of a combination has its shape
        np.maximum.at(bound, first, combo_bound)
    return shape, bound


def combo_bounds(cm: CostModel, columns: dict[str, np.ndarray],
                 rows: np.ndarray | None = None, *, per_combo_vpp: bool = True,
                 keep_shape: bool = True) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """``(shape, combo, bound)``: each row's shape, its ``(shape, mbs, sp)`` combination, and
    per combination a tokens/s none of its layouts can beat (module docstring).

    ``v`` in the bound is the largest ``vpp`` of the combination (``per_combo_vpp=False``:
    of the whole shape, the bound :func:`shape_bounds` takes the maximum of).  Finer than
    the shape's bound: a scan ordered by it skips the weak ``(mbs, sp)`` pairs of a strong
    shape (DeepSeek-V3 on 1,024 H100: 83k rows above the answer instead of 127k).
    ``keep_shape=False`` (with ``per_combo_vpp``): ``shape`` is ``None``, its array reused.
    """
    c: Mapping[str, np.ndarray] = columns if rows is None else _Rows(columns, rows)
    if (len(columns["tp"]) if rows is None else len(rows)) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    _, shape = shape_index(c)
    # one representative row per (shape, mbs, sp), grouped on one key, shape x width +
    # 2 mbs + sp (the same order, so the same groups and numbers), built in place: the
    # fewest arrays beside the table (this is the search's memory peak)
    width = 2 * (int(np.max(columns["mbs"], initial=0)) + 1)
    keep_shape = keep_shape or not per_combo_vpp  # the shape's own vpp reads it below
    if (int(shape.max()) + 1) * width <= 1 << 22:
        key = shape.astype(np.int32, copy=keep_shape)
        if not keep_shape:
            shape = None
        key *= width
        key += np.multiply(c["mbs"], 2, dtype=np.int32)
        key += c["sp"]
        rep, combo = group_rows({"key": key}, ("key",))  # type: ignore[misc]
        del key
    else:
        rep, combo = _groups({"shape": shape, "mbs": c["mbs"], "sp": c["sp"]},
                             ("shape", "mbs", "sp"))
    group = combo if per_combo_vpp else shape
    vpp = c["vpp"]
    vmax_int = np.ones(int(group.max()) + 1, dtype=vpp.dtype)
    np.maximum.at(vmax_int, group, vpp)
    del vpp
    vmax = vmax_int.astype(np.float64)
    picked = rep if rows is None else rows[rep]
    rc = wide_columns({k: np.asarray(v)[picked] for k, v in columns.items()})
    floors = _in_blocks(lambda part: unit_time_floor(cm, part), rc)
    totals = _unit_totals(cm, rc["pp"].astype(np.int64), rc["vpp"].astype(np.int64))
    stage_sum = sum(totals[:, i] * floors[u] for i, u in enumerate(UNITS))
    pp = rc["pp"].astype(np.float64)
    m = rc["m"].astype(np.float64) if "m" in rc else (
        cm.training.global_batch / (rc["mbs"] * rc["dp"]).astype(np.float64))
    v = vmax[np.arange(len(rep)) if per_combo_vpp else shape[rep]]
    step = stage_sum * (m / pp + (pp - 1.0) / (pp * v)) + cm.profile.step_overhead_s
    tokens = float(cm.training.global_batch * cm.training.seq_len)
    return shape, combo, tokens / step * (1.0 + BOUND_SLACK)


def _in_blocks(fn: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
               cols: dict[str, np.ndarray], block: int = 1 << 14) -> dict[str, np.ndarray]:
    """``fn`` (elementwise over rows) applied a block of rows at a time, the results joined:
    the same numbers, with temporaries the size of a block."""
    n = len(cols["tp"])
    if n <= block:
        return fn(cols)
    parts = []
    for start in range(0, n, block):
        rows = min(block, n - start)
        out = fn({k: v[start:start + rows] for k, v in cols.items()})
        parts.append({k: np.broadcast_to(v, (rows,)) for k, v in out.items()})
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def memory_floor(cm: CostModel, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Per row, bytes per GPU no choice of ``mbs``, ``sp`` or ``recompute`` goes below.

    One layout per ``(shape, vpp)`` is priced; the model state and fixed
    share of its peak stage (the same stage holds the same state in every
    layout of the group) floor every layout of the group.
    """
    if len(cols["tp"]) == 0:
        return np.zeros(0)
    floor, inverse = _group_memory_floor(cm, cols)
    return floor[inverse]


def under_memory_floor(cm: CostModel, cols: dict[str, np.ndarray],
                       hbm_bytes: float) -> np.ndarray:
    """Row numbers (narrow integers) whose :func:`memory_floor` is at most ``hbm_bytes``:
    the rows that may fit.  Compared per group, so no per-row float array is built."""
    n = len(cols["tp"])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    floor, inverse = _group_memory_floor(cm, cols)
    return nonzero_narrow((floor <= hbm_bytes)[inverse])


def nonzero_narrow(mask: np.ndarray, block: int = 1 << 20) -> np.ndarray:
    """``np.flatnonzero(mask)`` as 32-bit integers where they fit, built a block at a time."""
    index_type = np.int32 if mask.size < 2**31 else np.int64
    out = np.empty(int(np.count_nonzero(mask)), dtype=index_type)
    done = 0
    for start in range(0, mask.size, block):
        found = np.flatnonzero(mask[start:start + block])
        out[done:done + len(found)] = found + start
        done += len(found)
    return out


def _group_memory_floor(cm: CostModel,
                        cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`memory_floor` per ``(shape, vpp)`` group, and each row's group."""
    rep, inverse = _groups(cols, (*SHAPE_AXES, "vpp"))
    # searched memory features: the state of the setting holding least (offloading moves
    # activations only, never model state, so the floor leaves it out and stays tight)
    cm = least_memory(cm, offload=False)
    r = wide_columns({k: np.asarray(v)[rep] for k, v in cols.items()})
    # a block of groups at a time: the memory model's temporaries stay the size of a block
    # (they set the search's peak memory beside the table)
    state = _in_blocks(lambda part: {"state": _model_state(cm, part)}, r)["state"]
    return state * (1.0 - BOUND_SLACK), inverse.reshape(-1)


def _model_state(cm: CostModel, r: dict[str, np.ndarray]) -> np.ndarray:
    """Bytes per GPU of each layout's weights, gradients, optimizer state and fixed share."""
    mem = memory_arrays(cm.model, cm.training, r["tp"], r["cp"], r["pp"], r["ep"], r["etp"],
                        r["vpp"], r["mbs"], r["dp"], r["edp"], r["recompute"], r["sp"],
                        cm.options.memory)
    return (np.asarray(mem.weights) + np.asarray(mem.gradients) + np.asarray(mem.optimizer)
            + np.asarray(mem.other))


__all__ = ["BOUND_SLACK", "combo_bounds", "memory_floor", "nonzero_narrow", "shape_bounds",
           "shape_index", "under_memory_floor", "unit_time_floor"]
