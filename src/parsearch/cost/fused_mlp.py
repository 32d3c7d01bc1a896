"""Where Transformer Engine's op-fuser grouped MLP (the fused expert MLP) runs.

Megatron-Core runs the routed experts through Transformer Engine's op fuser
(``--use-transformer-engine-op-fuser``: FC1 grouped GEMM with the gated activation and the
block-scaled cast in its epilogue, FC2 likewise backward; priced in
:func:`parsearch.cost.compute.memory_bound_bytes_per_token`) from Megatron Core 0.18.0
(NVIDIA/Megatron-LM 6815c0fefe, 2026-05-15, "Combine GEMM + SwiGLU fused MLP PRs"; tag
core_v0.18.0, pinned by Megatron-Bridge 0.5.0).  ``TEGroupedMLP._is_fused_impl_supported``
(``megatron/core/transformer/moe/experts.py`` at d0b3b775) refuses it with an expert
tensor-parallel group larger than one, with fine-grained offloading of the experts' FC1 or
activation inputs, and for activations other than SwiGLU, quick GEGLU (GPT-OSS's clamped
gated activation) or weighted squared ReLU; Transformer Engine's fused kernels need SM100
and a block-scaled recipe (MXFP8 or NVFP4:
:func:`parsearch.cost.option_checks.check_precision_options`).

It only removes elementwise passes and kernels and holds no memory the unfused experts do
not, so where it is searched (``fused_expert_mlp`` in ``CostOptions.search_features``) it is
on wherever it runs: :func:`fused_mlp_runnable` for the job, :func:`fused_mlp_rows` per
layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parsearch.cost.options import CostOptions
from parsearch.cost.quantization import resolve_fp8_recipe
from parsearch.layout import Layout
from parsearch.model.offload_modules import EXPERT_OFFLOAD_MODULES
from parsearch.model.specs import ModelSpec, TrainingSpec


def fused_mlp_runnable(model: ModelSpec, training: TrainingSpec, capability: float | None,
                       fp8_recipe: str) -> bool:
    """Whether the job can run the fused expert MLP on some layout: a MoE model with a gated
    activation (SwiGLU, or GPT-OSS's clamped one), block-scaled low precision on SM100+ and
    no expert input offloaded.  Ungated squared-ReLU experts, which Megatron-Core fuses only
    with ``--use-fused-weighted-squared-relu`` as well, are left unfused."""
    if model.moe is None or model.mlp_activation != "swiglu":
        return False
    if capability is None or capability < 10:
        return False
    block_scaled = training.precision == "fp4" or (
        training.precision == "fp8" and resolve_fp8_recipe(fp8_recipe, capability) == "mxfp8")
    return block_scaled and not EXPERT_OFFLOAD_MODULES & set(training.offload_modules)


def fused_mlp_rows(fused_expert_mlp: Any, etp: Any, training: TrainingSpec) -> Any:
    """Per layout, whether the fused expert MLP runs: asked for (a flag, or one per layout),
    no expert tensor parallelism (``etp == 1``) and no expert input offloaded (the
    ``training`` priced: searched offload modules come with it); ``False`` where none runs.

    >>> spec = TrainingSpec(seq_len=4096, global_batch=64)
    >>> fused_mlp_rows(True, np.array([1.0, 2.0]), spec).tolist()
    [True, False]
    >>> fused_mlp_rows(False, np.array([1.0]), spec)
    False
    """
    if not np.any(fused_expert_mlp) or EXPERT_OFFLOAD_MODULES & set(training.offload_modules):
        return False
    return np.asarray(fused_expert_mlp, dtype=bool) & (np.asarray(etp) == 1)


def fused_mlp_pinned_flags(options: CostOptions, layout: Layout) -> list[str]:
    """The note for a layout that runs without the fused expert MLP the user pinned
    (``--fused-expert-mlp``): Megatron-Core refuses it with expert tensor parallelism."""
    if (not options.fused_expert_mlp or "fused_expert_mlp" in options.search_features
            or layout.etp <= 1):
        return []
    return [f"--fused-expert-mlp is not run here: Transformer Engine's op-fuser grouped MLP "
            f"needs an expert TP of 1 and this layout has etp = {layout.etp}; priced and "
            "launched without it"]
