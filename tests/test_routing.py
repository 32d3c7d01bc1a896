"""MoE routing as trained models route: imbalance by EP size, forced balance only when asked."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, layout_columns, score_columns
from parsearch.cost.options import CostOptions
from parsearch.cost.routing import (
    expected_max_standard_normal,
    priced_imbalance,
    routing_imbalance,
    trained_imbalance,
)
from parsearch.errors import SpecError
from parsearch.launch import launch_settings
from parsearch.layout import Layout
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.published_runs import (
    PublishedRun,
    load_published_runs,
    read_published_runs,
)
from parsearch.validation.published.runs import fabric_for, memory_saving_candidates, run_cost_model
from tests.cli_helpers import assert_one_line_error, run_cli

QWEN = get_preset("qwen3-30b-a3b")
EPS = (1, 2, 4, 8, 16, 32, 64, 128)


def test_expected_maximum_of_normals_matches_known_values() -> None:
    """Against tabulated expected maxima (Harter 1961: n = 2: 1/sqrt(pi) = 0.5642,
    n = 10: 1.5388, n = 100: 2.5076); 0 for one rank."""
    got = expected_max_standard_normal(np.array([1, 2, 10, 100]))
    assert got[0] == 0.0
    assert got[1:] == pytest.approx([0.5642, 1.5388, 2.5076], rel=1e-3)


@given(st.sampled_from(EPS), st.sampled_from(EPS), st.floats(64, 1e6))
def test_trained_imbalance_grows_with_ep_and_is_one_without_ep(a: int, b: int,
                                                               copies: float) -> None:
    lo, hi = sorted((a, b))
    i_lo, i_hi = trained_imbalance(QWEN, np.array([lo, hi]), np.array([copies, copies]),
                                   np.array([lo, hi]))
    assert 1.0 <= i_lo <= i_hi
    if lo == 1:
        assert i_lo == 1.0


@given(st.sampled_from(EPS), st.floats(64, 1e6), st.floats(1.0, 3.0), st.booleans())
def test_capacity_factor_caps_or_pads(ep: int, copies: float, factor: float, pad: bool) -> None:
    """Dropping caps the busiest rank at the capacity factor; padding runs it exactly."""
    value = routing_imbalance(QWEN, routing="trained", fixed=None, capacity_factor=factor,
                              pad_to_capacity=pad, ep=np.array([ep]),
                              copies_per_rank=np.array([copies]), sequences=np.array([ep]))[0]
    free = trained_imbalance(QWEN, np.array([ep]), np.array([copies]), np.array([ep]))[0]
    assert value == pytest.approx(factor if pad else min(factor, free))


def test_balanced_and_fixed_imbalance() -> None:
    ep, copies = np.array([1, 8, 64]), np.full(3, 4096.0)
    assert np.all(routing_imbalance(QWEN, routing="balanced", fixed=None, capacity_factor=None,
                                    pad_to_capacity=False, ep=ep, copies_per_rank=copies,
                                    sequences=ep) == 1)
    assert np.all(routing_imbalance(QWEN, routing="trained", fixed=1.7, capacity_factor=None,
                                    pad_to_capacity=False, ep=ep, copies_per_rank=copies,
                                    sequences=ep) == 1.7)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([8, 16, 32]), st.sampled_from(["alltoall", "allgather", "flex"]),
       st.booleans())
def test_trained_routing_is_never_faster_than_forced_balance(gpus: int, dispatcher: str,
                                                             overlap: bool) -> None:
    """Every layout of a MoE question: trained-router pricing is at least as slow, and
    equal where EP is 1 (no rank waits for another)."""
    training = TrainingSpec(seq_len=4096, global_batch=256, micro_batch_sizes=(1, 2))
    table = enumerate_layouts(QWEN, training, gpus)
    fabric = build_fabric(load_cluster("dgx-h100"), gpus)
    options = CostOptions(moe_dispatcher=dispatcher, moe_a2a_overlap=overlap)
    trained = build_cost_model(QWEN, training, fabric, options=options)
    balanced = build_cost_model(QWEN, training, fabric,
                                options=replace(options, routing="balanced"))
    t = np.asarray(score_columns(trained, table.columns, with_memory=False)["step_time_s"])
    b = np.asarray(score_columns(balanced, table.columns, with_memory=False)["step_time_s"])
    assert np.all(t >= b * (1 - 1e-12))
    no_ep = table.columns["ep"] == 1
    assert np.allclose(t[no_ep], b[no_ep], rtol=1e-12)
    assert np.any(t[~no_ep] > b[~no_ep])


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([8, 16, 32]), st.sampled_from([None, 1.25]))
def test_memory_holds_the_busiest_ranks_tokens_as_time_prices_them(
        gpus: int, capacity: float | None) -> None:
    """One router for time and memory: under trained routing a layout with EP needs at
    least the memory of forced balance, more where its expert activations grow with the
    busiest rank's share; without EP (or for a dense model) nothing changes; a capacity
    factor caps it."""
    training = TrainingSpec(seq_len=4096, global_batch=256, micro_batch_sizes=(1, 2))
    table = enumerate_layouts(QWEN, training, gpus)
    fabric = build_fabric(load_cluster("dgx-h100"), gpus)
    trained = CostOptions(moe_capacity_factor=capacity)
    assert trained.memory.routing == "trained"
    assert trained.memory.moe_capacity_factor == capacity
    mem = {}
    for name, options in (("trained", trained),
                          ("balanced", replace(trained, routing="balanced"))):
        cm = build_cost_model(QWEN, training, fabric, options=options)
        mem[name] = np.asarray(score_columns(cm, table.columns)["mem_activations"])
    no_ep = table.columns["ep"] == 1
    assert np.all(mem["trained"] >= mem["balanced"] * (1 - 1e-12))
    assert np.allclose(mem["trained"][no_ep], mem["balanced"][no_ep], rtol=1e-12)
    assert np.any(mem["trained"][~no_ep] > mem["balanced"][~no_ep])
    if capacity is not None:
        capped = build_cost_model(QWEN, training, fabric,
                                  options=replace(trained, moe_imbalance=capacity))
        fixed = np.asarray(score_columns(capped, table.columns)["mem_activations"])
        assert np.all(mem["trained"] <= fixed * (1 + 1e-12))
    # a fixed imbalance is fixed for memory too
    assert CostOptions(moe_imbalance=1.4).memory.moe_imbalance == 1.4


def _flags(routing: str, **extra: object) -> tuple[str, ...]:
    training = TrainingSpec(seq_len=4096, global_batch=256)
    layout = Layout(num_gpus=16, ep=16, mbs=1)
    return launch_settings(QWEN, training, layout, gpus_per_node=8,
                           options=CostOptions(routing=routing, **extra)).megatron_lm_args


def test_launch_forces_balance_only_when_priced_balanced() -> None:
    assert "--moe-router-force-load-balancing" not in _flags("trained")
    assert "--moe-router-force-load-balancing" in _flags("balanced")
    args = _flags("trained", moe_capacity_factor=1.25, moe_pad_to_capacity=True)
    i = args.index("--moe-expert-capacity-factor")
    assert args[i + 1] == "1.25" and "--moe-pad-expert-input-to-capacity" in args


def test_options_and_cli_refuse_inconsistent_routing() -> None:
    with pytest.raises(SpecError, match="routing must be one of"):
        CostOptions(routing="random")
    with pytest.raises(SpecError, match="needs a capacity factor"):
        CostOptions(moe_pad_to_capacity=True)
    result = run_cli("explain", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100",
                     "--gpus", "16", "--global-batch", "256", "--seq-len", "4096",
                     "--layout", "ep=16", "--moe-pad-to-capacity")
    assert_one_line_error(result, "--moe-capacity-factor")


def test_explain_names_the_routing_it_priced() -> None:
    base = ("explain", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
            "--global-batch", "256", "--seq-len", "4096", "--layout", "ep=16")
    trained, balanced = run_cli(*base), run_cli(*base, "--routing", "balanced")
    assert trained.code == 0 and balanced.code == 0
    assert "trained-router imbalance (busiest EP rank" in trained.out
    assert "forced-balance routing (benchmark) (busiest EP rank 1.00x" in balanced.out


def _independent() -> dict[str, PublishedRun]:
    data = resources.files("parsearch.data").joinpath("independent_runs.csv")
    with resources.as_file(data) as path:
        return {r.id: r for r in read_published_runs(path).runs}


def test_published_runs_are_read_with_their_recipes_routing() -> None:
    """NVIDIA's forced-balance rows stay balanced; a card run with its router on real data
    (i0059) is priced with the trained router, and the shipped constant reproduces the
    measured forced/natural step ratio of the same recipe (24.71 s vs 30.29 s)."""
    runs = _independent()
    natural = runs["i0059"]
    training, layout, _ = memory_saving_candidates(natural)[0]
    assert natural.cluster is not None
    cm = run_cost_model(natural, fabric_for({}, natural.cluster, natural.num_gpus),
                        CostOptions(), training)
    assert cm.options.routing == "trained"
    cols = layout_columns([layout])
    step = float(score_columns(cm, cols, with_memory=False)["step_time_s"][0])
    forced = replace(cm, options=replace(cm.options, routing="balanced", moe_imbalance=1.0))
    step_forced = float(score_columns(forced, cols, with_memory=False)["step_time_s"][0])
    measured = runs["i0049"].measured_tokens_per_s_per_gpu / natural.measured_tokens_per_s_per_gpu
    assert step / step_forced == pytest.approx(measured, rel=0.02)
    assert float(priced_imbalance(cm.model, cm.training, cm.options, cols)[0]) > 1.3
    # a forced-balance calibration row keeps imbalance 1
    r0001 = next(r for r in load_published_runs() if r.id == "r0001")
    training, layout, _ = memory_saving_candidates(r0001)[0]
    assert r0001.cluster is not None
    cm = run_cost_model(r0001, fabric_for({}, r0001.cluster, r0001.num_gpus), CostOptions(),
                        training)
    assert cm.options.routing == "balanced"
    assert float(priced_imbalance(cm.model, cm.training, cm.options,
                                  layout_columns([layout]))[0]) == 1.0


def test_bridge_overrides_reset_unpriced_recipe_features() -> None:
    """Issue 32: a recipe's op fuser, paged stash and per-rank capacity survived the
    overrides; a MoE launch now writes each as priced (off unless the fused MLP is)."""
    training = TrainingSpec(seq_len=4096, global_batch=256)
    layout = Layout(num_gpus=16, ep=16, mbs=1)
    overrides = launch_settings(QWEN, training, layout, gpus_per_node=8,
                                options=CostOptions()).bridge_overrides
    for field in ("++model.moe_paged_stash=false", "++model.moe_expert_rank_capacity_factor=null",
                  "++model.use_transformer_engine_op_fuser=false",
                  "++model.moe_router_force_load_balancing=false"):
        assert field in overrides
