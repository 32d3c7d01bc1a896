"""KV-cache bytes per token, per layer and per GPU (GQA, MLA compressed cache, sliding windows).

>>> from parsearch.model.presets import get_preset
>>> kv_bytes_per_token(get_preset("llama3-70b"), "bf16")      # 80 * 2 * 8 * 128 * 2
327680.0
>>> kv_bytes_per_token(get_preset("deepseek-v3"), "bf16")     # 61 * (512 + 64) * 2
70272.0
"""

from __future__ import annotations

import math

from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec
from parsearch.serve.spec import ELEMENT_BYTES, SlidingWindow


def sliding_window_for(model: ModelSpec,
                       window: SlidingWindow | None = None) -> SlidingWindow | None:
    """The sliding window served: ``window`` if given, else the model's own (or None).

    A model carries its window from its Hugging Face config or preset
    (``ModelSpec.sliding_window`` / ``sliding_window_layers``; GPT-OSS-120B: 18 of 36
    layers at 128 tokens).
    """
    chosen = window
    if chosen is None and model.sliding_window_layers:
        chosen = SlidingWindow(window=model.sliding_window,
                               windowed_layers=model.sliding_window_layers)
    if chosen is not None and chosen.windowed_layers > model.num_layers:
        raise SpecError(
            f"sliding_window: windowed_layers={chosen.windowed_layers} exceeds the model's "
            f"num_layers={model.num_layers}"
        )
    return chosen


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one TP rank stores.  With tp > kv heads each head is replicated so every
    rank holds one (vLLM ``QKVParallelLinear``: ``num_kv_head_replicas = tp / num_kv_heads``)."""
    return max(1, math.ceil(model.num_query_groups / tp))


def kv_bytes_per_token_layer(model: ModelSpec, kv_precision: str, tp: int = 1) -> float:
    """Bytes of KV cache one token adds to one attention layer on one TP rank.

    GQA/MHA: K and V of the local KV heads, ``2 * kv_heads * head_dim * bytes``
    (vLLM PagedAttention block layout).  MLA: the compressed latent plus the decoupled
    RoPE key, ``(kv_lora_rank + qk_rope_head_dim) * bytes`` per token and layer
    (DeepSeek-V2 arXiv 2405.04434 §2.1.2, Table 1: ``(d_c + d_h^R) l`` elements); the
    latent is not split over heads, so every TP rank stores all of it (vLLM/SGLang MLA
    backends), which is why MLA models are served with attention data parallelism.
    """
    element = ELEMENT_BYTES[kv_precision]
    if model.mla is not None:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * element
    return 2.0 * kv_heads_per_gpu(model, tp) * model.head_dim * element


def kv_bytes_per_token(model: ModelSpec, kv_precision: str, tp: int = 1) -> float:
    """Bytes per token over all layers on one TP rank, ignoring sliding windows."""
    return model.num_layers * kv_bytes_per_token_layer(model, kv_precision, tp)


def moe_layer_count(model: ModelSpec) -> int:
    """Layers with routed experts, in closed form of :meth:`ModelSpec.is_moe_layer`'s rule
    (layer i >= first_k_dense is MoE when (i - first_k_dense) % layer_freq == 0)."""
    if model.moe is None:
        return 0
    return -(-(model.num_layers - model.moe.first_k_dense) // model.moe.layer_freq)


def stage_layers(model: ModelSpec, pp: int) -> int:
    """Transformer layers of the largest pipeline stage (vLLM splits layers as evenly as it can)."""
    return math.ceil(model.num_layers / pp)


def stage_mix(model: ModelSpec, pp: int) -> tuple[int, float, float]:
    """(layers, MoE layers, dense layers) of the largest pipeline stage, the MoE and dense
    counts in the model's proportion (:func:`stage_layers`, :func:`moe_layer_count`)."""
    layers = stage_layers(model, pp)
    share = layers / model.num_layers
    moe_layers = moe_layer_count(model)
    return layers, moe_layers * share, (model.num_layers - moe_layers) * share


def kv_bytes_per_sequence(
    model: ModelSpec,
    kv_precision: str,
    tokens: float,
    *,
    tp: int = 1,
    pp: int = 1,
    window: SlidingWindow | None = None,
) -> float:
    """KV bytes one sequence of ``tokens`` tokens holds on one GPU of the largest stage.

    Windowed layers hold ``min(tokens, window)`` tokens (rolling buffer), the others
    all ``tokens``.  Windowed layers are assumed spread evenly over the stages.
    """
    layers = stage_layers(model, pp)
    per_layer = kv_bytes_per_token_layer(model, kv_precision, tp)
    if window is None:
        return layers * per_layer * tokens
    share = window.windowed_layers / model.num_layers
    windowed = layers * share
    return per_layer * ((layers - windowed) * tokens + windowed * min(tokens, window.window))
