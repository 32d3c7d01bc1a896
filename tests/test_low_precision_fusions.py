"""Recipe features that move work into FP8 kernels or GEMM epilogues: FP8 attention, the
MXFP8 LM head and the fused expert MLP, priced and launched as the recipes turn them on."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.cost.compute import unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.quantization import fp8_attention_cast_bytes_per_token
from parsearch.cost.recompute import LayerShares
from parsearch.cost.softmax import attention_speed, flops_per_score
from parsearch.errors import SpecError
from parsearch.launch import launch_for_cluster
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology import build_fabric, load_cluster
from parsearch.topology.hardware import load_gpu_profile
from parsearch.validation.published.recipes import apply_setup, load_run_setups

NO_RECOMPUTE = LayerShares(**{f.name: np.zeros(1) for f in fields(LayerShares)})
ONE_RANK = {k: np.array([v]) for k, v in
            {"tp": 1, "cp": 1, "ep": 1, "etp": 1, "mbs": 1, "sp": 0, "recompute": 0}.items()}


def _layer(model: str, gpu: str, seq: int, precision: str, **flags: bool):  # type: ignore[no-untyped-def]
    training = TrainingSpec(seq_len=seq, global_batch=64, precision=precision)
    return unit_compute(get_preset(model), training, load_gpu_profile(gpu),
                        efficiency_for_gpu(gpu), ONE_RANK, "dense", recompute=NO_RECOMPUTE,
                        causal=True, imbalance=1.0, cuda_graphs=False, **flags)


def test_fp8_over_bf16_forward_on_h100_matches_flashattention3() -> None:
    # FlashAttention-3 (arXiv 2407.08608, abstract): ~740 TFLOP/s in FP16 and ~1.2 PFLOP/s in
    # FP8 on H100 at head dim 128: 1.62x.  Same kernel, matmuls at twice the rate, same
    # exponentials on the SFUs.
    h100 = load_gpu_profile("h100-sxm")
    score = flops_per_score(get_preset("llama3-70b"))
    bf16 = attention_speed(h100, score, backward=False)
    fp8 = attention_speed(h100, score, backward=False, precision="fp8")
    assert bf16 is not None and fp8 is not None
    speedup = h100.peak_flops["fp8"] / h100.peak_flops["bf16"] * fp8 / bf16
    assert speedup == pytest.approx(1.2e15 / 740e12, abs=0.08)


def test_the_sfu_keeps_fp8_attention_below_twice_bf16() -> None:
    for gpu in ("h100-sxm", "b200", "gb300"):
        bf16 = _layer("llama3-8b", gpu, 8192, "fp8")
        fp8 = _layer("llama3-8b", gpu, 8192, "fp8", fp8_attention=True)
        ratio = float(bf16.attention[0] / fp8.attention[0])
        assert 1.3 < ratio < 2.0, (gpu, ratio)
        assert float(fp8.gemm[0]) == pytest.approx(float(bf16.gemm[0]))


@settings(max_examples=30, deadline=None)
@given(seq=st.sampled_from([1024, 2048, 4096, 8192, 16384]),
       gpu=st.sampled_from(["h100-sxm", "b200", "gb200", "gb300"]),
       model=st.sampled_from(["llama3-8b", "llama3-70b", "deepseek-v3"]))
def test_fp8_attention_is_faster_attention_and_pays_its_casts(seq: int, gpu: str,
                                                               model: str) -> None:
    bf16 = _layer(model, gpu, seq, "fp8")
    fp8 = _layer(model, gpu, seq, "fp8", fp8_attention=True)
    assert float(fp8.attention[0]) < float(bf16.attention[0])
    assert float(fp8.memory_bound[0]) > float(bf16.memory_bound[0])


def test_fp8_attention_is_refused_in_bf16() -> None:
    cluster = build_fabric(load_cluster("dgx-h100"), 8)
    model = get_preset("llama3-8b")
    with pytest.raises(SpecError, match="fp8 attention needs --precision fp8"):
        build_cost_model(model, TrainingSpec(seq_len=4096, global_batch=64), cluster,
                         options=CostOptions(fp8_attention=True))
    with pytest.raises(SpecError, match="fused attention backend"):
        build_cost_model(model, TrainingSpec(seq_len=4096, global_batch=64, precision="fp8"),
                         cluster, options=CostOptions(fp8_attention=True, flash_attention=False))


def test_cast_bytes_by_hand() -> None:
    # Llama 3 8B: Q and O 32 x 128, K and V 8 x 128 -> 10,240 elements, cast twice at 3 B.
    assert fp8_attention_cast_bytes_per_token(get_preset("llama3-8b"), 1) == 6 * 10240
    # TP 8 keeps one KV head per rank: 4 x 128 x 2 + 1 x 128 x 2 = 1,280 elements.
    assert fp8_attention_cast_bytes_per_token(get_preset("llama3-8b"), 8) == 6 * 1280
    # DeepSeek-V3 MLA: 128 heads x (2 x 192 + 2 x 128) = 81,920 elements.
    assert fp8_attention_cast_bytes_per_token(get_preset("deepseek-v3"), 1) == 6 * 81920


def _assert_faster_and_launched(model_name: str, training: TrainingSpec, layout: Layout,
                                flag: dict[str, bool], megatron_arg: str,
                                bridge_override: str) -> None:
    """On a B200 node: ``flag`` prices a faster step and is launched, and off it is not."""
    model = get_preset(model_name)
    cluster = load_cluster("dgx-b200")
    fabric = build_fabric(cluster, layout.num_gpus)
    plain = build_cost_model(model, training, fabric, options=CostOptions())
    on = build_cost_model(model, training, fabric, options=CostOptions(**flag))
    assert estimate(on, layout).step_time_s < estimate(plain, layout).step_time_s
    launch = launch_for_cluster(model, training, layout, cluster, options=on.options)
    assert megatron_arg in launch.megatron_lm_args
    assert bridge_override in launch.bridge_overrides
    off = launch_for_cluster(model, training, layout, cluster, options=plain.options)
    assert megatron_arg not in off.megatron_lm_args


def test_mxfp8_lm_head_is_priced_and_launched_only_with_mxfp8() -> None:
    model = get_preset("llama3-8b")
    training = TrainingSpec(seq_len=8192, global_batch=128, precision="fp8")
    layout = Layout(num_gpus=8, tp=1, pp=1, mbs=2)
    h100 = build_fabric(load_cluster("dgx-h100"), 8)
    with pytest.raises(SpecError, match="mxfp8"):
        build_cost_model(model, training, h100, options=CostOptions(fp8_output_proj=True))
    _assert_faster_and_launched("llama3-8b", training, layout, {"fp8_output_proj": True},
                                "--fp8-output-proj", "++model.fp8_output_proj=true")


def test_fp8_attention_launches_through_bridge_and_is_noted_for_megatron_lm() -> None:
    model = get_preset("llama3-8b")
    training = TrainingSpec(seq_len=8192, global_batch=128, precision="fp8")
    layout = Layout(num_gpus=8, tp=1, pp=1, mbs=2)
    cluster = load_cluster("dgx-b200")
    options = CostOptions(fp8_attention=True)
    launch = launch_for_cluster(model, training, layout, cluster, options=options)
    assert any("fp8_dot_product_attention=true" in o for o in launch.bridge_overrides)
    assert any("fp8_dot_product_attention" in g for g in launch.plan.megatron_lm_gaps)
    assert not launch.conflicts  # Bridge runs it: not a conflict, a Megatron-LM gap
    assert "not settable on this command line" in launch.shell_snippet()
    off = launch_for_cluster(model, training, layout, cluster, options=CostOptions())
    assert not any("fp8_dot_product_attention=true" in o for o in off.bridge_overrides)
    assert not off.plan.megatron_lm_gaps


def test_published_recipes_that_turn_fp8_attention_on_are_read_so() -> None:
    setups = load_run_setups()
    # Megatron-Bridge v0.6.0 perf_recipes: DeepSeek-V3 GB300 MXFP8 sets both, GB200 only the
    # LM head; v0.5.0 (26.06) DeepSeek-V3 B300 sets neither.
    assert setups["r0001"].fp8_attention and setups["r0001"].fp8_output_proj
    assert not setups["r0002"].fp8_attention and setups["r0002"].fp8_output_proj
    assert setups["r0043"].fp8_attention is False
    training = TrainingSpec(seq_len=4096, global_batch=4096, precision="fp8")
    _, options = apply_setup(setups["r0001"], training, CostOptions(), moe=True,
                             precision="fp8")
    assert options.fp8_attention and options.fp8_output_proj
    # a BF16 run of a recipe that names FP8 attention does not get it
    _, bf16 = apply_setup(setups["r0001"], replace(training, precision="bf16"), CostOptions(),
                          moe=True, precision="bf16")
    assert not bf16.fp8_attention and not bf16.fp8_output_proj


def test_fused_expert_mlp_removes_the_activation_and_its_casts_by_hand() -> None:
    from parsearch.cost.compute import memory_bound_bytes_per_token

    model = get_preset("qwen3-30b-a3b")
    h, fe = model.hidden_size, model.moe.expert_ffn_hidden_size  # type: ignore[union-attr]
    kwargs = {"tp": 1, "etp": 1, "dense": False, "moe": True, "quantize_bytes": 4.0}
    plain = memory_bound_bytes_per_token(model, **kwargs)
    fused = memory_bound_bytes_per_token(model, fused_expert_mlp=True, **kwargs)
    # SwiGLU forward and backward (16 f_e) and the MXFP8 casts of FC2's input and FC1's
    # output gradient (4 B x 3 f_e) move into the GEMM epilogues; permute/unpermute and the
    # casts of the expert input and of FC2's output gradient stay.
    assert float(plain["per_expert_copy"] - fused["per_expert_copy"]) == 16 * fe
    assert float(plain["quantize_routed_copy"] - fused["quantize_routed_copy"]) == 4 * 3 * fe
    assert float(fused["per_expert_copy"]) == 0.0
    assert float(plain["per_routed_copy"]) == float(fused["per_routed_copy"]) == 16 * h
    assert float(fused["quantize_routed_copy"]) == 4 * 2 * h


def test_fused_expert_mlp_needs_blackwell_block_scaling_and_is_launched() -> None:
    model = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=512, precision="fp8")
    layout = Layout(num_gpus=8, tp=1, pp=1, ep=8, mbs=2)
    hopper = build_fabric(load_cluster("dgx-h100"), 8)
    with pytest.raises(SpecError, match="fused-expert-mlp"):
        build_cost_model(model, training, hopper, options=CostOptions(fused_expert_mlp=True))
    fabric = build_fabric(load_cluster("dgx-b200"), 8)
    with pytest.raises(SpecError, match="fused-expert-mlp"):
        build_cost_model(model, replace(training, precision="bf16"), fabric,
                         options=CostOptions(fused_expert_mlp=True))
    _assert_faster_and_launched("qwen3-30b-a3b", training, layout, {"fused_expert_mlp": True},
                                "--use-transformer-engine-op-fuser",
                                "++model.moe_mlp_glu_interleave_size=32")


def test_each_mtp_layer_prices_its_own_pass_of_the_output_head() -> None:
    # Megatron-Core multi_token_prediction.py: every MTP depth runs output_layer and an LM
    # loss; transformer_flops counts h·V·(1 + n_mtp).  The one-unit MTP price carries one.
    from parsearch.cost.compute import unit_content
    from parsearch.cost.flops import stage_flops_core
    from parsearch.cost.token_flops import logits_forward_flops

    model = get_preset("deepseek-v3")
    assert model.mtp_layers >= 1
    mtp = stage_flops_core(model, 4096, unit_content(model, "mtp"), tp=1, cp=1, ep=8, etp=1,
                           mbs=1, recompute_code=0)
    out = stage_flops_core(model, 4096, unit_content(model, "output"), tp=1, cp=1, ep=8,
                           etp=1, mbs=1, recompute_code=0)
    per_pass = 4096 * logits_forward_flops(model)
    assert float(mtp.logits_flops) == pytest.approx(per_pass)
    assert float(out.logits_flops) == pytest.approx(per_pass)
