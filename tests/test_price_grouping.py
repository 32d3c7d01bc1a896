"""Pricing a layout never depends on the layouts priced beside it.

Large batches are priced once per distinct price key (``analytic._price_rows``) and looked
up by each row; below 256 rows every row is priced alone.  The two must agree, including
which MoE feature sets a row may run: Megatron's all-to-all overlap needs ``pp == 1`` or an
interleaved schedule, so ``vpp`` decides it although it is not otherwise part of the price.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import PRICE_KEY, build_cost_model, score_columns
from parsearch.cost.feature_search import runnable
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.search.exhaustive import rank_feasible, scan_bounded
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric

UNGROUPED_ROWS = 200  # under the 256 rows from which rows are priced by price key


def _in_pieces(cm, cols, with_memory):  # type: ignore[no-untyped-def]
    n = len(cols["tp"])
    parts = [score_columns(cm, {k: v[i:i + UNGROUPED_ROWS] for k, v in cols.items()},
                           with_memory=with_memory) for i in range(0, n, UNGROUPED_ROWS)]
    return {k: np.concatenate([np.asarray(p[k]).reshape(-1) for p in parts])
            for k in ("tokens_per_s", "feature_variant")}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), cluster=st.sampled_from(["dgx-h100", "gb200-nvl72"]),
       with_memory=st.booleans())
def test_a_row_is_priced_the_same_alone_and_in_a_large_batch(
        seed: int, cluster: str, with_memory: bool) -> None:
    model = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=256, micro_batch_sizes=(1, 2))
    gpus = 64  # EP across nodes: the all-to-all overlap is worth choosing
    table = enumerate_layouts(model, training, gpus)
    # pipelined MoE layouts of a few price keys, each key with every vpp it allows (so that
    # rows share a key while differing in whether they are interleaved), in random order
    c = table.columns
    pipelined = np.nonzero((c["pp"] > 1) & (c["ep"] > 1) & (c["cp"] == 1))[0]
    key = np.stack([c[k][pipelined].astype(np.int64) for k in (*PRICE_KEY, "dp", "edp")])
    _, key_of_row = np.unique(key, axis=1, return_inverse=True)
    rng = np.random.default_rng(seed)
    picked = rng.choice(key_of_row.max() + 1, size=120, replace=False)
    rows = rng.permutation(pipelined[np.isin(key_of_row.reshape(-1), picked)])
    cols = {k: v[rows] for k, v in c.items()}
    assert len(rows) > UNGROUPED_ROWS + 56  # priced by key (from 256 rows)
    assert np.any(cols["vpp"] == 1) and np.any(cols["vpp"] > 1)
    fabric = build_fabric(load_cluster(cluster), gpus)
    cm = build_cost_model(model, training, fabric,
                          options=CostOptions(search_features=SEARCHABLE_FEATURES))
    whole = score_columns(cm, cols, with_memory=with_memory)
    pieces = _in_pieces(cm, cols, with_memory)
    np.testing.assert_array_equal(np.asarray(whole["feature_variant"]), pieces["feature_variant"])
    np.testing.assert_allclose(np.asarray(whole["tokens_per_s"]), pieces["tokens_per_s"],
                               rtol=1e-12)
    chosen = np.asarray(whole["feature_variant"])
    for index, variant in enumerate(cm.variants):  # every row runs a set Megatron accepts
        rows = chosen == index
        if index and rows.any():
            assert np.all(runnable(variant, {k: v[rows] for k, v in cols.items()},
                                   cm.training))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(diverse=st.booleans(), top=st.sampled_from([3, 8]),
       cluster=st.sampled_from(["dgx-h100", "gb200-nvl72"]))
def test_the_scan_keeps_the_number_the_answer_reports(diverse: bool, top: int,
                                                      cluster: str) -> None:
    """Each layout the bounded scan keeps has the throughput and memory that pricing it
    alone gives (its features, memory features included, chosen by the same rule), on a
    table large enough to be priced in batches."""
    model = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=512, micro_batch_sizes=(1, 2))
    gpus = 64
    table = enumerate_layouts(model, training, gpus)
    cm = build_cost_model(model, training, build_fabric(load_cluster(cluster), gpus),
                          options=CostOptions(search_features=SEARCHABLE_FEATURES))
    scan = scan_bounded(cm, table, top=top, diverse=diverse)
    picks = rank_feasible(scan, top=top, diverse=diverse)
    assert len(picks) == top
    for position in picks:
        row = int(scan.feasible_rows[position])
        alone = score_columns(cm, {k: v[row:row + 1] for k, v in table.columns.items()})
        assert bool(alone["fits"][0])
        assert float(scan.tokens_per_s[position]) == pytest.approx(
            float(alone["tokens_per_s"][0]), rel=1e-9)
        assert float(scan.memory_bytes[position]) == pytest.approx(
            float(alone["mem_total"][0]), rel=1e-9)
    tokens = scan.tokens_per_s[picks]
    assert np.all(np.diff(tokens) <= 1e-9 * tokens[0])  # best first
