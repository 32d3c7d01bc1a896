"""Kernels per layer: SGLang's DeepSeek MLA + MoE chain against the generic Llama-like count."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.cost import decode_step
from parsearch.serve.kernels import (
    ALLREDUCE_FUSION_SAVED,
    KERNELS_PER_LAYER,
    SGLANG_DENSE_MLP_KERNELS,
    SGLANG_MLA_ATTENTION_KERNELS,
    SGLANG_MOE_KERNELS,
    TRTLLM_MOE_RUNNER_SAVED,
    TRTLLM_PYTORCH_KERNELS,
    kernels_per_layer,
)
from parsearch.serve.kv_cache import moe_layer_count
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster

DSV3 = get_preset("deepseek-v3")


def _work(engine: str, **knobs: bool) -> ServingWorkload:
    return ServingWorkload(isl=922, osl=922, precision="fp8", kv_precision="bf16",
                           engine=engine, **knobs)


def test_generic_count_for_other_engines_and_non_mla_models() -> None:
    # vLLM keeps the Llama-like estimate, and so does a GQA model on SGLang
    assert kernels_per_layer(DSV3, _work("vllm")) == KERNELS_PER_LAYER
    assert kernels_per_layer(get_preset("qwen3-235b-a22b"), _work("sglang")) == KERNELS_PER_LAYER


def test_trtllm_pytorch_backend_fuses_all_reduce_with_norm() -> None:
    # TensorRT-LLM's PyTorch backend folds each all-reduce into the residual add and RMSNorm
    # (10 kernels a layer besides the routed GEMMs); its TensorRT-engine workflow keeps the
    # generic count
    gpt_oss = get_preset("gpt-oss-120b")
    assert kernels_per_layer(gpt_oss, _work("trtllm")) == TRTLLM_PYTORCH_KERNELS
    assert TRTLLM_PYTORCH_KERNELS < KERNELS_PER_LAYER
    engine = replace(_work("trtllm"), tensorrt_engine=True)
    assert kernels_per_layer(gpt_oss, engine) == KERNELS_PER_LAYER


def test_sglang_deepseek_hand_count() -> None:
    # DeepSeek-V3: 61 layers, the first 3 dense, 58 with routed experts
    assert moe_layer_count(DSV3) == 58
    total = (61 * SGLANG_MLA_ATTENTION_KERNELS + 58 * SGLANG_MOE_KERNELS
             + 3 * SGLANG_DENSE_MLP_KERNELS)
    assert kernels_per_layer(DSV3, _work("sglang")) == pytest.approx(total / 61)
    # about 28 kernels per layer outside the routed GEMMs, well above the Llama-like 12
    assert 25 < kernels_per_layer(DSV3, _work("sglang")) < 32


def test_fusions_each_remove_their_kernels() -> None:
    base = kernels_per_layer(DSV3, _work("sglang"))
    fused_ar = kernels_per_layer(DSV3, _work("sglang", allreduce_fusion=True))
    fused_moe = kernels_per_layer(DSV3, _work("sglang", fused_moe_runner=True))
    both = kernels_per_layer(DSV3, _work("sglang", allreduce_fusion=True, fused_moe_runner=True))
    assert base - fused_ar == pytest.approx(ALLREDUCE_FUSION_SAVED)
    # the MoE runner only touches the 58 MoE layers
    assert base - fused_moe == pytest.approx(TRTLLM_MOE_RUNNER_SAVED * 58 / 61)
    assert both == pytest.approx(fused_ar + fused_moe - base)


def test_decode_step_pays_each_extra_kernel_once_per_layer() -> None:
    # the whole difference between SGLang and vLLM pricing of one small-batch decode step is
    # the extra kernels times the profile's fixed time per kernel (same GEMMs, bytes, links)
    cluster = load_cluster("dgx-h200")
    lay = ServingLayout(8, 1, 1, 1, 4)
    steps = {}
    for engine in ("vllm", "sglang"):
        ctx = _context(DSV3, cluster, _work(engine), None, None)
        steps[engine] = decode_step(DSV3, ctx.workload, lay, ctx.counts, ctx.rates,
                                    ctx.links(lay), None)
    ctx = _context(DSV3, cluster, _work("sglang"), None, None)
    extra = (kernels_per_layer(DSV3, _work("sglang")) - KERNELS_PER_LAYER) * 61
    assert steps["sglang"].total_s - steps["vllm"].total_s == pytest.approx(
        extra * ctx.rates.kernel_s, rel=1e-6)
    # ~970 more kernels at 3 us: about 2.9 ms on a ~6 ms step (InferenceMAX H200 TP8 at
    # concurrency 4 measures 12.1 ms TPOT)
    assert 2.5e-3 < steps["sglang"].total_s - steps["vllm"].total_s < 3.5e-3


def test_knobs_are_validated() -> None:
    with pytest.raises(SpecError, match="allreduce_fusion"):
        replace(_work("sglang"), allreduce_fusion="yes")
