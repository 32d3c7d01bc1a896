"""Routed experts in a serving step: which experts a batch touches and their grouped GEMMs.

>>> round(expected_touched_share(8, 128, 1), 4)     # one token touches its top-8 of 128
0.0625
>>> round(expected_touched_share(8, 128, 64), 3)    # 64 tokens touch most experts
0.984
"""

from __future__ import annotations

from parsearch.model.params import ParameterCounts
from parsearch.model.specs import ModelSpec
from parsearch.serve.kv_cache import moe_layer_count, stage_layers
from parsearch.serve.rates import Rates, gemm_eff
from parsearch.serve.spec import ServingLayout


def expected_touched_share(top_k: int, experts: int, tokens: float) -> float:
    """Expected share of the experts that at least one of ``tokens`` tokens is routed to, each
    token picking ``top_k`` of ``experts`` uniformly: ``1 - (1 - k/E)^tokens`` (an expert is
    missed by one token with probability ``1 - k/E``).  Skewed real routing touches fewer,
    so this is an upper bound on the bytes a step reads."""
    if tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - top_k / experts) ** tokens


def expert_gemm_time(model: ModelSpec, layout: ServingLayout, counts: ParameterCounts,
                     rates: Rates, tokens_stage: float, rows_tokens: float) -> float:
    """Routed-expert GEMM time on one GPU for ``tokens_stage`` tokens of the stage.

    Each token runs top_k experts (``2 * top_k * expert params`` FLOPs, spread over the
    stage width); an expert's grouped-GEMM slice has ``rows_tokens * top_k / E`` rows, whose
    size sets the GEMM efficiency (``eta(F)`` of the profile times its grouped-GEMM factor).

    Known gap (issue 34 item 3): engines run all experts of a layer in one fused grouped
    kernel per projection (vLLM/SGLang ``fused_moe``, TensorRT-LLM CUTLASS MoE), so charging
    ``F_half`` per expert over-prices small batches (Qwen3-235B TP8 on H100 at batch 8: TPOT
    93 ms here, 10.5 ms with one fused call whose rows are padded to the kernel's 16/64-row
    tiles).  That fused model was measured on benchmarks/validate_serving.py: MoE MAPE
    41% -> 82%, overall 19.4% -> 32.3%, every large-batch MoE row (TensorRT-LLM attention-DP
    + EP, Qwen3-30B on one GPU) predicted up to 2x too fast.  A grouped kernel whose rate
    follows the rows per expert, ``r / (r + 100)`` (DeepGEMM README's masked-layout table on
    H800: 0.72-0.95 of the large-M rate at 256-1,024 rows), measured MoE MAPE 77%.  So the
    per-expert charge stands in for a large-batch MoE cost the model does not have yet
    (candidates: EP load imbalance, the KV dtype of those checkpoints; with BF16 KV for the
    Qwen3 rows the fused model measures 32%, overall 16.6%), and it stays until that cost
    is found.
    """
    if model.moe is None:
        return 0.0
    moe = model.moe
    per_expert = counts.routed_experts_per_layer / moe.num_experts
    n_moe = moe_layer_count(model) * stage_layers(model, layout.pp) / model.num_layers
    flops = 2.0 * tokens_stage * moe.top_k * per_expert * n_moe / layout.stage_width
    rows = max(1.0, rows_tokens * moe.top_k / moe.num_experts)
    per_gemm = 2.0 * rows * per_expert / layout.expert_tp / 3.0  # gate, up, down GEMMs
    eff = gemm_eff(rates, per_gemm) * rates.grouped_gemm
    return flops / (rates.peak_flops * max(eff, 1e-6))
