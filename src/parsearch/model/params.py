"""Parameter counts of a :class:`~parsearch.model.specs.ModelSpec`, by sharding class.

Formulas follow ``shared/reference/formulas.md`` §4, i.e. Megatron-Core
``megatron/training/theoretical_memory_usage.py::compute_weight_and_optimizer_memory``;
the MLA projections follow the DeepSeek-V3 paper (arXiv 2412.19437, §2.1.1).

Conventions:

* "active" counts the parameters one token touches, *including* the input
  embedding and output layer (the convention of Mixtral's 12.9B and
  DeepSeek-V3's 37B).  The router counts as active; only ``top_k`` of the
  routed experts do.
* ``total`` and ``active`` exclude the multi-token-prediction (MTP) module,
  as DeepSeek-V3's 671B does; ``*_with_mtp`` include it.  MTP layers share
  the embedding and output layer with the main model (Megatron-Core and
  DeepSeek-V3 §2.2), so those are not counted again.
* Small terms the :class:`ModelSpec` cannot describe are left out: learned
  position embeddings, linear-layer biases other than the QKV bias, Qwen3's
  per-head q/k norms, router score biases, GPT-OSS attention sinks.  Each is
  far below 0.1% of the total of the models parsearch ships as presets.
"""

from __future__ import annotations

from dataclasses import dataclass

from parsearch.model.specs import ModelSpec


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts of one model, split the way the memory model shards them.

    Per-layer fields describe ONE transformer layer of the main model.
    Sharding classes (formulas.md §4): attention, dense MLP and shared
    experts are TP-sharded; routed experts are expert-sharded (÷ ep·etp);
    norms and the router are replicated.
    """

    attention_per_layer: int
    dense_mlp_per_layer: int
    routed_experts_per_layer: int
    active_routed_per_layer: int
    shared_experts_per_layer: int
    replicated_per_layer_dense: int
    replicated_per_layer_moe: int
    embedding: int
    output: int
    final_norm: int
    mtp: int
    total: int
    active: int
    total_with_mtp: int
    active_with_mtp: int


def mlp_matrix_factor(model: ModelSpec) -> int:
    """φ: weight matrices per MLP, 3 for SwiGLU (gate, up, down), 2 for GeLU (formulas.md §1)."""
    return 3 if model.mlp_activation == "swiglu" else 2


def norm_params(model: ModelSpec, width: int) -> int:
    """Parameters of one norm over ``width`` features (RMSNorm: scale; LayerNorm: +bias)."""
    return width * (1 if model.norm == "rmsnorm" else 2)


def attention_params(model: ModelSpec) -> int:
    """Projection weights (and QKV bias) of one attention block."""
    h = model.hidden_size
    a = model.num_attention_heads
    mla = model.mla
    if mla is None:
        # formulas.md §4 / MCORE: 2·h·a·d_h (Q and output) + 2·h·g·d_h (K and V).
        q_width = a * model.head_dim
        kv_width = 2 * model.num_query_groups * model.head_dim
        bias = q_width + kv_width if model.qkv_bias else 0
        return h * q_width + h * kv_width + q_width * h + bias
    qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    # DeepSeek-V3 §2.1.1 Eq. 6-7: W^DQ (h -> d_c') then W^UQ, W^QR (d_c' -> a·(d_nope+d_rope));
    # without q-LoRA (DeepSeek-V2-Lite style) queries are projected directly from h.
    q = h * mla.q_lora_rank + mla.q_lora_rank * a * qk_head if mla.q_lora_rank else h * a * qk_head
    # DeepSeek-V3 Eq. 1-5: W^DKV and W^KR (h -> d_c + d_rope), W^UK, W^UV (d_c -> a·(d_nope+d_v)).
    kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
    kv += mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
    # Eq. 10: output projection W^O (a·d_v -> h).
    out = a * mla.v_head_dim * h
    return q + kv + out


def layer_norm_params(model: ModelSpec) -> int:
    """Norms of one transformer layer: pre-attention and pre-MLP (+ MLA latent norms)."""
    total = 2 * norm_params(model, model.hidden_size)
    if model.mla is not None:
        # DeepSeek-V3 normalizes the compressed latents (q_a_layernorm, kv_a_layernorm).
        total += norm_params(model, model.mla.kv_lora_rank)
        if model.mla.q_lora_rank:
            total += norm_params(model, model.mla.q_lora_rank)
    return total


def parameter_counts(model: ModelSpec) -> ParameterCounts:
    """Total and active parameter counts, split by sharding class (formulas.md §4)."""
    h = model.hidden_size
    phi = mlp_matrix_factor(model)
    attention = attention_params(model)
    norms = layer_norm_params(model)
    # formulas.md §4: dense MLP 2·h·f·(3/2 if SwiGLU).
    dense_mlp = phi * h * model.ffn_hidden_size if model.has_dense_mlp else 0

    moe = model.moe
    if moe is not None:
        per_expert = phi * h * moe.expert_ffn_hidden_size
        routed = per_expert * moe.num_experts  # formulas.md §4: 2·h·f_e·E·(3/2 if SwiGLU)
        active_routed = per_expert * moe.top_k  # §4: active replaces E by k
        shared = phi * h * moe.shared_expert_ffn_hidden_size  # §4: 2·h·f_sh·(3/2 if SwiGLU)
        router = h * moe.num_experts  # §4: router h·E
    else:
        routed = active_routed = shared = router = 0

    embedding = model.vocab_size * h  # §4: h·V, ×2 when untied
    output = 0 if model.tied_embeddings else model.vocab_size * h
    final_norm = norm_params(model, h)

    dense_layer = attention + dense_mlp + norms
    moe_layer_total = attention + routed + shared + norms + router
    moe_layer_active = attention + active_routed + shared + norms + router
    n_moe = model.num_moe_layers
    n_dense = model.num_dense_layers
    outer = embedding + output + final_norm
    total = outer + n_dense * dense_layer + n_moe * moe_layer_total
    active = outer + n_dense * dense_layer + n_moe * moe_layer_active

    # MTP module (DeepSeek-V3 §2.2; MCORE: an MTP layer is MoE iff the last layer is):
    # two input norms (h each), eh-projection 2h -> h, one transformer layer, one final norm.
    mtp_extra = 2 * norm_params(model, h) + 2 * h * h + norm_params(model, h)
    last_is_moe = model.is_moe_layer(model.num_layers - 1)
    mtp_layer_total = moe_layer_total if last_is_moe else dense_layer
    mtp_layer_active = moe_layer_active if last_is_moe else dense_layer
    mtp = model.mtp_layers * (mtp_extra + mtp_layer_total)
    mtp_active = model.mtp_layers * (mtp_extra + mtp_layer_active)

    return ParameterCounts(
        attention_per_layer=attention,
        dense_mlp_per_layer=dense_mlp,
        routed_experts_per_layer=routed,
        active_routed_per_layer=active_routed,
        shared_experts_per_layer=shared,
        replicated_per_layer_dense=norms,
        replicated_per_layer_moe=norms + router if moe is not None else 0,
        embedding=embedding,
        output=output,
        final_norm=final_norm,
        mtp=mtp,
        total=total,
        active=active,
        total_with_mtp=total + mtp,
        active_with_mtp=active + mtp_active,
    )
