"""GPT-OSS's unfused side paths: YaRN RoPE, the GLU clamp and the experts' FC2 bias."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.compute import unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.recompute import LayerShares
from parsearch.cost.unfused_ops import (
    EXPERT_BIAS_BYTES,
    FUSED_ROPE_BYTES,
    GLU_CLAMP_BYTES,
    UNFUSED_ROPE_BYTES,
)
from parsearch.errors import SpecError
from parsearch.model.hf_config import load_hf_config
from parsearch.model.presets import get_preset
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.hardware import load_gpu_profile

OSS = get_preset("gpt-oss-120b")
PLAIN = replace(OSS, glu_limit=0.0, expert_bias=False, yarn_rope=False)
TRAINING = TrainingSpec(seq_len=4096, global_batch=1280, precision="bf16")
FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def _shares(value: float) -> LayerShares:
    return LayerShares(**{f.name: np.full(1, value) for f in fields(LayerShares)})


def _layer(model: ModelSpec, *, gpu: str = "b200", tp: int = 1, ep: int = 8, mbs: int = 4,
           recompute: float = 0.0, fused: bool = False, graphs: bool = False,
           unit: str = "moe"):  # type: ignore[no-untyped-def]
    cols = {k: np.array([v]) for k, v in
            {"tp": tp, "cp": 1, "ep": ep, "etp": 1, "mbs": mbs, "sp": int(tp > 1),
             "recompute": 0}.items()}
    return unit_compute(model, TRAINING, load_gpu_profile(gpu), efficiency_for_gpu(gpu), cols,
                        unit, recompute=_shares(recompute), causal=True, imbalance=1.0,
                        cuda_graphs=graphs, fused_expert_mlp=fused)


def test_hand_count_of_the_extra_bytes() -> None:
    # B200, EP8, one micro-batch of 4 x 4096 tokens, no recompute: each rank holds all
    # 16,384 tokens (TP1) and its experts process 16,384 x top-4 copies.
    tokens, copies = 4 * 4096, 4 * 4096 * 4
    qk = (64 + 8) * 64  # Q and K widths
    extra = (tokens * (UNFUSED_ROPE_BYTES - FUSED_ROPE_BYTES) * qk
             + copies * (2 * GLU_CLAMP_BYTES * 2880 + EXPERT_BIAS_BYTES * 2880))
    gpu, profile = load_gpu_profile("b200"), efficiency_for_gpu("b200")
    expected = profile.memory_bound_factor * extra / (gpu.hbm_bandwidth_Bps
                                                      * profile.hbm_efficiency)
    got = float(_layer(OSS).memory_bound[0] - _layer(PLAIN).memory_bound[0])
    assert got == pytest.approx(expected, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(gpu=st.sampled_from(["h100-sxm", "b200", "gb300"]), tp=st.sampled_from([1, 2, 4]),
       ep=st.sampled_from([1, 2, 8, 32, 128]), mbs=st.integers(1, 4),
       recompute=st.sampled_from([0.0, 0.5, 1.0]), fused=st.booleans(), graphs=st.booleans(),
       drop=st.sampled_from(["glu_limit", "expert_bias", "yarn_rope"]))
def test_a_feature_never_makes_a_layer_faster(gpu: str, tp: int, ep: int, mbs: int,
                                              recompute: float, fused: bool, graphs: bool,
                                              drop: str) -> None:
    without = replace(OSS, **{drop: 0.0 if drop == "glu_limit" else False})
    kw = {"gpu": gpu, "tp": tp, "ep": ep, "mbs": mbs, "recompute": recompute, "fused": fused,
          "graphs": graphs}
    with_it, base = _layer(OSS, **kw), _layer(without, **kw)
    assert float(with_it.memory_bound[0]) >= float(base.memory_bound[0])
    assert float(with_it.total[0]) >= float(base.total[0]) * (1 - 1e-12)


@settings(max_examples=20, deadline=None)
@given(ep=st.sampled_from([1, 4, 16, 64]), mbs=st.integers(1, 4))
def test_the_op_fuser_keeps_only_the_rope_term(ep: int, mbs: int) -> None:
    """TE's fused grouped MLP runs the clamp and the probability-scaled FC2 bias in its
    kernels: with it, only YaRN's unfused RoPE separates GPT-OSS from the plain model."""
    rope_only = replace(PLAIN, yarn_rope=True)
    assert float(_layer(OSS, ep=ep, mbs=mbs, fused=True).memory_bound[0]) == pytest.approx(
        float(_layer(rope_only, ep=ep, mbs=mbs, fused=True).memory_bound[0]), rel=1e-12)
    assert float(_layer(OSS, ep=ep, mbs=mbs).memory_bound[0]) > float(
        _layer(rope_only, ep=ep, mbs=mbs).memory_bound[0])


def test_the_per_expert_bias_adds_kernels_per_local_expert() -> None:
    # Fewer local experts (wider EP) issue fewer per-expert bias kernels: the host-side
    # overhead of the bias shrinks with EP, the bytes per copy stay.
    gap = [float(_layer(OSS, ep=ep).overhead[0] - _layer(replace(OSS, expert_bias=False),
                                                         ep=ep).overhead[0])
           for ep in (8, 64)]
    assert gap[0] > gap[1] > 0


def test_models_without_the_features_are_unchanged() -> None:
    llama = get_preset("llama3-8b")
    assert (llama.glu_limit, llama.expert_bias, llama.yarn_rope) == (0.0, False, False)
    assert float(_layer(PLAIN).total[0]) < float(_layer(OSS).total[0])


def test_the_hf_reader_finds_the_features() -> None:
    oss = load_hf_config(FIXTURES / "gpt-oss-120b.json")
    assert (oss.glu_limit, oss.expert_bias, oss.yarn_rope) == (7.0, True, True)
    # DeepSeek-V3's YaRN is MLA's own; Llama 3.1's rope_type is "llama3"
    for name in ("deepseek-v3", "llama3.1-405b", "qwen3-30b-a3b"):
        spec = load_hf_config(FIXTURES / f"{name}.json")
        assert (spec.glu_limit, spec.expert_bias, spec.yarn_rope) == (0.0, False, False)


@pytest.mark.parametrize(("change", "message"), [
    ({"glu_limit": -1.0}, "glu_limit"),
    ({"glu_limit": float("nan")}, "glu_limit"),
    ({"glu_limit": 7.0, "mlp_activation": "gelu"}, "not gated"),
    ({"expert_bias": True, "moe": None}, "expert_bias needs routed experts"),
    ({"yarn_rope": 1}, "yarn_rope"),
])
def test_bad_feature_values_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        replace(PLAIN, **change)


def test_yarn_on_mla_is_refused() -> None:
    with pytest.raises(SpecError, match="MLA"):
        replace(get_preset("deepseek-v3"), yarn_rope=True)


def test_a_model_file_keeps_the_features(tmp_path: Path) -> None:
    import json

    from parsearch.model.files import load_model_file, model_to_dict

    path = tmp_path / "oss.json"
    path.write_text(json.dumps(model_to_dict(OSS)))
    assert load_model_file(path) == OSS
    data = model_to_dict(OSS)
    data["expert_bias"] = "yes"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="expert_bias"):
        load_model_file(path)
