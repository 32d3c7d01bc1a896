"""Decode GEMMs on their rooflines: the dense projections call by call, the routed experts'
grouped GEMMs apart (used by :func:`parsearch.serve.cost.decode_step`)."""

from __future__ import annotations

from parsearch.model.specs import ModelSpec
from parsearch.serve.kv_cache import stage_mix
from parsearch.serve.rates import Rates, gemm_call_s
from parsearch.serve.spec import ServingLayout

#: GEMM calls of one attention block in a decode pass: the fused QKV projection and the
#: output projection (vLLM ``QKVParallelLinear`` + ``RowParallelLinear``; TensorRT-LLM's
#: fused QKV likewise).
ATTENTION_GEMMS = 2
#: Absorbed multi-head latent attention (DeepSeek-V2/V3 decode): the fused q_a/kv_a
#: projection, q_b, the two absorbed bmm (W_UK, W_UV) and o_proj (sglang deepseek_v2.py
#: ``forward_absorb_prepare``/``_core`` at 00114aef; without a q-LoRA, q_a/q_b are one q).
MLA_GEMMS = 5
#: A dense MLP: fused gate/up and down (or up and down when ungated).
MLP_GEMMS = 2
#: An MoE layer's dense calls besides its two routed grouped GEMMs: the router GEMM, and
#: the shared experts' gate/up and down when it has shared experts.
ROUTER_GEMMS = 1


def dense_gemm_calls(model: ModelSpec, pp: int) -> float:
    """GEMM calls of the heaviest stage's dense blocks in one decode pass (attention
    projections, dense MLPs, routers and shared experts; not the routed grouped GEMMs).

    >>> from parsearch.model.presets import get_preset
    >>> dense_gemm_calls(get_preset("llama3-70b"), 1)    # 80 layers x (QKV, O, gate/up, down)
    320.0
    """
    layers, n_moe, n_dense = stage_mix(model, pp)
    attention = float(ATTENTION_GEMMS)
    if model.mla is not None:  # without a q-LoRA the query is one projection, not two
        attention = MLA_GEMMS - (0 if model.mla.q_lora_rank else 1)
    shared = MLP_GEMMS if model.moe is not None and model.moe.shared_expert_ffn_hidden_size else 0
    return layers * attention + n_dense * MLP_GEMMS + n_moe * (ROUTER_GEMMS + shared)


def dense_gemm_fixed_s(model: ModelSpec, layout: ServingLayout, rates: Rates,
                       output_layer: bool) -> float:
    """Seconds of fixed time the heaviest stage's dense GEMM calls add beside their weight
    reads in one decode pass: ``t0`` per real call (:func:`dense_gemm_calls`), plus one for
    the output layer when the stage holds it (``output_layer``)."""
    calls = dense_gemm_calls(model, layout.pp) + (1.0 if output_layer else 0.0)
    return calls * gemm_call_s(rates, 0.0)


def dense_gemm_time_s(model: ModelSpec, layout: ServingLayout, rates: Rates, tokens: float,
                      block_params: float, block_bytes: float, output_params: float,
                      output_bytes: float) -> tuple[float, float]:
    """(compute time, time on the per-call rooflines) of one decode pass's dense GEMMs on one
    GPU, for ``tokens`` rows.

    A GEMM call costs a fixed time ``t0 = F_half / (peak eta_max)`` (launch, prologue and
    epilogue, the last wave) plus ``F / (peak eta_max)`` on the compute side (the profile's
    size curve ``eta(F) = eta_max F / (F + F_half)``; ``cost/compute.py``
    ``gemm_half_flops``), and streams its weights at HBM bandwidth on the memory side; each
    call takes its fixed time plus the slower of its main loop and its weight stream
    (Williams et al. 2009 apply the roofline per kernel; the fixed part is serial with the
    main loop whichever bound the loop is on: the prologue fills the pipeline before the
    first tile is consumed and the epilogue and the partial last wave follow the last,
    NVIDIA "Matrix Multiplication Background User's Guide", tile and wave quantization).
    The fixed times are charged per real call (:func:`dense_gemm_calls`); the compute side
    keeps its count of one call per ``h x h/tp`` square of parameters, its size-curve
    efficiency loss.  The output layer (``lm_head``, ``vocab/tp x h``) is one call: one
    ``t0`` against all its reads, not one per square (that count charged gpt-oss-120b's
    output layer, vocabulary 201,088 over hidden 2,880, 70 fixed times, 0.53 ms a step on
    Hopper at every TP, against 0.28 ms of BF16 reads at TP 1 and 0.04 ms at TP 8).  Summed
    per call, not under one roofline of the group: a call that waits on its fixed time does
    not hide another's weight reads.

    At decode batches the weight stream binds, so each call adds its ``t0`` to its reads: on
    gpt-oss-120b under vLLM on H100 (InferenceMAX, 922/922 tokens) the measured TPOT falls
    by 1.49 ms from TP 2 to TP 8 at concurrency 4, of which the max-of-both form gave 1.05.
    """
    square = model.hidden_size ** 2 / layout.tp
    blocks_s = block_params / square * gemm_call_s(rates, 2.0 * tokens * square)
    fixed_s = gemm_call_s(rates, 0.0)
    blocks_fixed = dense_gemm_fixed_s(model, layout, rates, False) if block_params > 0 else 0.0
    compute = blocks_s
    kernels = max(block_bytes / rates.hbm_Bps + blocks_fixed, blocks_s)
    if output_params > 0:
        output_s = gemm_call_s(rates, 2.0 * tokens * output_params)
        compute += output_s
        kernels += max(output_bytes / rates.hbm_Bps + fixed_s, output_s)
    return compute, kernels


def gemm_rooflines_s(dense_kernels_s: float, routed_bytes: float, routed_s: float,
                     hbm_Bps: float) -> float:
    """Time of a pass's dense GEMMs (``dense_kernels_s``, each call on its own roofline,
    :func:`dense_gemm_time_s`) and routed-expert grouped GEMMs, the latter the slower of
    their weight reads and their compute (Williams et al. 2009 apply the roofline per
    kernel; per-layer rooflines summed as in Yuan et al. 2024, arXiv 2402.16363 §3).  The two
    groups are separate kernels that run one after the other (the dense projections, then
    the grouped expert GEMMs), so the compute of one cannot hide the reads of the other."""
    return dense_kernels_s + max(routed_bytes / hbm_Bps, routed_s)
