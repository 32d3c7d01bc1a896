"""Sliding-window attention in training: GPT-OSS's windowed layers attend to 128 keys."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.flops import stage_flops_core
from parsearch.cost.stages import StageContent
from parsearch.cost.token_flops import (
    attended_keys,
    core_attention_forward_flops,
    model_flops_per_token,
)
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.files import load_model_file, model_to_dict
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.summary import fabric_from_spec

GPT_OSS = get_preset("gpt-oss-120b")  # 36 layers, 18 windowed at 128; 64 heads of 64
FULL = replace(GPT_OSS, sliding_window=0, sliding_window_layers=0)


def test_hand_count_of_windowed_attention() -> None:
    s = 4096
    # causal window 128: query i sees min(i, 128) keys, mean 128 - 128*127/(2*4096),
    # on the s/2 convention of full causal attention (exact mean (s+1)/2): x s/(s+1)
    windowed_keys = (128 - 128 * 127 / (2 * s)) * s / (s + 1)
    mean_keys = 0.5 * (s / 2) + 0.5 * windowed_keys  # half the layers windowed
    widths = 64 * 64 + 64 * 64  # QK^T and P.V, 64 heads of 64
    assert core_attention_forward_flops(GPT_OSS, s, windowed=True) == pytest.approx(
        2 * widths * mean_keys)
    # the model-FLOP convention (Megatron-Core's count) keeps full attention
    assert core_attention_forward_flops(GPT_OSS, s) == core_attention_forward_flops(FULL, s)
    assert model_flops_per_token(GPT_OSS, s).total_flops == pytest.approx(
        model_flops_per_token(FULL, s).total_flops)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 1 << 20), st.integers(0, 1 << 21), st.booleans())
def test_a_window_never_adds_keys(seq: int, window: int, causal: bool) -> None:
    full = attended_keys(seq, causal)
    keys = attended_keys(seq, causal, window)
    assert 0.0 < keys <= full + 1e-9
    if window == 0 or window >= seq:
        assert keys == full


def test_the_time_model_prices_the_windowed_layers() -> None:
    content = StageContent(rank=0, pp=1, vpp=1, chunk_layer_indices=((),), num_dense_layers=0,
                           num_moe_layers=36, has_embedding=False, has_output=False,
                           num_mtp_layers=0, mtp_is_moe=False)
    one = {"tp": 1, "cp": 1, "ep": 8, "etp": 1, "mbs": 1}
    windowed = stage_flops_core(GPT_OSS, 4096, content, recompute_code=np.array([0]),
                                causal=True, **one)
    full = stage_flops_core(FULL, 4096, content, recompute_code=np.array([0]), causal=True,
                            **one)
    assert float(windowed.core_attention_flops) < 0.6 * float(full.core_attention_flops)
    assert float(windowed.routed_expert_flops) == float(full.routed_expert_flops)
    fabric = fabric_from_spec(load_cluster("dgx-b200"), 64)
    training = TrainingSpec(seq_len=4096, global_batch=1280)
    layout = Layout(num_gpus=64, ep=8, mbs=1)
    fast = estimate(build_cost_model(GPT_OSS, training, fabric), layout)
    slow = estimate(build_cost_model(FULL, training, fabric), layout)
    assert fast.step_time_s < slow.step_time_s


@pytest.mark.parametrize(("window", "layers", "message"), [
    (128, 0, "go together"),
    (0, 18, "go together"),
    (128, 40, "exceeds num_layers=36"),
    (-1, 18, "sliding_window must be a non-negative integer"),
])
def test_bad_windows_are_named(window: int, layers: int, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        replace(GPT_OSS, sliding_window=window, sliding_window_layers=layers)


def test_a_model_file_keeps_its_window(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    path = tmp_path / "oss.yaml"
    path.write_text(yaml.safe_dump(model_to_dict(GPT_OSS)))
    loaded = load_model_file(path)
    assert (loaded.sliding_window, loaded.sliding_window_layers) == (128, 18)
