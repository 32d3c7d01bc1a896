"""Memory per GPU: model state, activations and overhead, per pipeline stage.

Everything is in bytes per GPU.  Sources (``shared/reference/formulas.md``):

* model state (weights, gradients, optimizer) — §5.1 (Megatron-Core
  ``docs/user-guide/features/dist_optimizer.md``; ZeRO, arXiv 1910.02054 §5)
  and §5.2 (``theoretical_memory_usage.py::compute_weight_and_optimizer_memory``):
  dense and replicated parameters shard the optimizer over DP·CP, routed
  experts over EDP;
* activations — §5.3: the Korthikanti et al. 2022 (KOR22, arXiv 2205.05198)
  Table 2 form for GPT-style models (``activation_model="korthikanti"``),
  or by default the FlashAttention / GQA / SwiGLU / MoE form derived there
  with the same accounting (``"flash"``);
* micro-batches in flight — §5.4 (NAR21 §2.2.1; MCORE ``schedules.py``);
* FP8 — §7.7.

Every pipeline stage is evaluated and the most loaded one is reported.
The arithmetic core (:func:`stage_memory_core`) is elementwise: the layout
degrees may be Python numbers or numpy arrays; :func:`estimate_memory`
(scalar) and :func:`memory_arrays` (vectorised) both call it, so they give
identical numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from parsearch.cost.stages import StageContent, rows_by_split, stage_contents
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.params import ParameterCounts, parameter_counts
from parsearch.workload import RECOMPUTE_CODES, ModelSpec, TrainingSpec

#: A float or an elementwise numpy array of floats.
Num = Any

ActivationModel = Literal["flash", "korthikanti"]

GIB = 2**30

#: Bytes per element of the low-precision copy of a GEMM operand (§7.7).  FP8: 1.
#: NVFP4: 4 bits + one FP8 scale per 16 elements = 0.5625 [assumption: the
#: recipe's high-precision exceptions (first/last layers, wgrad) are ignored].
LOW_PRECISION_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}

ACTIVATION_BYTES = 2.0  # 16-bit activations (KOR22 §4)
FP32_BYTES = 4.0


@dataclass(frozen=True)
class MemoryOptions:
    """Knobs of the memory model that the :class:`TrainingSpec` does not carry.

    * ``activation_model``: ``"flash"`` (default; formulas.md §5.3 modern form)
      or ``"korthikanti"`` (KOR22 Table 2; GPT with MHA, GeLU 4h, dropout,
      no FlashAttention — MoE layers are then counted as dense layers).
    * ``framework_overhead_bytes``: CUDA context, NCCL buffers, allocator
      fragmentation.  **Not sourced**: no reference quantifies it
      (formulas.md §5.4 last bullet); 3 GiB is our guess.
    * ``fp8_param_gather``: FP8 primary weights (``--fp8-param-gather``)
      drop the BF16 weight copy of GEMM weights (§7.7).
    * ``moe_imbalance``: max/mean tokens per expert rank (§5.3 MoE, §7.5).
    * ``fp32_logits``: an unfused cross-entropy keeps fp32 logits
      (``s·b·V·4/(t·c)`` bytes, §5.4) for the micro-batch in backward.
    """

    activation_model: ActivationModel = "flash"
    framework_overhead_bytes: float = 3.0 * GIB
    fp8_param_gather: bool = False
    moe_imbalance: float = 1.0
    fp32_logits: bool = True

    def __post_init__(self) -> None:
        if self.activation_model not in ("flash", "korthikanti"):
            raise SpecError(
                f"memory: activation_model must be flash or korthikanti, "
                f"got {self.activation_model!r}"
            )
        if self.framework_overhead_bytes < 0:
            raise SpecError(
                f"memory: framework_overhead_bytes must be >= 0, "
                f"got {self.framework_overhead_bytes!r}"
            )
        if self.moe_imbalance < 1.0:
            raise SpecError(f"memory: moe_imbalance must be >= 1, got {self.moe_imbalance!r}")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU; ``total`` is the sum of the five parts."""

    weights: Num
    gradients: Num
    optimizer: Num
    activations: Num
    other: Num
    total: Num

    @classmethod
    def of(
        cls, *, weights: Num, gradients: Num, optimizer: Num, activations: Num, other: Num
    ) -> MemoryBreakdown:
        """Build a breakdown, computing ``total``."""
        total = weights + gradients + optimizer + activations + other
        return cls(weights, gradients, optimizer, activations, other, total)

    def to_gib(self) -> dict[str, float]:
        """The CLI's ``memory_gib_per_gpu`` keys (without ``capacity``)."""
        return {f.name: float(getattr(self, f.name)) / GIB for f in fields(self)}


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory of every pipeline stage, and the most loaded one."""

    per_stage: tuple[MemoryBreakdown, ...]
    peak_stage: int

    @property
    def peak(self) -> MemoryBreakdown:
        """Breakdown of the stage with the largest total."""
        return self.per_stage[self.peak_stage]


@dataclass(frozen=True)
class MemoryArrays:
    """Vectorised peak memory: one entry per layout (bytes per GPU)."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    other: np.ndarray
    total: np.ndarray
    peak_stage: np.ndarray


# ---------------------------------------------------------------------------
# Model state
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelStateBytes:
    """Weights, gradients and optimizer state of some parameters, bytes per GPU."""

    weights: Num
    gradients: Num
    optimizer: Num

    @property
    def total(self) -> Num:
        """Sum of the three."""
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(
    params_per_gpu: Num,
    *,
    weight_bytes: float = 2.0,
    grad_bytes: float = 4.0,
    optimizer_bytes: float = 12.0,
    distributed_optimizer: bool = True,
    shard_degree: Num = 1,
    fully_sharded: bool = False,
) -> ModelStateBytes:
    """Model-state bytes of ``params_per_gpu`` parameters held by one GPU.

    Megatron-Core ``dist_optimizer.md`` (formulas.md §5.1): the distributed
    optimizer (ZeRO-1) shards only the optimizer state (fp32 master + Adam
    m, v = 12 bytes) over ``shard_degree`` ranks: 18 bytes per parameter
    without, ``6 + 12/D`` with.

    ``fully_sharded`` (ZeRO-3 / Megatron-FSDP ``optim_grads_params``; ZeRO
    paper §5, (2 + 2 + K)·Ψ/N_d) shards weights and gradients too.

    >>> s = model_state_bytes(1.0, distributed_optimizer=True, shard_degree=4)
    >>> (s.weights, s.gradients, s.optimizer)
    (2.0, 4.0, 3.0)
    >>> s = model_state_bytes(1.0, shard_degree=4, fully_sharded=True)
    >>> (s.weights, s.gradients, s.optimizer)
    (0.5, 1.0, 3.0)
    """
    optimizer = params_per_gpu * optimizer_bytes
    if distributed_optimizer or fully_sharded:
        optimizer = optimizer / shard_degree
    state_shards = shard_degree if fully_sharded else 1
    return ModelStateBytes(
        weights=params_per_gpu * weight_bytes / state_shards,
        gradients=params_per_gpu * grad_bytes / state_shards,
        optimizer=optimizer,
    )


@lru_cache(maxsize=256)
def _counts(model: ModelSpec) -> ParameterCounts:
    return parameter_counts(model)


@dataclass(frozen=True)
class _StageParams:
    """Parameters one GPU of a stage holds, by optimizer-sharding class."""

    dense: Num  # TP-sharded + replicated + embedding/output: optimizer over DP·CP
    expert: Num  # routed experts: optimizer over EDP
    dense_gemm: Num  # transformer-layer GEMM weights among ``dense`` (FP8 copies)
    layers: int  # transformer (and MTP) layers on the stage


def _attention_params_per_gpu(model: ModelSpec, pc: ParameterCounts, tp: Num) -> Num:
    """One layer's attention weights on one TP rank (formulas.md §4: TP-sharded).

    GQA: K/V are replicated once ``tp > g`` (layout-space.md R4), so a rank
    holds ``kv / min(tp, g)`` of them.  MLA: MCORE keeps the q/kv
    down-projections (``h·(q_lora + kv_lora + d_rope)``) unsharded
    (``parallel_mode="duplicated"``); the rest is TP-sharded.
    """
    h = model.hidden_size
    mla = model.mla
    if mla is None:
        kv = 2 * h * model.num_query_groups * model.head_dim
        kv += 2 * model.num_query_groups * model.head_dim if model.qkv_bias else 0
        return (pc.attention_per_layer - kv) / tp + kv / np.minimum(tp, model.num_query_groups)
    down = h * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim)
    return (pc.attention_per_layer - down) / tp + down


def _stage_params(
    model: ModelSpec, content: StageContent, *, tp: Num, ep: Num, etp: Num
) -> _StageParams:
    """formulas.md §5.2, per stage rather than only the first (with its caveat (iii))."""
    pc = _counts(model)
    attn = _attention_params_per_gpu(model, pc, tp)
    n_dense, n_moe = content.num_dense_layers, content.num_moe_layers
    dense_mlp = pc.dense_mlp_per_layer / tp
    shared = pc.shared_experts_per_layer / tp
    expert_shard = ep * etp
    gemm = (n_dense + n_moe) * attn + n_dense * dense_mlp + n_moe * shared
    replicated = n_dense * pc.replicated_per_layer_dense + n_moe * pc.replicated_per_layer_moe
    expert = n_moe * pc.routed_experts_per_layer / expert_shard

    n_mtp = content.num_mtp_layers
    if n_mtp:
        # MTP block (DeepSeek-V3 §2.2; MCORE places it on the last stage):
        # one transformer layer + eh-projection 2h² (TP-sharded) + norms (replicated).
        h = model.hidden_size
        if content.mtp_is_moe:
            layer = pc.attention_per_layer + pc.routed_experts_per_layer
            layer += pc.shared_experts_per_layer + pc.replicated_per_layer_moe
            gemm += n_mtp * (attn + shared)
            replicated += n_mtp * pc.replicated_per_layer_moe
            expert = expert + n_mtp * pc.routed_experts_per_layer / expert_shard
        else:
            layer = pc.attention_per_layer + pc.dense_mlp_per_layer
            layer += pc.replicated_per_layer_dense
            gemm += n_mtp * (attn + dense_mlp)
            replicated += n_mtp * pc.replicated_per_layer_dense
        extra = pc.mtp / n_mtp - layer  # eh-proj + MTP norms
        gemm += n_mtp * 2 * h * h / tp
        replicated += n_mtp * max(extra - 2 * h * h, 0)

    # Embedding on the first stage, output layer on the last (vocab-parallel, ÷ tp).
    # Tied embeddings with pp > 1: MCORE keeps a copy of the word embedding on the
    # last stage (formulas.md §5.2 caveat (iii)).
    vocab = 0.0
    if content.has_embedding:
        vocab += pc.embedding
    if content.has_output:
        vocab += pc.output if pc.output else (pc.embedding if content.pp > 1 else 0)
        replicated += pc.final_norm
    dense = gemm + replicated + vocab / tp
    return _StageParams(dense=dense, expert=expert, dense_gemm=gemm,
                        layers=n_dense + n_moe + n_mtp)


def _stage_model_state(
    training: TrainingSpec,
    params: _StageParams,
    options: MemoryOptions,
    *,
    dp: Num,
    cp: Num,
    edp: Num,
) -> ModelStateBytes:
    """Weights/grads/optimizer; dense shard over DP·CP, experts over EDP (formulas.md §5.1)."""
    common = {
        "weight_bytes": training.weight_bytes,
        "grad_bytes": training.grad_bytes,
        "optimizer_bytes": training.optimizer_bytes,
        "distributed_optimizer": training.distributed_optimizer,
        "fully_sharded": training.fsdp,
    }
    dense = model_state_bytes(params.dense, shard_degree=dp * cp, **common)
    expert = model_state_bytes(params.expert, shard_degree=edp, **common)
    weights = dense.weights + expert.weights
    if training.precision != "bf16":
        # formulas.md §7.7: FP8 GEMMs keep a low-precision copy of every GEMM weight
        # next to the BF16 one, unless FP8 primary weights replace the BF16 copy.
        low = LOW_PRECISION_BYTES[training.precision]
        gemm_params = params.dense_gemm / (dp * cp if training.fsdp else 1)
        gemm_params = gemm_params + params.expert / (edp if training.fsdp else 1)
        per_param = low - training.weight_bytes if options.fp8_param_gather else low
        weights = weights + gemm_params * per_param
    if training.fsdp:
        # formulas.md §5.1 ZeRO-3 transient peak [derived]: the unsharded BF16 weights of
        # the layer being computed and the prefetched next one, plus an fp32 gradient
        # bucket of one layer before its reduce-scatter.
        per_layer = (params.dense + params.expert) / max(params.layers, 1)
        weights = weights + per_layer * (2.0 * training.weight_bytes + FP32_BYTES)
    return ModelStateBytes(
        weights=weights,
        gradients=dense.gradients + expert.gradients,
        optimizer=dense.optimizer + expert.optimizer,
    )


# ---------------------------------------------------------------------------
# Activations per layer, per micro-batch, on one GPU
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _ActDegrees:
    tp: Num
    cp: Num
    ep: Num
    etp: Num
    mbs: Num
    sp_div: Num  # tp with sequence parallelism, else 1
    code: Num  # recompute code


def _mlp_up_factor(model: ModelSpec) -> int:
    """FC1 output width / ffn width: 2 for SwiGLU (gate and up), 1 for GeLU."""
    return 2 if model.mlp_activation == "swiglu" else 1


def _attention_act_bytes(model: ModelSpec, tokens: Num, deg: _ActDegrees, gemm_b: float) -> Num:
    """Attention half of a layer (formulas.md §5.3 modern form, derived).

    Norm-1 input (h) and norm-2 input (h) are SP-sharded; QKV-GEMM input (h)
    is SP-sharded and saved at GEMM-input precision; Q, K, V and the output O
    (out-proj input) are TP-sharded; FlashAttention keeps an fp32
    log-sum-exp per head and token.  Selective recompute (``core_attn``)
    drops only that log-sum-exp: Q, K, V stay as the checkpoint's inputs
    and O as the out-proj input.
    """
    h, a = model.hidden_size, model.num_attention_heads
    tp, sp_div = deg.tp, deg.sp_div
    mla = model.mla
    if mla is None:
        q = a * model.head_dim / tp
        kv = 2.0 * model.num_query_groups * model.head_dim / np.minimum(tp, model.num_query_groups)
        o = a * model.head_dim / tp
        latent = 0.0
    else:
        qk = a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) / tp
        q, kv, o = qk, qk + a * mla.v_head_dim / tp, a * mla.v_head_dim / tp
        # Latents: norm input + up-proj input for q and kv, plus the rope key [derived].
        latent = (2.0 * (mla.q_lora_rank + mla.kv_lora_rank) + mla.qk_rope_head_dim) / sp_div
    elems_act = 2.0 * h / sp_div + q + kv + latent
    elems_gemm = h / sp_div + o
    lse = np.where(deg.code >= 1, 0.0, FP32_BYTES * a / tp)
    return tokens * (elems_act * ACTIVATION_BYTES + elems_gemm * gemm_b + lse)


def _dense_mlp_act_bytes(model: ModelSpec, tokens: Num, deg: _ActDegrees, gemm_b: float) -> Num:
    """Dense MLP: FC1 input (h, SP-sharded), FC1 output (2f or f), FC2 input (f), ÷ tp."""
    f = model.ffn_hidden_size
    gemm_in = model.hidden_size / deg.sp_div + f / deg.tp
    fc1_out = _mlp_up_factor(model) * f / deg.tp
    return tokens * (gemm_in * gemm_b + fc1_out * ACTIVATION_BYTES)


def _moe_act_bytes(
    model: ModelSpec, tokens: Num, deg: _ActDegrees, gemm_b: float, imbalance: float
) -> Num:
    """MoE MLP (formulas.md §5.3 "MoE layer activations", derived).

    ``T = tokens/tp`` tokens enter the MoE on a rank; routed experts keep
    ``T·k·(h·etp + 3·f_e)`` elements (dispatched FC1 input, all-gathered over
    ETP; FC1 and activation outputs), times the imbalance; router input
    ``h`` (SP-sharded) and fp32 router logits ``4·E`` bytes per token; shared
    experts use the attention TP layout.
    """
    moe = model.moe
    assert moe is not None
    h = model.hidden_size
    up = _mlp_up_factor(model)
    routed_tokens = tokens / deg.tp * moe.top_k * imbalance
    f_e, f_sh = moe.expert_ffn_hidden_size, moe.shared_expert_ffn_hidden_size
    routed = routed_tokens * (
        (h * deg.etp + f_e) * gemm_b + up * f_e * ACTIVATION_BYTES
    )
    router = tokens * (h / deg.sp_div * ACTIVATION_BYTES + FP32_BYTES * moe.num_experts / deg.tp)
    shared = 0.0
    if f_sh:
        shared = tokens * (
            (h / deg.sp_div + f_sh / deg.tp) * gemm_b + up * f_sh / deg.tp * ACTIVATION_BYTES
        )
    return routed + router + shared


def _flash_layer_act_bytes(
    model: ModelSpec, is_moe: bool, deg: _ActDegrees, seq_len: int, gemm_b: float, imb: float
) -> Num:
    """One transformer layer, ``"flash"`` model, per micro-batch (bytes)."""
    tokens = deg.mbs * seq_len / deg.cp  # CP shards the sequence (formulas.md §5.3)
    attn = _attention_act_bytes(model, tokens, deg, gemm_b)
    mlp = (
        _moe_act_bytes(model, tokens, deg, gemm_b, imb)
        if is_moe
        else _dense_mlp_act_bytes(model, tokens, deg, gemm_b)
    )
    # Full recompute keeps only the layer input, SP-sharded (KOR22 Table 2 "2sbh",
    # /t with SP as MCORE checkpoints the sharded input; formulas.md §5.3/§11.4).
    full = tokens * model.hidden_size / deg.sp_div * ACTIVATION_BYTES
    return np.where(deg.code == 2, full, attn + mlp)


def _korthikanti_layer_act_bytes(model: ModelSpec, deg: _ActDegrees, seq_len: int) -> Num:
    """One layer, KOR22 Table 2 (bytes; GPT, MHA, GeLU 4h, dropout, no FlashAttention).

    CP is not in KOR22; every term is divided by cp (the sequence is sharded).
    """
    s, h, a = seq_len, model.hidden_size, model.num_attention_heads
    sbh = s * deg.mbs * h / deg.cp
    tp = deg.tp
    sp = deg.sp_div > 1
    # KOR22 Table 2 rows: "TP+SP" / "TP"; "TP+SP+selective" / "TP+selective"; full.
    none = np.where(sp, sbh * (34.0 + 5.0 * a * s / h) / tp,
                    sbh * (10.0 + 24.0 / tp + 5.0 * a * s / (h * tp)))
    selective = np.where(sp, 34.0 * sbh / tp, sbh * (10.0 + 24.0 / tp))
    # Full: KOR22 lists 2·s·b·h; with SP MCORE keeps the sharded input (÷t, §11.4).
    full = 2.0 * sbh / deg.sp_div
    return np.where(deg.code == 2, full, np.where(deg.code == 1, selective, none))


def _layer_act_bytes(
    model: ModelSpec,
    is_moe: bool,
    deg: _ActDegrees,
    seq_len: int,
    gemm_b: float,
    options: MemoryOptions,
) -> Num:
    if options.activation_model == "korthikanti":
        return _korthikanti_layer_act_bytes(model, deg, seq_len)
    return _flash_layer_act_bytes(model, is_moe, deg, seq_len, gemm_b, options.moe_imbalance)


def layer_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    *,
    is_moe: bool = False,
    tp: Num = 1,
    cp: Num = 1,
    ep: Num = 1,
    etp: Num = 1,
    mbs: Num = 1,
    sp: Num = False,
    recompute: str = "none",
    options: MemoryOptions = MemoryOptions(),
) -> Num:
    """Activation bytes one transformer layer keeps per micro-batch on one GPU.

    With ``options.activation_model="korthikanti"`` these are the KOR22
    Table 2 rows (e.g. TP+SP+selective ``34·s·b·h/t``); the default
    ``"flash"`` form is formulas.md §5.3's FlashAttention/GQA/SwiGLU/MoE one.
    """
    tp_f, cp_f, ep_f, etp_f, mbs_f = (_as_f64(x) for x in (tp, cp, ep, etp, mbs))
    deg = _ActDegrees(
        tp=tp_f, cp=cp_f, ep=ep_f, etp=etp_f, mbs=mbs_f,
        sp_div=np.where(np.asarray(sp, dtype=bool), tp_f, 1.0),
        code=np.asarray(RECOMPUTE_CODES[recompute]),
    )
    if is_moe and model.moe is None:
        raise SpecError(f"memory: model {model.name!r} has no MoE layers")
    result = _layer_act_bytes(
        model, is_moe, deg, training.seq_len, _gemm_input_bytes(training), options
    )
    return float(result) if np.ndim(result) == 0 else result


def _gemm_input_bytes(training: TrainingSpec) -> float:
    """Bytes per saved GEMM-input element: FP8/FP4 save linear inputs quantized (§7.7)."""
    return min(LOW_PRECISION_BYTES[training.precision], ACTIVATION_BYTES)


def in_flight_microbatches(rank: int, pp: int, vpp: int, num_microbatches: Num) -> Num:
    """Micro-batches whose activations pipeline rank ``rank`` holds at its peak.

    1F1B: ``min(m, p − r)`` (NAR21 §2.2.1; MCORE ``schedules.py`` warm-up
    ``p − r − 1`` + 1).  Interleaved: MCORE warm-up ``2·(p − r − 1) + (v − 1)·p``
    chunk-forwards + 1 outstanding chunks of ``1/v`` of the rank's layers;
    for ``r = 0`` that is ``p·(1 + (p − 1)/(p·v))`` micro-batches' worth
    (KOR22 §4.2.3 interleaving factor; formulas.md §5.4).
    """
    m = np.asarray(num_microbatches, dtype=np.float64)
    if vpp == 1:
        return np.minimum(m, pp - rank)
    chunks = 2 * (pp - rank - 1) + (vpp - 1) * pp + 1
    return np.minimum(m * vpp, chunks) / vpp


def _stage_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    content: StageContent,
    deg: _ActDegrees,
    num_microbatches: Num,
    options: MemoryOptions,
) -> Num:
    """All activations of the stage at its peak (layers × in-flight + output terms)."""
    s = training.seq_len
    gemm_b = _gemm_input_bytes(training)
    per_mb = 0.0
    if content.num_dense_layers:
        per_mb = per_mb + content.num_dense_layers * _layer_act_bytes(
            model, False, deg, s, gemm_b, options
        )
    if content.num_moe_layers:
        per_mb = per_mb + content.num_moe_layers * _layer_act_bytes(
            model, True, deg, s, gemm_b, options
        )
    tokens = deg.mbs * s / deg.cp
    h = model.hidden_size
    if content.num_mtp_layers:
        mtp_layer = _layer_act_bytes(model, content.mtp_is_moe, deg, s, gemm_b, options)
        # MTP extra: two norm inputs (2h) + eh-proj input (2h), SP-sharded [derived].
        mtp_extra = tokens * 2.0 * h / deg.sp_div * (ACTIVATION_BYTES + gemm_b)
        per_mb = per_mb + content.num_mtp_layers * (mtp_layer + mtp_extra)
    if content.has_embedding and options.activation_model == "korthikanti":
        # KOR22 §4.3 as coded in MCORE: token ids 8·s·b + embedding dropout mask s·b·h.
        per_mb = per_mb + (8.0 * s * deg.mbs + s * deg.mbs * h) / deg.cp / deg.sp_div
    in_flight = in_flight_microbatches(content.rank, content.pp, content.vpp, num_microbatches)
    total = in_flight * per_mb
    if content.has_output:
        # Only the micro-batch in backward holds these (formulas.md §5.4): final-norm
        # and output-layer inputs (KOR22's 4·s·b·h/t) and fp32 logits s·b·V·4/(t·c).
        total = total + tokens * 2.0 * h / deg.sp_div * ACTIVATION_BYTES
        if options.fp32_logits:
            heads = 1 + content.num_mtp_layers
            total = total + heads * tokens * model.vocab_size / deg.tp * FP32_BYTES
    return total


# ---------------------------------------------------------------------------
# Stage memory (the elementwise core) and its scalar and vectorised fronts
# ---------------------------------------------------------------------------


def _as_f64(value: Num) -> Num:
    return np.asarray(value, dtype=np.float64)


def num_microbatches(global_batch: int, mbs: Num, dp: Num) -> Num:
    """``m = B / (mbs·dp)`` (layout-space.md R10), at least 1."""
    denom = np.maximum(np.asarray(mbs) * np.asarray(dp), 1)
    return np.maximum(global_batch // denom, 1)


def stage_memory_core(
    model: ModelSpec,
    training: TrainingSpec,
    content: StageContent,
    *,
    tp: Num,
    cp: Num,
    ep: Num,
    etp: Num,
    mbs: Num,
    dp: Num,
    edp: Num,
    recompute_code: Num,
    sp: Num,
    options: MemoryOptions = MemoryOptions(),
) -> MemoryBreakdown:
    """Memory of one GPU of ``content``'s stage, elementwise over the degrees."""
    tp, cp, ep, etp, mbs, dp, edp = (_as_f64(x) for x in (tp, cp, ep, etp, mbs, dp, edp))
    sp_div = np.where(np.asarray(sp, dtype=bool), tp, 1.0)
    params = _stage_params(model, content, tp=tp, ep=ep, etp=etp)
    state = _stage_model_state(training, params, options, dp=dp, cp=cp, edp=edp)
    deg = _ActDegrees(tp=tp, cp=cp, ep=ep, etp=etp, mbs=mbs, sp_div=sp_div,
                      code=np.asarray(recompute_code))
    m = num_microbatches(training.global_batch, mbs, dp)
    activations = _stage_activation_bytes(model, training, content, deg, m, options)
    other = np.full_like(tp, options.framework_overhead_bytes)
    return MemoryBreakdown.of(
        weights=state.weights + 0.0 * tp,
        gradients=state.gradients + 0.0 * tp,
        optimizer=state.optimizer + 0.0 * tp,
        activations=activations + 0.0 * tp,
        other=other,
    )


def _scalar_breakdown(b: MemoryBreakdown) -> MemoryBreakdown:
    return MemoryBreakdown(*(float(getattr(b, f.name)) for f in fields(b)))


def stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    content: StageContent,
    options: MemoryOptions = MemoryOptions(),
) -> MemoryBreakdown:
    """Memory per GPU of one pipeline stage of ``layout`` (floats, bytes)."""
    result = stage_memory_core(
        model,
        training,
        content,
        tp=layout.tp,
        cp=layout.cp,
        ep=layout.ep,
        etp=layout.etp,
        mbs=layout.mbs,
        dp=layout.dp,
        edp=layout.edp,
        recompute_code=RECOMPUTE_CODES[layout.recompute],
        sp=layout.sp,
        options=options,
    )
    return _scalar_breakdown(result)


def estimate_memory(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    options: MemoryOptions = MemoryOptions(),
) -> MemoryEstimate:
    """Memory per GPU of every pipeline stage of ``layout``; the peak is the largest total."""
    contents = stage_contents(model, layout.pp, layout.vpp, training.pipeline_split)
    per_stage = tuple(stage_memory(model, training, layout, c, options) for c in contents)
    totals = [b.total for b in per_stage]
    return MemoryEstimate(per_stage=per_stage, peak_stage=totals.index(max(totals)))


def memory_arrays(
    model: ModelSpec,
    training: TrainingSpec,
    tp: Num,
    cp: Num,
    pp: Num,
    ep: Num,
    etp: Num,
    vpp: Num,
    mbs: Num,
    dp: Num,
    edp: Num,
    recompute_code: Num,
    sp: Num,
    options: MemoryOptions = MemoryOptions(),
) -> MemoryArrays:
    """Peak memory per GPU for many layouts at once (elementwise over the arrays).

    Layouts are grouped by ``(pp, vpp)``: the stage split is computed once per
    group (:func:`~parsearch.cost.stages.stage_contents` is memoised), every
    stage is evaluated with :func:`stage_memory_core` and the largest total
    wins (the first such stage on ties, as in :func:`estimate_memory`).
    Degrees must describe valid layouts (``dp, edp >= 1``; in ``even`` split
    mode ``L % (pp*vpp) == 0``, else :class:`SpecError`): filter first.
    """
    arrays = np.broadcast_arrays(
        *(np.asarray(x) for x in (tp, cp, pp, ep, etp, vpp, mbs, dp, edp, recompute_code, sp))
    )
    tp_a, cp_a, pp_a, ep_a, etp_a, vpp_a, mbs_a, dp_a, edp_a, code_a, sp_a = (
        np.ravel(a) for a in arrays
    )
    n = tp_a.size
    out = {name: np.zeros(n) for name in ("weights", "gradients", "optimizer",
                                          "activations", "other", "total")}
    peak_stage = np.zeros(n, dtype=np.int64)
    for pp_g, vpp_g, idx in rows_by_split(pp_a, vpp_a):
        best_total = np.full(idx.size, -np.inf)
        for content in stage_contents(model, int(pp_g), int(vpp_g), training.pipeline_split):
            b = stage_memory_core(
                model, training, content,
                tp=tp_a[idx], cp=cp_a[idx], ep=ep_a[idx], etp=etp_a[idx], mbs=mbs_a[idx],
                dp=dp_a[idx], edp=edp_a[idx], recompute_code=code_a[idx], sp=sp_a[idx],
                options=options,
            )
            better = b.total > best_total
            sel = idx[better]
            for name in out:
                out[name][sel] = np.asarray(getattr(b, name))[better]
            peak_stage[sel] = content.rank
            best_total = np.where(better, b.total, best_total)
    shape = arrays[0].shape
    return MemoryArrays(
        **{name: value.reshape(shape) for name, value in out.items()},
        peak_stage=peak_stage.reshape(shape),
    )
