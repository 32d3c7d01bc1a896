"""Training FLOPs: per token, per iteration and per pipeline stage.

Conventions (``shared/reference/formulas.md`` §3):

* A GEMM of an ``m×k`` by ``k×n`` matrix costs ``2·m·k·n`` FLOPs; backward
  (dgrad + wgrad) costs 2× forward, so a training step is 3× forward
  (Megatron-Core ``training.py::num_floating_point_operations``).
* *Model* FLOPs exclude recomputation; *hardware* FLOPs add the recomputed
  forward (Korthikanti et al. 2022, arXiv 2205.05198, §6 "model FLOPs" vs
  "hardware FLOPs"; formulas.md §3.2/§3.4).
* ``causal=True`` halves the core-attention (``QKᵀ`` and ``P·V``) FLOPs for
  the causal mask, as Megatron-Core does since 2026-01 (formulas.md §3.3,
  §11.1); ``causal=False`` is the NAR21/KOR22 convention (full ``s²``).
* Router GEMM, norms, softmax, RoPE and token permutation are not counted
  (as in Megatron-Core).

Per-stage functions (:func:`stage_flops`, :func:`stage_flops_core`) accept
Python numbers or numpy arrays for the layout degrees; the scalar API calls
the same arithmetic, so both give identical numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from parsearch.cost.stages import StageContent, effective_split, stage_contents
from parsearch.layout import Layout
from parsearch.model.params import mlp_matrix_factor
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec, TrainingSpec

#: A float or an elementwise numpy array of floats (vectorised scoring).
Num = Any



# ---------------------------------------------------------------------------
# Forward FLOPs per token, per layer component (the building blocks)
# ---------------------------------------------------------------------------


def attention_gemm_forward_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one layer's attention projections (QKV + output).

    GQA: MCORE ``training.py::transformer_flops``, ``h·(a·d_h + 2·g·d_h) + a·d_h·h``
    weights, ×2 FLOPs per multiply-add (formulas.md §3.3).  MLA: the MCORE MLA
    branch, ``q_term + kv_lora·(h + a·(d_nope + d_v) + 1) + h·d_rope + a·d_v·h``
    with ``q_term = h·a·(d_nope+d_rope)`` or ``q_lora·(h + a·(d_nope+d_rope) + 1)``.
    """
    h, a = model.hidden_size, model.num_attention_heads
    mla = model.mla
    if mla is None:
        q_width = a * model.head_dim
        kv_width = 2 * model.num_query_groups * model.head_dim
        return 2.0 * (h * (q_width + kv_width) + q_width * h)
    qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    q_term = mla.q_lora_rank * (h + a * qk_head + 1) if mla.q_lora_rank else h * a * qk_head
    kv_term = mla.kv_lora_rank * (h + a * (mla.qk_nope_head_dim + mla.v_head_dim) + 1)
    kv_term += h * mla.qk_rope_head_dim
    return 2.0 * (q_term + kv_term + a * mla.v_head_dim * h)


def core_attention_forward_flops(model: ModelSpec, seq_len: int, causal: bool = True, *,
                                 windowed: bool = False) -> float:
    """Forward FLOPs per token of one layer's ``QKᵀ`` and ``P·V`` (formulas.md §3.3/§3.4).

    GQA: ``2·s·a·d_h`` for each of the two batched GEMMs (NAR21 Appendix:
    ``2Bs²h`` each for MHA), times κ = 1/2 for the causal mask (MCORE).
    MLA: ``2·s·a·(d_nope + d_rope)`` for ``QKᵀ`` and ``2·s·a·d_v`` for ``P·V``.
    ``windowed``: sliding-window layers attend to at most ``w`` keys
    (:func:`attended_keys`), averaged over the model's layers (GPT-OSS alternates
    windowed and full layers, so every pipeline stage holds about the mean); the time
    model counts this work, while the model-FLOP conventions (MCORE, NAR21, KOR22)
    count full attention, as Megatron-Core's ``num_floating_point_operations`` does.
    GPT-OSS's attention sinks add one logit per row, nothing against the products.
    """
    a = model.num_attention_heads
    mla = model.mla
    if mla is None:
        qk_width = pv_width = a * model.head_dim
    else:
        qk_width = a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        pv_width = a * mla.v_head_dim
    keys = attended_keys(seq_len, causal)
    if windowed and model.sliding_window_layers:
        windowed = attended_keys(seq_len, causal, model.sliding_window)
        share = model.sliding_window_layers / model.num_layers
        keys = (1.0 - share) * keys + share * windowed
    return 2.0 * (qk_width + pv_width) * keys


def attended_keys(seq_len: int, causal: bool, window: int = 0) -> float:
    """Mean keys one query attends to: ``κ·s`` without a window (κ = 1/2 causal, the
    MCORE convention); with a causal window ``w < s`` query ``i`` sees ``min(i, w)``
    keys, a mean of ``w − w(w−1)/(2s)``, scaled by ``s/(s+1)`` as the convention scales
    the exact causal mean ``(s+1)/2`` to ``s/2`` (so the two meet at ``w = s``); a
    bidirectional window: ``min(w, s)``.

    >>> attended_keys(4096, True), round(attended_keys(4096, True, 128), 4)
    (2048.0, 125.9849)
    """
    full = (0.5 if causal else 1.0) * seq_len
    if window <= 0 or window >= seq_len:
        return full
    if not causal:
        return float(window)
    exact = window - window * (window - 1) / (2.0 * seq_len)
    return exact * seq_len / (seq_len + 1.0)


def dense_mlp_forward_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one dense MLP: ``2·φ·h·f`` (MCORE; φ = 3 SwiGLU, 2 GeLU)."""
    return 2.0 * mlp_matrix_factor(model) * model.hidden_size * model.ffn_hidden_size


def routed_expert_forward_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of the routed experts of one MoE layer: ``2·φ·h·f_e·k`` (MCORE)."""
    if model.moe is None:
        return 0.0
    phi = mlp_matrix_factor(model)
    return 2.0 * phi * model.hidden_size * model.moe.expert_ffn_hidden_size * model.moe.top_k


def shared_expert_forward_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of the shared experts of one MoE layer: ``2·φ·h·f_sh`` (MCORE)."""
    if model.moe is None:
        return 0.0
    phi = mlp_matrix_factor(model)
    return 2.0 * phi * model.hidden_size * model.moe.shared_expert_ffn_hidden_size


def logits_forward_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of the output projection: ``2·h·V`` (NAR21 Appendix; MCORE).

    Counted once even with tied embeddings (formulas.md §3.4).
    """
    return 2.0 * model.hidden_size * model.vocab_size


def mtp_extra_forward_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one MTP block outside its transformer layer.

    MCORE ``transformer_flops``: ``n_mtp·(3h + 2h²)`` (norms + eh-projection)
    per ``6`` ⇒ ``2·(3h + 2h²)`` forward.  Its logits are counted separately.
    """
    h = model.hidden_size
    return 2.0 * (3 * h + 2 * h * h)


def _mtp_mlp_forward_flops(model: ModelSpec) -> tuple[float, float]:
    """(TP-sharded MLP FLOPs, routed FLOPs) of one MTP layer: MoE iff the last layer is."""
    if model.is_moe_layer(model.num_layers - 1):
        return shared_expert_forward_flops(model), routed_expert_forward_flops(model)
    return dense_mlp_forward_flops(model), 0.0


# ---------------------------------------------------------------------------
# Whole-model FLOPs per token
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FlopsBreakdown:
    """Training FLOPs per token (forward + backward, plus recompute when asked).

    The main-model components exclude the MTP block, whose layers, eh-projection
    and extra logits are all in ``mtp_flops``.  ``recompute_flops`` is 0 for
    model FLOPs.
    """

    attention_gemm_flops: float
    core_attention_flops: float
    dense_mlp_flops: float
    routed_expert_flops: float
    shared_expert_flops: float
    logits_flops: float
    mtp_flops: float
    recompute_flops: float = 0.0

    @property
    def model_flops(self) -> float:
        """Everything except recomputation."""
        return self.total_flops - self.recompute_flops

    @property
    def total_flops(self) -> float:
        """Sum of all components."""
        return float(sum(getattr(self, f.name) for f in fields(self)))


def _mtp_layer_forward_flops(model: ModelSpec, seq_len: int, causal: bool) -> float:
    """Forward FLOPs per token of one MTP transformer layer (recomputable part)."""
    tp_mlp, routed = _mtp_mlp_forward_flops(model)
    core = core_attention_forward_flops(model, seq_len, causal)
    return attention_gemm_forward_flops(model) + core + tp_mlp + routed


def model_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> FlopsBreakdown:
    """Model FLOPs per trained token (MCORE ``training.py::num_floating_point_operations``).

    Every component is 3× its forward FLOPs (forward + dgrad + wgrad,
    formulas.md §3.3).  ``causal`` selects the causal-mask halving of the
    core-attention term (MCORE ≥ 2026-01) versus the full ``s²`` of
    NAR21/KOR22.
    """
    layers = model.num_layers
    n_mtp = model.mtp_layers
    mtp_forward = n_mtp * (
        _mtp_layer_forward_flops(model, seq_len, causal)
        + mtp_extra_forward_flops(model)
        + logits_forward_flops(model)  # MCORE: h·V·(1 + n_mtp)
    )
    return FlopsBreakdown(
        attention_gemm_flops=3.0 * layers * attention_gemm_forward_flops(model),
        core_attention_flops=3.0 * layers * core_attention_forward_flops(model, seq_len, causal),
        dense_mlp_flops=3.0 * model.num_dense_layers * dense_mlp_forward_flops(model),
        routed_expert_flops=3.0 * model.num_moe_layers * routed_expert_forward_flops(model),
        shared_expert_flops=3.0 * model.num_moe_layers * shared_expert_forward_flops(model),
        logits_flops=3.0 * logits_forward_flops(model),
        mtp_flops=3.0 * mtp_forward,
    )


def recompute_flops_per_token(
    model: ModelSpec, seq_len: int, recompute: str, causal: bool = True
) -> float:
    """Extra forward FLOPs per token that activation recomputation adds (formulas.md §3.4).

    ``full``: one more forward of every transformer layer (MTP layers
    included), not of the logits (NAR21 §5.1 Eq. 3 "×4 for layers",
    KOR22 §6).  ``selective``: the core-attention forward only (MCORE
    ``recompute_modules=["core_attn"]``; KOR22 §5).  ``none``: 0.
    """
    if recompute == "none":
        return 0.0
    core = core_attention_forward_flops(model, seq_len, causal)
    if recompute == "selective":
        return (model.num_layers + model.mtp_layers) * core
    if recompute != "full":
        raise ValueError(f"recompute must be none, selective or full; got {recompute!r}")
    main = model.num_layers * (attention_gemm_forward_flops(model) + core)
    main += model.num_dense_layers * dense_mlp_forward_flops(model)
    main += model.num_moe_layers * (
        routed_expert_forward_flops(model) + shared_expert_forward_flops(model)
    )
    return main + model.mtp_layers * _mtp_layer_forward_flops(model, seq_len, causal)


def hardware_flops_per_token(
    model: ModelSpec, seq_len: int, recompute: str, causal: bool = True
) -> FlopsBreakdown:
    """Hardware FLOPs per token: model FLOPs plus recomputation (KOR22 §6; formulas.md §3.4)."""
    base = model_flops_per_token(model, seq_len, causal)
    extra = recompute_flops_per_token(model, seq_len, recompute, causal)
    return FlopsBreakdown(
        **{f.name: getattr(base, f.name) for f in fields(base) if f.name != "recompute_flops"},
        recompute_flops=extra,
    )


def narayanan_flops_per_iteration(
    global_batch: float, seq_len: float, num_layers: float, hidden: float, vocab: float
) -> float:
    """NAR21 (arXiv 2104.04473) §5.1 Eq. 3: ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``.

    GPT with MHA and a 4h GeLU MLP, full recompute counted, no causal discount.
    """
    b, s, lay, h, v = global_batch, seq_len, num_layers, hidden, vocab
    return 96.0 * b * s * lay * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * lay * h))


def korthikanti_model_flops_per_iteration(
    global_batch: float, seq_len: float, num_layers: float, hidden: float, vocab: float
) -> float:
    """KOR22 (arXiv 2205.05198) §6 model FLOPs: ``72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))``.

    NAR21's layer term × 3/4 (no recompute), no causal discount.
    """
    b, s, lay, h, v = global_batch, seq_len, num_layers, hidden, vocab
    return 72.0 * b * s * lay * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * lay * h))


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
                              effective_split(training, layout.pp, layout.vpp))
    return tuple(stage_flops(model, training, layout, c, causal) for c in contents)
