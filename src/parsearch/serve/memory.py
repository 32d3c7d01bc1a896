"""Memory of one serving GPU as the engines allocate it: weights, activation workspace, CUDA
context and graphs, and the KV pool each engine sizes by its memory fraction.

Weights follow :mod:`parsearch.model.params` (parameter counts by sharding class).  Quantized
checkpoints quantize the linear layers of the transformer blocks only; embedding, output
layer, norms and router stay BF16 (NVIDIA ModelOpt FP8/NVFP4 model cards: "only the
weights and activations of the linear operators within transformer blocks are quantized").
OpenAI's MXFP4 gpt-oss checkpoints leave attention out of their quantization: it stays BF16
(``ModelSpec.attention_unquantized``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parsearch.model.params import ParameterCounts, parameter_counts
from parsearch.model.specs import ModelSpec
from parsearch.serve.kv_cache import moe_layer_count, stage_layers
from parsearch.serve.spec import ELEMENT_BYTES, SERVING_ENGINES, ServingLayout, ServingWorkload
from parsearch.topology.hardware import GpuProfile

GIB = float(2**30)
#: Memory outside weights, KV pool and activations that the engine's budget must cover: CUDA
#: context, NCCL buffers, cuBLAS workspaces.  vLLM's memory profiler logs it as "non-torch
#: memory", 0.3-1.1 GiB on Hopper with TP (vllm/v1/worker/gpu_worker.py
#: ``determine_available_memory``); 1 GiB is taken.
CONTEXT_BYTES = 1.0 * GIB
#: Decode CUDA graphs' private memory pool.  All three engines capture them after the KV pool
#: is allocated, from the memory the fraction leaves out (vLLM logs "Graph capturing
#: finished ... took 0.3-1.5 GiB"; TensorRT-LLM ``cuda_graph_config``; SGLang
#: ``--cuda-graph-max-bs``); 1 GiB is taken.
CUDA_GRAPH_BYTES = 1.0 * GIB
#: Engines whose memory rules are modelled (:func:`gpu_memory`).
ENGINES = SERVING_ENGINES
#: vLLM ``--gpu-memory-utilization`` default (vLLM engine arguments documentation).
VLLM_DEFAULT_FRACTION = 0.9
#: TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction`` default, the
#: ``kv_cache_free_gpu_memory_fraction`` of trtllm-serve/trtllm-bench
#: (tensorrt_llm/llmapi/llm_args.py: "The fraction of GPU memory fraction that should be
#: allocated for the KV cache. Default is 90%").
TRTLLM_DEFAULT_FRACTION = 0.9
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
    attention: float = 0.0  # the attention projections' part of ``linear``


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
        attention=attention,
    )


def attention_element_bytes(model: ModelSpec, precision: str) -> float:
    """Bytes per attention-projection parameter: BF16 in an FP4 checkpoint that leaves
    attention unquantized (``ModelSpec.attention_unquantized``: openai/gpt-oss-120b and
    gpt-oss-20b config.json ``quantization_config``, ``quant_method`` mxfp4,
    ``modules_to_not_convert`` ``model.layers.*.self_attn``), so a decode step reads their
    QKV and output projections at 2 bytes a parameter, not FP4's 0.56, and holds that much;
    else the weights' precision."""
    if precision == "fp4" and model.attention_unquantized:
        return _BF16
    return ELEMENT_BYTES[precision]


def linear_bytes(model: ModelSpec, w: StageWeights, precision: str) -> float:
    """Bytes of the stage's quantizable transformer-block linears (``w.linear``) on one GPU,
    the attention projections at :func:`attention_element_bytes`."""
    return ((w.linear - w.attention) * ELEMENT_BYTES[precision]
            + w.attention * attention_element_bytes(model, precision))


def weight_bytes_per_gpu(model: ModelSpec, layout: ServingLayout, precision: str,
                         counts: ParameterCounts | None = None) -> float:
    """Bytes of weights on one GPU of the heaviest stage."""
    w = stage_weights(model, layout, counts)
    return (linear_bytes(model, w, precision) + w.routed * ELEMENT_BYTES[precision]
            + w.bf16 * _BF16)


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


def sglang_default_fraction(world_size: int) -> float:
    """SGLang's ``--mem-fraction-static`` default by the instance's GPU count
    (sglang/srt/server_args.py ``ServerArgs.__post_init__``: 0.79 from 16 GPUs, 0.81 from
    8, 0.85 from 4, 0.87 from 2, else 0.88)."""
    for size, fraction in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87)):
        if world_size >= size:
            return fraction
    return 0.88


def memory_fraction(workload: ServingWorkload, layout: ServingLayout) -> float:
    """The engine's memory fraction: the workload's when given, else the engine default."""
    if workload.memory_fraction is not None:
        return workload.memory_fraction
    if workload.engine == "sglang":
        return sglang_default_fraction(layout.gpus_per_replica)
    return VLLM_DEFAULT_FRACTION if workload.engine == "vllm" else TRTLLM_DEFAULT_FRACTION


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory budget (bytes)."""

    weights: float
    workspace: float
    reserve: float       # CUDA context, NCCL, cuBLAS (:data:`CONTEXT_BYTES`)
    graphs: float        # decode CUDA graph pool (:data:`CUDA_GRAPH_BYTES`)
    kv_capacity: float   # what the engine gives to the KV cache (may be <= 0: no room)
    usable: float        # HBM of the GPU
    fraction: float      # the engine memory fraction that sized the pool

    @property
    def fits_weights(self) -> bool:
        return self.kv_capacity > 0


def kv_pool_bytes(engine: str, fraction: float, hbm: float, weights: float,
                  workspace: float) -> float:
    """The KV pool each engine allocates (bytes; <= 0: none), capped by what is physically
    left once the activation workspace, context and CUDA graphs have their room.

    * vLLM: ``fraction`` of *total* memory is the instance's budget; the KV cache gets what
      the profile run (weights, activation peak of ``max_num_batched_tokens``, non-torch
      memory) leaves of it (vllm/v1/worker/gpu_worker.py ``determine_available_memory``:
      ``requested_memory - non_kv_cache_memory``).
    * TensorRT-LLM: ``fraction`` of the memory *free* after loading the weights and running
      the activation estimate (tensorrt_llm/_torch/pyexecutor/_util.py ``KvCacheCreator``;
      ``free_gpu_memory_fraction`` documentation).
    * SGLang: ``fraction`` (``mem_fraction_static``) of total memory holds weights and the KV
      pool; activations and CUDA graphs live in the rest (sglang/srt/model_executor/
      model_runner.py ``profile_max_num_token``: ``rest_memory = available - total *
      (1 - mem_fraction_static)``).
    """
    physical = hbm - weights - workspace - CONTEXT_BYTES - CUDA_GRAPH_BYTES
    if engine == "trtllm":
        rule = fraction * (hbm - weights - workspace - CONTEXT_BYTES)
    elif engine == "sglang":
        rule = fraction * hbm - weights
    else:
        rule = fraction * hbm - weights - workspace - CONTEXT_BYTES
    return min(rule, physical)


def gpu_memory(model: ModelSpec, layout: ServingLayout, workload: ServingWorkload,
               gpu: GpuProfile, counts: ParameterCounts | None = None) -> GpuMemory:
    """One GPU's weights, workspace and KV pool as ``workload.engine`` sizes them
    (:func:`kv_pool_bytes`)."""
    weights = weight_bytes_per_gpu(model, layout, workload.precision, counts)
    work = workspace_bytes(model, layout, workload)
    fraction = memory_fraction(workload, layout)
    kv = kv_pool_bytes(workload.engine, fraction, gpu.hbm_bytes, weights, work)
    return GpuMemory(weights=weights, workspace=work, reserve=CONTEXT_BYTES,
                     graphs=CUDA_GRAPH_BYTES, kv_capacity=kv, usable=gpu.hbm_bytes,
                     fraction=fraction)


def max_sequences(capacity_bytes: float, bytes_per_sequence: float) -> int:
    """Whole sequences that fit in ``capacity_bytes`` (0 when none)."""
    if capacity_bytes <= 0 or bytes_per_sequence <= 0:
        return 0
    return math.floor(capacity_bytes / bytes_per_sequence)
