"""Parameter counts: hand-checked small models, MLA/MTP terms and properties."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.params import ParameterCounts, parameter_counts
from parsearch.model.presets import PRESETS
from parsearch.model.specs import MlaSpec, ModelSpec, MoeSpec


def _tiny(**overrides: object) -> ModelSpec:
    fields: dict[str, object] = dict(
        name="tiny",
        num_layers=2,
        hidden_size=8,
        ffn_hidden_size=32,
        num_attention_heads=2,
        num_query_groups=1,
        head_dim=4,
        vocab_size=10,
    )
    fields.update(overrides)
    return ModelSpec(**fields)  # type: ignore[arg-type]


def _decomposed_total(model: ModelSpec, c: ParameterCounts) -> int:
    dense = c.attention_per_layer + c.dense_mlp_per_layer + c.replicated_per_layer_dense
    moe = (
        c.attention_per_layer
        + c.routed_experts_per_layer
        + c.shared_experts_per_layer
        + c.replicated_per_layer_moe
    )
    outer = c.embedding + c.output + c.final_norm
    return outer + model.num_dense_layers * dense + model.num_moe_layers * moe


def test_tiny_dense_swiglu_by_hand() -> None:
    c = parameter_counts(_tiny())
    # q: 8*(2*4)=64, k+v: 2*8*(1*4)=64, o: (2*4)*8=64
    assert c.attention_per_layer == 192
    assert c.dense_mlp_per_layer == 3 * 8 * 32
    assert c.replicated_per_layer_dense == 2 * 8  # two RMSNorm scales
    assert c.replicated_per_layer_moe == 0
    assert (c.embedding, c.output, c.final_norm) == (80, 80, 8)
    assert c.total == 2 * (192 + 768 + 16) + 80 + 80 + 8
    assert c.active == c.total
    assert c.mtp == 0 and c.total_with_mtp == c.total and c.active_with_mtp == c.active


def test_tiny_gelu_layernorm_tied_with_qkv_bias() -> None:
    model = _tiny(
        mlp_activation="gelu",
        norm="layernorm",
        tied_embeddings=True,
        qkv_bias=True,
        num_query_groups=2,
    )
    c = parameter_counts(model)
    # MHA: 4·h·(a·d_h) = 4*8*8 = 256, plus QKV bias 3*8
    assert c.attention_per_layer == 256 + 24
    assert c.dense_mlp_per_layer == 2 * 8 * 32
    assert c.replicated_per_layer_dense == 2 * 2 * 8  # LayerNorm: weight + bias
    assert c.output == 0
    assert c.final_norm == 16
    assert c.total == 2 * (280 + 512 + 32) + 80 + 16


def test_gpt_matches_nar21_eq2_layer_term() -> None:
    # NAR21 Eq. 2: a GPT layer has 12·h² weights (+13h biases/norms); here 12h² + 3h QKV bias + 4h.
    model = PRESETS["gpt-7.5b"]
    c = parameter_counts(model)
    h = model.hidden_size
    assert c.attention_per_layer + c.dense_mlp_per_layer == 12 * h * h + 3 * h


def test_moe_layer_selection_and_split() -> None:
    moe = MoeSpec(
        num_experts=4,
        top_k=2,
        expert_ffn_hidden_size=16,
        shared_expert_ffn_hidden_size=16,
        first_k_dense=1,
        layer_freq=2,
    )
    model = _tiny(num_layers=6, moe=moe)
    c = parameter_counts(model)
    assert model.num_moe_layers == 3  # layers 1, 3, 5
    assert c.routed_experts_per_layer == 4 * 3 * 8 * 16
    assert c.active_routed_per_layer == 2 * 3 * 8 * 16
    assert c.shared_experts_per_layer == 3 * 8 * 16
    assert c.replicated_per_layer_moe == 16 + 8 * 4  # norms + router h·E
    assert c.total == _decomposed_total(model, c)
    routed_inactive = model.num_moe_layers * (
        c.routed_experts_per_layer - c.active_routed_per_layer
    )
    assert c.total - c.active == routed_inactive


def test_deepseek_v3_mla_attention_by_hand() -> None:
    c = parameter_counts(PRESETS["deepseek-v3"])
    h, a = 7168, 128
    q = h * 1536 + 1536 * a * (128 + 64)  # W^DQ, then W^UQ and W^QR
    kv = h * (512 + 64) + 512 * a * (128 + 128)  # W^DKV + W^KR, then W^UK and W^UV
    o = a * 128 * h
    assert c.attention_per_layer == q + kv + o == 187_105_280
    # two RMSNorms of h plus the q/kv latent norms
    assert c.replicated_per_layer_dense == 2 * h + 1536 + 512
    assert c.replicated_per_layer_moe == 2 * h + 1536 + 512 + h * 256


def test_mla_without_q_lora() -> None:
    mla = MlaSpec(kv_lora_rank=16, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
    model = _tiny(num_query_groups=2, mla=mla)
    c = parameter_counts(model)
    assert c.attention_per_layer == 8 * 2 * 6 + 8 * (16 + 2) + 16 * 2 * (4 + 4) + 2 * 4 * 8
    assert c.replicated_per_layer_dense == 2 * 8 + 16


def test_deepseek_v3_mtp_module() -> None:
    model = PRESETS["deepseek-v3"]
    c = parameter_counts(model)
    h = model.hidden_size
    moe_layer = (
        c.attention_per_layer
        + c.routed_experts_per_layer
        + c.shared_experts_per_layer
        + c.replicated_per_layer_moe
    )
    # DeepSeek-V3 §2.2: two RMSNorms, projection M (2h -> h), one block, (shared head's) norm.
    assert c.mtp == moe_layer + 2 * h * h + 3 * h
    assert c.total_with_mtp == c.total + c.mtp
    assert c.active < c.active_with_mtp < c.active + c.mtp
    no_mtp = parameter_counts(dataclasses.replace(model, mtp_layers=0))
    assert (no_mtp.total, no_mtp.active) == (c.total, c.active)


def test_mtp_of_dense_model_uses_a_dense_layer() -> None:
    c = parameter_counts(_tiny(mtp_layers=2))
    layer = c.attention_per_layer + c.dense_mlp_per_layer + c.replicated_per_layer_dense
    assert c.mtp == 2 * (layer + 2 * 8 * 8 + 3 * 8)
    assert c.active_with_mtp - c.active == c.mtp


# ----------------------------------------------------------------------------- properties

_dims = st.sampled_from([8, 16, 32, 64])


@st.composite
def _dense_models(draw: st.DrawFn) -> ModelSpec:
    groups = draw(st.sampled_from([1, 2, 4]))
    return ModelSpec(
        name="p",
        num_layers=draw(st.integers(1, 8)),
        hidden_size=draw(_dims),
        ffn_hidden_size=draw(_dims),
        num_attention_heads=groups * draw(st.integers(1, 4)),
        num_query_groups=groups,
        head_dim=draw(_dims),
        vocab_size=draw(st.integers(1, 1000)),
        tied_embeddings=draw(st.booleans()),
        mlp_activation=draw(st.sampled_from(["swiglu", "gelu"])),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        qkv_bias=draw(st.booleans()),
        mtp_layers=draw(st.integers(0, 2)),
    )


@st.composite
def _moe_models(draw: st.DrawFn) -> ModelSpec:
    base = draw(_dense_models())
    top_k = draw(st.integers(1, 4))
    moe = MoeSpec(
        num_experts=draw(st.integers(top_k, 64)),
        top_k=top_k,
        expert_ffn_hidden_size=draw(_dims),
        shared_expert_ffn_hidden_size=draw(st.sampled_from([0, 16])),
        first_k_dense=draw(st.integers(0, base.num_layers - 1)),
        layer_freq=draw(st.integers(1, 3)),
    )
    return dataclasses.replace(base, moe=moe)


@settings(max_examples=60, deadline=None)
@given(_dense_models())
def test_dense_active_equals_total(model: ModelSpec) -> None:
    c = parameter_counts(model)
    assert c.active == c.total
    assert c.active_with_mtp == c.total_with_mtp
    assert c.total == _decomposed_total(model, c)


@settings(max_examples=60, deadline=None)
@given(_moe_models())
def test_moe_total_at_least_active(model: ModelSpec) -> None:
    c = parameter_counts(model)
    assert c.total >= c.active > 0
    assert c.total_with_mtp >= c.active_with_mtp
    assert c.total == _decomposed_total(model, c)


@settings(max_examples=60, deadline=None)
@given(_moe_models(), st.integers(1, 64))
def test_more_experts_same_top_k_keeps_active_but_not_total(model: ModelSpec, extra: int) -> None:
    assert model.moe is not None
    bigger = dataclasses.replace(
        model, moe=dataclasses.replace(model.moe, num_experts=model.moe.num_experts + extra)
    )
    small, large = parameter_counts(model), parameter_counts(bigger)
    assert large.active - small.active == model.num_moe_layers * model.hidden_size * extra
    # only the router grows on the active side; the experts' weights stay out of it
    assert large.active_routed_per_layer == small.active_routed_per_layer
    assert large.total > small.total
