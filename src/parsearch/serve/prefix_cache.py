"""Prefix caching: prompt tokens whose KV is already cached are not prefilled again.

Engines keep the KV blocks of earlier prompts and reuse them when a new prompt starts with
the same tokens (vLLM automatic prefix caching, docs "Automatic Prefix Caching"; SGLang
RadixAttention, Zheng et al. 2024, arXiv 2312.07104 §3; TensorRT-LLM KV cache reuse,
``kv_cache_config.enable_block_reuse``).  With a hit rate ``h`` (the share of a prompt's
tokens found in the cache, as the engines report it: vLLM's ``prefix_cache_hit_rate``
metric), prefill computes only the last ``(1 - h) * isl`` tokens of each prompt, and each
of them attends to the cached prefix plus the new tokens before it: on average
``h * isl + (1 - h) * isl / 2 = isl * (1 + h) / 2`` keys (causal).  So the GEMM FLOPs of
prefill fall by ``1 - h`` and its attention FLOPs by ``(1 - h) * (1 + h) = 1 - h^2``;
TTFT and the instance time prefill takes from decode fall with them.

Not modelled: the cached blocks shared between requests also save KV memory; engines may
evict them under load, lowering the hit rate.  The KV pool is sized as without sharing
(conservative), and ``h`` is taken as the hit rate reached at that load.

>>> computed_prompt_tokens(1000, 0.75)
250.0
>>> mean_prefill_attended(1000, 0.0), mean_prefill_attended(1000, 0.5)
(500.0, 750.0)
"""

from __future__ import annotations


def computed_prompt_tokens(isl: float, hit: float) -> float:
    """Prompt tokens prefill computes: those not found in the cache (at least one, the
    engines recompute the last token to produce its logits)."""
    return max(1.0, float(isl) * (1.0 - hit))


def mean_prefill_attended(isl: float, hit: float) -> float:
    """Keys a computed prompt token attends to on average: the cached prefix plus half of
    the computed part (causal), ``isl * (1 + h) / 2``."""
    return float(isl) * (1.0 + hit) / 2.0
