"""The search's shortcuts give the numbers of the plain computation they replace.

Run-by-run grouping of an enumerated table (``bounds.run_starts``) and the per-(shape, mbs,
sp) bounds the bounded scan is ordered by (``bounds.combo_bounds``) each equal what they
stand for, exactly; the enumerator keeps its rows in axis order (what runs rely on).
"""

from __future__ import annotations

import numpy as np
import pytest

from parsearch.cost.analytic import build_cost_model, group_rows, score_columns
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.search.bounds import (
    SHAPE_AXES,
    _groups,
    combo_bounds,
    run_starts,
    shape_bounds,
)
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric

CASES = [("qwen3-30b-a3b", 64, 4096, 512), ("llama3-70b", 256, 8192, 512)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request):  # type: ignore[no-untyped-def]
    name, gpus, seq, batch = request.param
    model, training = get_preset(name), TrainingSpec(seq_len=seq, global_batch=batch)
    table = enumerate_layouts(model, training, gpus)
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), gpus),
                          options=CostOptions(search_features=SEARCHABLE_FEATURES))
    return cm, table


@pytest.mark.parametrize("keys", [SHAPE_AXES, (*SHAPE_AXES, "vpp")])
def test_grouping_run_by_run_is_grouping_row_by_row(case, keys) -> None:  # type: ignore[no-untyped-def]
    _, table = case
    starts = run_starts(table.columns, keys, min_rows=1)
    assert starts is not None and len(starts) < len(table)  # the table sits in runs
    expected = group_rows(table.columns, keys)
    assert expected is not None
    got = _groups(table.columns, keys)  # the run path on tables this size
    rows = np.sort(np.random.default_rng(0).choice(len(table), len(table) // 2, replace=False))
    sub = {k: v[rows] for k, v in table.columns.items()}
    for (rep, inverse), (want_rep, want_inverse) in (
            (got, expected), (_groups(sub, keys), group_rows(sub, keys))):
        assert np.array_equal(rep, want_rep) and np.array_equal(inverse, want_inverse)


def test_combination_bounds_hold_and_max_to_the_shape_bounds(case) -> None:  # type: ignore[no-untyped-def]
    cm, table = case
    shape, combo, bound = combo_bounds(cm, table.columns)
    same_shape, shape_bound = shape_bounds(cm, table.columns)
    assert np.array_equal(shape, same_shape)
    widest = combo_bounds(cm, table.columns, per_combo_vpp=False)[2]
    per_shape = np.zeros(len(shape_bound))
    np.maximum.at(per_shape, shape, widest[combo])
    assert np.array_equal(per_shape, shape_bound)
    assert np.all(bound <= widest)  # each combination's own largest vpp: tighter
    tokens = np.asarray(score_columns(cm, table.columns, with_memory=False)["tokens_per_s"])
    best = np.full(len(bound), -np.inf)
    np.maximum.at(best, combo, tokens)
    assert np.all(bound >= best)
    cols = table.columns
    for k in np.unique(combo)[:: max(1, len(bound) // 50)]:
        rows = np.nonzero(combo == k)[0]
        assert len({tuple(int(cols[a][r]) for a in (*SHAPE_AXES, "mbs", "sp"))
                    for r in rows}) == 1


def test_enumerated_rows_are_in_axis_order(case) -> None:  # type: ignore[no-untyped-def]
    _, table = case  # what run grouping and the repeat expansion rely on
    from parsearch.layout.space import AXIS_ORDER
    keys = [table.columns[a].astype(np.int64) for a in reversed(AXIS_ORDER)]
    order = np.lexsort(keys)
    assert np.array_equal(order, np.arange(len(table)))
