"""Loading models: HF config.json fixtures, parsearch model files, presets, error messages."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from parsearch.errors import SpecError
from parsearch.model.files import (
    SUPPORTED_MODEL_TYPES,
    load_hf_config,
    load_model_file,
    model_to_dict,
    resolve_model,
)
from parsearch.model.params import parameter_counts
from parsearch.model.presets import PRESETS
from parsearch.model.specs import ModelSpec

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
WITH_PRESET = sorted(p.stem for p in FIXTURES.glob("*.json") if p.stem in PRESETS)


def _hf(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def _write_json(tmp_path: Path, data: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _error(target: str | Path, loader: Any = resolve_model) -> str:
    with pytest.raises(SpecError) as err:
        loader(str(target))
    message = str(err.value)
    assert "\n" not in message, message
    return message


# ----------------------------------------------------------------------------- HF configs


def test_fixture_set_covers_every_preset_family() -> None:
    assert set(WITH_PRESET) >= {
        "llama3-8b",
        "llama3-70b",
        "llama3.1-405b",
        "mixtral-8x7b",
        "mixtral-8x22b",
        "qwen2-57b-a14b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v3",
        "kimi-k2",
        "gpt-oss-120b",
    }


@pytest.mark.parametrize("name", WITH_PRESET)
def test_hf_fixture_equals_preset(name: str) -> None:
    loaded = load_hf_config(FIXTURES / f"{name}.json")
    preset = PRESETS[name]
    assert loaded.name == name
    assert dataclasses.replace(loaded, source=preset.source) == preset
    assert parameter_counts(loaded) == parameter_counts(preset)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("mistral-7b", 7.25e9),  # HF hub safetensors count, mistralai/Mistral-7B-v0.3
        ("qwen2-7b", 7.62e9),  # HF hub safetensors count, Qwen/Qwen2-7B
        ("qwen3-8b", 8.2e9),  # Qwen/Qwen3-8B model card, "Number of Parameters: 8.2B"
    ],
)
def test_hf_fixture_without_preset(name: str, published: float) -> None:
    counts = parameter_counts(load_hf_config(FIXTURES / f"{name}.json"))
    assert counts.active == counts.total
    assert math.isclose(counts.total, published, rel_tol=0.01)


def test_hf_family_details() -> None:
    assert load_hf_config(FIXTURES / "qwen2-7b.json").qkv_bias  # Qwen2 default
    assert not load_hf_config(FIXTURES / "qwen3-8b.json").qkv_bias
    oss = load_hf_config(FIXTURES / "gpt-oss-120b.json")
    assert (oss.head_dim, oss.qkv_bias) == (64, True)
    kimi = load_hf_config(FIXTURES / "kimi-k2.json")
    assert kimi.mla is not None and kimi.moe is not None and kimi.moe.first_k_dense == 1


def test_hf_defaults_head_dim_kv_heads_and_tied(tmp_path: Path) -> None:
    data = _hf("llama3-8b")
    del data["num_key_value_heads"]
    data.pop("head_dim", None)
    data["tie_word_embeddings"] = True
    spec = load_hf_config(_write_json(tmp_path, data))
    assert spec.name == tmp_path.name  # config.json takes its folder's name
    assert (spec.num_query_groups, spec.head_dim, spec.tied_embeddings) == (32, 128, True)
    assert parameter_counts(spec).output == 0


def test_hf_architectures_without_model_type(tmp_path: Path) -> None:
    data = _hf("mixtral-8x7b")
    del data["model_type"]
    spec = load_hf_config(_write_json(tmp_path, data, "m.json"))
    assert spec.moe is not None and spec.moe.num_experts == 8


def test_hf_qwen_sparse_step_and_mlp_only_layers(tmp_path: Path) -> None:
    data = _hf("qwen3-30b-a3b") | {"num_hidden_layers": 8, "decoder_sparse_step": 2}
    moe = load_hf_config(_write_json(tmp_path, data)).moe
    assert moe is not None and (moe.first_k_dense, moe.layer_freq) == (1, 2)  # layers 1,3,5,7

    data = _hf("qwen3-30b-a3b") | {"num_hidden_layers": 8, "mlp_only_layers": [0, 1]}
    moe = load_hf_config(_write_json(tmp_path, data)).moe
    assert moe is not None and (moe.first_k_dense, moe.layer_freq) == (2, 1)

    data = _hf("qwen3-30b-a3b") | {"num_hidden_layers": 8, "mlp_only_layers": [5]}
    message = _error(_write_json(tmp_path, data), load_hf_config)
    assert "'mlp_only_layers'" in message and "[0, 1, 2, 3, 4, 6, 7]" in message


def test_hf_deepseek_layer_freq_and_null_q_lora(tmp_path: Path) -> None:
    data = _hf("deepseek-v3") | {
        "num_hidden_layers": 10,
        "moe_layer_freq": 2,
        "q_lora_rank": None,
        "n_shared_experts": 2,
        "num_nextn_predict_layers": 0,
    }
    spec = load_hf_config(_write_json(tmp_path, data))
    assert spec.moe is not None and spec.mla is not None
    # HF: MoE iff i >= 3 and i % 2 == 0 -> layers 4, 6, 8
    assert (spec.moe.first_k_dense, spec.moe.layer_freq) == (4, 2)
    assert spec.mla.q_lora_rank == 0
    assert spec.moe.shared_expert_ffn_hidden_size == 2 * 2048
    assert spec.mtp_layers == 0


# ----------------------------------------------------------------------------- own model files


def test_model_file_yaml_round_trip(tmp_path: Path) -> None:
    for name in ("deepseek-v3", "gpt-1.7b", "qwen2-57b-a14b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(model_to_dict(PRESETS[name])))
        assert load_model_file(path) == PRESETS[name]
        assert resolve_model(str(path)) == PRESETS[name]


def test_model_file_json_and_defaults(tmp_path: Path) -> None:
    data = {
        "num_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "vocab_size": 1000,
        "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 512},
    }
    spec = load_model_file(_write_json(tmp_path, data, "toy.json"))
    assert spec == ModelSpec(
        name="toy",
        num_layers=4,
        hidden_size=256,
        ffn_hidden_size=512,
        num_attention_heads=8,
        num_query_groups=8,
        head_dim=32,
        vocab_size=1000,
        moe=spec.moe,
    )


def test_resolve_model_prefers_presets_then_files(tmp_path: Path) -> None:
    assert resolve_model("DeepSeek-V3") is PRESETS["deepseek-v3"]
    hf_as_yaml = tmp_path / "mixtral.yaml"
    hf_as_yaml.write_text(yaml.safe_dump(_hf("mixtral-8x7b")))
    assert (
        parameter_counts(resolve_model(str(hf_as_yaml))).total
        == parameter_counts(PRESETS["mixtral-8x7b"]).total
    )


# ----------------------------------------------------------------------------- error messages


def test_error_unknown_preset_suggests_closest() -> None:
    message = _error("mixtral-8x8b")
    assert "unknown model preset 'mixtral-8x8b'" in message
    assert "did you mean mixtral-8x7b" in message
    assert "parsearch models" in message


def test_error_file_not_found(tmp_path: Path) -> None:
    message = _error(tmp_path / "nope.yaml")
    assert message.startswith("model file not found:") and "nope.yaml" in message
    assert "model file not found" in _error(tmp_path / "nope.json", load_hf_config)


def test_error_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n')
    message = _error(path)
    assert "invalid JSON at line 3, column" in message and "bad.json" in message


def test_error_malformed_yaml_and_non_mapping(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("num_layers: [1, 2\nhidden_size: 3\n")
    assert "invalid YAML at line" in _error(path)
    path.write_text("- 1\n- 2\n")
    assert "expected a mapping" in _error(path)


def test_error_missing_key(tmp_path: Path) -> None:
    data = _hf("llama3-8b")
    del data["hidden_size"]
    path = _write_json(tmp_path, data)
    assert _error(path) == f"{path}: missing key 'hidden_size'"

    path = tmp_path / "own.yaml"
    path.write_text("num_layers: 2\nhidden_size: 8\nnum_attention_heads: 2\n")
    assert _error(path) == f"{path}: missing key 'vocab_size'"
    path.write_text(
        "num_layers: 2\nhidden_size: 8\nnum_attention_heads: 2\nvocab_size: 10\n"
        "moe: {num_experts: 4, expert_ffn_hidden_size: 8}\n"
    )
    assert _error(path) == f"{path}: missing key 'moe.top_k'"


def test_error_wrong_type(tmp_path: Path) -> None:
    path = _write_json(tmp_path, _hf("llama3-8b") | {"num_hidden_layers": "32"})
    message = _error(path)
    assert "'num_hidden_layers'" in message and "'32'" in message and "integer" in message

    path = _write_json(tmp_path, _hf("llama3-8b") | {"tie_word_embeddings": "no"})
    assert "'tie_word_embeddings' = 'no': expected true or false" in _error(path)

    own = tmp_path / "own.yaml"
    own.write_text(
        "num_layers: '2'\nhidden_size: 8\nffn_hidden_size: 16\n"
        "num_attention_heads: 2\nvocab_size: 10\n"
    )
    message = _error(own)
    assert "num_layers" in message and "'2'" in message and "positive integer" in message


def test_error_non_positive_size(tmp_path: Path) -> None:
    path = _write_json(tmp_path, _hf("llama3-8b") | {"intermediate_size": 0})
    message = _error(path)
    assert "'intermediate_size' = 0" in message and "positive integer" in message

    own = tmp_path / "own.yaml"
    own.write_text(
        "num_layers: 2\nhidden_size: -8\nffn_hidden_size: 16\n"
        "num_attention_heads: 2\nvocab_size: 10\n"
    )
    message = _error(own)
    assert "hidden_size" in message and "-8" in message and "positive integer" in message


def test_error_unsupported_architecture(tmp_path: Path) -> None:
    path = _write_json(tmp_path, _hf("llama3-8b") | {"model_type": "gemma2"})
    message = _error(path)
    assert "unsupported model_type 'gemma2'" in message
    for family in SUPPORTED_MODEL_TYPES:
        assert family in message

    data = _hf("llama3-8b")
    del data["model_type"]
    data["architectures"] = ["FalconForCausalLM"]
    assert "unsupported architecture 'FalconForCausalLM'" in _error(_write_json(tmp_path, data))


def test_error_unknown_key_and_bad_activation(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    own.write_text("num_layers: 2\nhiden_size: 8\nnum_attention_heads: 2\nvocab_size: 10\n")
    assert "unknown key 'hiden_size'; did you mean 'hidden_size'?" in _error(own)
    path = _write_json(tmp_path, _hf("llama3-8b") | {"hidden_act": "relu"})
    assert "'hidden_act' = 'relu'" in _error(path)


def test_error_invalid_combination_names_file(tmp_path: Path) -> None:
    path = _write_json(tmp_path, _hf("llama3-8b") | {"num_key_value_heads": 5})
    message = _error(path)
    assert message.startswith(str(path)) and "num_query_groups=5" in message
