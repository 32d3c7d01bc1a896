"""TP overlap pairs each collective with its own block's GEMMs (TE userbuffers)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.compute import attention_block_share
from parsearch.cost.options import CostOptions
from parsearch.cost.token_flops import attention_gemm_forward_flops, dense_mlp_forward_flops
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology import build_fabric, load_cluster

#: Megatron-Bridge memory-tuning skill (NVIDIA-NeMo/Megatron-Bridge@0026ec187,
#: skills/nemo-mbridge-perf-memory-tuning/SKILL.md lines 185-187, PR #3107): Llama 3 70B
#: SFT on 32 H100, VPP5, MBS 1, GBS 32, 4,096 tokens, FP8 current scaling, preset
#: LLAMA3_70B_SFT_CONFIG_H100_FP8_CS_V1 (TE CUDA graphs of the MLP; the recipe turns TP
#: comm overlap on for TP > 1): model TFLOP/s per GPU by (TP, PP).
BRIDGE_LAYOUT_TFLOPS = {(4, 4): 704.0, (4, 8): 668.0, (8, 4): 508.7}


def _predicted(tp_comm_overlap: bool) -> dict[tuple[int, int], float]:
    model = get_preset("llama3-70b")
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    options = replace(CostOptions(), tp_comm_overlap=tp_comm_overlap, fp8_recipe="tensorwise",
                      cuda_graphs=True, cuda_graph_scope=("mlp",), memory_margin=0.0)
    training = TrainingSpec(seq_len=4096, global_batch=32, precision="fp8",
                            recompute_modes=("selective",), recompute_modules=("core_attn",))
    cost_model = build_cost_model(model, training, fabric, options=options)
    out = {}
    for tp, pp in BRIDGE_LAYOUT_TFLOPS:
        layout = Layout(num_gpus=32, tp=tp, pp=pp, cp=1, ep=1, etp=1, vpp=5, mbs=1, sp=True,
                        recompute="selective")
        out[(tp, pp)] = estimate(cost_model, layout).tokens_per_s_per_gpu
    return out


def test_tp8_against_deeper_pipelines_is_ordered_as_measured() -> None:
    """Measured: TP4 PP8 0.949x and TP8 PP4 0.723x of TP4 PP4.  At TP8 the attention
    block's QKV and projection GEMMs are shorter than their all-gathers and
    reduce-scatters, and the MLP's long GEMMs cannot hide them; pooling the two blocks
    priced TP8 at 0.949x, level with the deeper pipeline."""
    predicted = _predicted(tp_comm_overlap=True)
    base = predicted[(4, 4)]
    assert base > predicted[(4, 8)] > predicted[(8, 4)]
    assert predicted[(4, 8)] / base == pytest.approx(668.0 / 704.0, abs=0.03)
    assert predicted[(8, 4)] / base < 0.88  # the TP8 loss is not hidden any more


def test_attention_block_share_is_the_flop_split_of_the_two_tp_blocks() -> None:
    for name in ("llama3-8b", "llama3-70b", "llama3.1-405b", "gpt3-175b"):
        model = get_preset(name)
        attention = attention_gemm_forward_flops(model)
        mlp = dense_mlp_forward_flops(model)
        share = attention_block_share(model, "dense")
        assert share == pytest.approx(attention / (attention + mlp))
        assert 0.0 < share < 0.5  # the MLP block holds most GEMM FLOPs in these models
    assert attention_block_share(get_preset("llama3-70b"), "output") == 1.0
