"""Kernels per transformer layer as Megatron-Core issues them, and what CUDA graphs capture.

The counts price each kernel's GPU launch-and-tail time and the host's issue time
(:func:`parsearch.cost.compute.unit_compute`); the CUDA-graph scope says which of them
one graph launch replaces.
"""

from __future__ import annotations

from typing import Any

#: Kernels per layer, forward + backward, in Megatron-Core with Transformer Engine: our count
#: of the fused LayerNorm-Linear, attention, activation, residual and TP communication
#: kernels (about 15 forward, twice that backward).  An MoE layer adds, forward, the
#: router (gate GEMM, softmax/sigmoid, top-k, load-balancing loss: ~15 ops), the
#: dispatcher's preprocessing (token counts, their exchange and host copy: ~10), permute
#: and chunk sorting (~10), dispatch and combine, the activation, unsort and unpermute
#: (~10): about 50 forward and 100 backward (``moe/router.py``, ``moe/token_dispatcher.py``,
#: ``moe/moe_utils.py`` of Megatron-Core), plus the expert GEMMs below; FP8 adds a cast
#: (and transpose) per GEMM input and output gradient.
KERNELS_DENSE_LAYER = 45.0
KERNELS_MOE_EXTRA = 150.0
KERNELS_FP8_EXTRA = 20.0
#: Expert GEMMs: Transformer Engine's GroupedLinear (``general_grouped_gemm``) issues one
#: cuBLAS GEMM per local expert (spread over several CUDA streams), so FC1 and FC2 forward,
#: dgrad and wgrad cost 6 kernels per local expert and layer.
KERNELS_PER_LOCAL_EXPERT = 6.0
#: CUDA graphs replay a captured layer with one launch: the host issue time left is
#: graph launches and the Python around them (CUDA C++ Programming Guide, "CUDA
#: Graphs": work submitted as one unit removes per-kernel CPU launch overhead).
CUDA_GRAPH_HOST_SHARE = 0.1
#: The parts of a layer Megatron-Core's ``--cuda-graph-scope`` (``--cuda-graph-modules``)
#: captures (``megatron/training/arguments.py``: "attn" = ``_forward_attention()``, "mlp" =
#: a dense layer's ``_forward_mlp()``, "moe" = a MoE layer's ``_forward_mlp()``,
#: "moe_router" = ``_forward_mlp()`` up to the router, "moe_preprocess" = the dispatcher's
#: ``preprocess()``; an empty scope = the whole layer).  Our split of the kernel counts
#: above: the attention sublayer (input norm + QKV, RoPE, core attention, projection,
#: residual) holds 25 of the 45 per-layer kernels and half the FP8 casts (2 of 4 GEMMs);
#: of the MoE layer's extra 150, the router holds 45 and the preprocessing 30.
CUDA_GRAPH_SCOPES: tuple[str, ...] = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")
KERNELS_ATTENTION_SUBLAYER = 25.0
KERNELS_ROUTER = 45.0
KERNELS_PREPROCESS = 30.0


def graphed_kernels(scope: tuple[str, ...], *, moe_unit: bool, low_precision: bool,
                    total: Any, attention_extra: float = 0.0) -> Any:
    """Kernels of one layer that CUDA graphs capture under ``scope`` (empty: all of them).

    ``attention_extra``: kernels the model adds to the attention sublayer beyond the
    count above (unfused RoPE, :func:`parsearch.cost.unfused_ops.unfused_attention_kernels`).

    >>> graphed_kernels(("attn",), moe_unit=False, low_precision=False, total=45.0)
    25.0
    >>> graphed_kernels(("moe_router", "moe_preprocess"), moe_unit=True, low_precision=False,
    ...                 total=200.0)
    75.0
    """
    if not scope:
        return total
    casts = KERNELS_FP8_EXTRA / 2.0 if low_precision else 0.0
    attention = KERNELS_ATTENTION_SUBLAYER + casts + attention_extra
    captured = attention if "attn" in scope else 0.0
    if moe_unit:
        if "moe" in scope:  # the whole MLP part: all but the attention sublayer
            return captured + (total - attention)
        captured += KERNELS_ROUTER if "moe_router" in scope else 0.0
        captured += KERNELS_PREPROCESS if "moe_preprocess" in scope else 0.0
    elif "mlp" in scope:
        captured += total - attention
    return captured + 0.0 * total
