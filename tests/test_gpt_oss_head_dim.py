"""A head dim the calibration never had: the exponentials' larger share of fused attention."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.compute import unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.recompute import LayerShares
from parsearch.cost.softmax import calibration_head_dim, head_dim_scale
from parsearch.model.presets import PRESETS, get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.hardware import load_gpu_profile

OSS = get_preset("gpt-oss-120b")
NO_RECOMPUTE = LayerShares(**{f.name: np.zeros(1) for f in fields(LayerShares)})


@settings(max_examples=40, deadline=None)
@given(gpu=st.sampled_from(["a100-sxm-80gb", "h100-sxm", "b200", "gb300"]),
       small=st.sampled_from([32, 48, 64, 80]), backward=st.booleans())
def test_a_smaller_head_dim_is_never_faster_per_flop(gpu: str, small: int,
                                                     backward: bool) -> None:
    profile = efficiency_for_gpu(gpu)
    smaller = replace(OSS, head_dim=small)
    assert head_dim_scale(profile, smaller, backward=backward) <= 1.0
    half = replace(OSS, head_dim=small // 2)
    assert (head_dim_scale(profile, half, backward=backward)
            <= head_dim_scale(profile, smaller, backward=backward) + 1e-12)


def test_calibrated_head_dims_and_mla_keep_their_rate() -> None:
    for gpu in ("a100-sxm-80gb", "h100-sxm", "b200"):
        profile = efficiency_for_gpu(gpu)
        assert profile.coverage is not None
        for model in PRESETS.values():
            covered = model.mla is not None or model.head_dim in profile.coverage.head_dims
            if covered:
                assert calibration_head_dim(model, profile) == model.head_dim
                assert head_dim_scale(profile, model, backward=True) == 1.0


def test_the_time_model_slows_head_dim_64_attention_by_the_scale() -> None:
    """Against a profile whose calibration had head dim 64, the shipped one prices GPT-OSS's
    attention slower by between the backward's and the forward's factor."""
    training = TrainingSpec(seq_len=4096, global_batch=1280, precision="bf16")
    gpu, profile = load_gpu_profile("b200"), efficiency_for_gpu("b200")
    assert profile.coverage is not None
    had_64 = replace(profile, coverage=replace(profile.coverage, head_dims=(64, 128)))
    cols = {k: np.array([v]) for k, v in
            {"tp": 1, "cp": 1, "ep": 8, "etp": 1, "mbs": 4, "sp": 0, "recompute": 0}.items()}

    def attention(prof) -> float:  # type: ignore[no-untyped-def]
        layer = unit_compute(OSS, training, gpu, prof, cols, "moe", recompute=NO_RECOMPUTE,
                             causal=True, imbalance=1.0, cuda_graphs=False)
        return float(layer.attention[0])

    fwd = head_dim_scale(profile, OSS, backward=False)
    bwd = head_dim_scale(profile, OSS, backward=True)
    assert 0.0 < fwd < bwd < 1.0  # the backward's 2.5x matmuls hide more of the exponentials
    assert head_dim_scale(had_64, OSS, backward=False) == 1.0
    calibrated, shipped = attention(had_64), attention(profile)
    assert calibrated / bwd <= shipped * (1 + 1e-12)
    assert shipped <= calibrated / fwd * (1 + 1e-12)
