"""`serve` lists one row per instance shape at its best batch (default), or every batch."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.presets import get_preset
from parsearch.serve.api import ServeResult, serve_layouts
from parsearch.serve.evaluate import ServingEstimate
from parsearch.serve.front import best_per_shape, instance_shape, rank_estimates
from parsearch.serve.spec import ServingLayout, ServingWorkload
from tests.cli_helpers import run_cli

_SHAPES = st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]),
                    st.sampled_from([1, 2]), st.sampled_from([1, 2]))


def _estimate(shape: tuple[int, int, int, int], batch: int, tokens: float,
              prefill: tuple[int, int, int, int] | None = None) -> ServingEstimate:
    tp, adp, pp, ep = shape
    pre = None
    if prefill is not None:
        p_tp, p_adp, p_pp, p_ep = prefill
        pre = ServingLayout(p_tp, p_pp, p_ep, p_adp, 1)
    return ServingEstimate(ServingLayout(tp, pp, ep, adp, batch), tp * adp * pp, tokens,
                           tokens / batch, 1.0, 1.0, 1.0, 1.0, True, batch, "compute",
                           prefill_layout=pre)


@given(st.lists(st.tuples(_SHAPES, st.integers(1, 512), st.floats(1.0, 1e5)), max_size=30))
@settings(max_examples=80, deadline=None)
def test_best_per_shape_keeps_the_first_of_each_shape_in_order(
        rows: list[tuple[tuple[int, int, int, int], int, float]]) -> None:
    ranked = rank_estimates([_estimate(s, b, t) for s, b, t in rows], by_gpus=False)
    kept = best_per_shape(ranked)
    shapes = [instance_shape(e) for e in kept]
    assert len(shapes) == len(set(shapes))                    # one row per shape
    assert set(shapes) == {instance_shape(e) for e in ranked}  # every shape is there
    positions = [next(i for i, e in enumerate(ranked) if e is k) for k in kept]
    assert positions == sorted(positions)                     # the ranked order is kept
    for k, pos in zip(kept, positions, strict=True):          # each is its shape's first
        assert all(instance_shape(e) != instance_shape(k) for e in ranked[:pos])


def test_disaggregated_shapes_count_the_prefill_instance() -> None:
    decode = (2, 1, 1, 1)
    a = _estimate(decode, 64, 100.0, prefill=(4, 1, 1, 1))
    b = _estimate(decode, 64, 90.0, prefill=(8, 1, 1, 1))
    c = _estimate(decode, 32, 80.0, prefill=(4, 1, 1, 1))
    assert best_per_shape([a, b, c]) == [a, b]


def _llama_70b(diverse: bool, top: int) -> ServeResult:
    w = ServingWorkload(isl=128, osl=128, precision="fp8", kv_precision="fp8")
    return serve_layouts(model=get_preset("llama3-70b"), cluster="dgx-h200", num_gpus=8,
                         workload=w, top=top, diverse=diverse)


def test_default_lists_distinct_launches_and_keeps_the_best() -> None:
    diverse, every = _llama_70b(True, 10), _llama_70b(False, 40)
    shapes = [instance_shape(e.estimate) for e in diverse.entries]
    assert len(shapes) == len(set(shapes)) == len(diverse.entries)
    # batch variants of one shape crowd the undiversified list on this question
    every_shapes = [instance_shape(e.estimate) for e in every.entries]
    assert len(set(every_shapes)) < len(every_shapes)
    assert diverse.best.estimate == every.best.estimate
    # the diverse list is the undiversified ranking's first row of each shape
    firsts = best_per_shape([e.estimate for e in every.entries])
    assert [e.estimate for e in diverse.entries] == firsts[:len(diverse.entries)]
    assert diverse.query["diverse"] is True and every.query["diverse"] is False


def test_first_rows_do_not_depend_on_top() -> None:
    few, many = _llama_70b(True, 3), _llama_70b(True, 8)
    assert [e.estimate for e in few.entries] == [e.estimate for e in many.entries[:3]]


def test_cli_no_diverse_lists_batch_variants() -> None:
    args = ("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "2",
            "--isl", "512", "--osl", "256", "--top", "6", "--format", "json")
    one = json.loads(run_cli(*args).out)
    all_batches = json.loads(run_cli(*args, "--no-diverse").out)

    def shapes(result: dict) -> list[tuple[int, ...]]:
        return [tuple(e["layout"][k] for k in ("tp", "attention_dp", "pp", "ep"))
                for e in result["results"]]

    assert len(set(shapes(one))) == len(shapes(one))
    assert len(set(shapes(all_batches))) < len(shapes(all_batches))
    text = run_cli(*args[:-2]).out
    assert "one row per instance shape" in text
