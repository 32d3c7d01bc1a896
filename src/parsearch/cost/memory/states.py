"""Model state per GPU: weights, gradients and optimizer state of one pipeline stage.

Sources (``shared/reference/formulas.md``): §5.1 (Megatron-Core
``docs/user-guide/features/dist_optimizer.md``; ZeRO, arXiv 1910.02054 §5)
and §5.2 (``theoretical_memory_usage.py::compute_weight_and_optimizer_memory``):
dense and replicated parameters shard the optimizer over DP·CP, routed
experts over EDP; FP8 weight copies §7.7.

The gradient buffer is ``TrainingSpec.grad_bytes`` per parameter: 4 for fp32
main gradients (Megatron default), 2 for BF16 main gradients; the FSDP
transient gradient bucket uses the same width.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from parsearch.cost.memory.options import LOW_PRECISION_BYTES, MemoryOptions, Num
from parsearch.cost.stages import StageContent
from parsearch.model.params import ParameterCounts, parameter_counts
from parsearch.model.specs import ModelSpec, TrainingSpec


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
    weights_sharded: bool = True,
) -> ModelStateBytes:
    """Model-state bytes of ``params_per_gpu`` parameters held by one GPU.

    Megatron-Core ``dist_optimizer.md`` (formulas.md §5.1): the distributed
    optimizer (ZeRO-1) shards only the optimizer state (fp32 master + Adam
    m, v = 12 bytes) over ``shard_degree`` ranks: 18 bytes per parameter
    without, ``6 + 12/D`` with.

    ``fully_sharded`` (ZeRO-3 / Megatron-FSDP ``optim_grads_params``; ZeRO
    paper §5, (2 + 2 + K)·Ψ/N_d) shards weights and gradients too;
    ``weights_sharded=False`` with it is ZeRO-2 (``optim_grads``, ZeRO paper §5
    P_os+g: 2Ψ + (2 + K)·Ψ/N_d), the weights whole.

    >>> s = model_state_bytes(1.0, distributed_optimizer=True, shard_degree=4)
    >>> (s.weights, s.gradients, s.optimizer)
    (2.0, 4.0, 3.0)
    >>> s = model_state_bytes(1.0, shard_degree=4, fully_sharded=True)
    >>> (s.weights, s.gradients, s.optimizer)
    (0.5, 1.0, 3.0)
    >>> s = model_state_bytes(1.0, shard_degree=4, fully_sharded=True, weights_sharded=False)
    >>> (s.weights, s.gradients, s.optimizer)
    (2.0, 1.0, 3.0)
    """
    optimizer = params_per_gpu * optimizer_bytes
    if distributed_optimizer or fully_sharded:
        optimizer = optimizer / shard_degree
    state_shards = shard_degree if fully_sharded else 1
    weight_shards = state_shards if weights_sharded else 1
    return ModelStateBytes(
        weights=params_per_gpu * weight_bytes / weight_shards,
        gradients=params_per_gpu * grad_bytes / state_shards,
        optimizer=optimizer,
    )


@lru_cache(maxsize=256)
def _counts(model: ModelSpec) -> ParameterCounts:
    return parameter_counts(model)


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds, by optimizer-sharding class."""

    dense: Num  # TP-sharded + replicated + embedding/output: optimizer over DP·CP
    expert: Num  # routed experts: optimizer over EDP
    dense_gemm: Num  # transformer-layer GEMM weights among ``dense`` (FP8 copies)
    layers: Num  # transformer (and MTP) layers on the stage


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


@dataclass(frozen=True)
class StageCounts:
    """What a stage's model state depends on besides the degrees: the fields of
    :class:`~parsearch.cost.stages.StageContent` of the same names, as numbers or
    (elementwise) arrays, so many stages can be evaluated at once."""

    pp: Num
    num_dense_layers: Num
    num_moe_layers: Num
    num_mtp_layers: Num
    mtp_is_moe: Num
    has_embedding: Num
    has_output: Num


def stage_params(
    model: ModelSpec, content: StageContent | StageCounts, *, tp: Num, ep: Num, etp: Num
) -> StageParams:
    """formulas.md §5.2, per stage rather than only the first (with its caveat (iii)).

    Elementwise in the degrees and, with :class:`StageCounts`, in the stage's counts.
    """
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
    if np.any(n_mtp):
        # MTP block (DeepSeek-V3 §2.2; MCORE places it on the last stage):
        # one transformer layer + eh-projection 2h² (TP-sharded) + norms (replicated).
        # (Where ``n_mtp`` is 0 every term below adds an exact 0.)
        h = model.hidden_size
        is_moe = np.asarray(content.mtp_is_moe, dtype=bool)
        moe_layer = pc.attention_per_layer + pc.routed_experts_per_layer
        moe_layer += pc.shared_experts_per_layer + pc.replicated_per_layer_moe
        dense_layer = pc.attention_per_layer + pc.dense_mlp_per_layer
        dense_layer += pc.replicated_per_layer_dense
        gemm = gemm + n_mtp * (attn + np.where(is_moe, shared, dense_mlp))
        replicated = replicated + n_mtp * np.where(is_moe, pc.replicated_per_layer_moe,
                                                   pc.replicated_per_layer_dense)
        expert = expert + np.where(is_moe, n_mtp, 0) * pc.routed_experts_per_layer / expert_shard
        extra = np.where(np.greater(n_mtp, 0),  # eh-proj + MTP norms
                         pc.mtp / np.maximum(n_mtp, 1) - np.where(is_moe, moe_layer,
                                                                  dense_layer), 0.0)
        gemm = gemm + n_mtp * 2 * h * h / tp
        replicated = replicated + n_mtp * np.maximum(extra - 2 * h * h, 0)

    # Embedding on the first stage, output layer on the last (vocab-parallel, ÷ tp).
    # Tied embeddings with pp > 1: MCORE keeps a copy of the word embedding on the
    # last stage (formulas.md §5.2 caveat (iii)).
    output = pc.output if pc.output else np.where(np.greater(content.pp, 1), pc.embedding, 0)
    vocab = content.has_embedding * pc.embedding + content.has_output * output
    replicated = replicated + content.has_output * pc.final_norm
    dense = gemm + replicated + vocab / tp
    return StageParams(dense=dense, expert=expert, dense_gemm=gemm,
                        layers=n_dense + n_moe + n_mtp)


def stage_model_state(
    training: TrainingSpec,
    params: StageParams,
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
        "weights_sharded": training.fsdp_shards_weights,
    }
    dense = model_state_bytes(params.dense, shard_degree=dp * cp, **common)
    expert = model_state_bytes(params.expert, shard_degree=edp, **common)
    weights = dense.weights + expert.weights
    if training.precision != "bf16":
        # formulas.md §7.7: FP8 GEMMs keep a low-precision copy of every GEMM weight
        # next to the BF16 one, unless FP8 primary weights replace the BF16 copy.
        low = LOW_PRECISION_BYTES[training.precision]
        shard = training.fsdp_shards_weights
        gemm_params = params.dense_gemm / (dp * cp if shard else 1)
        gemm_params = gemm_params + params.expert / (edp if shard else 1)
        per_param = low - training.weight_bytes if options.fp8_param_gather else low
        weights = weights + gemm_params * per_param
    if training.fsdp:
        # formulas.md §5.1 ZeRO-3 transient peak [derived]: the unsharded BF16 weights of
        # the layer being computed and the prefetched next one, plus a gradient bucket of
        # one layer (grad_bytes: fp32 or BF16 main grads) before its reduce-scatter.
        # ZeRO-2 holds its weights whole: only the gradient bucket is transient.
        per_layer = (params.dense + params.expert) / np.maximum(params.layers, 1)
        gathered = 2.0 * training.weight_bytes if training.fsdp_shards_weights else 0.0
        weights = weights + per_layer * (gathered + training.grad_bytes)
    return ModelStateBytes(
        weights=weights,
        gradients=dense.gradients + expert.gradients,
        optimizer=dense.optimizer + expert.optimizer,
    )
