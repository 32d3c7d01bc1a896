"""Sliding-window layers' fused attention against cuDNN's measured window kernels.

cudnn-frontend@3929da2e ``benchmark/sdpa_benchmark_training/results/gpt_oss/{gb200,gb300}``
(cuDNN 9.22): batch 2 x 128 heads, head dim 64, causal window 128, s = 4,096, the
attention of one GPT-OSS micro-batch of 4 sequences x 64 heads.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.compute import unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.recompute import LayerShares
from parsearch.cost.token_flops import attended_keys
from parsearch.cost.window_attention import (
    KV_TILE,
    window_keys_processed,
    window_time_factors,
)
from parsearch.model.presets import get_preset
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.hardware import load_gpu_profile

OSS = get_preset("gpt-oss-120b")
#: Every layer windowed, so a layer's attention is the window kernel's alone.
ALL_WINDOWED = replace(OSS, sliding_window_layers=OSS.num_layers)
#: Measured fwd + bwd ms (BF16; FP8 = the per-tensor FP8 columns) of that benchmark.
MEASURED_MS = {"gb200": (0.210 + 0.465, 0.195 + 1.731), "gb300": (0.202 + 0.442, 0.167 + 1.480)}


def _attention_ms(model: ModelSpec, gpu: str, *, fp8: bool = False, seq: int = 4096) -> float:
    cols = {k: np.array([v]) for k, v in
            {"tp": 1, "cp": 1, "ep": 1, "etp": 1, "mbs": 4, "sp": 0, "recompute": 0}.items()}
    none = LayerShares(**{f.name: np.zeros(1) for f in fields(LayerShares)})
    training = TrainingSpec(seq_len=seq, global_batch=64, precision="fp8" if fp8 else "bf16")
    unit = unit_compute(model, training, load_gpu_profile(gpu), efficiency_for_gpu(gpu), cols,
                        "moe", recompute=none, causal=True, imbalance=1.0, cuda_graphs=False,
                        fp8_attention=fp8, fp8_recipe="mxfp8" if fp8 else "auto")
    return float(unit.attention[0]) * 1e3


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_bf16_window_layer_matches_cudnn(gpu: str) -> None:
    # 0.66 ms against 0.675 on GB200, 0.53 against 0.644 on GB300 (2026-12-06); at the
    # full layer's rate (before) about 0.13.
    assert _attention_ms(ALL_WINDOWED, gpu) == pytest.approx(MEASURED_MS[gpu][0], rel=0.2)


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_fp8_window_backward_costs_the_causal_triangle(gpu: str) -> None:
    # cuDNN's FP8 window backward grows with s^2; priced as a causal layer's FP8 backward:
    # 1.38 ms against 1.93 on GB200, 1.02 against 1.65 on GB300 (2026-12-06).
    got = _attention_ms(ALL_WINDOWED, gpu, fp8=True)
    assert got == pytest.approx(MEASURED_MS[gpu][1], rel=0.4)
    assert got > 1.5 * _attention_ms(ALL_WINDOWED, gpu)


def test_window_layer_grows_with_the_sequence_not_its_square() -> None:
    short, long = _attention_ms(ALL_WINDOWED, "gb200"), _attention_ms(ALL_WINDOWED, "gb200",
                                                                       seq=32768)
    assert long / short == pytest.approx(8.0, rel=0.01)  # measured 8.7x fwd, 7.9x bwd


def test_models_without_windows_are_unchanged() -> None:
    llama = get_preset("llama3-70b")
    assert window_time_factors(llama, 8192, True, 8192.0, 768.0) == (1.0, 1.0)


@given(window=st.integers(1, 8192), seq=st.integers(2, 65536))
@settings(max_examples=200, deadline=None)
def test_processed_keys_cover_the_kept_ones(window: int, seq: int) -> None:
    keys = window_keys_processed(window, seq)
    assert attended_keys(seq, True, window) <= keys <= seq + KV_TILE


@given(share=st.integers(1, 36), window=st.sampled_from([128, 512, 1024, 4096]))
@settings(max_examples=60, deadline=None)
def test_windowed_layers_never_cost_less_than_their_kept_scores(share: int,
                                                                 window: int) -> None:
    model = replace(OSS, sliding_window=window, sliding_window_layers=share)
    forward, backward = window_time_factors(model, 8192, True, 8192.0, 768.0)
    assert forward >= 1.0 and backward >= 1.0
