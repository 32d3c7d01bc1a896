"""Fused attention at each GPU's softmax exponential (SFU) rate relative to its generation."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.compute import unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.recompute import LayerShares
from parsearch.cost.softmax import (
    EXP_EXPOSED_SHARE,
    attention_scale,
    attention_speed,
    flops_per_score,
)
from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.hardware import gpu_profile_from_dict, load_gpu_profile

BLACKWELL = ("b200", "b300", "gb200", "gb300")


def test_flops_per_score_counts_both_matmuls() -> None:
    # GQA, head dim 128: QK^T and P.V each 2 x 128 FLOPs per score
    assert flops_per_score(get_preset("llama3-70b")) == 2 * (128 + 128)
    # MLA: (nope 128 + rope 64) for QK^T, v 128 for P.V
    assert flops_per_score(get_preset("deepseek-v3")) == 2 * (128 + 64 + 128)


def test_hand_count_of_b200_forward_speed() -> None:
    b200 = load_gpu_profile("b200")
    # 2.25 PF / 512 FLOPs per score = 4.39e12 scores/s against 4.65e12 exponentials/s
    exp_over_mma = (2.25e15 / 512) / 4.65e12
    expected = 1.0 / (1.0 + EXP_EXPOSED_SHARE * exp_over_mma)
    assert attention_speed(b200, 512.0, backward=False) == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("model", ["llama3-70b", "deepseek-v3", "qwen3-30b-a3b"])
def test_blackwell_scales_average_to_one_and_ultra_is_faster(model: str, backward: bool) -> None:
    spec = get_preset(model)
    profile = efficiency_for_gpu("b200")
    scales = {g: attention_scale(load_gpu_profile(g), profile, spec, backward=backward)
              for g in BLACKWELL}
    assert sum(scales.values()) / len(scales) == pytest.approx(1.0)
    # Blackwell Ultra (B300, GB300) doubles the SFU rate: its attention is the faster
    assert min(scales["b300"], scales["gb300"]) > max(scales["b200"], scales["gb200"])


def test_backward_depends_less_on_the_sfu_than_forward() -> None:
    spec = get_preset("llama3-70b")
    profile = efficiency_for_gpu("gb300")
    gb300 = load_gpu_profile("gb300")
    forward = attention_scale(gb300, profile, spec, backward=False)
    backward = attention_scale(gb300, profile, spec, backward=True)
    assert 1.0 < backward < forward


def test_one_gpu_generations_and_unstated_rates_keep_one() -> None:
    spec = get_preset("llama3-70b")
    for name in ("h100-sxm", "h200-sxm", "h800-sxm"):  # one die, one SFU rate
        gpu = load_gpu_profile(name)
        assert attention_scale(gpu, efficiency_for_gpu(name), spec, backward=False) == 1.0
    unstated = replace(load_gpu_profile("gb300"), exp_per_s=None)
    assert attention_scale(unstated, efficiency_for_gpu("gb300"), spec, backward=False) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.floats(0.5, 50.0), st.floats(64.0, 2048.0))
def test_a_faster_sfu_never_slows_attention(rate_tps: float, score_flops: float) -> None:
    gpu = replace(load_gpu_profile("b200"), exp_per_s=rate_tps * 1e12)
    faster = replace(gpu, exp_per_s=2 * rate_tps * 1e12)
    for backward in (False, True):
        slow = attention_speed(gpu, score_flops, backward=backward)
        fast = attention_speed(faster, score_flops, backward=backward)
        assert slow is not None and fast is not None
        assert 0.0 < slow <= fast <= 1.0


def test_a_scored_layer_prices_attention_at_the_gpus_sfu_rate() -> None:
    spec = get_preset("llama3-70b")
    training = TrainingSpec(seq_len=8192, global_batch=128, precision="bf16")
    profile = efficiency_for_gpu("gb200")
    zero = np.zeros(1)
    no_recompute = LayerShares(**{f.name: zero for f in fields(LayerShares)})
    cols = {k: np.array([v]) for k, v in
            {"tp": 1, "cp": 1, "ep": 1, "etp": 1, "mbs": 1, "sp": 0, "recompute": 0}.items()}
    times = {}
    for name in ("gb200", "gb300"):  # same BF16 peak (2.5 PF), SFU rate doubled on GB300
        gpu = load_gpu_profile(name)
        layer = unit_compute(spec, training, gpu, profile, cols, "dense", recompute=no_recompute,
                             causal=True, imbalance=1.0, cuda_graphs=False)
        times[name] = float(layer.attention[0])
    # forward is 1/3.5 of the attention FLOPs-time, backward 2.5/3.5 at the profile's
    # efficiencies; each part speeds up by its own scale
    fwd = {g: attention_scale(load_gpu_profile(g), profile, spec, backward=False)
           for g in times}
    bwd = {g: attention_scale(load_gpu_profile(g), profile, spec, backward=True)
           for g in times}
    f_share = 1.0 / profile.attention_forward_efficiency
    b_share = 2.5 / profile.attention_backward_efficiency
    expected = ((f_share / fwd["gb300"] + b_share / bwd["gb300"])
                / (f_share / fwd["gb200"] + b_share / bwd["gb200"]))
    assert times["gb300"] / times["gb200"] == pytest.approx(expected, rel=1e-6)
    assert times["gb300"] < times["gb200"]


def test_a_bad_rate_is_refused_with_its_field() -> None:
    data = {"name": "x", "peak_tflops": {"bf16": 100}, "hbm_capacity_GiB": 80,
            "hbm_bandwidth_TBps": 3, "source": "test", "exp_Tps": -1}
    with pytest.raises(SpecError, match="exp_Tps"):
        gpu_profile_from_dict(data, "x.yaml")
