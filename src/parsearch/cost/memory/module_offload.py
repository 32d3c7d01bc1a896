"""Bytes per layer and micro-batch that fine-grained activation offloading keeps on host.

Megatron-Core's ``--offload-modules`` (:mod:`parsearch.model.offload_modules`) wraps each
named submodule in an offload group: the tensors that submodule saves for its backward go to
host memory if they have at least ``min_offloaded_tensor_size`` elements (1,048,576 by
default), and come back before its backward (``fine_grained_activation_offload.py``,
``attention.py``, ``multi_latent_attention.py``, ``moe/experts.py``,
``transformer_layer.py`` at d98e8a64).  Per module, with the tensors
:mod:`parsearch.cost.memory.activations` counts for a layer:

* ``attn_norm`` -- the layer input a standalone input norm saves (MLA layers; under
  Transformer Engine the other attention fuses the norm into its QKV linear and the norm
  module is an ``IdentityOp``, which Megatron skips);
* ``qkv_linear`` -- what the QKV step saves: the QKV GEMM's input, plus the layer input
  where the norm is fused into it (Transformer Engine's ``LayerNormLinear``), or for MLA
  the low-rank latents of the down- and up-projections;
* ``core_attn`` -- Q, K, V and FlashAttention's log-sum-exp;
* ``attn_proj`` -- the attention output, the projection's input;
* ``mlp_norm`` -- the norm-2 input of MoE layers (dense MLPs fuse that norm too);
* ``expert_fc1`` -- the dispatched tokens, the experts' FC1 input;
* ``moe_act`` -- the experts' FC1 output, their activation's input.

What a recompute module already discards is not on the GPU to move (``layernorm`` drops the
QKV GEMM input, ``core_attn`` the log-sum-exp, ``mla_up_proj`` MLA's Q, K, V).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from parsearch.cost.memory.options import ACTIVATION_BYTES, FP32_BYTES, Num
from parsearch.model.offload_modules import MIN_OFFLOADED_ELEMENTS
from parsearch.model.specs import ModelSpec


class Degrees(Protocol):
    """The layout degrees the bytes depend on (``activations.ActDegrees`` has them)."""

    @property
    def tp(self) -> Num: ...

    @property
    def etp(self) -> Num: ...

    @property
    def sp_div(self) -> Num: ...


def _moved(elements: Num, bytes_each: float) -> Num:
    """Bytes of one saved tensor of ``elements`` elements that the offload moves."""
    return np.where(np.asarray(elements) >= MIN_OFFLOADED_ELEMENTS, elements * bytes_each, 0.0)


def module_offload_bytes(model: ModelSpec, tokens: Num, deg: Degrees, gemm_b: float,
                         imbalance: Num, recompute: frozenset[str],
                         offload: frozenset[str], is_moe: bool) -> Num:
    """Bytes of one layer per micro-batch that ``offload`` moves to host memory.

    ``tokens``: the micro-batch's tokens on this rank before TP (``mbs * s / cp``);
    ``recompute``: the selective recompute modules in force (empty: none).
    """
    if not offload:
        return 0.0
    h, a, sp_div, tp = model.hidden_size, model.num_attention_heads, deg.sp_div, deg.tp
    layer_in = tokens * h / sp_div
    moved: Num = 0.0
    mla = model.mla
    gemm_in = 0.0 if "layernorm" in recompute else layer_in
    if mla is None:
        q = tokens * a * model.head_dim / tp
        k = v = tokens * model.num_query_groups * model.head_dim / np.minimum(
            tp, model.num_query_groups)
        o = tokens * a * model.head_dim / tp
        if "qkv_linear" in offload:  # TE LayerNormLinear: its input and the normed GEMM input
            moved = moved + _moved(layer_in, ACTIVATION_BYTES) + _moved(gemm_in, gemm_b)
    else:
        up = "mla_up_proj" in recompute
        q = k = 0.0 if up else tokens * a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) / tp
        v = 0.0 if up else tokens * a * mla.v_head_dim / tp
        o = tokens * a * mla.v_head_dim / tp
        if "attn_norm" in offload:  # MLA's standalone input norm saves the layer input
            moved = moved + _moved(layer_in, ACTIVATION_BYTES)
        if "qkv_linear" in offload:
            latent = tokens * (2.0 * (mla.q_lora_rank + mla.kv_lora_rank)
                               + mla.qk_rope_head_dim) / sp_div
            moved = moved + _moved(gemm_in, gemm_b) + _moved(latent, ACTIVATION_BYTES)
    if "core_attn" in offload:
        lse = 0.0 if "core_attn" in recompute else tokens * a / tp
        moved = (moved + _moved(q, ACTIVATION_BYTES) + _moved(k, ACTIVATION_BYTES)
                 + _moved(v, ACTIVATION_BYTES) + _moved(lse, FP32_BYTES))
    if "attn_proj" in offload:
        moved = moved + _moved(o, gemm_b)
    moe = model.moe
    if not is_moe or moe is None:
        return moved
    if "mlp_norm" in offload:  # MoE layers keep a standalone pre-MLP norm (router input)
        moved = moved + _moved(layer_in, ACTIVATION_BYTES)
    routed = tokens / tp * moe.top_k * imbalance
    if "expert_fc1" in offload:
        moved = moved + _moved(routed * h * deg.etp, gemm_b)
    if "moe_act" in offload:
        up_factor = 2 if model.mlp_activation == "swiglu" else 1
        moved = moved + _moved(routed * up_factor * moe.expert_ffn_hidden_size, ACTIVATION_BYTES)
    return moved
