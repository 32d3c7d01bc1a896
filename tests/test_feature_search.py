"""MoE features chosen per layout: exact, runnable, priced in memory, named in the launch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.cost.ep_overlap import stands_in_for_pinned_overlap
from parsearch.cost.feature_search import feature_variants, graphs_runnable, runnable
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.layout.rules import RECOMPUTE_CODES
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.search import search_layouts
from parsearch.search.exhaustive import rank_feasible, scan_bounded, scan_table
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import run_cli
from tests.strategies import small_models, small_trainings
from tests.test_search import _scored

CLUSTERS = ("dgx-h100", "gb200-nvl72", "dgx-a100")


@st.composite
def moe_cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    model = draw(small_models(moe=True))
    training = draw(small_trainings())
    cluster = load_cluster(draw(st.sampled_from(CLUSTERS)))
    gpus = draw(st.sampled_from([4, 8, 16, 32]))
    searched = tuple(f for f in SEARCHABLE_FEATURES if draw(st.booleans())) or \
        SEARCHABLE_FEATURES
    # the base set may overlap the all-to-all (a recipe that runs it), which some layouts
    # of the table cannot run
    options = CostOptions(search_features=searched,
                          moe_dispatcher=draw(st.sampled_from(("alltoall", "flex"))),
                          routing=draw(st.sampled_from(("trained", "balanced"))),
                          moe_a2a_overlap=draw(st.booleans()))
    if cluster.gpu.startswith("a100") and options.moe_dispatcher == "flex":
        options = replace(options, moe_dispatcher="alltoall")
    return model, training, cluster, gpus, options


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(moe_cases())
def test_each_layout_gets_its_fastest_runnable_fitting_features(case) -> None:  # type: ignore[no-untyped-def]
    """Exact per layout: the chosen feature set is runnable there (where no set is, one
    with the base set's MoE features: a pinned overlap the layout cannot run), fits when
    any does, and no runnable fitting set is faster; its numbers are that set's own
    pricing."""
    cm, table = _scored(case)
    cols = table.columns
    chosen = score_columns(cm, cols)
    index = np.asarray(chosen["feature_variant"])
    singles = [score_columns(replace(cm, options=v, variants=()), cols) for v in cm.variants]
    runs = [runnable(v, cols) for v in cm.variants]
    # a set standing in for a pinned all-to-all overlap runs only where no set with it does
    stand_in = stands_in_for_pinned_overlap(cm.variants)
    pinned_runs = np.logical_or.reduce([r for r, s in zip(runs, stand_in, strict=True)
                                        if not s])
    runs = [r & ~pinned_runs if s else r for r, s in zip(runs, stand_in, strict=True)]
    none_runs = ~np.logical_or.reduce(runs)
    base = cm.options
    ok = [r | (none_runs & graphs_runnable(v, cm.training, cols)
               & (v.moe_a2a_overlap == base.moe_a2a_overlap)
               & (v.moe_dispatcher == base.moe_dispatcher)
               & (v.moe_shared_expert_overlap == base.moe_shared_expert_overlap))
          for r, v in zip(runs, cm.variants, strict=True)]
    for row in range(len(table)):
        k = int(index[row])
        assert ok[k][row]
        assert chosen["step_time_s"][row] == pytest.approx(singles[k]["step_time_s"][row],
                                                           rel=1e-12)
        assert chosen["mem_total"][row] == pytest.approx(singles[k]["mem_total"][row],
                                                         rel=1e-12)
        fitting = [i for i in range(len(singles)) if ok[i][row] and singles[i]["fits"][row]]
        if fitting:
            assert chosen["fits"][row]
            assert chosen["step_time_s"][row] <= min(
                singles[i]["step_time_s"][row] for i in fitting) * (1 + 1e-12)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(moe_cases(), st.integers(1, 5), st.booleans())
def test_bounded_scan_with_features_ranks_like_the_full_scan(case, top: int,  # type: ignore[no-untyped-def]
                                                             diverse: bool) -> None:
    cm, table = _scored(case)
    full = scan_table(cm, table)
    bounded = scan_bounded(cm, table, top=top, diverse=diverse, first_rows=1)
    picks_full = full.feasible_rows[rank_feasible(full, top=top, diverse=diverse)]
    picks = bounded.feasible_rows[rank_feasible(bounded, top=top, diverse=diverse)]
    assert picks.tolist() == picks_full.tolist()


@given(moe_cases())
@settings(max_examples=40, deadline=None)
def test_only_unpinned_features_vary(case) -> None:  # type: ignore[no-untyped-def]
    model, _, cluster, _, options = case
    gpu_cc = 8.0 if cluster.gpu.startswith("a100") else 9.0
    variants = feature_variants(model, options, gpu_cc)
    assert variants[0].moe_dispatcher == options.moe_dispatcher
    stand_in = stands_in_for_pinned_overlap(variants)
    # stand-ins exist only for an overlap pinned on, and differ from it only there
    moe_searched = bool(set(options.search_features) - {"cuda_graphs"})
    assert stand_in.any() == (moe_searched and options.moe_a2a_overlap
                              and "moe_a2a_overlap" not in options.search_features)
    pinned = [v for v, s in zip(variants, stand_in, strict=True) if not s]
    for feature in SEARCHABLE_FEATURES:
        if feature not in options.search_features:
            assert {getattr(v, feature) for v in pinned} == {getattr(options, feature)}
            if feature != "moe_a2a_overlap":
                assert {getattr(v, feature) for v in variants} == {getattr(options, feature)}
    for v in variants:
        assert not (v.moe_a2a_overlap and v.moe_shared_expert_overlap)
        assert v.memory.extra_in_flight == (1 if v.moe_a2a_overlap else 0)
        if gpu_cc < 9.0 and v is not variants[0]:
            assert v.moe_dispatcher != "flex"


def test_all_to_all_overlap_is_refused_where_megatron_refuses_it() -> None:
    cols = {"ep": np.array([1, 8, 8, 8, 8]), "pp": np.array([1, 1, 4, 4, 1]),
            "vpp": np.array([1, 1, 1, 2, 1]),
            "recompute": np.array([0, 0, 0, 0, RECOMPUTE_CODES["full"]]),
            "tp": np.ones(5, dtype=int)}
    got = runnable(CostOptions(moe_a2a_overlap=True), cols)
    assert got.tolist() == [False, True, False, True, False]


def test_the_overlap_holds_one_more_warm_up_chunk_when_interleaved() -> None:
    """Same layouts, the overlap's merged schedule: more activation memory exactly where the
    pipeline is interleaved (one more warm-up chunk), the same elsewhere."""
    model = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=256, micro_batch_sizes=(1,))
    table = enumerate_layouts(model, training, 16)
    fabric = build_fabric(load_cluster("dgx-h100"), 16)
    off = build_cost_model(model, training, fabric, options=CostOptions())
    on = build_cost_model(model, training, fabric, options=CostOptions(moe_a2a_overlap=True))
    a = np.asarray(score_columns(off, table.columns)["mem_activations"])
    b = np.asarray(score_columns(on, table.columns)["mem_activations"])
    interleaved = table.columns["vpp"] > 1
    assert interleaved.any() and (~interleaved).any()
    assert np.all(b[interleaved] >= a[interleaved]) and np.any(b[interleaved] > a[interleaved])
    assert np.array_equal(a[~interleaved], b[~interleaved])


def test_search_names_and_launches_the_features_it_chose() -> None:
    """Qwen3-30B-A3B across two H100 nodes: the fastest layouts run EP across nodes with the
    flex dispatcher, and the launch carries what was chosen."""
    training = TrainingSpec(seq_len=4096, global_batch=512)
    result = search_layouts(model="qwen3-30b-a3b", training=training, cluster="dgx-h100",
                            num_gpus=16, top=5,
                            options=CostOptions(search_features=SEARCHABLE_FEATURES))
    fixed = search_layouts(model="qwen3-30b-a3b", training=training, cluster="dgx-h100",
                           num_gpus=16, top=5, options=CostOptions())
    assert result.entries[0].estimate.tokens_per_s > fixed.entries[0].estimate.tokens_per_s
    for entry in result.entries:
        chosen = entry.estimate.options
        assert chosen is not None
        args = entry.launch.megatron_lm_args
        if entry.layout.ep > 1:
            assert args[args.index("--moe-token-dispatcher-type") + 1] == chosen.moe_dispatcher
            assert ("--overlap-moe-expert-parallel-comm" in args) == chosen.moe_a2a_overlap


def test_cli_pins_what_the_user_sets() -> None:
    base = ("search", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
            "--global-batch", "512", "--seq-len", "4096", "--top", "3", "--launch")
    pinned = run_cli(*base, "--moe-dispatcher", "alltoall", "--no-moe-a2a-overlap")
    assert pinned.code == 0, pinned.err
    assert "--moe-token-dispatcher-type flex" not in pinned.out
    assert "--overlap-moe-expert-parallel-comm" not in pinned.out
    searched = run_cli(*base)
    assert searched.code == 0, searched.err
    assert "--moe-token-dispatcher-type flex" in searched.out


@pytest.mark.parametrize("dualpipe", [False, True])
def test_a_pinned_overlap_is_priced_and_launched_only_where_it_runs(dualpipe: bool) -> None:
    """Qwen3-30B-A3B on 32 H100 with the all-to-all overlap pinned: Megatron refuses it
    under a non-interleaved pipeline, so there it hides nothing and the launch omits it;
    DeepSeek's DualPipe (``dualpipe``, read from the DeepSeek-V3 report, not launchable
    with Megatron) hides it under any pipeline."""
    from parsearch.cost.analytic import estimate
    from parsearch.launch.plan import launch_plan

    model = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=256)
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    table = enumerate_layouts(model, training, 32)
    pick = {}
    for row in range(len(table)):
        lay = table.layout(row)
        if (lay.tp, lay.cp, lay.ep, lay.etp, lay.mbs, lay.recompute) != (1, 1, 8, 1, 1, "none"):
            continue
        if lay.pp == 2 and lay.vpp in (1, 2):
            pick[lay.vpp] = lay
    assert set(pick) == {1, 2}, "the table holds pp 2 with and without interleaving"
    hidden = {}
    for vpp, lay in pick.items():
        on = build_cost_model(model, training, fabric,
                              options=CostOptions(moe_a2a_overlap=True, dualpipe=dualpipe))
        off = build_cost_model(model, training, fabric,
                               options=CostOptions(moe_a2a_overlap=False, dualpipe=dualpipe))
        hidden[vpp] = estimate(off, lay).time_s["ep_comm"] - estimate(on, lay).time_s["ep_comm"]
        # Megatron launches no DualPipe: the flag goes only where Megatron runs it
        plan = launch_plan(model, training, lay, on.options)
        assert plan.moe_a2a_overlap == (vpp > 1)
    assert hidden[2] > 0.0
    assert (hidden[1] > 0.0) == dualpipe
