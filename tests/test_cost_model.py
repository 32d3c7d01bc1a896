"""Invariants of the analytic time model, and the vectorized path against the scalar one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import (
    TIME_KEYS,
    build_cost_model,
    estimate,
    estimate_from_row,
    score_columns,
)
from parsearch.cost.schedule import bubble_fraction, pipeline_time
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import ModelSpec, MoeSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DENSE = ModelSpec("dense-toy", 8, 1024, 4096, 16, 4, 64, 32000)
MOE = ModelSpec("moe-toy", 8, 1024, 4096, 16, 4, 64, 32000,
                moe=MoeSpec(num_experts=16, top_k=2, expert_ffn_hidden_size=1024,
                            shared_expert_ffn_hidden_size=1024, first_k_dense=1))
TRAINING = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2))


def _table_and_scores(model: ModelSpec, training: TrainingSpec, gpus: int, cluster: str):
    fabric = build_fabric(load_cluster(cluster), gpus)
    cm = build_cost_model(model, training, fabric)
    table = enumerate_layouts(model, training, gpus)
    return cm, table, score_columns(cm, table.columns)


@pytest.fixture(scope="module")
def dense_scores():
    return _table_and_scores(DENSE, TRAINING, 32, "dgx-h100")


@pytest.fixture(scope="module")
def moe_scores():
    return _table_and_scores(MOE, TRAINING, 32, "dgx-h100")


@pytest.mark.parametrize("which", ["dense_scores", "moe_scores"])
def test_vectorized_scores_equal_scalar_estimates(which: str, request) -> None:
    cm, table, scores = request.getfixturevalue(which)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(table), size=min(60, len(table)), replace=False):
        layout = table.layout(int(i))
        one = estimate(cm, layout)
        many = estimate_from_row(cm, scores, int(i), layout)
        assert one.step_time_s == pytest.approx(many.step_time_s, rel=1e-12)
        for key in TIME_KEYS:
            assert one.time_s[key] == pytest.approx(many.time_s[key], rel=1e-12, abs=1e-15)
        for key, value in one.memory_bytes.items():
            assert value == pytest.approx(many.memory_bytes[key], rel=1e-12)
        assert one.fits == many.fits


@pytest.mark.parametrize("which", ["dense_scores", "moe_scores"])
def test_step_time_is_the_sum_of_its_parts_and_throughput_is_consistent(which, request) -> None:
    _cm, _table, scores = request.getfixturevalue(which)
    parts = sum(scores[f"time_{k}"] for k in TIME_KEYS)
    np.testing.assert_allclose(parts, scores["step_time_s"], rtol=1e-12)
    tokens = TRAINING.global_batch * TRAINING.seq_len
    np.testing.assert_allclose(scores["tokens_per_s"] * scores["step_time_s"], tokens, rtol=1e-12)
    assert np.all(scores["mfu"] > 0) and np.all(scores["mfu"] < 1)
    assert all(np.all(scores[f"time_{k}"] >= 0) for k in TIME_KEYS)


@pytest.mark.parametrize("which", ["dense_scores", "moe_scores"])
def test_tp1_means_no_tp_traffic_and_pp1_means_no_bubble(which: str, request) -> None:
    _cm, table, scores = request.getfixturevalue(which)
    c = table.columns
    assert np.all(scores["time_tp_comm"][c["tp"] == 1] == 0)
    assert np.any(scores["time_tp_comm"][c["tp"] > 1] > 0)
    assert np.all(scores["time_pp_bubble"][c["pp"] == 1] == 0)
    assert np.all(scores["time_pp_p2p"][c["pp"] == 1] == 0)
    assert np.any(scores["time_pp_bubble"][c["pp"] > 1] > 0)
    assert np.all(scores["time_cp_comm"][c["cp"] == 1] == 0)
    assert np.all(scores["time_ep_comm"][(c["ep"] == 1) & (c["etp"] == 1)] == 0)


@SETTINGS
@given(factor=st.sampled_from([1.5, 2.0, 4.0]), which=st.sampled_from(["nvlink", "nic", "both"]),
       cluster=st.sampled_from(["dgx-h100", "h100-roce", "dgx-h100-oversub", "gb200-nvl72"]),
       moe=st.booleans())
def test_more_bandwidth_is_never_slower(factor: float, which: str, cluster: str,
                                        moe: bool) -> None:
    model = MOE if moe else DENSE
    base = load_cluster(cluster)
    faster = replace(
        base,
        nvlink_bandwidth_Bps=base.nvlink_bandwidth_Bps * (factor if which != "nic" else 1),
        nic_bandwidth_Bps=base.nic_bandwidth_Bps * (factor if which != "nvlink" else 1),
    )
    table = enumerate_layouts(model, TRAINING, 32)
    slow = score_columns(build_cost_model(model, TRAINING, build_fabric(base, 32)), table.columns)
    fast = score_columns(build_cost_model(model, TRAINING, build_fabric(faster, 32)),
                         table.columns)
    assert np.all(fast["step_time_s"] <= slow["step_time_s"] * (1 + 1e-12))


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_fp8_compute_is_never_slower_than_bf16(model: ModelSpec) -> None:
    """FP8 GEMMs are never slower; FP8 costs only its casts (memory-bound work), its extra
    kernels and the communication the faster GEMMs no longer hide."""
    table = enumerate_layouts(model, TRAINING, 16)
    fabric = build_fabric(load_cluster("dgx-h100"), 16)
    bf16 = score_columns(build_cost_model(model, TRAINING, fabric), table.columns)
    fp8 = score_columns(
        build_cost_model(model, replace(TRAINING, precision="fp8"), fabric), table.columns)
    assert np.all(fp8["time_compute"] <= bf16["time_compute"] * (1 + 1e-12))
    extra = sum(np.maximum(0.0, fp8[f"time_{k}"] - bf16[f"time_{k}"])
                for k in ("memory_bound", "overhead", "tp_comm", "cp_comm", "ep_comm",
                          "pp_p2p", "pp_bubble", "stage_imbalance", "dp_comm"))
    assert np.all(fp8["step_time_s"] <= bf16["step_time_s"] + extra + 1e-12)


def test_nvlink_tp_beats_network_tp_for_the_same_degrees() -> None:
    """TP=8 inside a DGX node pays less TP time than TP=16 across two nodes."""
    model = get_preset("llama3-70b")
    training = TrainingSpec(seq_len=8192, global_batch=64)
    fabric = build_fabric(load_cluster("dgx-h100"), 64)
    cm = build_cost_model(model, training, fabric)
    from parsearch.layout import parse_layout_string

    inside = estimate(cm, parse_layout_string("tp=8,pp=8,sp=true", 64))
    across = estimate(cm, parse_layout_string("tp=16,pp=4,sp=true", 64))
    assert across.time_s["tp_comm"] > 3 * inside.time_s["tp_comm"]


def test_fp4_on_hopper_is_a_clear_error() -> None:
    from parsearch.errors import SpecError

    fabric = build_fabric(load_cluster("dgx-h100"), 8)
    with pytest.raises(SpecError, match="precision fp4 is not supported by h100"):
        build_cost_model(DENSE, replace(TRAINING, precision="fp4"), fabric)


def test_pipeline_schedule_matches_narayanan_bubble_for_equal_stages() -> None:
    for pp, vpp, m in [(4, 1, 8), (8, 2, 16), (2, 4, 4)]:
        busy, bubble = pipeline_time(np.ones((1, pp)), np.array([m]), np.array([vpp]))
        assert bubble[0] / busy[0] == pytest.approx(bubble_fraction(pp, vpp, m))


def test_unequal_stages_pay_for_the_slowest() -> None:
    busy, bubble = pipeline_time(np.array([[1.0, 2.0]]), np.array([4]), np.array([1]))
    assert busy[0] == 8.0 and bubble[0] == 1.0


def test_partial_recompute_prices_between_none_and_full() -> None:
    """--recompute-num-layers N re-runs only N layers per model chunk (Megatron block method)."""
    from parsearch.layout import parse_layout_string

    model = get_preset("llama3-8b")
    fabric = build_fabric(load_cluster("dgx-h100"), 8)
    base = TrainingSpec(seq_len=8192, global_batch=64)

    def step(recompute: str, layers: int | None = None) -> float:
        training = replace(base, recompute_num_layers=layers)
        layout = parse_layout_string(f"mbs=1,recompute={recompute}", 8)
        return estimate(build_cost_model(model, training, fabric), layout).step_time_s

    none, full = step("none"), step("full")
    partial = [step("full", n) for n in (4, 16, 32)]
    assert none < partial[0] < partial[1] < full
    assert partial[2] == pytest.approx(full)  # every layer of the single chunk


@SETTINGS
@given(
    moe=st.booleans(),
    precision=st.sampled_from(["bf16", "fp8"]),
    fsdp=st.sampled_from([None, "optim_grads_params", "optim_grads"]),
    distributed_optimizer=st.booleans(),
    recompute_num_layers=st.sampled_from([None, 1, 2]),
    offload=st.sampled_from([0, 1]),
    overlap=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_many_layouts_at_once_score_as_each_alone(moe, precision, fsdp, distributed_optimizer,
                                                  recompute_num_layers, offload, overlap,
                                                  seed) -> None:
    """The vectorised scorer (which prices each distinct degree set once and folds unit
    prices into per-stage coefficients) gives every layout the numbers the one-layout
    path gives it, under the training options that change the arithmetic."""
    from parsearch.cost.analytic import CostOptions

    training = replace(TRAINING, precision=precision, fsdp=fsdp is not None,
                       fsdp_strategy=fsdp or "optim_grads_params",
                       distributed_optimizer=distributed_optimizer,
                       recompute_num_layers=recompute_num_layers,
                       activation_offload_layers=offload)
    options = CostOptions(overlap_grad_reduce=overlap, overlap_param_gather=not overlap)
    model = MOE if moe else DENSE
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), 32),
                          options=options)
    table = enumerate_layouts(model, training, 32)
    # large enough for the scorer to share prices between rows (CPU offload keeps only the
    # pp=1, recompute-none layouts Megatron runs it with: rule R11)
    assert len(table) >= (64 if offload else 256)
    scores = score_columns(cm, table.columns)
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(table), size=4, replace=False):
        layout = table.layout(int(i))
        one = estimate(cm, layout)
        step = one.step_time_s
        assert float(scores["step_time_s"][i]) == pytest.approx(step, rel=1e-12)
        for key in TIME_KEYS:  # parts that cancel (max - mean) compare against the step
            assert float(scores[f"time_{key}"][i]) == pytest.approx(one.time_s[key],
                                                                     abs=1e-12 * step)
        for key, value in one.memory_bytes.items():
            assert float(scores[f"mem_{key}"][i]) == pytest.approx(value, rel=1e-12)
        assert bool(scores["fits"][i]) == one.fits
        assert int(scores["slowest_stage"][i]) == one.slowest_stage
        assert int(scores["peak_memory_stage"][i]) == one.peak_memory_stage
