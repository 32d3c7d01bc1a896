"""Kernels one decode (or prefill) pass launches per transformer layer.

Each kernel costs the profile's fixed time (``Rates.kernel_s``: launch gap and tail, ~3 us
inside a CUDA graph), which at small decode batches is a large part of the step.  The
generic count (:data:`KERNELS_PER_LAYER`, 12) is that of a Llama-like layer with the
usual fusions.  SGLang runs DeepSeek's MLA + MoE layer without a graph compiler (its
``--enable-torch-compile`` is off by default, so no Inductor fusion of the small ops, unlike
vLLM's default compilation) as a longer chain of kernels, counted here from its model code
(sgl-project/sglang ``python/sglang/srt/models/deepseek_v2.py``, ``forward_absorb_prepare``,
``forward_absorb_core``, ``DeepseekV2MoE.forward_normal``, at 00114aef; the per-kernel times
of that chain on 8 H200 at batch 1 in sgl-project/sglang PR #5432: quantization kernels of
1.1-2.7 us, a 0.9 us zero-fill, 5.7-7.9 us absorbed bmm).

TensorRT-LLM's PyTorch backend goes the other way: it folds each TP all-reduce into the
residual add and the following RMSNorm, so its layer runs 10 (:data:`TRTLLM_PYTORCH_KERNELS`;
its Llama layer has the same ``next_layer_layernorm`` fusion, modeling_llama.py at 012cf909).

The two routed-expert grouped GEMMs are not counted here: :func:`parsearch.serve.moe.
expert_gemm_time` charges their launches.

Eager prefill (:func:`eager_prefill_host_s`).  SGLang replays CUDA graphs for decode batches
only: its prefill (``forward_extend``) runs eagerly unless ``--enable-piecewise-cuda-graph``
(server_args.py ``enable_piecewise_cuda_graph: bool = False`` and ``enable_torch_compile:
bool = False`` in sglang 0.5.6; model_runner.py ``forward_extend`` takes the piecewise runner
only when it exists).  Eagerly, the host issues every kernel through Python and the PyTorch
dispatcher, tens of microseconds each, far more than the ~3 us a kernel costs inside a graph.
Measured: a DeepSeek-V3 prefill of one new token took 82.6 ms eagerly and 23.1 ms from a
CUDA graph (sgl-project/sglang PR #12160, scheduler log "forward cost", Oct 2025; its author
reports the same ~80-100 ms TTFT for any prefill under ~100 new tokens), i.e. 82.6 ms /
(61 layers x 27.9 kernels, this module's count for that configuration) = 48 us per kernel.
The prefill pass is counted like the decode pass: SGLang's MHA prefill path
(``forward_normal_prepare``/``_core`` in the 0.5.6 wheel's deepseek_v2.py: fused q_a/kv_a
projection, two RMSNorms, q_b and kv_b projections with their quantizations, RoPE, cache
write, K concatenation, ragged attention, o_proj, all-reduce) launches about as many
kernels as the absorbed decode path.
The same order as PyTorch's own measurement of eager Llama-7B decode, 25.5 tokens/s
(39 ms a step) where the weight reads take ~9 ms ("Accelerating Generative AI with PyTorch
II: GPT, Fast", PyTorch blog, Nov 2023: "CPU overhead bound"), ~35 us for each of its ~35
ops a layer.
"""

from __future__ import annotations

from parsearch.model.specs import ModelSpec
from parsearch.serve.kv_cache import moe_layer_count
from parsearch.serve.spec import ServingWorkload

#: Kernels per transformer layer in a decode step (norms, QKV, rope/cache write, attention,
#: output projection, all-reduce, MLP GEMMs and activation); an estimate from vLLM/SGLang
#: decode traces, which show 10-15 kernels per Llama layer with fusions.
KERNELS_PER_LAYER = 12

#: SGLang's absorbed-MLA attention block (deepseek_v2.py ``forward_absorb_prepare``/``_core``
#: at 00114aef), with FP8 block-scaled linears (each preceded by its per-token-group
#: activation quantization kernel, ``sglang_per_token_group_quant_fp8``):
#: fused residual-add RMSNorm 1; fused q_a/kv_a projection 2 (quant + GEMM); q_a and kv_a
#: RMSNorms 2; q_b projection 2; absorbed W_UK bmm 3 (activation quant, its scale
#: buffer, bmm: the bmm_fp8 path has a two-stage quant plus a zero-fill, the DeepGEMM masked
#: path a quant and the GEMM, PR #5432); RoPE 1; KV-cache write and MLA decode attention 2;
#: absorbed W_UV bmm 3; o_proj 2; TP all-reduce 1.
SGLANG_MLA_ATTENTION_KERNELS = 19
#: SGLang's MoE block without its two grouped GEMMs (``DeepseekV2MoE.forward_normal`` with
#: the Triton ``fused_moe`` runner, the shared expert fused in as one more expert, SGLang's
#: default ``disable_shared_experts_fusion`` False): fused residual-add RMSNorm 1, router
#: GEMM 1, grouped top-k 1, block alignment 1, two activation quantizations 2, SiLU-and-mul
#: 1, weighted sum over top-k 1, TP all-reduce 1.
SGLANG_MOE_KERNELS = 9
#: A dense (first-k) MLP block: fused residual-add RMSNorm 1, gate/up 2, SiLU-and-mul 1,
#: down 2, TP all-reduce 1.
SGLANG_DENSE_MLP_KERNELS = 7
#: ``--enable-flashinfer-allreduce-fusion``: each TP all-reduce runs fused with the residual
#: add and RMSNorm after it (FlashInfer ``trtllm_allreduce_fusion``), two kernels fewer per
#: layer.
ALLREDUCE_FUSION_SAVED = 2
#: ``--moe-runner-backend flashinfer_trtllm``: routing, activation quantization, SiLU-and-mul
#: and the top-k reduction run inside TensorRT-LLM's fused MoE (FlashInfer
#: ``trtllm_fp8_block_scale_moe``: routing kernel, GEMM1 with the activation fused, GEMM2,
#: finalize), against the Triton runner's grouped top-k, alignment, two quantizations,
#: SiLU-and-mul and sum: three kernels fewer per MoE layer (the router GEMM stays).
TRTLLM_MOE_RUNNER_SAVED = 3


#: TensorRT-LLM's PyTorch backend (tensorrt_llm/_torch/models/modeling_gpt_oss.py
#: ``TransformerBlock.forward_tp`` and ``MLPBlock``, at 050b6cb9): QKV GEMM 1, attention 2
#: (RoPE/KV-cache-write preprocessing and the generation kernel), o_proj 1, the TP
#: all-reduce fused with the residual add and the next RMSNorm
#: (``AllReduceFusionOp.RESIDUAL_RMS_NORM``) 1, router GEMM 1 (``tinygemm2`` up to 128
#: tokens), fused MoE routing 1, activation quantization 1, MoE finalize 1, the second
#: fused all-reduce + residual + RMSNorm 1: 10 kernels besides the two routed GEMMs.
TRTLLM_PYTORCH_KERNELS = 10


#: Host time to issue one kernel from eager PyTorch: 82.6 ms / (61 x 27.9), sglang PR #12160
#: (module docstring; 35 us from the PyTorch GPT-fast measurement, the low end).
EAGER_LAUNCH_S = 48e-6
#: Engines whose prefill passes run outside CUDA graphs, at their defaults: SGLang (module
#: docstring) and TensorRT-LLM's PyTorch backend, which replays CUDA graphs for
#: generation-only batches and runs context (prefill) iterations eagerly unless
#: ``torch_compile_config.enable_piecewise_cuda_graph`` (default False; TensorRT-LLM docs
#: "Torch Compile & Piecewise CUDA Graph": piecewise graphs exist "to reduce context-phase
#: launch overhead"; ``TorchCompileConfig`` reference).  vLLM compiles the model with
#: torch.compile by default (Inductor fuses the small ops and its generated wrapper launches
#: the rest) and replays piecewise graphs up to its capture size: not priced with the floor.
#: TensorRT engines (``trtllm-build``) run no Python per kernel.
EAGER_PREFILL: dict[str, bool] = {"sglang": True, "trtllm": True}


def eager_prefill_host_s(model: ModelSpec, workload: ServingWorkload, layers: float) -> float:
    """Host time to issue one eager prefill pass over ``layers`` layers (0 for an engine that
    graphs or compiles its prefill).  The host issues kernels ahead of the GPU, so a pass
    lasts the longer of this and its GPU time (a two-stage flow line runs at its slower
    stage, Hopp and Spearman, Factory Physics, 3rd ed., section 7.2)."""
    if not EAGER_PREFILL.get(workload.engine, False) or workload.tensorrt_engine:
        return 0.0
    return layers * kernels_per_layer(model, workload) * EAGER_LAUNCH_S


def kernels_per_layer(model: ModelSpec, workload: ServingWorkload) -> float:
    """Mean kernels per layer of one pass, outside the routed grouped GEMMs.

    >>> from parsearch.model.presets import get_preset
    >>> from parsearch.serve.spec import ServingWorkload
    >>> kernels_per_layer(get_preset("llama3-70b"), ServingWorkload(isl=1, osl=1))
    12.0
    """
    if workload.engine == "trtllm" and not workload.tensorrt_engine:
        return float(TRTLLM_PYTORCH_KERNELS)
    if workload.engine != "sglang" or model.mla is None:
        return float(KERNELS_PER_LAYER)
    n_moe = moe_layer_count(model)
    n_dense = model.num_layers - n_moe
    moe = SGLANG_MOE_KERNELS - (TRTLLM_MOE_RUNNER_SAVED if workload.fused_moe_runner else 0)
    total = (model.num_layers * SGLANG_MLA_ATTENTION_KERNELS + n_moe * moe
             + n_dense * SGLANG_DENSE_MLP_KERNELS)
    if workload.allreduce_fusion:
        total -= model.num_layers * ALLREDUCE_FUSION_SAVED
    return total / model.num_layers
