"""Training FLOPs per token and per iteration: the per-component formulas.

Conventions (``shared/reference/formulas.md`` §3): a GEMM of an ``m×k`` by ``k×n`` matrix
costs ``2·m·k·n`` FLOPs; a training step is 3× forward (dgrad + wgrad = 2× forward;
Megatron-Core ``training.py::num_floating_point_operations``).  *Model* FLOPs exclude
recomputation, *hardware* FLOPs add it (KOR22, arXiv 2205.05198, §6).  ``causal=True``
halves core attention for the causal mask (Megatron-Core since 2026-01, formulas.md
§3.3); ``causal=False`` is NAR21/KOR22's full ``s²``.  Router GEMM, norms, softmax, RoPE
and token permutation are not counted (as in Megatron-Core).

These depend on the model and sequence only, not on a layout, so the pipeline split
(:mod:`parsearch.cost.stages`) can weigh stages with them; :mod:`parsearch.cost.flops`
re-exports them beside the per-stage FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from parsearch.model.params import mlp_matrix_factor
from parsearch.model.specs import ModelSpec

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
