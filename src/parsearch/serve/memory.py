"""Memory of one serving GPU: weights, activation workspace, and what is left for the KV cache.

Weights follow :mod:`parsearch.model.params` (parameter counts by sharding class).  Quantized
checkpoints quantize the linear layers of the transformer blocks only; embedding, output
layer, norms and router stay BF16 (NVIDIA ModelOpt FP8/NVFP4 model cards: "only the
weights and activations of the linear operators within transformer blocks are quantized").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parsearch.model.params import ParameterCounts, parameter_counts
from parsearch.model.specs import ModelSpec
from parsearch.serve.kv_cache import moe_layer_count, stage_layers
from parsearch.serve.spec import ELEMENT_BYTES, ServingLayout, ServingWorkload
from parsearch.topology.hardware import GpuProfile

GIB = float(2**30)
#: Memory the engine needs outside weights, KV and activations: CUDA context, NCCL
#: buffers, captured CUDA graphs.  Assumption: vLLM start-up logs report about 0.5 GiB
#: context plus 0.3-1.5 GiB "Graph capturing ... took X GiB"; 1.5 GiB is taken.
RUNTIME_RESERVE_BYTES = 1.5 * GIB
_BF16 = ELEMENT_BYTES["bf16"]


@dataclass(frozen=True)
class StageWeights:
    """Parameters one GPU of the largest pipeline stage holds, by kind (counts, not bytes)."""

    linear: float          # quantizable transformer-block linears (attention, dense MLP, shared)
    routed: float          # routed experts held on this GPU (quantizable)
    bf16: float            # embedding, output layer, norms, router
    output: float          # output-layer parameters on this GPU (read every decode step)
    routed_per_expert: float  # one expert's parameters on this GPU (for partial reads)
    local_experts: float   # experts per MoE layer on this GPU, times MoE layers held


def stage_weights(model: ModelSpec, layout: ServingLayout, counts: ParameterCounts | None = None
                  ) -> StageWeights:
    """Per-GPU parameters of the heaviest stage.

    Attention, dense MLPs and shared experts are split over ``tp`` and replicated over the
    attention-DP ranks (SGLang ``--moe-dense-tp-size 1`` / DeepSeek's inference system:
    data-parallel dense FFNs beside DP attention); routed experts over the whole stage
    width ``tp * attention_dp``; the vocabulary of the embedding and output layer over
    ``tp`` (vocab-parallel layers).
    """
    c = counts or parameter_counts(model)
    width = layout.stage_width
    layers = stage_layers(model, layout.pp)
    share = layers / model.num_layers  # the stage holds this share of each kind of layer
    moe_layers = moe_layer_count(model)
    n_moe = moe_layers * share
    n_dense = (model.num_layers - moe_layers) * share
    attention = model.num_layers * share * c.attention_per_layer / layout.tp
    dense = n_dense * c.dense_mlp_per_layer / layout.tp
    shared = n_moe * c.shared_experts_per_layer / layout.tp
    routed = n_moe * c.routed_experts_per_layer / width
    norms = n_dense * c.replicated_per_layer_dense + n_moe * c.replicated_per_layer_moe
    ends = c.embedding + c.output if layout.pp == 1 else max(c.embedding, c.output)
    output = (c.output or c.embedding) / layout.tp
    experts = model.moe.num_experts if model.moe is not None else 0
    per_expert = c.routed_experts_per_layer / experts / layout.expert_tp if experts else 0.0
    return StageWeights(
        linear=attention + dense + shared,
        routed=routed,
        bf16=norms + ends / layout.tp + c.final_norm,
        output=output,
        routed_per_expert=per_expert,
        local_experts=n_moe * (experts / layout.ep if experts else 0.0),
    )


def weight_bytes_per_gpu(model: ModelSpec, layout: ServingLayout, precision: str,
                         counts: ParameterCounts | None = None) -> float:
    """Bytes of weights on one GPU of the heaviest stage."""
    w = stage_weights(model, layout, counts)
    return (w.linear + w.routed) * ELEMENT_BYTES[precision] + w.bf16 * _BF16


def workspace_bytes(model: ModelSpec, layout: ServingLayout, workload: ServingWorkload) -> float:
    """Activation workspace of one scheduler step of ``max_num_batched_tokens`` tokens.

    The largest live set is around the MLP: residual and normed input (2h), the local
    QKV (attention) or the gate/up output (2 f / width), BF16; plus FP32 logits of the
    sampled rows over the local vocabulary (vLLM's profile run allocates exactly this
    peak before sizing the KV cache, vLLM docs "Memory profiling").
    """
    t = workload.max_num_batched_tokens
    h = model.hidden_size
    ffn = model.ffn_hidden_size
    if model.moe is not None:
        moe = model.moe
        ffn = max(ffn, moe.top_k * moe.expert_ffn_hidden_size, moe.shared_expert_ffn_hidden_size)
    qkv = (model.num_attention_heads + 2 * model.num_query_groups) * model.head_dim / layout.tp
    widest = max(qkv, 2.0 * ffn / layout.stage_width)
    activations = t * (2 * h + widest) * _BF16
    logits = min(workload.max_batch, t) * model.vocab_size / layout.tp * 4.0
    return activations + logits


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory budget (bytes)."""

    weights: float
    workspace: float
    reserve: float
    kv_capacity: float   # what the engine may give to the KV cache (may be <= 0: no room)
    usable: float

    @property
    def fits_weights(self) -> bool:
        return self.kv_capacity > 0


def gpu_memory(model: ModelSpec, layout: ServingLayout, workload: ServingWorkload,
               gpu: GpuProfile, counts: ParameterCounts | None = None) -> GpuMemory:
    """KV capacity = utilization * HBM - weights - workspace - runtime reserve (vLLM sizing:
    ``gpu_memory_utilization`` of total memory, minus what the profile run measured)."""
    usable = workload.gpu_memory_utilization * gpu.hbm_bytes
    weights = weight_bytes_per_gpu(model, layout, workload.precision, counts)
    work = workspace_bytes(model, layout, workload)
    kv = usable - weights - work - RUNTIME_RESERVE_BYTES
    return GpuMemory(weights=weights, workspace=work, reserve=RUNTIME_RESERVE_BYTES,
                     kv_capacity=kv, usable=usable)


def max_sequences(capacity_bytes: float, bytes_per_sequence: float) -> int:
    """Whole sequences that fit in ``capacity_bytes`` (0 when none)."""
    if capacity_bytes <= 0 or bytes_per_sequence <= 0:
        return 0
    return math.floor(capacity_bytes / bytes_per_sequence)
