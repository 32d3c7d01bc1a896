"""Training FLOPs per pipeline stage: forward FLOPs of one micro-batch on one GPU.

Built from the per-component, per-token formulas of :mod:`parsearch.cost.token_flops`
(conventions there: 2·m·k·n per GEMM, backward 2× forward, causal halving of core
attention), split by the layout's degrees (formulas.md §3.5).

Per-stage functions (:func:`stage_flops`, :func:`stage_flops_core`) accept
Python numbers or numpy arrays for the layout degrees; the scalar API calls
the same arithmetic, so both give identical numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from parsearch.cost.stages import StageContent, effective_split, stage_contents
from parsearch.cost.token_flops import (  # re-exported: the per-token formulas
    _mtp_mlp_forward_flops,
    attention_gemm_forward_flops,
    core_attention_forward_flops,
    dense_mlp_forward_flops,
    logits_forward_flops,
    mtp_extra_forward_flops,
    routed_expert_forward_flops,
    shared_expert_forward_flops,
)
from parsearch.layout import Layout
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec, TrainingSpec

#: A float or an elementwise numpy array of floats (vectorised scoring).
Num = Any




# ---------------------------------------------------------------------------
# Per-stage, per-micro-batch FLOPs on one GPU
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmShape:
    """Per-GPU GEMM sizes of one stage, for a compute-efficiency model.

    Dense GEMMs (attention projections, dense MLP, shared experts, logits)
    run on ``dense_tokens = mbs·s/cp`` rows: with SP the input is all-gathered
    over TP back to the CP chunk; without SP it is replicated on the TP ranks
    (NAR21 §3.2; KOR22 §4.2.2).  Column widths after TP sharding:
    ``qkv_width`` (Q plus K/V; K/V are replicated once tp exceeds the query
    groups), ``mlp_width = f/tp``, ``vocab_width = V/tp``; contraction dim ``hidden``.

    Expert GEMMs (formulas.md §3.5, derived): a rank feeds ``T = mbs·s/(tp·cp)``
    tokens into the MoE, each routed to ``k`` experts; over the EP group the
    ``ep·T·k`` token copies spread over ``E`` experts, and the ETP all-gather
    multiplies rows by ``etp``, so under balanced routing each of the
    ``local_experts = E/ep`` local experts runs a GEMM of
    ``expert_tokens = T·k·ep·etp/E`` rows with ``expert_width = f_e/etp`` columns.
    """

    dense_tokens: Num
    hidden: int
    qkv_width: Num
    mlp_width: Num
    vocab_width: Num
    expert_tokens: Num
    expert_width: Num
    local_experts: Num


@dataclass(frozen=True)
class StageFlops:
    """Forward FLOPs of one micro-batch on one GPU of one pipeline stage.

    * ``dense_gemm_flops``: attention projections, dense MLPs, shared experts
      and the MTP eh-projection, ÷ (tp·cp) (formulas.md §3.5);
    * ``routed_expert_flops``: ``(mbs·s/(tp·cp))·k·2·φ·h·f_e`` per MoE layer,
      independent of ep and etp under balanced routing (§3.5);
    * ``core_attention_flops``: ÷ (tp·cp) — CP's load-balanced causal split
      gives every rank the same share (§3.5);
    * ``logits_flops``: output projection (+ MTP heads) on the last stage;
    * ``recompute_flops``: extra forward FLOPs that recomputation runs
      during backward (full: the layers; selective: core attention).

    Backward is 2× forward (dgrad + wgrad; NAR21 Appendix).  Fields are
    floats, or numpy arrays when the degrees were arrays.
    """

    dense_gemm_flops: Num
    routed_expert_flops: Num
    core_attention_flops: Num
    logits_flops: Num
    recompute_flops: Num
    gemm: GemmShape

    @property
    def forward_flops(self) -> Num:
        """Forward FLOPs (no recompute)."""
        return (
            self.dense_gemm_flops
            + self.routed_expert_flops
            + self.core_attention_flops
            + self.logits_flops
        )

    @property
    def backward_flops(self) -> Num:
        """Backward FLOPs: 2× forward (NAR21 Appendix: dgrad + wgrad)."""
        return 2.0 * self.forward_flops

    @property
    def total_flops(self) -> Num:
        """Forward + backward + recompute for one micro-batch."""
        return 3.0 * self.forward_flops + self.recompute_flops


def _as_float_array(value: Num) -> Num:
    return np.asarray(value, dtype=np.float64)


def stage_flops_core(
    model: ModelSpec,
    seq_len: int,
    content: StageContent,
    *,
    tp: Num,
    cp: Num,
    ep: Num,
    etp: Num,
    mbs: Num,
    recompute_code: Num,
    causal: bool = True,
) -> StageFlops:
    """Elementwise per-stage FLOPs; degrees may be Python numbers or numpy arrays.

    ``recompute_code`` uses :data:`RECOMPUTE_CODES` (0 none, 1 selective, 2 full).
    """
    tp, cp, ep, etp, mbs = (_as_float_array(x) for x in (tp, cp, ep, etp, mbs))
    code = np.asarray(recompute_code)
    tokens = mbs * seq_len / (tp * cp)  # formulas.md §3.5: b·s/(t·c) per rank

    n_dense, n_moe, n_mtp = content.num_dense_layers, content.num_moe_layers, content.num_mtp_layers
    attn = attention_gemm_forward_flops(model)
    core = core_attention_forward_flops(model, seq_len, causal, windowed=True)
    mtp_tp_mlp, mtp_routed = _mtp_mlp_forward_flops(model)
    layer_gemm = (
        (n_dense + n_moe) * attn
        + n_dense * dense_mlp_forward_flops(model)
        + n_moe * shared_expert_forward_flops(model)
        + n_mtp * (attn + mtp_tp_mlp)
    )
    routed = n_moe * routed_expert_forward_flops(model) + n_mtp * mtp_routed
    core_total = (n_dense + n_moe + n_mtp) * core
    # The output layer's logits, plus one more pass of the shared output head per MTP layer
    # (MCORE multi_token_prediction.py: each MTP depth calls output_layer and its own LM
    # loss; transformer_flops: h·V·(1 + n_mtp)).  A one-unit MTP content carries its own.
    logits = logits_forward_flops(model) * (float(content.has_output) + n_mtp)

    dense_gemm = tokens * (layer_gemm + n_mtp * mtp_extra_forward_flops(model))
    routed_flops = tokens * routed
    core_flops = tokens * core_total
    # formulas.md §3.4: full = one more forward of the layers (not logits, not eh-proj);
    # selective = the core-attention forward.
    full = tokens * (layer_gemm + routed + core_total)
    recompute = np.where(code == 2, full, np.where(code == 1, core_flops, 0.0))
    return StageFlops(
        dense_gemm_flops=dense_gemm,
        routed_expert_flops=routed_flops,
        core_attention_flops=core_flops,
        logits_flops=tokens * logits,
        recompute_flops=recompute,
        gemm=_gemm_shape(model, seq_len, tp=tp, cp=cp, ep=ep, etp=etp, mbs=mbs),
    )


def _gemm_shape(
    model: ModelSpec, seq_len: int, *, tp: Num, cp: Num, ep: Num, etp: Num, mbs: Num
) -> GemmShape:
    """See :class:`GemmShape`."""
    mla = model.mla
    if mla is None:
        q_width = model.num_attention_heads * model.head_dim
        kv_width = 2.0 * model.num_query_groups * model.head_dim
        # KV heads are replicated when tp > g (layout-space.md R4).
        qkv = q_width / tp + kv_width / np.minimum(tp, model.num_query_groups)
    else:
        qkv = model.num_attention_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) / tp
    moe = model.moe
    if moe is None:
        expert_tokens = expert_width = local_experts = np.zeros_like(tp)
    else:
        expert_tokens = mbs * seq_len / (tp * cp) * moe.top_k * ep * etp / moe.num_experts
        expert_width = moe.expert_ffn_hidden_size / etp
        local_experts = moe.num_experts / ep
    return GemmShape(
        dense_tokens=mbs * seq_len / cp,
        hidden=model.hidden_size,
        qkv_width=qkv,
        mlp_width=model.ffn_hidden_size / tp,
        vocab_width=model.vocab_size / tp,
        expert_tokens=expert_tokens,
        expert_width=expert_width,
        local_experts=local_experts,
    )


def _to_scalars(obj: Any) -> Any:
    """Replace 0-d arrays of a (nested) frozen dataclass by Python floats."""
    values = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, GemmShape):
            values[f.name] = _to_scalars(value)
        elif isinstance(value, np.ndarray | np.generic):
            values[f.name] = float(value)
        else:
            values[f.name] = value
    return type(obj)(**values)


def stage_flops(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    stage_content: StageContent,
    causal: bool = True,
) -> StageFlops:
    """Forward FLOPs per micro-batch on one GPU of ``stage_content``'s stage (floats)."""
    result = stage_flops_core(
        model,
        training.seq_len,
        stage_content,
        tp=layout.tp,
        cp=layout.cp,
        ep=layout.ep,
        etp=layout.etp,
        mbs=layout.mbs,
        recompute_code=RECOMPUTE_CODES[layout.recompute],
        causal=causal,
    )
    return _to_scalars(result)


def all_stage_flops(
    model: ModelSpec, training: TrainingSpec, layout: Layout, causal: bool = True
) -> tuple[StageFlops, ...]:
    """:func:`stage_flops` for every pipeline rank of ``layout``."""
    contents = stage_contents(model, layout.pp, layout.vpp,
                              effective_split(model, training, layout.pp, layout.vpp))
    return tuple(stage_flops(model, training, layout, c, causal) for c in contents)
