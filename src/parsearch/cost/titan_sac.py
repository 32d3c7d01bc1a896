"""torchtitan's op-level selective activation checkpointing, priced for dense blocks.

torchtitan (``selective_ac_option = "op"``, ``_apply_ac_to_transformer_block`` in
``torchtitan/models/llama3/infra/parallelize.py``, later
``torchtitan/distributed/activation_checkpoint.py``) wraps each transformer block in a
selective checkpoint whose policy saves the outputs of ``aten.mm`` (every one but every
second: "Saves output of all compute ops, except every second mm"; the count restarts in
each block), of SDPA (output and log-sum-exp) and of ``reduce_scatter``; everything else,
norms, RoPE, the activation and its product, residual adds, the sequence-parallel
all-gathers and the skipped matmuls, is recomputed in backward from the saved tensors and
the block's input.  A Llama block calls its matmuls in the order ``wq, wk, wv, wo, w1,
w3, w2`` (``Attention.forward``, ``FeedForward.forward``: ``w2(silu(w1(x)) * w3(x))``),
so ``wk``, ``wo`` and ``w3`` are recomputed; a GeLU MLP (``fc1, fc2``) recomputes
``wk``, ``wo`` and ``fc2``.

Both functions count per token and layer, TP-sharded like
:mod:`parsearch.cost.memory.activations` (our derivation from the code above).  Without
TP a Llama 3 8B block keeps 31,808 elements per token, 0.46 of what it keeps without
recompute; with TP the saved output of the row-parallel ``w2`` is the full-width partial
sum before its reduce-scatter, so at TP 8 the policy can keep more than no checkpointing
does.  MoE and MLA blocks call their matmuls in other orders and are refused by
:func:`require_dense_block`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parsearch.errors import SpecError
from parsearch.model.specs import TORCHTITAN_OP_SAC, ModelSpec

#: A float or an elementwise numpy array of floats.
Num = Any


def require_dense_block(model: ModelSpec, modules: tuple[str, ...] | frozenset[str]) -> None:
    """A :class:`SpecError` when ``modules`` ask for torchtitan's op-level checkpointing of a
    block it is not priced for (MoE or MLA: another matmul order)."""
    if TORCHTITAN_OP_SAC in modules and (model.moe is not None or model.mla is not None):
        kind = "MoE" if model.moe is not None else "MLA"
        raise SpecError(
            f"recompute module {TORCHTITAN_OP_SAC!r} is priced for dense GQA blocks (Llama's "
            f"matmul order); {model.name} has {kind} layers: use recompute selective with "
            "Megatron modules, or full"
        )


def _matmul_widths(model: ModelSpec) -> list[tuple[str, float]]:
    """(name, multiply-adds per token) of a block's matmuls in the order torchtitan calls them."""
    h, f = model.hidden_size, model.ffn_hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.num_query_groups * model.head_dim
    attention = [("wq", h * q), ("wk", h * kv), ("wv", h * kv), ("wo", q * h)]
    if model.mlp_activation == "swiglu":
        return [*attention, ("w1", h * f), ("w3", h * f), ("w2", f * h)]
    return [*attention, ("fc1", h * f), ("fc2", f * h)]


def recomputed_gemm_share(model: ModelSpec) -> float:
    """Share of a block's forward matmul FLOPs torchtitan recomputes: every second matmul.

    >>> from parsearch.model.presets import get_preset
    >>> round(recomputed_gemm_share(get_preset("llama3-8b")), 3)  # wk + wo + w3 of 7
    0.365
    """
    widths = _matmul_widths(model)
    again = sum(w for i, (_, w) in enumerate(widths, start=1) if i % 2 == 0)
    return again / sum(w for _, w in widths)


def saved_elements(model: ModelSpec, tp: Num, sp_div: Num) -> tuple[Num, Num]:
    """(activation-precision elements, matmul-output elements) a block saves per token.

    Saved: the block's input (the checkpoint's input, ``h``, sequence-sharded), the outputs
    of the odd-numbered matmuls (``wq``, ``wv``, ``w1``, ``w2`` of a SwiGLU block; column-
    parallel outputs are TP-sharded, the row-parallel ``w2``'s is the full-width partial
    sum before its reduce-scatter), SDPA's output and its fp32 log-sum-exp (returned in the
    first element as bytes / 2, i.e. in 16-bit-element units), and with TP the
    reduce-scatter outputs after ``wo`` and ``w2`` (``h`` each, sequence-sharded).
    """
    h = model.hidden_size
    a = model.num_attention_heads
    mm = 0.0
    for i, (name, width) in enumerate(_matmul_widths(model), start=1):
        if i % 2 == 0:  # recomputed, not saved
            continue
        if name in {"wo", "w2", "fc2"}:  # row-parallel: the partial sum before its RS
            mm = mm + float(h)
        elif name in {"wk", "wv"}:  # K/V heads shard over at most their groups
            mm = mm + width / h / np.minimum(tp, model.num_query_groups)
        else:
            mm = mm + width / h / tp
    lse_as_elements = 2.0 * a / tp  # fp32 per head and token = two 16-bit elements
    reduce_scatter = np.where(np.asarray(tp) > 1, 2.0 * h / sp_div, 0.0)
    block_input = h / sp_div
    sdpa_out = a * model.head_dim / tp
    return block_input + sdpa_out + lse_as_elements + reduce_scatter, mm
