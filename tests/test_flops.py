"""FLOPs: paper conventions, Megatron-Core's formula, per-stage consistency."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.flops import all_stage_flops, stage_flops, stage_flops_core
from parsearch.cost.stages import StageContent, stage_contents
from parsearch.cost.token_flops import (
    hardware_flops_per_token,
    korthikanti_model_flops_per_iteration,
    model_flops_per_token,
    narayanan_flops_per_iteration,
    recompute_flops_per_token,
)
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, MlaSpec, ModelSpec, MoeSpec, TrainingSpec

REL = 1e-12


def gpt(layers: int, hidden: int, heads: int, vocab: int = 51200) -> ModelSpec:
    """NAR21/KOR22 GPT: MHA, GeLU FFN of 4h."""
    return ModelSpec(
        name="gpt",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        head_dim=hidden // heads,
        vocab_size=vocab,
        mlp_activation="gelu",
        norm="layernorm",
        tied_embeddings=True,
    )


def mcore_flops_per_iteration(model: ModelSpec, batch: int, seq: int) -> float:
    """formulas.md §3.3 transcribed literally (MCORE ``transformer_flops``, causal-halved)."""
    h, a, g, d_h = (model.hidden_size, model.num_attention_heads,
                    model.num_query_groups, model.head_dim)
    phi = 3 if model.mlp_activation == "swiglu" else 2
    n_mtp = model.mtp_layers
    last_moe = model.is_moe_layer(model.num_layers - 1)
    l_moe = model.num_moe_layers + (n_mtp if last_moe else 0)
    l_dense = model.num_dense_layers + (0 if last_moe else n_mtp)
    layers = model.num_layers + n_mtp
    tokens = batch * seq
    s2 = batch * seq * seq
    moe = model.moe
    f_e = moe.expert_ffn_hidden_size if moe else 0
    k = moe.top_k if moe else 0
    f_sh = moe.shared_expert_ffn_hidden_size if moe else 0
    mla = model.mla
    if mla is None:
        attn = h * (a * d_h + 2 * g * d_h) + a * d_h * h
        core = 6 * a * d_h * layers
    else:
        d_qk, d_rope, d_v = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        q_term = (mla.q_lora_rank * (h + a * (d_qk + d_rope) + 1) if mla.q_lora_rank
                  else h * a * (d_qk + d_rope))
        attn = (q_term + mla.kv_lora_rank * (h + a * (d_qk + d_v) + 1) + h * d_rope
                + a * d_v * h)
        core = 6 * (a * (d_qk + d_rope) / 2 + a * d_v / 2) * layers
        return tokens * 6 * (
            h * model.ffn_hidden_size * phi * l_dense + h * f_e * k * phi * l_moe
            + h * f_sh * phi * l_moe + layers * attn + n_mtp * (3 * h + 2 * h * h)
            + h * model.vocab_size * (1 + n_mtp)
        ) + s2 * core
    return tokens * 6 * (
        h * model.ffn_hidden_size * phi * l_dense + h * f_e * k * phi * l_moe
        + h * f_sh * phi * l_moe + layers * attn + n_mtp * (3 * h + 2 * h * h)
        + h * model.vocab_size * (1 + n_mtp)
    ) + s2 * core * 0.5 * 2  # "/2 causal mask … *2 QK^T and (QK^T)V"


@pytest.mark.parametrize(
    ("layers", "hidden", "heads", "seq", "batch"),
    [(96, 12288, 96, 2048, 1536), (24, 2304, 24, 2048, 512), (128, 25600, 160, 2048, 3072)],
)
def test_gpt_matches_korthikanti_and_narayanan(
    layers: int, hidden: int, heads: int, seq: int, batch: int
) -> None:
    model = gpt(layers, hidden, heads)
    tokens = batch * seq
    kor = korthikanti_model_flops_per_iteration(batch, seq, layers, hidden, 51200)
    nar = narayanan_flops_per_iteration(batch, seq, layers, hidden, 51200)
    model_f = model_flops_per_token(model, seq, causal=False).total_flops * tokens
    hw_full = hardware_flops_per_token(model, seq, "full", causal=False).total_flops * tokens
    assert math.isclose(model_f, kor, rel_tol=REL)
    assert math.isclose(hw_full, nar, rel_tol=REL)
    # KOR22 §6 / formulas.md §3.2: selective adds 4·B·s²·h per layer.
    hw_sel = hardware_flops_per_token(model, seq, "selective", causal=False).total_flops * tokens
    assert math.isclose(hw_sel - model_f, 4 * batch * seq**2 * hidden * layers, rel_tol=REL)
    assert math.isclose(nar / kor * 3 / 4, (1 + seq / (6 * hidden) + 51200 / (16 * layers * hidden))
                        / (1 + seq / (6 * hidden) + 51200 / (12 * layers * hidden)), rel_tol=REL)


@pytest.mark.parametrize(
    "name", ["llama3-8b", "llama3-70b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b",
             "kimi-k2", "gpt-oss-120b", "gpt3-175b"]
)
def test_matches_megatron_core_formula(name: str) -> None:
    model = get_preset(name)
    seq, batch = 4096, 8
    expected = mcore_flops_per_iteration(model, batch, seq)
    got = model_flops_per_token(model, seq).total_flops * batch * seq
    assert math.isclose(got, expected, rel_tol=1e-12)


def test_compact_per_token_form_llama3_70b() -> None:
    """formulas.md §3.4: 6·P_gemm + 12·L·a·d_h·s·κ + 6·h·V."""
    model = get_preset("llama3-70b")
    h, f, a, g, d, n, v = 8192, 28672, 64, 8, 128, 80, 128256
    p_gemm = n * (2 * h * a * d + 2 * h * g * d + 3 * h * f)
    for causal, kappa in ((True, 0.5), (False, 1.0)):
        expected = 6 * p_gemm + 12 * n * a * d * 8192 * kappa + 6 * h * v
        got = model_flops_per_token(model, 8192, causal=causal)
        assert math.isclose(got.total_flops, expected, rel_tol=REL)
    breakdown = model_flops_per_token(model, 8192)
    assert breakdown.routed_expert_flops == breakdown.mtp_flops == 0.0
    assert breakdown.recompute_flops == 0.0


def test_moe_components() -> None:
    model = get_preset("deepseek-v3")
    b = model_flops_per_token(model, 4096)
    h, f_e = 7168, 2048
    assert b.routed_expert_flops == 6 * 58 * 8 * 3 * h * f_e
    assert b.shared_expert_flops == 6 * 58 * 3 * h * 2048
    assert b.dense_mlp_flops == 6 * 3 * 3 * h * 18432
    assert b.mtp_flops > 0
    no_mtp = model_flops_per_token(
        ModelSpec(**{**model.__dict__, "mtp_layers": 0}), 4096
    )
    assert no_mtp.mtp_flops == 0
    assert math.isclose(b.total_flops - b.mtp_flops, no_mtp.total_flops, rel_tol=REL)


def test_causal_halves_only_core_attention() -> None:
    model = get_preset("llama3-8b")
    causal = model_flops_per_token(model, 8192, causal=True)
    full = model_flops_per_token(model, 8192, causal=False)
    assert full.core_attention_flops == 2 * causal.core_attention_flops
    assert full.attention_gemm_flops == causal.attention_gemm_flops
    assert full.logits_flops == causal.logits_flops


def test_recompute_adders() -> None:
    model = get_preset("mixtral-8x7b")
    base = model_flops_per_token(model, 4096)
    assert recompute_flops_per_token(model, 4096, "none") == 0.0
    sel = recompute_flops_per_token(model, 4096, "selective")
    full = recompute_flops_per_token(model, 4096, "full")
    assert math.isclose(sel, base.core_attention_flops / 3, rel_tol=REL)
    layers = (base.attention_gemm_flops + base.core_attention_flops + base.dense_mlp_flops
              + base.routed_expert_flops + base.shared_expert_flops) / 3
    assert math.isclose(full, layers, rel_tol=REL)
    hw = hardware_flops_per_token(model, 4096, "full")
    assert math.isclose(hw.total_flops - hw.model_flops, full, rel_tol=REL)
    with pytest.raises(ValueError, match="recompute"):
        recompute_flops_per_token(model, 4096, "partial")


# --- per-stage ---------------------------------------------------------------


@st.composite
def stage_cases(draw: st.DrawFn) -> tuple[ModelSpec, TrainingSpec, Layout]:
    moe = draw(st.booleans())
    layers = draw(st.integers(2, 12))
    heads = draw(st.sampled_from([4, 8]))
    model = ModelSpec(
        name="t",
        num_layers=layers,
        hidden_size=heads * 16,
        ffn_hidden_size=draw(st.sampled_from([64, 96, 128])),
        num_attention_heads=heads,
        num_query_groups=draw(st.sampled_from([1, 2, 4])),
        head_dim=16,
        vocab_size=draw(st.sampled_from([1000, 1024])),
        mlp_activation=draw(st.sampled_from(["swiglu", "gelu"])),
        moe=MoeSpec(8, draw(st.integers(1, 4)), 32, draw(st.sampled_from([0, 32])),
                    first_k_dense=draw(st.integers(0, 1))) if moe else None,
        mla=MlaSpec(32, 16, 8, 16, draw(st.sampled_from([0, 24]))) if draw(st.booleans())
        else None,
        mtp_layers=draw(st.integers(0, 2)),
    )
    pp = draw(st.integers(1, min(layers, 4)))
    vpp = draw(st.integers(1, max(1, min(3, layers // pp))))
    training = TrainingSpec(seq_len=draw(st.sampled_from([64, 128])), global_batch=8)
    layout = Layout(
        num_gpus=64,
        tp=draw(st.sampled_from([1, 2, 4])),
        cp=draw(st.sampled_from([1, 2])),
        pp=pp,
        vpp=vpp,
        ep=draw(st.sampled_from([1, 2, 8])) if moe else 1,
        etp=draw(st.sampled_from([1, 2])) if moe else 1,
        mbs=draw(st.integers(1, 4)),
        sp=draw(st.booleans()),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
    )
    return model, training, layout


@given(stage_cases())
@settings(max_examples=150, deadline=None)
def test_stages_sum_to_model_flops(case: tuple[ModelSpec, TrainingSpec, Layout]) -> None:
    """Σ over stages of per-GPU FLOPs × tp·cp / tokens = per-token FLOPs (formulas.md §3.5)."""
    model, training, layout = case
    stages = all_stage_flops(model, training, layout)
    tokens = layout.mbs * training.seq_len
    scale = layout.tp * layout.cp / tokens
    per_token = model_flops_per_token(model, training.seq_len)
    assert math.isclose(sum(s.total_flops - s.recompute_flops for s in stages) * scale,
                        per_token.total_flops, rel_tol=1e-9)
    assert math.isclose(sum(s.recompute_flops for s in stages) * scale,
                        recompute_flops_per_token(model, training.seq_len, layout.recompute),
                        rel_tol=1e-9, abs_tol=1e-9)
    routed = sum(s.routed_expert_flops for s in stages) * scale * 3
    mtp_routed = 0.0
    if model.mtp_layers and model.is_moe_layer(model.num_layers - 1):
        mtp_routed = 3 * model.mtp_layers * 2 * (3 if model.mlp_activation == "swiglu" else 2) \
            * model.hidden_size * model.moe.expert_ffn_hidden_size * model.moe.top_k
    assert math.isclose(routed, per_token.routed_expert_flops + mtp_routed, rel_tol=1e-9,
                        abs_tol=1e-9)
    for s in stages:
        assert s.backward_flops == 2 * s.forward_flops
    assert stages[-1].logits_flops > 0
    assert all(s.logits_flops == 0 for s in stages[:-1])


def test_routed_expert_flops_independent_of_ep_etp_and_gemm_shape() -> None:
    model = get_preset("mixtral-8x22b")
    training = TrainingSpec(seq_len=4096, global_batch=256)
    content = stage_contents(model, 8)[3]
    results = [
        stage_flops(model, training, Layout(num_gpus=128, tp=2, pp=8, ep=ep, etp=etp), content)
        for ep, etp in ((1, 1), (4, 2), (8, 1), (2, 4))
    ]
    assert len({r.routed_expert_flops for r in results}) == 1
    for r in results:
        g = r.gemm
        # local experts × expert GEMM FLOPs (FC1 gate+up and FC2) × MoE layers = routed FLOPs
        per_layer = g.local_experts * 2 * g.expert_tokens * g.hidden * 3 * g.expert_width
        assert math.isclose(per_layer * content.num_moe_layers, r.routed_expert_flops,
                            rel_tol=REL)
        assert g.dense_tokens == 4096


def test_stage_flops_sample_llama3_70b() -> None:
    model = get_preset("llama3-70b")
    training = TrainingSpec(seq_len=8192, global_batch=256)
    layout = Layout(num_gpus=64, tp=4, pp=4, mbs=1, sp=True, recompute="selective")
    first, *_, last = all_stage_flops(model, training, layout)
    assert first.logits_flops == 0 and last.logits_flops > 0
    assert first.recompute_flops == first.core_attention_flops
    assert first.gemm.qkv_width == (64 * 128) / 4 + 2 * 8 * 128 / 4
    # KV heads replicate once tp > g
    wide = stage_flops(model, training, Layout(num_gpus=64, tp=16, pp=4), first_content(model))
    assert wide.gemm.qkv_width == 64 * 128 / 16 + 2 * 128


def first_content(model: ModelSpec) -> StageContent:
    return stage_contents(model, 4)[0]


def test_vectorized_stage_flops_match_scalar() -> None:
    """stage_flops_core on columns of layouts gives each layout's scalar stage_flops."""
    rng = random.Random(7)
    model = get_preset("deepseek-v3")
    training = TrainingSpec(seq_len=4096, global_batch=1024)
    layouts = [
        Layout(num_gpus=4096, tp=rng.choice([1, 2, 4, 8]), cp=rng.choice([1, 2]), pp=8,
               vpp=2, ep=rng.choice([1, 8, 64]), etp=rng.choice([1, 2]),
               mbs=rng.choice([1, 2]), recompute=rng.choice(["none", "selective", "full"]))
        for _ in range(300)
    ]
    for content in stage_contents(model, 8, 2, training.pipeline_split):
        arr = stage_flops_core(
            model, training.seq_len, content,
            tp=np.array([x.tp for x in layouts]), cp=np.array([x.cp for x in layouts]),
            ep=np.array([x.ep for x in layouts]), etp=np.array([x.etp for x in layouts]),
            mbs=np.array([x.mbs for x in layouts]),
            recompute_code=np.array([RECOMPUTE_CODES[x.recompute] for x in layouts]),
        )
        for i, layout in enumerate(layouts):
            one = stage_flops(model, training, layout, content)
            assert arr.dense_gemm_flops[i] == one.dense_gemm_flops
            assert arr.routed_expert_flops[i] == one.routed_expert_flops
            assert arr.recompute_flops[i] == one.recompute_flops
            assert np.broadcast_to(arr.logits_flops, (len(layouts),))[i] == one.logits_flops
