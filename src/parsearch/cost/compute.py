"""Compute time of one pipeline unit (a layer, the embedding, the output layer) per micro-batch.

Everything is elementwise over numpy columns of layouts.  The time of a unit
on one GPU is built from what its kernels do:

* GEMMs: FLOPs / (peak of the precision x efficiency), the efficiency
  falling for small per-call GEMMs (:func:`gemm_efficiency`); backward runs
  the dgrad and wgrad GEMMs, 2x the forward FLOPs (NAR21 Appendix);
* MoE expert GEMMs as a grouped GEMM of the per-expert shape, with each
  expert's rows padded to the GEMM tile (:func:`tile_padding`);
* fused attention forward and backward, each with its own efficiency, the
  backward doing 2.5x the forward FLOPs (FlashAttention-2, arXiv 2307.08691
  §3: five matmuls in backward against two in forward);
* memory-bound kernels priced by the HBM bytes they move
  (:func:`memory_bound_bytes_per_token`);
* a fixed GPU time per kernel, and the host time to issue them: a layer whose
  GPU work is shorter than that waits for the CPU (eager mode; CUDA graphs
  remove most of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.cost.flops import stage_flops_core
from parsearch.cost.fused_mlp import fused_mlp_rows
from parsearch.cost.kernels import (
    CUDA_GRAPH_HOST_SHARE,
    KERNELS_DENSE_LAYER,
    KERNELS_FP8_EXTRA,
    KERNELS_MOE_EXTRA,
    KERNELS_PER_LOCAL_EXPERT,
    graphed_kernels,
)
from parsearch.cost.quantization import (
    fp8_attention_cast_bytes_per_token,
    gemm_rate_factor,
    quantize_bytes_per_element,
)
from parsearch.cost.recompute import LayerShares
from parsearch.cost.softmax import attention_scale, head_dim_scale
from parsearch.cost.stages import StageContent
from parsearch.cost.token_flops import (
    attention_gemm_forward_flops,
    dense_mlp_forward_flops,
    shared_expert_forward_flops,
)
from parsearch.cost.unfused_ops import (
    expert_bias_bytes,
    glu_clamp_bytes,
    rope_extra_bytes,
    unfused_attention_kernels,
    unfused_kernels,
    unfused_share,
)
from parsearch.cost.window_attention import window_time_factors
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.hardware import GpuProfile, generation_profiles

ACT_BYTES = 2.0  # bf16 activations
#: Rows of an expert GEMM tile: grouped GEMMs pad each expert's tokens up to a multiple
#: of the tile M (128 in CUTLASS/cuBLAS grouped kernels and DeepGEMM's contiguous layout;
#: Megatron's --moe-router-padding-for-fp8 pads to 16/32 for FP8 alignment).
EXPERT_TILE_ROWS = 128
#: Backward FLOPs of fused attention relative to forward (FlashAttention-2 §3.2).
ATTENTION_BACKWARD_RATIO = 2.5
#: Unfused attention (Megatron before FlashAttention, 2-byte scores): HBM bytes per
#: attention-score element of the non-GEMM kernels, our count.  Forward: the fused
#: scale-mask-softmax reads and writes it (4), dropout reads it, writes it and a 1-byte
#: mask (5) = 9.  Backward: dropout's gradient reads the gradient and the mask and writes
#: one (5), the fused softmax backward reads the gradient and the saved probabilities and
#: writes one (6) = 11.
UNFUSED_SCORE_BYTES_FORWARD = 9.0
UNFUSED_SCORE_BYTES_BACKWARD = 11.0
#: ... and of the batched GEMMs, whose inner dimension is the head dim, so the score
#: matrix they write or read bounds their time (FlashAttention, Dao et al. 2022 §2.2:
#: standard attention is memory-bound on these N x N reads and writes).  Forward: QK^T
#: writes it (2), PV reads it (2) = 4; backward: dV reads the dropped probabilities (2),
#: dP is written (2), dQ and dK each read dS (4) = 8.
UNFUSED_SCORE_GEMM_BYTES_FORWARD = 4.0
UNFUSED_SCORE_GEMM_BYTES_BACKWARD = 8.0
#: CP ring merge: bytes per attention-output element and ring step, forward + backward.
CP_MERGE_BYTES = 20.0
#: Megatron-Core's all-to-all dispatcher sorts the received tokens by local expert after
#: the all-to-all and unsorts them before the combine ("Permutation 2", ``sort_chunks_by_idxs``
#: in ``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` / ``combine_preprocess``) whenever
#: a rank holds more than one expert; each pass reads and writes every copy the rank
#: received (after the expert-TP all-gather), bf16, forward and backward: 4 x 4h = 16h bytes
#: per copy.  The flex (DeepEP/HybridEP) and
#: all-gather dispatchers permute once, into expert order (counted in ``per_routed_copy``).
EXPERT_SORT_BYTES_PER_HIDDEN = 16.0


def unit_content(model: ModelSpec, unit: str) -> StageContent:
    """A one-unit stage (``dense``, ``moe``, ``mtp``, ``embedding`` or ``output``)."""
    last_is_moe = model.is_moe_layer(model.num_layers - 1)
    return StageContent(
        rank=0, pp=1, vpp=1, chunk_layer_indices=((),),
        num_dense_layers=int(unit == "dense"),
        num_moe_layers=int(unit == "moe"),
        has_embedding=unit == "embedding",
        has_output=unit == "output",
        num_mtp_layers=int(unit == "mtp"),
        mtp_is_moe=last_is_moe,
    )


def is_moe_unit(model: ModelSpec, unit: str) -> bool:
    """Whether the unit holds routed experts (an MTP layer is MoE iff the last layer is)."""
    return unit == "moe" or (unit == "mtp" and model.is_moe_layer(model.num_layers - 1))


def generation_matmul_reference(gpus: tuple[str, ...], precision: str) -> float | None:
    """Mean measured large-matmul fraction of a generation's GPUs (``None``: none measured)."""
    measured = [p.large_matmul_fraction[precision] for p in generation_profiles(gpus)
                if precision in p.large_matmul_fraction]
    return sum(measured) / len(measured) if measured else None


def matmul_scale(gpu: GpuProfile, profile: EfficiencyProfile, precision: str) -> float:
    """This GPU's best measured large matmul relative to its generation's mean.

    A profile's GEMM efficiency is shared by a generation's GPUs, but parts with one
    datasheet peak reach different shares of it under their power and clock limits
    (maximum-achievable-matmul sweeps, stas00/ml-engineering: GB200 0.729 of its BF16
    peak, B200 0.776, B300 0.786); a GPU with a measurement scales by its share over the
    generation's mean, one without keeps the mean (1.0).

    >>> from parsearch.cost.efficiency import efficiency_for_gpu
    >>> from parsearch.topology.hardware import load_gpu_profile
    >>> round(matmul_scale(load_gpu_profile("gb200"), efficiency_for_gpu("gb200"), "bf16"), 3)
    0.955
    """
    own = gpu.large_matmul_fraction.get(precision)
    reference = generation_matmul_reference(tuple(profile.gpus), precision)
    if own is None or reference is None:
        return 1.0
    return own / reference


def gemm_efficiency(profile: EfficiencyProfile, precision: str, flops_per_call: Any,
                    half_flops: float) -> Any:
    """eta(F) = eta_max * F / (F + F_half): small GEMMs reach less of the peak.

    ``eta_max`` is capped by the large-matmul throughput measured on the GPU
    (the profile's cited range); the saturating form is a smooth version of
    Calculon's size-stepped matrix efficiency (``systems/h100_80g_nvl8.json``).
    ``half_flops`` is ``F_half`` for ``precision`` at its peak (:func:`gemm_half_flops`).
    """
    f = np.maximum(np.asarray(flops_per_call, dtype=np.float64), 1.0)
    return profile.gemm_efficiency[precision] * f / (f + half_flops)


def gemm_half_flops(profile: EfficiencyProfile, precision: str, peak_flops: float,
                    bf16_peak_flops: float) -> float:
    """``F_half`` of ``precision`` at a GEMM peak of ``peak_flops``: one fixed time per call.

    A call costs a fixed time ``t0`` (launch, prologue and epilogue, the last wave) plus
    ``F / R_max``, so its efficiency is ``eta_max F / (F + t0 R_max)``: the half-rate
    size is ``t0 R_max``.  ``t0`` is the profile's ``gemm_half_flops`` over the BF16 rate
    of the sweep that measured it (``gemm_half_flops_ceiling`` of the BF16 peak; without
    one, the fitted BF16 efficiency), the same for every precision, so a GEMM is never
    slower in FP8 than in BF16.  XLA's measured sm_100 tables
    (``cost_models/references/xla_matmul_sm100_{bf16,fp8}.csv``) bear this out: FP8
    17.6 GFLOP and BF16 8.8 GFLOP at large-GEMM rates of 0.621 x 4.5 and 0.624 x 2.25
    PFLOP/s, a fixed time of 6.3 us for both.

    >>> from parsearch.cost.efficiency import efficiency_for_gpu
    >>> profile = efficiency_for_gpu("b200")
    >>> t0 = profile.gemm_half_flops / (profile.gemm_half_flops_ceiling * 2.25e15)
    >>> half = gemm_half_flops(profile, "fp8", 4.5e15, 2.25e15)
    >>> round(half / (profile.gemm_efficiency["fp8"] * 4.5e15) / t0, 6)
    1.0
    """
    ceiling = profile.gemm_half_flops_ceiling or profile.gemm_efficiency["bf16"]
    rate = profile.gemm_efficiency[precision] * peak_flops
    return profile.gemm_half_flops * rate / (ceiling * bf16_peak_flops)


def tile_padding(rows_per_expert: Any) -> Any:
    """Padded/real rows of a grouped GEMM: each expert's rows round up to the tile."""
    rows = np.maximum(np.asarray(rows_per_expert, dtype=np.float64), 1e-9)
    return np.ceil(rows / EXPERT_TILE_ROWS) * EXPERT_TILE_ROWS / rows


def memory_bound_bytes_per_token(model: ModelSpec, *, tp: Any, etp: Any, dense: bool,
                                 moe: bool, quantize_bytes: float,
                                 fused_expert_mlp: Any = False,
                                 fp32_probs: bool = False) -> dict[str, Any]:
    """HBM bytes per token of the non-GEMM kernels of one layer, forward + backward.

    Counted per tensor an op reads and writes (bf16, 2 bytes), our count from
    the op list of a Megatron-Core / Transformer Engine layer:

    * ``per_hidden`` (on the tokens a rank holds, ÷tp with SP): two RMSNorms
      (read x, write y: 4h forward; read x, dy, write dx: 6h backward) and two
      residual adds (read 2h, write h forward; 2h backward): 36h;
    * ``per_head`` (÷tp): RoPE on Q and K, forward and backward, 8 bytes per element;
    * ``per_ffn`` (÷tp): SwiGLU reads 2f and writes f forward (6f), reads 2f + f and
      writes 2f backward (10f) = 16f (GeLU 10f);
    * ``per_routed_copy`` (per token copy this rank sends to an expert): permute and
      unpermute read and write h (8h forward, 8h backward);
    * ``per_expert_copy`` (per copy an expert processes: with expert TP the dispatcher
      all-gathers the received copies over the ETP group first, so a rank processes etp
      times the copies it sent, Megatron-Core ``MoEAlltoAllTokenDispatcher``
      ``dispatch_postprocess``): the expert activation 16f_e/etp;
    * ``quantize`` (FP8/FP4 only, formulas.md §7.7): every GEMM input and
      output gradient is read in bf16 and written in 8 (4) bits twice (row- and
      column-wise for dgrad and wgrad), plus the amax read of recipes that scale
      by the current tensor: ``quantize_bytes`` per element of the operands
      (:mod:`parsearch.cost.quantization`; 0 for BF16); the experts' casts
      (``quantize_routed_copy``) are per copy an expert processes, like ``per_expert_copy``;
    * GPT-OSS's unfused side paths (:mod:`parsearch.cost.unfused_ops`): YaRN RoPE in
      ``per_head``, the GLU clamp in ``per_ffn`` / ``per_expert_copy``, the experts' FC2
      bias in ``per_expert_copy`` (in fp32 with ``fp32_probs``, the flex dispatcher's).

    With ``fused_expert_mlp`` (Transformer Engine's op-fuser grouped MLP) the expert
    activation and the casts of its output and of its input gradient run in the epilogues
    of the FC1 GEMM (forward: SwiGLU, routing-probability scale and the MXFP8 cast written
    for FC2) and of FC2's dgrad GEMM (backward: SwiGLU backward and the cast for FC1's
    dgrad and wgrad), overlapped with the GEMMs like any GEMM output: those bytes leave
    ``per_expert_copy`` and ``quantize_routed_copy``.
    """
    h = float(model.hidden_size)
    attn_width = (model.num_attention_heads + model.num_query_groups) * model.head_dim
    # An ungated activation (GELU, or Nemotron-4's squared ReLU, one fused kernel each way:
    # Megatron-Core's bias_gelu / jit-fused activations.squared_relu) reads and writes the
    # f-wide FC1 output: 10 bytes per element forward + backward, as GELU.
    ffn_factor = 16.0 if model.mlp_activation == "swiglu" else 10.0
    glu = 2.0 if model.mlp_activation == "swiglu" else 1.0
    tp = np.asarray(tp, dtype=np.float64)
    out: dict[str, Any] = {
        "per_hidden": 36.0 * h if (dense or moe) else 0.0,
        "per_head": 8.0 * attn_width / tp if (dense or moe) else 0.0 * tp,
        "per_ffn": 0.0 * tp,
        "per_routed_copy": 0.0 * tp,
        "per_expert_copy": 0.0 * tp,
        "quantize_sp": 0.0 * tp,
        "quantize_rows": 0.0 * tp,
        "quantize_routed_copy": 0.0 * tp,
    }
    shared = model.moe.shared_expert_ffn_hidden_size if model.moe else 0
    ffn = model.ffn_hidden_size if dense else (shared if moe else 0)
    # GPT-OSS's unfused side paths (cost/unfused_ops.py): YaRN RoPE on Q and K, the GLU
    # clamp on the 2f-wide FC1 output, the experts' per-expert FC2 bias on h.
    out["per_head"] = out["per_head"] + rope_extra_bytes(model) * attn_width / tp
    out["per_ffn"] = (ffn_factor + 2.0 * glu_clamp_bytes(model, routed=False) * dense) * ffn / tp
    if moe and model.moe is not None:
        fe = model.moe.expert_ffn_hidden_size / np.asarray(etp, dtype=np.float64)
        out["per_routed_copy"] = 16.0 * h + 0.0 * tp
        out["per_expert_copy"] = ffn_factor * fe * unfused_share(fused_expert_mlp) + (
            2.0 * glu_clamp_bytes(model, fused_expert_mlp) * fe
            + expert_bias_bytes(model, fused_expert_mlp, fp32_probs=fp32_probs) * h)
    q = float(quantize_bytes)
    if q > 0 and (dense or moe):
        # Inputs of QKV and FC1 (h, quantized on the SP shard before the FP8 all-gather)
        # and their output gradients (h) ...
        out["quantize_sp"] = 4.0 * q * h
        # ... the projection and FC2 inputs and the QKV / FC1 output gradients (÷tp).
        q_width = model.num_attention_heads * model.head_dim
        qkv = q_width + 2 * model.num_query_groups * model.head_dim
        out["quantize_rows"] = q * (q_width + qkv + ffn * (1 + glu)) / tp
        if moe and model.moe is not None:
            fe = model.moe.expert_ffn_hidden_size / np.asarray(etp, dtype=np.float64)
            out["quantize_routed_copy"] = q * (2.0 * h + fe * (1 + glu)
                                               * unfused_share(fused_expert_mlp))
    return out


@dataclass(frozen=True)
class UnitCompute:
    """Seconds per micro-batch of one unit on one GPU (arrays over layouts).

    ``gemm_*`` are forward + backward (+ recompute) GEMM times, ``attention``
    the fused attention, ``memory_bound`` the non-GEMM kernels, ``overhead``
    the per-kernel GPU time plus the host time the GPU waits for.
    ``tp_gemm`` is the GEMM time of the TP-sharded linears (what TP overlap
    can hide behind); ``tp_attention_share`` the share of it in the attention block
    (QKV and output projection), the rest being the MLP block's
    (:func:`attention_block_share`).  ``host_wait`` is the part of ``overhead`` the GPU
    idles waiting for the host to issue kernels (0 when the GPU work is the longer).
    """

    gemm: np.ndarray
    routed: np.ndarray
    attention: np.ndarray
    logits: np.ndarray
    memory_bound: np.ndarray
    overhead: np.ndarray
    tp_gemm: np.ndarray
    tp_attention_share: float = 1.0
    host_wait: np.ndarray | float = 0.0

    @property
    def total(self) -> np.ndarray:
        return (self.gemm + self.routed + self.attention + self.logits + self.memory_bound
                + self.overhead)


def attention_block_share(model: ModelSpec, unit: str) -> float:
    """Share of a layer unit's TP-sharded GEMM FLOPs in its attention block.

    The attention block holds the QKV and output projections, the MLP block the dense
    MLP or the shared experts (formulas.md §3.5 counts); units with one TP block
    (embedding, output layer, MoE layers without shared experts) give 1.0.

    >>> from parsearch.model.presets import get_preset
    >>> round(attention_block_share(get_preset("llama3-70b"), "dense"), 3)
    0.176
    >>> attention_block_share(get_preset("mixtral-8x7b"), "moe")
    1.0
    """
    if unit not in ("dense", "moe", "mtp"):
        return 1.0
    attention = attention_gemm_forward_flops(model)
    mlp = (shared_expert_forward_flops(model) if is_moe_unit(model, unit)
           else dense_mlp_forward_flops(model))
    return attention / (attention + mlp) if attention + mlp > 0 else 1.0


def unit_compute(model: ModelSpec, training: TrainingSpec, gpu: GpuProfile,
                 profile: EfficiencyProfile, cols: dict[str, np.ndarray], unit: str, *,
                 recompute: LayerShares, causal: bool, imbalance: np.ndarray | float,
                 cuda_graphs: bool,
                 flash_attention: bool = True,
                 cuda_graph_scope: tuple[str, ...] = (),
                 fp8_recipe: str = "auto",
                 moe_dispatcher: str = "alltoall",
                 fp8_attention: bool = False,
                 fp8_output_proj: bool = False,
                 fused_expert_mlp: Any = False) -> UnitCompute:
    """Compute time of ``unit`` for every layout in ``cols`` (see module docstring).

    ``recompute`` gives the share of each forward cost category the unit re-runs in
    backward (:func:`parsearch.cost.recompute.recompute_shares`: full, partial
    ``--recompute-num-layers`` or per-module selective recompute).
    """
    tp, cp, ep, etp, mbs = (cols[k].astype(np.float64) for k in ("tp", "cp", "ep", "etp", "mbs"))
    sp = cols["sp"].astype(bool)
    code = cols["recompute"]
    # the op-fuser grouped MLP runs only where the experts have no TP of their own
    fused_expert_mlp = fused_mlp_rows(fused_expert_mlp, etp, training)
    s = training.seq_len
    precision = training.precision
    flops = stage_flops_core(model, s, unit_content(model, unit), tp=tp, cp=cp, ep=ep, etp=etp,
                             mbs=mbs, recompute_code=code, causal=causal)
    # GEMMs run at the GPU's own measured large-matmul ceiling relative to its
    # generation's (matmul_scale); fused attention has its own efficiency.
    # Block-scaled FP8 GEMMs run below the per-tensor rate the FP8 efficiency is
    # anchored on (cost/quantization.py MXFP8_GEMM_RATE: TE GEMM profiling guide).
    peak = (gpu.peak_flops[precision] * matmul_scale(gpu, profile, precision)
            * gemm_rate_factor(precision, fp8_recipe, gpu.compute_capability))
    peak_bf16 = gpu.peak_flops["bf16"]
    peak_bf16_gemm = peak_bf16 * matmul_scale(gpu, profile, "bf16")
    # Dense-class GEMMs: QKV, attention output, FC1, FC2 per layer (4 calls).
    half = gemm_half_flops(profile, precision, peak, peak_bf16_gemm)
    half_bf16 = gemm_half_flops(profile, "bf16", peak_bf16_gemm, peak_bf16_gemm)
    t_gemm_fwd = flops.dense_gemm_flops / (
        peak * gemm_efficiency(profile, precision, flops.dense_gemm_flops / 4.0, half))
    # Expert GEMMs: one grouped GEMM per projection over the local experts, priced at the
    # per-expert shape (rows = tokens per expert), rows padded to the tile.
    local_experts = np.maximum(np.asarray(flops.gemm.local_experts, dtype=np.float64), 1.0)
    per_expert_call = flops.routed_expert_flops / (2.0 * local_experts)
    padding = tile_padding(flops.gemm.expert_tokens) if model.moe else 1.0
    t_routed_fwd = imbalance * padding * flops.routed_expert_flops / (
        peak * gemm_efficiency(profile, precision, per_expert_call, half)
        * profile.grouped_gemm_efficiency)
    # Fused attention on blocks of s/cp tokens (CP's ring runs over the local chunk),
    # BF16 unless FP8 attention is requested (MCORE transformer_config
    # fp8_dot_product_attention; Transformer Engine fp8_dpa runs forward and backward in FP8
    # in the FusedAttention backend): then both matmuls run at the FP8 rate beside the same
    # exponentials (cost/softmax.py attention_scale).
    # With CP > 1 the causal load balancing splits each rank's share into two chunks of
    # s/(2 cp) tokens and the ring runs one kernel per chunk pair (Megatron-Core
    # context_parallel.md; Transformer Engine AttnFuncWithCPAndKVP2P).
    block = np.where(cp > 1, s / (2.0 * cp), float(s))
    size_factor = block / (block + profile.attention_half_block)
    # Each GPU's softmax exponential rate against its generation's (cost/softmax.py).
    attn_precision = "fp8" if fp8_attention and precision != "bf16" else "bf16"
    peak_attn = gpu.peak_flops[attn_precision]
    # A head dim the calibration never had: its exponential share (head_dim_scale).
    t_attn_fwd = flops.core_attention_flops / (
        peak_attn * profile.attention_forward_efficiency * size_factor
        * attention_scale(gpu, profile, model, backward=False, precision=attn_precision)
        * head_dim_scale(profile, model, backward=False))
    t_attn_bwd = ATTENTION_BACKWARD_RATIO * flops.core_attention_flops / (
        peak_attn * profile.attention_backward_efficiency * size_factor
        * attention_scale(gpu, profile, model, backward=True, precision=attn_precision)
        * head_dim_scale(profile, model, backward=True))
    # Sliding-window layers: whole key tiles, a short key loop, FP8 backward over the
    # causal triangle (cost/window_attention.py; cuDNN's measured window kernels).
    if model.sliding_window_layers:
        fp8_attention = attn_precision == "fp8"
        fp8_speedup = (peak_attn * attention_scale(gpu, profile, model, backward=False,
                                                   precision=attn_precision)
                       / (peak_bf16 * attention_scale(gpu, profile, model, backward=False))
                       if fp8_attention else 1.0)
        window_fwd, window_bwd = window_time_factors(
            model, s, causal, block, profile.attention_half_block,
            fp8_attention=fp8_attention, fp8_speedup=fp8_speedup)
        t_attn_fwd = t_attn_fwd * window_fwd
        t_attn_bwd = t_attn_bwd * window_bwd
    hbm = gpu.hbm_bandwidth_Bps * profile.hbm_efficiency
    # Attention-score elements of one micro-batch on this rank (heads / tp, s/cp squared).
    score_elements = mbs * (s / cp) * model.num_attention_heads / tp * (s / cp)
    if not flash_attention:
        # Batched GEMMs over the full score matrix (the causal half is computed and
        # masked), one (s/cp x d x s/cp) GEMM per head; backward 2x forward (NAR21).
        full_scores = flops.core_attention_flops * (2.0 if causal else 1.0)
        heads = max(model.num_attention_heads, 1)
        per_call = full_scores / (2.0 * np.maximum(mbs * heads / tp, 1.0))
        t_attn_fwd = full_scores / (peak_bf16_gemm
                                    * gemm_efficiency(profile, "bf16", per_call, half_bf16))
        t_attn_bwd = 2.0 * t_attn_fwd
        # Each GEMM takes the longer of its FLOPs and its score-matrix traffic (roofline).
        t_attn_fwd = np.maximum(t_attn_fwd,
                                score_elements * UNFUSED_SCORE_GEMM_BYTES_FORWARD / hbm)
        t_attn_bwd = np.maximum(t_attn_bwd,
                                score_elements * UNFUSED_SCORE_GEMM_BYTES_BACKWARD / hbm)
    # The output layer stays BF16 unless fp8_output_proj runs it under the MXFP8 autocast
    # (MCORE transformer_config fp8_output_proj, TELMHeadColumnParallelLinear).
    if fp8_output_proj and precision == "fp8":
        t_logits_fwd = flops.logits_flops / (
            peak * gemm_efficiency(profile, precision, flops.logits_flops, half))
    else:
        t_logits_fwd = flops.logits_flops / (
            peak_bf16_gemm * gemm_efficiency(profile, "bf16", flops.logits_flops, half_bf16))

    gemm = (3.0 + recompute.gemm) * t_gemm_fwd
    routed = (3.0 + recompute.routed) * t_routed_fwd
    attention = t_attn_fwd + t_attn_bwd + recompute.core_attention * t_attn_fwd
    logits = 3.0 * t_logits_fwd

    # Memory-bound kernels (formulas.md §7.7 for the FP8 casts): bytes / achieved HBM rate.
    is_layer = unit in ("dense", "moe", "mtp")
    moe_unit = is_moe_unit(model, unit)
    counts = memory_bound_bytes_per_token(
        model, tp=tp, etp=etp, dense=is_layer and not moe_unit, moe=moe_unit,
        quantize_bytes=quantize_bytes_per_element(precision, fp8_recipe,
                                                  gpu.compute_capability),
        fused_expert_mlp=fused_expert_mlp, fp32_probs=moe_dispatcher == "flex")
    tokens_sp = mbs * s / (cp * np.where(sp, tp, 1.0))  # rows of the SP-sharded tensors
    rows = mbs * s / cp  # rows of the GEMMs after the SP all-gather
    routed_copies = mbs * s / (tp * cp) * (model.moe.top_k if (moe_unit and model.moe) else 0)
    # The copies the experts process: the sent ones gathered over the ETP group.
    expert_copies = routed_copies * etp
    per_expert = counts["per_expert_copy"] + counts["quantize_routed_copy"]
    if moe_unit and moe_dispatcher == "alltoall":  # the second sort by local expert
        per_expert = per_expert + np.where(local_experts > 1, EXPERT_SORT_BYTES_PER_HIDDEN
                                           * model.hidden_size, 0.0)
    byte_count = (tokens_sp * (counts["per_hidden"] + counts["quantize_sp"])
                  + rows * (counts["per_head"] + counts["per_ffn"] + counts["quantize_rows"])
                  + imbalance * (routed_copies * counts["per_routed_copy"]
                                 + expert_copies * per_expert))
    if is_layer:
        # CP ring: each of the cp steps writes a partial attention output that is merged
        # into fp32 accumulators (output and log-sum-exp correction, TE
        # AttnFuncWithCPAndKVP2P); our count: read the bf16 partial (2 B) and read and write
        # the fp32 accumulator (8 B) per output element and step, forward and backward.
        heads_width = model.num_attention_heads * model.head_dim / tp
        steps = cp  # the rank's mbs*s/cp tokens, merged once per ring step
        byte_count = byte_count + np.where(
            cp > 1, rows * heads_width * steps * CP_MERGE_BYTES, 0.0)
    if is_layer and attn_precision == "fp8":
        # FP8 attention's casts in and out of the FP8 kernels (cost/quantization.py).
        byte_count = byte_count + rows * fp8_attention_cast_bytes_per_token(model, tp)
    if not flash_attention and is_layer:
        score_bytes = (UNFUSED_SCORE_BYTES_FORWARD + UNFUSED_SCORE_BYTES_BACKWARD
                       + recompute.core_attention * UNFUSED_SCORE_BYTES_FORWARD)
        byte_count = byte_count + score_elements * score_bytes
    if unit in ("output", "mtp"):  # fused cross-entropy reads the logits, writes their grad
        byte_count = byte_count + rows * 8.0 * model.vocab_size / tp
    memory_bound = profile.memory_bound_factor * byte_count / hbm
    # The forward is about a third of the counted bytes; recompute re-runs its share.
    memory_bound = memory_bound * (1.0 + recompute.elementwise / 3.0)

    # Per-kernel GPU time and host issue time (eager: the GPU idles when its work per
    # layer is shorter than the CPU's issue time).
    kernels = 0.0
    if is_layer:
        kernels = KERNELS_DENSE_LAYER + (KERNELS_MOE_EXTRA if moe_unit else 0.0)
        kernels += KERNELS_FP8_EXTRA if precision != "bf16" else 0.0
        if moe_unit:
            kernels = kernels + KERNELS_PER_LOCAL_EXPERT * local_experts
        kernels = kernels + unfused_kernels(model, moe_unit=moe_unit, local_experts=local_experts,
                                            fused_expert_mlp=fused_expert_mlp)
    kernel_time = kernels * profile.kernel_overhead_s * (1.0 + recompute.elementwise / 3.0)
    # A graph launch replaces the per-kernel issue of what it captured; kernels outside
    # the captured scope are still issued one by one.
    graphed = (graphed_kernels(cuda_graph_scope, moe_unit=moe_unit,
                               low_precision=precision != "bf16", total=kernels,
                               attention_extra=unfused_attention_kernels(model))
               if cuda_graphs and is_layer else 0.0)
    issued = kernels - (1.0 - CUDA_GRAPH_HOST_SHARE) * graphed
    host = profile.host_time_per_layer_s * issued / KERNELS_DENSE_LAYER
    gpu_busy = gemm + routed + attention + logits + memory_bound + kernel_time
    # The layer takes about max(GPU work, host issue time); a smooth maximum (a 4-norm)
    # because the host runs ahead only partly (syncs, allocator): the wait is shared.
    paced = (gpu_busy**4 + host**4) ** 0.25
    overhead = kernel_time + (paced - gpu_busy)
    return UnitCompute(gemm=gemm, routed=routed, attention=attention, logits=logits,
                       memory_bound=memory_bound, overhead=overhead, tp_gemm=gemm + logits,
                       tp_attention_share=attention_block_share(model, unit),
                       host_wait=paced - gpu_busy)
