"""Exhaustive search: ranking, memory pre-filter, diversity, launch settings."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.cost.options import MOE_DISPATCHERS, CostOptions
from parsearch.errors import NoValidLayoutError, SpecError
from parsearch.launch import NodeGeometry, launch_settings
from parsearch.launch.plan import pipeline_layout_string
from parsearch.layout import Layout
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import ModelSpec, MoeSpec, TrainingSpec
from parsearch.search import search_layouts
from parsearch.search.api import tie_band
from parsearch.search.bounds import SHAPE_AXES, shape_bounds
from parsearch.search.exhaustive import (
    fitting_mask,
    rank_feasible,
    scan_bounded,
    scan_table,
    shape_codes,
)
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.topology.summary import fabric_from_spec
from tests.strategies import small_models, small_trainings

# A small model and setup that keep the search fast.
TOY = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
SETUP = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2),
                     recompute_modes=("none", "full"))
CLUSTER = "dgx-h100"


@pytest.fixture(scope="module")
def scored():  # type: ignore[no-untyped-def]
    table = enumerate_layouts(TOY, SETUP, 16)
    cm = build_cost_model(TOY, SETUP, build_fabric(load_cluster(CLUSTER), 16))
    return cm, table, score_columns(cm, table.columns)


def test_memory_prefilter_agrees_with_scorer(scored) -> None:  # type: ignore[no-untyped-def]
    cm, table, scores = scored
    mask = fitting_mask(cm.model, cm.training, cm.options.memory, cm.fabric.gpu.hbm_bytes,
                        table.columns)
    assert np.array_equal(mask, scores["fits"])


def test_scan_matches_full_scoring_and_top_is_argmax(scored) -> None:  # type: ignore[no-untyped-def]
    cm, table, scores = scored
    scan = scan_table(cm, table, chunk_rows=97)  # several chunks
    assert scan.feasible == int(scores["fits"].sum())
    assert np.array_equal(np.sort(scan.feasible_rows), np.nonzero(scores["fits"])[0])
    order = rank_feasible(scan, top=5)
    best = scan.feasible_rows[order[0]]
    assert scores["tokens_per_s"][best] == scores["tokens_per_s"][scores["fits"]].max()
    ranked = scan.tokens_per_s[order]
    assert np.all(np.diff(ranked) <= 0)


@pytest.mark.parametrize("diverse", [True, False])
def test_tied_total_counts_the_band_whatever_top_is(diverse: bool) -> None:
    # The band of the best holds as many entries whatever ``top`` is; a list cut inside
    # it says how many it left out, and a list that long shows every tie marked.
    short = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=1,
                           diverse=diverse)
    total = short.tied_total
    assert total > 1  # the toy job's band holds several layouts and shapes
    assert short.tied_unlisted == total - 1
    assert short.to_dict()["tied_total"] == total
    full = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16,
                          top=total + 3, diverse=diverse)
    assert full.tied_total == total and full.tied_unlisted == 0
    marked = [e for e in full.entries if e.tied]
    assert len(marked) == total and full.entries[:total] == tuple(marked)
    if diverse:  # one entry per shape: the tied ones are distinct shapes
        shapes = {(e.layout.tp, e.layout.pp, e.layout.cp, e.layout.ep, e.layout.etp)
                  for e in marked}
        assert len(shapes) == total


def test_search_result_ranked_with_breakdowns() -> None:
    result = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=6)
    assert [e.rank for e in result.entries] == [1, 2, 3, 4, 5, 6]
    tokens = [e.estimate.tokens_per_s for e in result.entries]
    # Best predicted throughput first, ties with the best (within the profile's error
    # band) included: they are marked, not reordered.
    assert tokens == sorted(tokens, reverse=True)
    band = result.entries[0].estimate.tokens_per_s_per_gpu_range
    assert band is not None and band[0] < band[1]
    floor = max(tokens) * (1.0 - (band[1] / band[0] - 1.0) / 2.0)  # ErrorBand half-width
    tied = [e for e in result.entries if e.estimate.tokens_per_s >= floor * (1 - 1e-9)]
    assert list(result.entries[:len(tied)]) == tied
    # the tied ones are marked, with one note saying why (only when two or more tie)
    assert [e.tied for e in result.entries] == [
        len(tied) > 1 and e in tied for e in result.entries]
    assert bool(result.tie_note) == (len(tied) > 1)
    doc = result.to_dict()
    assert [r["tied_with_best"] for r in doc["results"]] == [e.tied for e in result.entries]
    assert {"query", "considered", "valid", "feasible", "results"} <= doc.keys()
    first = doc["results"][0]
    for key in ("layout", "num_gpus", "fits", "step_time_s", "tokens_per_s",
                "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "memory_gib_per_gpu",
                "time_s", "bottleneck", "headroom_gib_per_gpu", "launch"):
        assert key in first
    assert first["fits"] and first["headroom_gib_per_gpu"] >= 0
    assert first["launch"]["nodes"] == 2
    assert any(a.startswith("++model.tensor_model_parallel_size=")
               for a in first["launch"]["megatron_bridge_overrides"])
    # deterministic: the same query gives the same list
    again = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=6)
    assert [e.layout for e in again.entries] == [e.layout for e in result.entries]


def test_diverse_keeps_one_layout_per_shape() -> None:
    """The diverse list is the full ranking with each shape's first layout kept: the same
    first entry, and every entry the first of its shape in the full list."""
    plain = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=10_000)
    diverse = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16,
                             top=10_000, diverse=True)
    shapes = [(e.layout.tp, e.layout.pp, e.layout.cp, e.layout.ep, e.layout.etp)
              for e in diverse.entries]
    assert len(shapes) == len(set(shapes))
    assert diverse.entries[0].layout == plain.entries[0].layout
    first_of_shape: dict[tuple[int, ...], object] = {}
    for e in plain.entries:
        key = (e.layout.tp, e.layout.pp, e.layout.cp, e.layout.ep, e.layout.etp)
        first_of_shape.setdefault(key, e.layout)
    assert [e.layout for e in diverse.entries] == [
        layout for layout in first_of_shape.values()]
    cols = {k: np.array([getattr(e.layout, k) for e in diverse.entries])
            for k in ("tp", "pp", "cp", "ep", "etp")}
    assert len(set(shape_codes(cols, np.arange(len(shapes))).tolist())) == len(shapes)


def test_nothing_fits_and_bad_arguments() -> None:
    setup = TrainingSpec(seq_len=65536, global_batch=8, micro_batch_sizes=(8,),
                         recompute_modes=("none",))
    result = search_layouts(model=TOY, training=setup, cluster=CLUSTER, num_gpus=1)
    assert result.entries == () and result.feasible == 0
    assert result.smallest_memory_gib and result.smallest_memory_gib > 80
    with pytest.raises(SpecError, match="top must be a positive integer"):
        search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=8, top=0)
    with pytest.raises(NoValidLayoutError):
        search_layouts(model=TOY, training=TrainingSpec(seq_len=4096, global_batch=3,
                                                           micro_batch_sizes=(2,)),
                       cluster=CLUSTER, num_gpus=8)


def test_launch_settings_megatron_lm_and_bridge() -> None:
    moe = ModelSpec("toy-moe", 30, 1024, 4096, 16, 16, 64, 32000,
                    moe=MoeSpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))
    setup = TrainingSpec(seq_len=4096, global_batch=64, precision="fp8")
    layout = Layout(num_gpus=12, tp=2, pp=2, ep=2, vpp=2, mbs=2, sp=True,
                    recompute="full")
    s = launch_settings(moe, setup, layout, gpus_per_node=8)
    args = list(s.megatron_lm_args)
    assert s.nodes == 2 == NodeGeometry(12, 8).nodes
    for flag, value in (("--tensor-model-parallel-size", "2"),
                        ("--expert-model-parallel-size", "2"),
                        ("--micro-batch-size", "2"), ("--global-batch-size", "64"),
                        ("--recompute-granularity", "full"), ("--fp8-format", "hybrid")):
        assert args[args.index(flag) + 1] == value
    assert "--sequence-parallel" in args and "--use-distributed-optimizer" in args
    # 30 layers on pp*vpp=4: uneven -> an explicit layout string
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == \
        pipeline_layout_string(moe, 2, 2, "uneven")
    assert "++model.expert_model_parallel_size=2" in s.bridge_overrides
    even = launch_settings(TOY, SETUP, Layout(num_gpus=8, pp=2, vpp=2), gpus_per_node=8)
    assert "--num-layers-per-virtual-pipeline-stage" in even.megatron_lm_args
    assert "++model.virtual_pipeline_model_parallel_size=2" in even.bridge_overrides
    assert "--expert-model-parallel-size" not in even.megatron_lm_args


# --- shape bounds: an upper bound that prunes without changing the answer ------------------

BOUND_CLUSTERS = ("dgx-h100", "gb200-nvl72", "dgx-a100")


@st.composite
def bound_cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A small random model, setup, cluster, GPU count and cost options."""
    model = draw(small_models())
    training = draw(small_trainings())
    if draw(st.booleans()):  # partial recompute: prices then depend on vpp
        training = replace(training, recompute_num_layers=draw(st.integers(1, 2)))
    if draw(st.booleans()):
        training = replace(training, precision="fp8")
    cluster = load_cluster(draw(st.sampled_from(BOUND_CLUSTERS)))
    if training.precision == "fp8" and cluster.gpu.startswith("a100"):
        training = replace(training, precision="bf16")
    options = CostOptions(
        tp_comm_overlap=draw(st.booleans()), moe_a2a_overlap=draw(st.booleans()),
        overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()),
        cuda_graphs=draw(st.booleans()), flash_attention=draw(st.booleans()),
        moe_dispatcher=draw(st.sampled_from(MOE_DISPATCHERS)))
    gpus = draw(st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64]))
    return model, training, cluster, gpus, options


def _scored(case):  # type: ignore[no-untyped-def]
    model, training, cluster, gpus, options = case
    table = enumerate_layouts(model, training, gpus)
    assume(len(table) > 0)
    cm = build_cost_model(model, training, build_fabric(cluster, gpus), options=options)
    return cm, table


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(bound_cases())
def test_shape_bound_is_never_below_the_shapes_best(case) -> None:  # type: ignore[no-untyped-def]
    cm, table = _scored(case)
    shape, bound = shape_bounds(cm, table.columns)
    tokens = np.asarray(score_columns(cm, table.columns, with_memory=False)["tokens_per_s"])
    best = np.full(len(bound), -np.inf)
    np.maximum.at(best, shape, tokens)  # memory ignored: the bound must hold for every layout
    assert np.all(np.isfinite(bound)) and np.all(bound >= best)
    # every row's shape is its (tp, pp, cp, ep, etp)
    cols = table.columns
    for k in range(len(bound)):
        rows = np.nonzero(shape == k)[0]
        assert len({tuple(int(cols[a][r]) for a in SHAPE_AXES) for r in rows}) == 1


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(bound_cases(), st.integers(1, 6), st.booleans())
def test_bounded_scan_ranks_like_the_full_scan(case, top: int, diverse: bool) -> None:  # type: ignore[no-untyped-def]
    cm, table = _scored(case)
    full = scan_table(cm, table)
    bounded = scan_bounded(cm, table, top=top, diverse=diverse, first_rows=1)
    assert bounded.checked <= bounded.valid == full.valid
    assert bounded.pruned == bounded.valid - bounded.checked
    picks_full = full.feasible_rows[rank_feasible(full, top=top, diverse=diverse)]
    picks = bounded.feasible_rows[rank_feasible(bounded, top=top, diverse=diverse)]
    assert picks.tolist() == picks_full.tolist()


def test_bounds_prune_a_large_space() -> None:
    """On a real space the bound skips most layouts and still returns the full scan's top 10."""
    setup = TrainingSpec(seq_len=8192, global_batch=512)
    table = enumerate_layouts(get_preset("llama3-70b"), setup, 256)
    cm = build_cost_model(get_preset("llama3-70b"), setup,
                          build_fabric(load_cluster(CLUSTER), 256))
    band = tie_band(cm)
    full, bounded = scan_table(cm, table), scan_bounded(cm, table, top=10, tie_band=band)
    assert bounded.pruned > bounded.valid // 2
    assert (bounded.feasible_rows[rank_feasible(bounded, top=10)].tolist()
            == full.feasible_rows[rank_feasible(full, top=10)].tolist())
    result = search_layouts(model="llama3-70b", training=setup, cluster=CLUSTER, num_gpus=256,
                            top=10)
    doc = result.to_dict()
    assert doc["exact"] is True and doc["examined"] + doc["pruned"] == doc["valid"]
    assert doc["pruned"] == bounded.pruned


FABRIC_ARRAYS = ("node_of", "domain_of", "leaf_group_of", "pod_of", "nvlink_Bps",
                 "nic_share_Bps", "leaf_uplink_share_Bps", "pod_uplink_share_Bps")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["dgx-h100", "dgx-h100-oversub", "gb200-nvl72", "gb300-nvl72",
                        "dgx-a100", "h100-roce", "hgx-h800", "dgx-b200"]),
       st.integers(1, 20_000))
def test_fabric_from_spec_equals_the_graph_walk(name: str, gpus: int) -> None:
    """The search's fabric (computed from the cluster fields) is the graph's, array for array."""
    cluster = load_cluster(name)
    assume(cluster.max_gpus is None or gpus <= cluster.max_gpus)
    graph, spec = build_fabric(cluster, gpus), fabric_from_spec(cluster, gpus)
    for attr in FABRIC_ARRAYS:
        a, b = getattr(graph, attr), getattr(spec, attr)
        assert a.dtype == b.dtype and np.array_equal(a, b), attr
    assert graph.tier_latency_s == spec.tier_latency_s
    for stride, size in ((1, min(gpus, 8)), (1, gpus), (8, gpus // 8)):
        if size >= 1 and gpus % (stride * size) == 0:
            assert graph.group_link(stride, size) == spec.group_link(stride, size)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), block=st.integers(1, 50))
def test_blockwise_helpers_equal_their_whole_table_forms(data, block: int) -> None:
    """The memory-saving forms (derived columns a block of rows at a time, row numbers
    from a mask a block at a time, the memory floor compared per group, shape bounds with
    unit time floors in blocks) give exactly what the whole-table forms give."""
    from parsearch.cost.analytic import wide_columns
    from parsearch.layout.rules import derive_columns, rule_context
    from parsearch.layout.space import _derive_in_chunks
    from parsearch.search.bounds import (
        _in_blocks,
        memory_floor,
        nonzero_narrow,
        under_memory_floor,
        unit_time_floor,
    )

    mask = np.asarray(data.draw(st.lists(st.booleans(), max_size=200)), dtype=bool)
    np.testing.assert_array_equal(nonzero_narrow(mask, block=block), np.flatnonzero(mask))
    moe = ModelSpec("toy-moe", 8, 1024, 4096, 16, 4, 64, 32000,
                    moe=MoeSpec(num_experts=16, top_k=2, expert_ffn_hidden_size=1024,
                                first_k_dense=1))
    model = data.draw(st.sampled_from([TOY, moe]))
    training = TrainingSpec(seq_len=2048, global_batch=64, micro_batch_sizes=(1, 2))
    table = enumerate_layouts(model, training, 32)
    ctx = rule_context(model, training, 32)
    base = {k: v for k, v in table.columns.items() if k not in ("dp", "edp", "m")}
    whole, blocks = derive_columns(ctx, base), _derive_in_chunks(ctx, base, chunk=block)
    assert set(whole) == set(blocks)
    for name, values in whole.items():
        np.testing.assert_array_equal(blocks[name], values)
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), 32))
    hbm = data.draw(st.sampled_from([20e9, 40e9, 72e9]))
    np.testing.assert_array_equal(under_memory_floor(cm, table.columns, hbm),
                                  np.flatnonzero(memory_floor(cm, table.columns) <= hbm))
    rows = wide_columns({k: v[:300] for k, v in table.columns.items()})
    one = unit_time_floor(cm, rows)
    split = _in_blocks(lambda part: unit_time_floor(cm, part), rows, block=block)
    assert set(one) == set(split)
    for unit, values in one.items():
        np.testing.assert_array_equal(split[unit], np.broadcast_to(values, (len(rows["tp"]),)))
