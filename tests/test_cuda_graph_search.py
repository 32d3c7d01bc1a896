"""CUDA graphs as a searched feature: priced in time and memory, chosen per layout exactly,
refused where Megatron refuses them, pinned by a flag, named in the launch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import (
    UNITS,
    build_cost_model,
    layout_columns,
    score_columns,
    wide_columns,
)
from parsearch.cost.feature_search import (
    feature_variants,
    graph_level,
    graph_levels,
    graphs_runnable,
    runnable,
    with_graph_level,
)
from parsearch.cost.memory.cuda_graph_memory import (
    cuda_graph_layer_bytes,
    graph_callables,
    layer_graph_counts,
)
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.cost.recompute import recompute_shares
from parsearch.cost.unit_prices import process_groups, unit_prices
from parsearch.errors import SpecError
from parsearch.launch.bridge import bridge_fields
from parsearch.launch.megatron_lm import megatron_lm_args
from parsearch.launch.plan import launch_plan, priced_features
from parsearch.layout import parse_layout_string
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, TrainingSpec
from parsearch.search.exhaustive import rank_feasible, scan_bounded, scan_table
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import run_cli
from tests.strategies import small_models, small_trainings

GRAPHS = CostOptions(search_features=("cuda_graphs",))
CLUSTERS = ("dgx-h100", "gb200-nvl72", "dgx-a100")


@st.composite
def cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    model = draw(small_models())
    training = draw(small_trainings())
    cluster = load_cluster(draw(st.sampled_from(CLUSTERS)))
    gpus = draw(st.sampled_from([4, 8, 16]))
    searched = tuple(f for f in SEARCHABLE_FEATURES if draw(st.booleans()))
    options = CostOptions(search_features=tuple(sorted({*searched, "cuda_graphs"})),
                          routing=draw(st.sampled_from(("trained", "balanced"))))
    table = enumerate_layouts(model, training, gpus)
    assume(len(table) > 0)
    cm = build_cost_model(model, training, build_fabric(cluster, gpus), options=options)
    return cm, table


def _every_level(cm):  # type: ignore[no-untyped-def]
    base = replace(cm.options, search_features=())
    return [with_graph_level(base, level)
            for level in graph_levels(cm.model, cm.options, base.moe_dispatcher)]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases())
def test_graphs_never_increase_time_and_never_decrease_memory(case) -> None:  # type: ignore[no-untyped-def]
    """A graph only removes host issue time (compute.py) and only adds static buffers
    (cuda_graph_memory.py): under every level each unit of every layout (its compute and
    the traffic left exposed beside it) is at most as slow as eager, and each layout at
    least as large.  (The step is compared, not assumed: the stage's pipeline sends and DP
    reduction hide behind the same host gaps again, stage_time.py, so a step can come out
    slower with graphs; the search then keeps eager, as the next test checks.)"""
    cm, table = case
    cols = wide_columns(table.columns)
    cols["m"] = cm.training.global_batch // (cols["mbs"] * cols["dp"])
    groups = process_groups(cm.fabric, cols)
    shares = recompute_shares(cm.model, cm.training, cols["recompute"], pp=cols["pp"],
                              vpp=cols["vpp"], tp=cols["tp"], sp=cols["sp"])
    eager_cm = replace(cm, options=with_graph_level(cm.options, (False, ())), variants=())
    eager = score_columns(eager_cm, cols)
    units = {unit: sum(unit_prices(eager_cm, cols, groups, unit, shares).values())
             for unit in UNITS}
    for options in _every_level(cm):
        level_cm = replace(cm, options=options, variants=())
        for unit in UNITS:
            priced = sum(unit_prices(level_cm, cols, groups, unit, shares).values())
            assert np.all(priced <= units[unit] * (1 + 1e-12) + 1e-18), unit
        memory = score_columns(level_cm, cols)["mem_total"]
        assert np.all(memory >= eager["mem_total"] * (1 - 1e-12))
        if not options.cuda_graphs:
            np.testing.assert_allclose(memory, eager["mem_total"], rtol=1e-12)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases())
def test_each_layout_keeps_its_fastest_runnable_fitting_variant(case) -> None:  # type: ignore[no-untyped-def]
    cm, table = case
    cols = table.columns
    chosen = score_columns(cm, cols)
    index = np.asarray(chosen["feature_variant"])
    singles = [score_columns(replace(cm, options=v, variants=()), cols) for v in cm.variants]
    ok = [runnable(v, cols, cm.training) | ((i == 0) & ~v.cuda_graphs)
          for i, v in enumerate(cm.variants)]
    for row in range(len(table)):
        k = int(index[row])
        assert ok[k][row], (row, cm.variants[k])
        assert chosen["step_time_s"][row] == pytest.approx(singles[k]["step_time_s"][row],
                                                           rel=1e-12)
        assert chosen["mem_total"][row] == pytest.approx(singles[k]["mem_total"][row], rel=1e-12)
        fitting = [i for i in range(len(singles)) if ok[i][row] and singles[i]["fits"][row]]
        if fitting:
            assert chosen["fits"][row]
            assert chosen["step_time_s"][row] <= min(
                singles[i]["step_time_s"][row] for i in fitting) * (1 + 1e-12)


# --- a real model near its memory limit: the graph level is chosen by memory --------------

LLAMA = get_preset("llama3-70b")
LLAMA_TRAINING = TrainingSpec(seq_len=8192, global_batch=128, micro_batch_sizes=(1, 2),
                              recompute_modes=("none", "selective", "full"))


@pytest.mark.parametrize("margin", [0.0, 0.1, 0.2])
def test_near_the_memory_limit_the_fastest_fitting_level_is_kept(margin: float) -> None:
    fabric = build_fabric(load_cluster("dgx-h100"), 64)
    cm = build_cost_model(LLAMA, LLAMA_TRAINING, fabric,
                          options=replace(GRAPHS, memory_margin=margin))
    table = enumerate_layouts(LLAMA, LLAMA_TRAINING, 64)
    rows = np.arange(0, len(table), max(1, len(table) // 400))
    cols = {k: v[rows] for k, v in table.columns.items()}
    chosen = score_columns(cm, cols)
    on, off = (score_columns(replace(cm, options=v, variants=()), cols) for v in cm.variants[::-1])
    assert cm.variants[0].cuda_graphs is False and cm.variants[1].cuda_graphs is True
    graphs = np.asarray(chosen["feature_variant"]) == 1
    can = graphs_runnable(cm.variants[1], cm.training, cols)
    # graphs where they run, fit and are faster; eager where they cannot run or only eager
    # fits
    faster = on["step_time_s"] < off["step_time_s"]
    np.testing.assert_array_equal(graphs, can & on["fits"] & (faster | ~off["fits"]))
    full = np.asarray(cols["recompute"]) == RECOMPUTE_CODES["full"]
    assert not np.any(graphs & full)
    only_eager = can & ~on["fits"] & off["fits"]
    assert np.all(chosen["fits"][only_eager]) and not np.any(graphs[only_eager])
    if margin == 0.1:
        assert np.any(only_eager) and np.any(graphs), "the case must exercise both"


def test_bounded_search_agrees_with_the_full_scan_near_the_limit() -> None:
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    cm = build_cost_model(LLAMA, LLAMA_TRAINING, fabric, options=replace(GRAPHS,
                                                                         memory_margin=0.1))
    table = enumerate_layouts(LLAMA, LLAMA_TRAINING, 32)
    full = scan_table(cm, table)
    for top, diverse in ((1, False), (5, True)):
        bounded = scan_bounded(cm, table, top=top, diverse=diverse, first_rows=1)
        a = full.feasible_rows[rank_feasible(full, top=top, diverse=diverse)]
        b = bounded.feasible_rows[rank_feasible(bounded, top=top, diverse=diverse)]
        np.testing.assert_array_equal(a, b)


# --- the memory term ---------------------------------------------------------------------

def test_static_buffers_by_hand() -> None:
    """Llama 3 70B, TP8 with SP, one 8,192-token micro-batch: a whole-layer graph holds its
    static input and grad input, 2 x 8192 x 8192/8 x 2 B = 32 MiB per layer and micro-batch
    in flight; attn + mlp graphs twice that."""
    assert graph_callables((), moe_layer=False) == 1
    assert graph_callables(("attn", "mlp"), moe_layer=False) == 2
    assert cuda_graph_layer_bytes(1, 8192.0, 8192, 8.0) == 32 * 2**20
    assert cuda_graph_layer_bytes(2, 8192.0, 8192, 8.0) == 64 * 2**20
    assert layer_graph_counts(True, "transformer_engine", ("attn", "moe_router",
                                                           "moe_preprocess")) == (1, 2)
    assert layer_graph_counts(True, "full_iteration", ()) == (0, 0)


def test_graph_memory_is_layers_times_micro_batches_in_flight() -> None:
    """The term is held like an activation: per layer of the peak stage and per micro-batch
    in flight, so its total is the eager layer count times in-flight count times 32 MiB."""
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    training = TrainingSpec(seq_len=8192, global_batch=64)
    layout = parse_layout_string("tp=8,pp=4,sp=true,mbs=1", 32)
    cols = layout_columns([layout])
    eager = score_columns(build_cost_model(LLAMA, training, fabric), cols)
    graphs = score_columns(build_cost_model(LLAMA, training, fabric,
                                            options=CostOptions(cuda_graphs=True)), cols)
    extra = float(graphs["mem_total"][0] - eager["mem_total"][0])
    # rank 0 of PP4 1F1B holds 4 micro-batches of its 20 layers
    assert extra == pytest.approx(20 * 4 * 32 * 2**20, rel=1e-9)
    # the full-iteration graph has no per-layer buffers
    whole = score_columns(build_cost_model(LLAMA, training, fabric, options=CostOptions(
        cuda_graphs=True, cuda_graph_impl="full_iteration")), cols)
    assert float(whole["mem_total"][0]) == pytest.approx(float(eager["mem_total"][0]))


# --- preconditions -------------------------------------------------------------------------

def test_searched_graphs_respect_megatrons_preconditions() -> None:
    qwen = get_preset("qwen3-30b-a3b")
    levels = graph_levels(qwen, GRAPHS, "flex")
    # dropless MoE: never the whole layer, never the moe scope
    assert all(on is False or (scope and "moe" not in scope) for on, scope in levels)
    # alltoall with a capacity factor: no preprocessing graph (host copies)
    capped = replace(GRAPHS, moe_capacity_factor=1.5)
    assert all("moe_preprocess" not in scope for _, scope in graph_levels(qwen, capped,
                                                                          "alltoall"))
    # padded expert inputs: the whole layer
    padded = replace(GRAPHS, moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    assert graph_levels(qwen, padded, "alltoall")[0] == (True, ())
    # CPU offloading: no layout runs per-layer graphs
    cols = layout_columns([parse_layout_string("tp=1,ep=8,mbs=1", 8)])
    offload = TrainingSpec(seq_len=4096, global_batch=64, activation_offload_layers=2)
    graphs = with_graph_level(GRAPHS, levels[0])
    assert not graphs_runnable(graphs, offload, cols).any()
    # recompute module moe beside a moe_router graph (transformer_engine)
    selective = parse_layout_string("tp=1,ep=8,mbs=1,recompute=selective", 8)
    moe_rec = TrainingSpec(seq_len=4096, global_batch=64, recompute_modules=("moe",))
    assert not graphs_runnable(graphs, moe_rec, layout_columns([selective])).any()
    assert graphs_runnable(with_graph_level(GRAPHS, (True, ("attn",))), moe_rec,
                           layout_columns([selective])).all()


def test_search_falls_back_to_eager_under_cpu_offloading() -> None:
    fabric = build_fabric(load_cluster("dgx-h100"), 16)
    training = TrainingSpec(seq_len=4096, global_batch=64, activation_offload_layers=1,
                            recompute_modes=("none",))
    cm = build_cost_model(get_preset("llama3-8b"), training, fabric, options=GRAPHS)
    table = enumerate_layouts(get_preset("llama3-8b"), training, 16)
    chosen = score_columns(cm, table.columns)
    assert not any(cm.variants[int(i)].cuda_graphs for i in chosen["feature_variant"])


@pytest.mark.parametrize(("options", "training", "needle"), [
    (CostOptions(cuda_graphs=True),
     TrainingSpec(seq_len=4096, global_batch=64, activation_offload_layers=1), "offloading"),
    (CostOptions(cuda_graphs=True, cuda_graph_scope=("attn", "moe")),
     TrainingSpec(seq_len=4096, global_batch=64), "padded expert inputs"),
    (CostOptions(cuda_graphs=True, cuda_graph_scope=("attn", "moe_router")),
     TrainingSpec(seq_len=4096, global_batch=64, recompute_modes=("selective",),
                  recompute_modules=("moe",)), "recompute module moe"),
])
def test_pinned_graphs_megatron_refuses_are_errors(options: CostOptions,
                                                   training: TrainingSpec,
                                                   needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        build_cost_model(get_preset("qwen3-30b-a3b"), training,
                         build_fabric(load_cluster("dgx-h100"), 8), options=options)


def test_bad_graph_options_are_named() -> None:
    with pytest.raises(SpecError, match="cuda_graph_impl"):
        CostOptions(cuda_graphs=True, cuda_graph_impl="cudnn")
    with pytest.raises(SpecError, match="full_iteration"):
        CostOptions(cuda_graphs=True, cuda_graph_impl="full_iteration",
                    cuda_graph_scope=("attn",))
    with pytest.raises(SpecError, match="moe and moe_router"):
        CostOptions(cuda_graphs=True, cuda_graph_scope=("moe", "moe_router"))


def test_variants_cover_every_level_under_every_moe_set() -> None:
    qwen = get_preset("qwen3-30b-a3b")
    options = CostOptions(search_features=SEARCHABLE_FEATURES)
    variants = feature_variants(qwen, options, 9.0)
    moe_only = feature_variants(qwen, replace(options, search_features=SEARCHABLE_FEATURES[:3]),
                                9.0)
    assert len(variants) == 3 * len(moe_only)
    assert {graph_level(v) for v in variants} == set(graph_levels(qwen, options, "flex"))
    dense = feature_variants(get_preset("llama3-8b"), options, 9.0)
    assert [graph_level(v) for v in dense] == [(False, ()), (True, ())]


# --- flags, tables, explain and launch ----------------------------------------------------

SEARCH = ("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
          "--global-batch", "64", "--seq-len", "4096", "--top", "3", "--format", "json")


def _features(*extra: str) -> list[list[str]]:
    import json

    result = run_cli(*SEARCH, *extra)
    assert result.code == 0, result.err
    return [entry["priced_features"] for entry in json.loads(result.out)["results"]]


def test_flags_pin_graphs_and_unset_searches_them() -> None:
    searched = _features()
    assert all("CUDA graphs (whole layers)" in f for f in searched)
    assert all(not any("CUDA graphs" in x for x in f) for f in _features("--no-cuda-graphs"))
    assert all("CUDA graphs (whole layers)" in f for f in _features("--cuda-graphs"))
    assert all("CUDA graphs (attn)" in f for f in _features("--cuda-graph-scope", "attn"))
    assert all(not any("CUDA graphs" in x for x in f)
               for f in _features("--no-feature-search"))


def test_table_and_explain_name_the_chosen_graphs() -> None:
    table = run_cli(*SEARCH[:-2])
    assert table.code == 0 and " cg\n" in table.out and "cg: CUDA graphs" in table.out
    explain = run_cli("explain", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100",
                      "--gpus", "16", "--global-batch", "64", "--seq-len", "4096",
                      "--layout", "tp=1,pp=2,ep=8,mbs=1")
    assert explain.code == 0, explain.err
    assert "CUDA graphs (attn, moe_router, moe_preprocess)" in explain.out


def test_launch_names_the_graphs_with_the_recorded_arguments() -> None:
    qwen = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=64, recompute_modes=("selective",))
    layout = parse_layout_string("tp=1,ep=8,mbs=1,recompute=selective", 8)
    options = CostOptions(cuda_graphs=True,
                          cuda_graph_scope=("attn", "moe_router", "moe_preprocess"))
    plan = launch_plan(qwen, training, layout, options)
    args = megatron_lm_args(qwen, plan)
    text = " ".join(args)
    assert "--cuda-graph-impl transformer_engine" in text
    assert "--cuda-graph-modules attn moe_router moe_preprocess" in text
    assert "--cuda-graph-scope" not in text  # the deprecated spelling
    assert "--attention-dropout 0.0" in text  # graphed core_attn recompute needs no dropout
    fields = bridge_fields(plan, {})
    assert fields["model.cuda_graph_impl"] == "transformer_engine"
    assert fields["model.cuda_graph_modules"] == ["attn", "moe_router", "moe_preprocess"]
    assert fields["model.cuda_graph_scope"] is None
    assert any("CUDA graphs (attn" in f for f in priced_features(plan))
    full = launch_plan(qwen, training, layout, CostOptions(cuda_graphs=True,
                                                           cuda_graph_impl="full_iteration"))
    assert "--no-check-for-nan-in-loss-and-grad" in megatron_lm_args(qwen, full)
    off = launch_plan(qwen, training, layout, CostOptions())
    assert bridge_fields(off, {})["model.cuda_graph_impl"] == "none"
    # Megatron refuses per-layer graphs with full recompute: a pinned flag says so
    full_rec = parse_layout_string("tp=1,ep=8,mbs=1,recompute=full", 8)
    conflicts = launch_plan(qwen, replace(training, recompute_modes=("full",)), full_rec,
                            CostOptions(cuda_graphs=True, cuda_graph_scope=("attn",))).conflicts
    assert any("full recompute" in c for c in conflicts)
