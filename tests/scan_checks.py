"""Shared checks of the memory-feature searches: the bounded search against the full scan,
and the memory model's peak per layout."""

from __future__ import annotations

import numpy as np

from parsearch.cost.analytic import CostModel, wide_columns
from parsearch.cost.memory import memory_arrays
from parsearch.layout.space import LayoutTable
from parsearch.search.exhaustive import rank_feasible, scan_bounded, scan_table


def assert_bounded_scan_matches_full(cm: CostModel, table: LayoutTable, top: int,
                                     diverse: bool) -> None:
    """The bounded scan picks the full scan's layouts, at the full scan's speeds."""
    full = scan_table(cm, table)
    bounded = scan_bounded(cm, table, top=top, diverse=diverse, first_rows=1)
    picks_full = rank_feasible(full, top=top, diverse=diverse)
    picks = rank_feasible(bounded, top=top, diverse=diverse)
    assert full.feasible_rows[picks_full].tolist() == bounded.feasible_rows[picks].tolist()
    np.testing.assert_allclose(bounded.tokens_per_s[picks], full.tokens_per_s[picks_full],
                               rtol=1e-9)


def peak_memory_total(cm: CostModel, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Peak bytes per GPU of each layout under ``cm``'s training spec and memory options."""
    c = wide_columns(cols)
    mem = memory_arrays(cm.model, cm.training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"],
                        c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"],
                        cm.options.memory)
    return np.asarray(mem.total, dtype=np.float64).reshape(-1)
