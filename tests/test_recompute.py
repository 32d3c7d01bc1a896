"""Recompute shares: what is re-run in backward, per layer kind and cost category."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.recompute import (
    CATEGORIES,
    full_recompute_fractions,
    recompute_shares,
    recomputed_layer_counts,
)
from parsearch.cost.stages import stage_contents
from parsearch.cost.token_flops import (
    attention_gemm_forward_flops,
    dense_mlp_forward_flops,
    shared_expert_forward_flops,
)
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, RECOMPUTE_MODULES, ModelSpec, TrainingSpec

T = TrainingSpec(seq_len=4096, global_batch=64)
NONE, SEL, FULL = (RECOMPUTE_CODES[m] for m in ("none", "selective", "full"))
MODELS = ("llama3-8b", "mixtral-8x7b", "deepseek-v3")


def _values(shares, kind: str) -> dict[str, np.ndarray]:
    layer = getattr(shares, kind)
    return {c: np.asarray(getattr(layer, c)) for c in CATEGORIES}


@pytest.mark.parametrize("name", MODELS)
def test_none_is_zero_and_full_is_one(name: str) -> None:
    model = get_preset(name)
    for code, want in ((NONE, 0.0), (FULL, 1.0)):
        s = recompute_shares(model, T, code, tp=4, sp=True)
        for cat, value in _values(s, "dense").items():
            assert float(value) == (0.0 if cat in ("routed", "ep_comm") else want), cat
        if model.is_moe:
            assert all(float(v) == want for v in _values(s, "moe").values())


def test_selective_core_attn_is_core_attention_only() -> None:
    for name in MODELS:
        s = recompute_shares(get_preset(name), T, SEL)
        for kind in ("dense", "moe"):
            values = _values(s, kind)
            if kind == "moe" and not get_preset(name).is_moe:
                assert all(float(v) == 0 for v in values.values())
                continue
            assert float(values["core_attention"]) == 1.0
            assert all(float(v) == 0 for c, v in values.items() if c != "core_attention")


def test_selective_module_hand_shares() -> None:
    dense = get_preset("llama3-8b")
    t = replace(T, recompute_modules=("mlp",))
    s = recompute_shares(dense, t, SEL)
    mlp, attn = dense_mlp_forward_flops(dense), attention_gemm_forward_flops(dense)
    assert np.isclose(s.dense.gemm, mlp / (mlp + attn))
    assert float(s.dense.core_attention) == 0 and float(s.dense.tp_comm) == 0.5
    moe_model = get_preset("deepseek-v3")
    t = replace(T, recompute_modules=("moe",))
    s = recompute_shares(moe_model, t, SEL)
    shared = shared_expert_forward_flops(moe_model)
    attn = attention_gemm_forward_flops(moe_model)
    assert np.isclose(s.moe.gemm, shared / (shared + attn))
    assert float(s.moe.routed) == 1 and float(s.moe.ep_comm) == 1
    assert float(s.dense.gemm) == 0  # "moe" does nothing to a dense layer
    # moe_act: elementwise only
    s = recompute_shares(moe_model, replace(T, recompute_modules=("moe_act",)), SEL)
    assert 0 < float(s.moe.elementwise) < 1
    assert float(s.moe.gemm) == float(s.moe.routed) == 0


@given(modules=st.sets(st.sampled_from(RECOMPUTE_MODULES)), name=st.sampled_from(MODELS),
       tp=st.sampled_from([1, 2, 8]), sp=st.booleans(), extra=st.sampled_from(RECOMPUTE_MODULES))
@settings(max_examples=80, deadline=None)
def test_shares_in_unit_interval_and_monotone_in_modules(modules, name, tp, sp, extra) -> None:
    model = get_preset(name)
    codes = np.array([NONE, SEL, FULL])
    a = recompute_shares(model, replace(T, recompute_modules=tuple(modules)), codes, tp=tp,
                         sp=sp and tp > 1)
    b = recompute_shares(model, replace(T, recompute_modules=tuple(modules | {extra})), codes,
                         tp=tp, sp=sp and tp > 1)
    for kind in ("dense", "moe"):
        va, vb = _values(a, kind), _values(b, kind)
        for cat in CATEGORIES:
            assert va[cat].shape == (3,)
            assert np.all((va[cat] >= 0) & (va[cat] <= 1)), (kind, cat, va[cat])
            assert np.all(vb[cat] >= va[cat] - 1e-12)
            assert float(va[cat][0]) == 0.0  # none


@given(layers=st.integers(2, 40), pp=st.integers(1, 4), vpp=st.integers(1, 3),
       n=st.integers(1, 12))
@settings(max_examples=80, deadline=None)
def test_full_share_monotone_in_recompute_num_layers(layers, pp, vpp, n) -> None:
    if pp * vpp > layers + 2:
        return
    model = ModelSpec("toy", layers, 64, 128, 4, 4, 16, 1000)
    t = T
    low = recompute_shares(model, replace(t, recompute_num_layers=n), FULL, pp=pp, vpp=vpp)
    high = recompute_shares(model, replace(t, recompute_num_layers=n + 1), FULL, pp=pp, vpp=vpp)
    everything = recompute_shares(model, t, FULL, pp=pp, vpp=vpp)
    assert 0 < float(low.dense.gemm) <= float(high.dense.gemm) <= 1
    assert float(everything.dense.gemm) == 1.0
    # a hand count: recomputed layers = sum over chunks of min(n, chunk size)
    counts = [len(c) for s in stage_contents(model, pp, vpp) for c in s.chunk_layer_indices]
    assert np.isclose(float(low.dense.gemm), sum(min(n, c) for c in counts) / layers)
    assert all(float(v) == float(low.dense.gemm)
               for c, v in _values(low, "dense").items() if c not in ("routed", "ep_comm"))


def test_vectorised_over_pipeline_splits() -> None:
    model = get_preset("deepseek-v3")  # 61 layers, first 3 dense
    t = replace(T, recompute_num_layers=1)
    pp = np.array([1, 8, 8])
    vpp = np.array([1, 1, 2])
    s = recompute_shares(model, t, FULL, pp=pp, vpp=vpp)
    for i in range(3):
        d, m = full_recompute_fractions(model, int(pp[i]), int(vpp[i]), "uneven", 1)
        assert float(s.dense.gemm[i]) == d and float(s.moe.routed[i]) == m
    # pp=1: one chunk of 61 layers, the first (dense) one recomputed
    assert float(s.dense.gemm[0]) == pytest.approx(1 / 3) and float(s.moe.gemm[0]) == 0
    first = stage_contents(model, 8, 1)[0]
    assert recomputed_layer_counts(model, first, 1) == (1, 0)
    assert recomputed_layer_counts(model, first, None) == (3, first.num_moe_layers)


#: Megatron-Bridge activation-recompute skill (NVIDIA-NeMo/Megatron-Bridge@0026ec187,
#: skills/nemo-mbridge-perf-activation-recompute/SKILL.md lines 215-218, PR #3107): Llama 3
#: 70B SFT on 32 H100, TP4 PP4 VPP5, MBS 1, GBS 32, 4,096 tokens, FP8 current scaling,
#: preset LLAMA3_70B_SFT_CONFIG_H100_FP8_CS_V1 (TE CUDA graphs of the MLP, TP comm overlap):
#: model TFLOP/s per GPU by selective recompute module list.
BRIDGE_RECOMPUTE_TFLOPS = {("core_attn",): 704.0, ("mlp",): 593.6,
                           ("mlp", "core_attn"): 586.8, ("core_attn", "layernorm"): 702.0}


def test_recompute_module_costs_match_a_measured_a_b() -> None:
    """What each module list costs against core_attn alone, as measured, within 3 points.

    The runs packed SFT samples into 4,096-token sequences, which makes attention cheaper
    than the full-length causal attention priced here; the measured ratios are of the
    same model FLOP count, so they compare directly.
    """
    from parsearch.cost.analytic import build_cost_model, estimate
    from parsearch.cost.options import CostOptions
    from parsearch.layout import Layout
    from parsearch.topology import build_fabric, load_cluster

    model = get_preset("llama3-70b")
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    options = replace(CostOptions(), tp_comm_overlap=True, fp8_recipe="tensorwise",
                      cuda_graphs=True, cuda_graph_scope=("mlp",), memory_margin=0.0)
    layout = Layout(num_gpus=32, tp=4, pp=4, cp=1, ep=1, etp=1, vpp=5, mbs=1, sp=True,
                    recompute="selective")
    predicted = {}
    for modules in BRIDGE_RECOMPUTE_TFLOPS:
        training = TrainingSpec(seq_len=4096, global_batch=32, precision="fp8",
                                recompute_modes=("selective",), recompute_modules=modules)
        cost_model = build_cost_model(model, training, fabric, options=options)
        predicted[modules] = estimate(cost_model, layout).tokens_per_s_per_gpu
    base = ("core_attn",)
    for modules, measured in BRIDGE_RECOMPUTE_TFLOPS.items():
        measured_ratio = measured / BRIDGE_RECOMPUTE_TFLOPS[base]
        assert predicted[modules] / predicted[base] == pytest.approx(measured_ratio, abs=0.03)
    # and the decision: recomputing the MLP is the expensive choice, layernorm nearly free
    assert predicted[("mlp", "core_attn")] < predicted[("mlp",)] < predicted[
        ("core_attn", "layernorm")] <= predicted[base]
