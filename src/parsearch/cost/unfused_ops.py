"""Architecture features that Megatron-Core runs as separate PyTorch ops, outside its fused kernels.

The time model prices a layer from the kernels of a Llama-like layer: a rotary embedding
fused into one Transformer Engine kernel, a gated activation fused with the routing
probabilities, expert GEMMs without biases (:func:`parsearch.cost.compute.
memory_bound_bytes_per_token`).  GPT-OSS has three features that leave that path
(Megatron-Bridge's GPT-OSS bridge sets them: ``position_embedding_type="yarn"``,
``activation_func_clamp_value=7.0``, ``add_bias_linear=True``,
NVIDIA-NeMo/Megatron-Bridge@c810129341a8 ``src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py``),
and each becomes a chain of eager elementwise ops in the Megatron-Core the Bridge
releases pin (NVIDIA/Megatron-LM@2edffadb, d0b3b775 and cd4afffa, 2026-05 to 2026-07):

* **YaRN RoPE runs unfused.**  Megatron-LM turns ``apply_rope_fusion`` off for any
  ``position_embedding_type`` other than ``rope`` (``megatron/training/arguments.py``,
  "if args.position_embedding_type != 'rope': args.apply_rope_fusion = False"), and so
  does the Bridge (``validate_rope_fusion_compatibility`` in
  ``src/megatron/bridge/utils/fusions.py``, called by ``GPTModelProvider.provide``), even
  though the performance overrides ask for it.  Q and K then go through
  ``_apply_rotary_pos_emb_bshd`` (``megatron/core/models/common/embeddings/rope_utils.py``):
  ``t * cos``, ``_rotate_half`` (a negation and a ``cat``), ``* sin``, the add and a final
  ``cat`` with the empty pass-through part.
* **The gated-activation clamp runs before the fused kernel.**
  ``weighted_bias_quick_geglu_impl`` (``megatron/core/fusions/fused_bias_geglu.py``) clamps
  the two halves of the FC1 output and concatenates them again (``chunk``, two ``clamp``,
  ``cat``) before the fused quick-GEGLU; autograd runs the clamps' masked gradients and
  the ``cat`` of the two halves backward.
* **The experts' FC2 bias is added per expert in Python.**  ``TEGroupedMLP`` builds FC2
  with ``skip_bias_add=True`` and ``_apply_bias`` adds ``bias * prob`` expert by expert
  (``torch.split``, one multiply and one add per local expert, ``torch.cat``)
  (``megatron/core/transformer/moe/experts.py``); backward reduces both products.  FC1's
  bias stays in the grouped GEMM (``skip_bias_add=False``).

Transformer Engine's op-fuser grouped MLP (``use_transformer_engine_op_fuser``, Megatron
``TEGroupedMLP._is_fused_impl_supported`` at cd4afffa: ``ScaledClampedQGeGLU`` and
``GroupedLinear(scale_bias=...)``) runs the clamp and the probability-scaled FC2 bias inside
its fused kernels (cuDNN's ``grouped_gemm_dglu_dbias`` kernel, NVIDIA/cudnn-frontend issue
256): with ``fused_expert_mlp`` the expert terms vanish; the RoPE term stays.

Each function returns HBM bytes per element (our count, bf16, 2 bytes; an elementwise op
reads its inputs and writes its output once) or kernels per layer, forward + backward,
for :func:`parsearch.cost.compute.unit_compute` to price like its other memory-bound
kernels.  Attention sinks (``softmax_type="learnable"``) are not here: Transformer Engine
keeps the cuDNN fused backend for them and disables only FlashAttention
(``transformer_engine/pytorch/attention/dot_product_attention/utils.py``, "Filter: Softmax
type"), and the unfused fallback could not hold these runs' ``s x s`` scores in memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parsearch.model.specs import ModelSpec

#: Fused RoPE (Transformer Engine ``fused_apply_rotary_pos_emb``): reads and writes Q or K
#: once forward and once backward, 8 bytes per element (what ``per_head`` prices).
FUSED_ROPE_BYTES = 8.0
#: Unfused RoPE, per element of Q and K.  Forward: ``t * cos`` (read 2, write 2), the
#: negation of one half (2 per element of t), ``cat`` in ``_rotate_half`` (4), ``* sin``
#: (4), the add (read 4, write 2) and the closing ``cat`` (4) = 24.  Backward: ``* sin``
#: (4), the negation (2), the ``cat`` of the two half-gradients (4), ``* cos`` (4) and the
#: sum of the two gradients of ``t`` (6) = 20.  Total 44.
UNFUSED_ROPE_BYTES = 44.0
#: Its kernels per tensor: 6 forward (mul, neg, cat, mul, add, cat) and 5 backward
#: (mul, neg, cat, mul, add), for Q and K, against 2 fused (one forward, one backward).
UNFUSED_ROPE_KERNELS_PER_TENSOR = 11.0
FUSED_ROPE_KERNELS_PER_TENSOR = 2.0
#: Clamp before the fused activation, per element of the FC1 output (the 2f-wide GLU
#: input).  Forward: two ``clamp`` (read 2, write 2) and the ``cat`` (read 2, write 2) =
#: 8.  Backward: the clamps' masked gradients (read the gradient and the saved input,
#: write the gradient: 6) and the ``cat`` of the two halves (4) = 10.  Total 18.
GLU_CLAMP_BYTES = 18.0
#: Its kernels per layer: clamp, clamp, cat forward; two clamp backwards and a cat.
GLU_CLAMP_KERNELS = 6.0
#: Expert FC2 bias, per element of the FC2 output ([copies, h]).  Forward: ``b * p``
#: written (2), the add (read 4, write 2) and ``torch.cat`` (read 2, write 2) = 12.
#: Backward: the product's gradients, ``(g * p).sum(0)`` for the bias and
#: ``(g * b).sum(-1)`` for the probability (write and read a full product each: 6 + 6)
#: = 12.  Total 24 with bf16 router probabilities: the router's logits dtype (Megatron's
#: default ``moe_router_dtype``, which GPT-OSS keeps; Transformer Engine's fused router
#: returns "probs in the same dtype as the logits", ``transformer_engine/pytorch/router.py``).
EXPERT_BIAS_BYTES = 24.0
#: The flex dispatcher upcasts the probabilities to fp32 (Megatron-Core
#: ``token_dispatcher.py``: "HybridEP only supports float32 probs", likewise DeepEP), and
#: the bias add then runs in fp32: forward ``b * p`` written in fp32 (4), the add (read 2 +
#: 4, write 4), ``cat`` (8) and the cast back (6) = 28; backward the cast's gradient (6),
#: the gradient of ``t`` cast to bf16 (6) and the two products with their reductions in
#: fp32 (12 + 12) = 36.  Total 64.
EXPERT_BIAS_BYTES_FP32_PROBS = 64.0
#: Its kernels: per local expert a multiply and an add forward, two multiplies and two
#: reductions backward (6); per layer the ``cat``.
EXPERT_BIAS_KERNELS_PER_EXPERT = 6.0
EXPERT_BIAS_KERNELS_PER_LAYER = 1.0


def rope_extra_bytes(model: ModelSpec) -> float:
    """Bytes per Q/K element that unfused RoPE moves beyond the fused kernel (0: fused).

    >>> from parsearch.model.presets import get_preset
    >>> rope_extra_bytes(get_preset("gpt-oss-120b")), rope_extra_bytes(get_preset("llama3-8b"))
    (36.0, 0.0)
    """
    return UNFUSED_ROPE_BYTES - FUSED_ROPE_BYTES if model.yarn_rope else 0.0


def unfused_share(fused_expert_mlp: Any) -> Any:
    """1 where the experts run unfused, 0 where the op-fuser grouped MLP runs them
    (``fused_expert_mlp``: a flag, or one per layout): a float for a flag, else an array.

    >>> unfused_share(True), unfused_share(False), unfused_share(np.array([True, False]))
    (0.0, 1.0, array([0., 1.]))
    """
    share = 1.0 - np.asarray(fused_expert_mlp, dtype=np.float64)
    return float(share) if share.ndim == 0 else share


def glu_clamp_bytes(model: ModelSpec, fused_expert_mlp: Any = False, *,
                    routed: bool = True) -> Any:
    """Bytes per element of an MLP's FC1 output that the clamp adds (0: no clamp, or the
    routed experts' clamp inside the op-fuser kernel; ``fused_expert_mlp`` may hold one
    flag per layout).

    >>> from parsearch.model.presets import get_preset
    >>> oss = get_preset("gpt-oss-120b")
    >>> glu_clamp_bytes(oss), glu_clamp_bytes(oss, fused_expert_mlp=True)
    (18.0, 0.0)
    """
    if model.glu_limit <= 0:
        return 0.0
    return GLU_CLAMP_BYTES * (unfused_share(fused_expert_mlp) if routed else 1.0)


def expert_bias_bytes(model: ModelSpec, fused_expert_mlp: Any = False, *,
                      fp32_probs: bool = False) -> Any:
    """Bytes per element of the experts' FC2 output that the per-expert bias add moves
    (``fp32_probs``: the flex dispatcher's fp32 routing probabilities).

    >>> from parsearch.model.presets import get_preset
    >>> oss = get_preset("gpt-oss-120b")
    >>> expert_bias_bytes(oss), expert_bias_bytes(oss, fp32_probs=True)
    (24.0, 64.0)
    >>> expert_bias_bytes(get_preset("mixtral-8x7b"))
    0.0
    """
    if not model.expert_bias:
        return 0.0
    return ((EXPERT_BIAS_BYTES_FP32_PROBS if fp32_probs else EXPERT_BIAS_BYTES)
            * unfused_share(fused_expert_mlp))


def unfused_attention_kernels(model: ModelSpec) -> float:
    """Of :func:`unfused_kernels`, those in the attention sublayer (unfused RoPE on Q and
    K), which a CUDA graph of the ``attn`` scope captures.

    >>> from parsearch.model.presets import get_preset
    >>> unfused_attention_kernels(get_preset("gpt-oss-120b"))
    18.0
    """
    if not model.yarn_rope:
        return 0.0
    return 2.0 * (UNFUSED_ROPE_KERNELS_PER_TENSOR - FUSED_ROPE_KERNELS_PER_TENSOR)


def unfused_kernels(model: ModelSpec, *, moe_unit: bool, local_experts: Any,
                    fused_expert_mlp: Any = False) -> Any:
    """Kernels per layer, forward + backward, that these features add (elementwise over
    ``local_experts``, the routed experts a rank holds).

    >>> from parsearch.model.presets import get_preset
    >>> float(unfused_kernels(get_preset("gpt-oss-120b"), moe_unit=True, local_experts=16.0))
    121.0
    """
    experts = np.asarray(local_experts, dtype=np.float64)
    kernels = 0.0 * experts + unfused_attention_kernels(model)
    unfused = unfused_share(fused_expert_mlp) if moe_unit else 1.0
    if model.glu_limit > 0:
        kernels = kernels + GLU_CLAMP_KERNELS * unfused
    if moe_unit and model.expert_bias:
        kernels = kernels + unfused * (EXPERT_BIAS_KERNELS_PER_LAYER
                                       + EXPERT_BIAS_KERNELS_PER_EXPERT * experts)
    return kernels
