"""What activation recompute re-runs in backward: shares of each forward cost category.

A pure, vectorised function for the time model: :func:`recompute_shares`
gives, per layer kind (dense layer, MoE layer), the fraction of each forward
cost category that is run a second time during backward:

* ``gemm`` — dense-class GEMMs (QKV, attention output, FC1/FC2 of the dense
  MLP or of the shared experts, MLA projections), by FLOPs
  (:mod:`parsearch.cost.flops`);
* ``routed`` — the routed-expert GEMMs;
* ``core_attention`` — ``QKᵀ`` and ``P·V`` (FlashAttention);
* ``elementwise`` — norms, activations, token permutation, RoPE, residual
  adds, by HBM traffic (each op's elements read + written per token, the
  quantity the time model charges non-GEMM kernels by) [derived];
* ``tp_comm`` / ``ep_comm`` — the forward TP/SP collectives and EP
  dispatch/combine that the recomputed modules contain.

Recompute modes (Megatron-Core ``transformer_config.py``):

* ``none``: 0 everywhere.
* ``full`` (``--recompute-granularity full``): every forward op of a
  recomputed layer runs again (``megatron/core/recompute.py`` checkpoints the
  whole ``TransformerLayer``), so every share is the fraction of the kind's
  layers that are recomputed: 1, or with ``recompute_num_layers = N``
  (``--recompute-method block``) the first N layers of each model chunk —
  averaged over the model's layers of that kind for the layout's
  ``(pp, vpp)`` split (:func:`full_recompute_fractions`; per stage:
  :func:`recomputed_layer_counts`).
* ``selective``: the union of what each of ``recompute_modules`` re-runs:

  ==============  ======================================================  =====================
  module          re-runs in backward (Megatron-Core file)                categories
  ==============  ======================================================  =====================
  core_attn       core attention (``attention.py``                         core_attention
                  ``_checkpointed_attention_forward``)
  layernorm       input and pre-MLP norms (``transformer_layer.py``,      elementwise (norms)
                  ``CheckpointWithoutOutput``)
  mla_up_proj     MLA q/kv up-projections + RoPE                          gemm (up-proj), elem.
                  (``multi_latent_attention.py::qkv_up_proj_and_rope_apply``)  (RoPE)
  mlp             the dense MLP of dense layers (``transformer_layer.py``  gemm (FC1, FC2), elem.
                  ``recompute_mlp``, ``if not self.is_moe_layer``)         (activation), tp_comm
  moe             the whole MoE block (``moe_layer.py``                    routed, gemm (shared),
                  ``moe_layer_recompute``): router, dispatch, experts,     elem., ep_comm, tp_comm
                  combine, shared experts
  moe_act         the expert activation function (``experts.py``           elementwise
                  ``activation_recompute``)
  shared_experts  the shared experts (``moe_layer.py``                     gemm (shared), elem.,
                  ``shared_experts_compute``)                              tp_comm
  ==============  ======================================================  =====================

  ``torchtitan_op_sac`` (not a Megatron module; it stands alone) prices torchtitan's
  op-level checkpointing of dense blocks: every second matmul, every elementwise op and the
  sequence-parallel all-gathers (:mod:`parsearch.cost.titan_sac`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parsearch.cost.stages import StageContent, effective_split, rows_by_split, stage_contents
from parsearch.cost.titan_sac import recomputed_gemm_share, require_dense_block
from parsearch.cost.token_flops import (
    attention_gemm_forward_flops,
    dense_mlp_forward_flops,
    shared_expert_forward_flops,
)
from parsearch.model.specs import RECOMPUTE_CODES, TORCHTITAN_OP_SAC, ModelSpec, TrainingSpec

#: A float or an elementwise numpy array of floats.
Num = Any

CATEGORIES: tuple[str, ...] = (
    "gemm", "routed", "core_attention", "elementwise", "tp_comm", "ep_comm",
)


@dataclass(frozen=True)
class LayerShares:
    """Share of each forward cost category of one layer kind re-run in backward (0..1)."""

    gemm: np.ndarray
    routed: np.ndarray
    core_attention: np.ndarray
    elementwise: np.ndarray
    tp_comm: np.ndarray
    ep_comm: np.ndarray


@dataclass(frozen=True)
class RecomputeShares:
    """:class:`LayerShares` for dense and MoE layers (arrays broadcast over layouts).

    ``routed`` and ``ep_comm`` of ``dense`` are 0 (a dense layer has none);
    for a dense model ``moe`` is all zeros.
    """

    dense: LayerShares
    moe: LayerShares

    def of(self, is_moe: bool) -> LayerShares:
        """The shares of one layer kind."""
        return self.moe if is_moe else self.dense


# ---------------------------------------------------------------------------
# Full recompute with --recompute-num-layers: which layers are recomputed
# ---------------------------------------------------------------------------


def recomputed_layer_counts(model: ModelSpec, content: StageContent,
                            recompute_num_layers: int | None) -> tuple[int, int]:
    """(dense, MoE) layers of one stage that ``full`` recompute re-runs.

    Megatron ``--recompute-method block --recompute-num-layers N``
    (``megatron/core/recompute.py``, block branch): the first N layers of each
    model chunk; ``None``: all of them.
    """
    dense = moe = 0
    for chunk in content.chunk_layer_indices:
        first = chunk if recompute_num_layers is None else chunk[:recompute_num_layers]
        n_moe = sum(model.is_moe_layer(i) for i in first)
        moe += n_moe
        dense += len(first) - n_moe
    return dense, moe


def full_recompute_fractions(model: ModelSpec, pp: int, vpp: int, split: str,
                             recompute_num_layers: int | None) -> tuple[float, float]:
    """Share of the model's (dense, MoE) layers that ``full`` recompute re-runs.

    >>> from parsearch.model.specs import ModelSpec
    >>> m = ModelSpec("toy", 8, 64, 256, 4, 4, 16, 1000)
    >>> full_recompute_fractions(m, 2, 2, "uneven", 1)   # chunks of 2 layers: 1 of 2
    (0.5, 0.0)
    """
    dense = moe = 0
    for content in stage_contents(model, pp, vpp, split):
        d, m = recomputed_layer_counts(model, content, recompute_num_layers)
        dense, moe = dense + d, moe + m
    n_moe = model.num_moe_layers
    n_dense = model.num_layers - n_moe
    return (dense / n_dense if n_dense else 0.0, moe / n_moe if n_moe else 0.0)


# ---------------------------------------------------------------------------
# Selective recompute: what each module re-runs
# ---------------------------------------------------------------------------


def _mla_up_proj_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of the MLA up-projections (``qkv_up_proj_and_rope_apply``).

    ``linear_q_up_proj`` (q_lora → a·(d_nope+d_rope)) or, without q-LoRA,
    ``linear_q_proj`` (h → a·(d_nope+d_rope)); ``linear_kv_up_proj``
    (kv_lora → a·(d_nope+d_v)); 2 FLOPs per multiply-add.
    """
    mla = model.mla
    if mla is None:
        return 0.0
    a = model.num_attention_heads
    q_in = mla.q_lora_rank or model.hidden_size
    q = q_in * a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    kv = mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
    return 2.0 * (q + kv)


def _elementwise_traffic(model: ModelSpec, is_moe: bool, tp: Num, sp_div: Num) -> dict[str, Num]:
    """Elements read + written per token of each non-GEMM op of a layer, per GPU [derived].

    Norms read and write h (SP-sharded); residual bias-dropout-adds read two
    and write one h; RoPE reads and writes Q and K; a SwiGLU (GeLU) reads
    2f (f) and writes f; token permute and unpermute read and write k·h per
    token entering the MoE (``tokens/tp``).
    """
    h = model.hidden_size
    up = 2 if model.mlp_activation == "swiglu" else 1
    mla = model.mla
    a = model.num_attention_heads
    if mla is None:
        g = model.num_query_groups  # K heads on a rank: g/tp, or 1 replicated when tp > g
        rope = 2.0 * model.head_dim * (a / tp + g / np.minimum(tp, g))
    else:
        rope = 2.0 * (a * mla.qk_rope_head_dim / tp + mla.qk_rope_head_dim)
    traffic = {
        "norms": 2 * 2.0 * h / sp_div,
        "residual": 2 * 3.0 * h / sp_div,
        "rope": rope,
    }
    if not is_moe:
        traffic["mlp_act"] = (up + 1) * model.ffn_hidden_size / tp
        return traffic
    moe = model.moe
    assert moe is not None
    traffic["permute"] = 2 * 2.0 * moe.top_k * h / tp
    traffic["expert_act"] = (up + 1) * moe.top_k * moe.expert_ffn_hidden_size / tp
    traffic["shared_act"] = (up + 1) * moe.shared_expert_ffn_hidden_size / tp
    return traffic


#: The elementwise ops each module re-runs (names of :func:`_elementwise_traffic`).
_MODULE_ELEMENTWISE: dict[str, tuple[str, ...]] = {
    "layernorm": ("norms",),
    "mla_up_proj": ("rope",),
    "mlp": ("mlp_act",),
    "moe": ("permute", "expert_act", "shared_act"),
    "moe_act": ("expert_act",),
    "shared_experts": ("shared_act",),
}


def _selective_layer(model: ModelSpec, is_moe: bool, modules: frozenset[str], tp: Num,
                     sp_div: Num) -> dict[str, Num]:
    """Shares re-run by ``modules`` in one layer of a kind (selective recompute)."""
    if TORCHTITAN_OP_SAC in modules:
        # torchtitan's op-level checkpointing (parsearch.cost.titan_sac): every second
        # matmul, every elementwise op and the sequence-parallel all-gathers (half the
        # block's forward TP collectives) run again; SDPA and the reduce-scatters are saved.
        require_dense_block(model, modules)
        return {"gemm": recomputed_gemm_share(model), "routed": 0.0, "core_attention": 0.0,
                "elementwise": 1.0, "tp_comm": 0.5, "ep_comm": 0.0}
    mla_up = _mla_up_proj_flops(model) if "mla_up_proj" in modules else 0.0
    attn = attention_gemm_forward_flops(model)
    if is_moe:
        shared = shared_expert_forward_flops(model)
        mlp_gemm = shared if modules & {"moe", "shared_experts"} else 0.0
        total_gemm = attn + shared
        routed = 1.0 if "moe" in modules else 0.0
        ep = routed
        shared_block = bool(model.moe and model.moe.shared_expert_ffn_hidden_size)
        # TP collectives by block (attention, shared experts), as the time model counts them.
        tp_comm = 0.5 if shared_block and modules & {"moe", "shared_experts"} else 0.0
    else:
        mlp = dense_mlp_forward_flops(model)
        mlp_gemm = mlp if "mlp" in modules else 0.0
        total_gemm = attn + mlp
        routed = ep = 0.0
        tp_comm = 0.5 if "mlp" in modules else 0.0  # the MLP's AG/RS of its 2 blocks
    traffic = _elementwise_traffic(model, is_moe, tp, sp_div)
    ops = {op for m in modules for op in _MODULE_ELEMENTWISE.get(m, ()) if op in traffic}
    elementwise = sum((traffic[op] for op in ops), 0.0) / sum(traffic.values())
    return {
        "gemm": (mlp_gemm + mla_up) / total_gemm,
        "routed": routed,
        "core_attention": 1.0 if "core_attn" in modules else 0.0,
        "elementwise": elementwise,
        "tp_comm": tp_comm,
        "ep_comm": ep,
    }


def _full_fractions(model: ModelSpec, training: TrainingSpec, pp: np.ndarray,
                    vpp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dense = np.ones(pp.shape)
    moe = np.ones(pp.shape)
    if training.recompute_num_layers is None:
        return dense, moe
    for p, v, rows in rows_by_split(pp, vpp):
        d, m = full_recompute_fractions(model, p, v, effective_split(model, training, p, v),
                                        training.recompute_num_layers)
        dense.reshape(-1)[rows], moe.reshape(-1)[rows] = d, m
    return dense, moe


def recompute_shares(
    model: ModelSpec,
    training: TrainingSpec,
    recompute_code: Num,
    *,
    pp: Num = 1,
    vpp: Num = 1,
    tp: Num = 1,
    sp: Num = False,
) -> RecomputeShares:
    """Shares of each forward cost category re-run in backward, per layer kind.

    Elementwise over ``recompute_code`` (``RECOMPUTE_CODES``), ``pp``,
    ``vpp`` (which fix the chunks ``recompute_num_layers`` counts in),
    ``tp`` and ``sp`` (which weight the elementwise ops); every share is in
    [0, 1].  ``training.recompute_modules`` chooses the selective modules.

    >>> from parsearch.model.presets import get_preset
    >>> t = TrainingSpec(seq_len=4096, global_batch=8)
    >>> s = recompute_shares(get_preset("llama3-8b"), t, RECOMPUTE_CODES["selective"])
    >>> float(s.dense.core_attention), float(s.dense.gemm), float(s.dense.elementwise)
    (1.0, 0.0, 0.0)
    """
    arrays = np.broadcast_arrays(*(np.asarray(x) for x in (recompute_code, pp, vpp, tp, sp)))
    code, pp_a, vpp_a = (a.astype(np.int64) for a in arrays[:3])
    tp_a = arrays[3].astype(np.float64)
    sp_div = np.where(arrays[4].astype(bool), tp_a, 1.0)
    full_dense, full_moe = _full_fractions(model, training, pp_a, vpp_a)
    modules = frozenset(training.recompute_modules)
    is_full = code == RECOMPUTE_CODES["full"]
    is_selective = code == RECOMPUTE_CODES["selective"]

    def kind(is_moe: bool, full_fraction: np.ndarray) -> LayerShares:
        if is_moe and model.moe is None:
            zero = np.zeros(code.shape)
            return LayerShares(*(zero for _ in CATEGORIES))
        selective = _selective_layer(model, is_moe, modules, tp_a, sp_div)
        out = {}
        for name in CATEGORIES:
            if name in ("routed", "ep_comm") and not is_moe:
                out[name] = np.zeros(code.shape)
                continue
            sel = np.broadcast_to(np.asarray(selective[name], dtype=np.float64), code.shape)
            out[name] = np.where(is_full, full_fraction, np.where(is_selective, sel, 0.0))
        return LayerShares(**out)

    return RecomputeShares(dense=kind(False, full_dense), moe=kind(True, full_moe))
