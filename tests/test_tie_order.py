"""The ranking is one total order fixed before the cut, so ``--top`` never changes who
comes first, ties within the error band included."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model
from parsearch.layout.space import enumerate_layouts
from parsearch.model.specs import TrainingSpec
from parsearch.search import search_layouts
from parsearch.search.exhaustive import rank_feasible, scan_bounded, scan_table
from parsearch.topology.fabric import build_fabric
from tests.test_search import bound_cases


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(bound_cases(), st.integers(1, 5), st.integers(1, 5), st.booleans(),
       st.floats(0.0, 0.3))
def test_a_larger_top_only_appends(case, k1: int, k2: int, diverse: bool,  # type: ignore[no-untyped-def]
                                   band: float) -> None:
    """The bounded scan with a tie band ranks like the full scan, and the list for ``top=k``
    is the first k of the list for any larger ``top`` (the K-dependent tie order of the
    issue: top 1 and top 2 named different leaders)."""
    model, training, cluster, gpus, options = case
    table = enumerate_layouts(model, training, gpus)
    assume(len(table) > 0)
    cm = build_cost_model(model, training, build_fabric(cluster, gpus), options=options)
    full = scan_table(cm, table)
    assume(full.feasible > 0)
    lo, hi = sorted((k1, k2))
    whole = full.feasible_rows[rank_feasible(full, top=hi, diverse=diverse)]
    for top in (lo, hi):
        scan = scan_bounded(cm, table, top=top, diverse=diverse, tie_band=band, first_rows=1)
        picks = scan.feasible_rows[rank_feasible(scan, top=top, diverse=diverse)]
        assert picks.tolist() == whole[:top].tolist()
        # the bounded scan keeps every layout of the band, so the ties can be counted
        floor = float(full.tokens_per_s.max()) * (1.0 - band)
        assert (np.count_nonzero(scan.tokens_per_s >= floor)
                == np.count_nonzero(full.tokens_per_s >= floor))
    # ties keep the throughput order (the point estimate), equal throughput by memory
    ranked = rank_feasible(full, top=hi, diverse=diverse)
    tokens, memory = full.tokens_per_s[ranked], full.memory_bytes[ranked]
    assert np.all(np.diff(tokens) <= 0)
    same = np.diff(tokens) == 0
    assert np.all(np.diff(memory)[same] >= 0)


def test_search_leader_is_the_same_for_every_top() -> None:
    """A MoE question with many layouts inside the band: top 1, 2, 3 and 10 share a prefix."""
    lists = [[e.estimate.layout for e in search_layouts(
        model="mixtral-8x7b", training=_moe_setup(), cluster="dgx-h100", num_gpus=64,
        top=top).entries] for top in (1, 2, 3, 10)]
    longest = lists[-1]
    assert len(longest) == 10
    for short in lists[:-1]:
        assert short == longest[:len(short)]


def _moe_setup() -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch=512, precision="bf16")
