"""Shared check of the bounded search against the full scan (memory-feature searches)."""

from __future__ import annotations

import numpy as np

from parsearch.cost.analytic import CostModel
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
