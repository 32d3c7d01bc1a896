"""Map a Hugging Face ``config.json`` to a :class:`ModelSpec`.

Families: llama, mistral, mixtral, qwen2/3 (and their MoE variants), deepseek_v3,
kimi_k2, gpt_oss.  Every problem is a :class:`SpecError` with one line of text that
names the file and the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from parsearch.errors import SpecError
from parsearch.model.config_text import one_line, parse_mapping_file
from parsearch.model.specs import MAX_SIZES, MlaSpec, ModelSpec, MoeSpec, short_repr

Config = Mapping[str, Any]

# HF ``architectures`` entries, for configs that lack ``model_type``.
_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "KimiK2ForCausalLM": "kimi_k2",
    "GptOssForCausalLM": "gpt_oss",
}
# Families whose attention has a QKV bias unless ``attention_bias`` says otherwise.
_QKV_BIAS_DEFAULT = frozenset({"qwen2", "qwen2_moe", "gpt_oss"})
_GATED_ACTIVATIONS = frozenset({"silu", "swish", "swiglu"})


def is_hf_config(data: Config) -> bool:
    """Whether a parsed mapping is a Hugging Face config (it names its model type)."""
    return "model_type" in data or "architectures" in data



# --------------------------------------------------------------------------- typed access

# HF config keys and the ModelSpec field whose bound (workload.MAX_SIZES) they obey.
_HF_SIZE_NAMES: dict[str, str] = {
    "num_hidden_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "moe_intermediate_size": "expert_ffn_hidden_size",
    "shared_expert_intermediate_size": "shared_expert_ffn_hidden_size",
    "num_key_value_heads": "num_query_groups",
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "top_k",
    "n_shared_experts": "num_experts",
    "first_k_dense_replace": "first_k_dense",
    "moe_layer_freq": "layer_freq",
    "decoder_sparse_step": "layer_freq",
    "num_nextn_predict_layers": "mtp_layers",
}
_MAX_OTHER_INT = 2**31 - 1


class _Reader:
    """Typed access to the keys of one config, with errors that name the key and the file."""

    def __init__(self, data: Config, where: str) -> None:
        self.data = data
        self.where = where

    def _bad(self, key: str, value: object, expected: str) -> SpecError:
        return SpecError(f"{self.where}: key {key!r} = {short_repr(value)}: expected {expected}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get_int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise SpecError(f"{self.where}: missing key {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self._bad(key, value, "an integer")
        if value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self._bad(key, value, kind)
        bound = MAX_SIZES.get(_HF_SIZE_NAMES.get(key, key), _MAX_OTHER_INT)
        if value > bound:
            raise SpecError(f"{self.where}: key {key!r} = {short_repr(value)} exceeds the largest "
                            f"supported value, {bound:,}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def get_str(self, key: str, default: str) -> str:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._bad(key, value, "a string")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self._bad(key, value, "a list of layer indices")
        return list(value)


# --------------------------------------------------------------------------- Hugging Face configs


def _moe_pattern(is_moe: list[bool], reader: _Reader, key: str) -> tuple[int, int]:
    """Express per-layer MoE flags as ``(first_k_dense, layer_freq)``, else raise naming ``key``.

    The first MoE layer fixes ``first_k_dense`` and the gap to the next one
    the frequency (one MoE layer: the smallest frequency that reaches past
    the last layer); one pass then checks every layer.
    """
    n = len(is_moe)
    moe_layers = [i for i, flag in enumerate(is_moe) if flag]
    if moe_layers:
        first_k = moe_layers[0]
        freq = moe_layers[1] - first_k if len(moe_layers) > 1 else max(1, n - first_k)
        if all(is_moe[i] == (i >= first_k and (i - first_k) % freq == 0) for i in range(n)):
            return first_k, freq
    raise SpecError(
        f"{reader.where}: key {key!r} gives MoE layers {short_repr(moe_layers)}, which "
        "parsearch cannot express as first-k-dense plus a frequency"
    )


def _attention_fields(r: _Reader, family: str) -> dict[str, Any]:
    heads = r.get_int("num_attention_heads")
    return {
        "num_layers": r.get_int("num_hidden_layers"),
        "hidden_size": r.get_int("hidden_size"),
        "num_attention_heads": heads,
        "num_query_groups": r.get_int("num_key_value_heads", heads),
        "vocab_size": r.get_int("vocab_size"),
        "tied_embeddings": r.get_bool("tie_word_embeddings", False),
        "qkv_bias": r.get_bool("attention_bias", family in _QKV_BIAS_DEFAULT),
        **_sliding_window(r),
    }


def _sliding_window(r: _Reader) -> dict[str, int]:
    """``sliding_window`` in tokens (null or 0: none; ``use_sliding_window: false``: off,
    Qwen2/3) and the layers using it: those ``layer_types`` marks ``sliding_attention``
    (GPT-OSS), else every layer (Mistral 7B v0.1) -- transformers' ``configuration_*.py``."""
    window = r.data.get("sliding_window")
    if window in (None, 0) or r.data.get("use_sliding_window") is False:
        return {}
    size = r.get_int("sliding_window")
    types = r.data.get("layer_types")
    if types is None:
        return {"sliding_window": size, "sliding_window_layers": r.get_int("num_hidden_layers")}
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise r._bad("layer_types", types, "a list of layer types")
    windowed = sum(1 for t in types if t == "sliding_attention")
    return {"sliding_window": size, "sliding_window_layers": windowed} if windowed else {}


#: Families whose attention is MLA: their YaRN lives in the MLA rotary embedding.
_MLA_FAMILIES = frozenset({"deepseek_v3", "kimi_k2"})


def _unfused_features(r: _Reader, family: str) -> dict[str, Any]:
    """``glu_limit`` (``swiglu_limit``: GPT-OSS clamps the gate at 7.0 and the linear half to
    +-7.0), ``expert_bias`` (transformers' ``GptOssExperts`` always holds
    ``gate_up_proj_bias`` and ``down_proj_bias``) and ``yarn_rope`` (``rope_scaling`` of
    type ``yarn`` on standard attention) -- see :mod:`parsearch.cost.unfused_ops`."""
    out: dict[str, Any] = {}
    limit = r.data.get("swiglu_limit")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int | float) or limit < 0:
            raise r._bad("swiglu_limit", limit, "a number >= 0")
        out["glu_limit"] = float(limit)
    if family == "gpt_oss":
        out["expert_bias"] = True
    scaling = r.data.get("rope_scaling")
    if isinstance(scaling, dict) and family not in _MLA_FAMILIES:
        kind = scaling.get("rope_type", scaling.get("type"))
        out["yarn_rope"] = kind == "yarn"
    elif scaling is not None and not isinstance(scaling, dict):
        raise r._bad("rope_scaling", scaling, "a mapping or null")
    # a quantized release that leaves attention out of its quantization (openai/gpt-oss:
    # quant_method mxfp4, modules_to_not_convert "model.layers.*.self_attn")
    quant = r.data.get("quantization_config")
    if isinstance(quant, dict):
        skipped = quant.get("modules_to_not_convert")
        if isinstance(skipped, list) and any(isinstance(m, str) and "self_attn" in m
                                             for m in skipped):
            out["attention_unquantized"] = True
    return out


def _head_dim(r: _Reader, hidden: int, heads: int) -> int:
    """``head_dim`` if given (may differ from h/a: Qwen3, GPT-OSS), else hidden / heads."""
    if r.has("head_dim"):
        return r.get_int("head_dim")
    if hidden % heads:
        raise SpecError(
            f"{r.where}: key 'head_dim' is missing and hidden_size={hidden} is not a multiple "
            f"of num_attention_heads={heads}"
        )
    return hidden // heads


def _activation(r: _Reader, family: str) -> str:
    act = r.get_str("hidden_act", "silu")
    if act not in _GATED_ACTIVATIONS:
        raise SpecError(
            f"{r.where}: key 'hidden_act' = {act!r}: expected one of "
            f"{', '.join(sorted(_GATED_ACTIVATIONS))} (gated MLP of the {family} family)"
        )
    return "swiglu"


def _dense(r: _Reader, family: str) -> dict[str, Any]:
    return {"ffn_hidden_size": r.get_int("intermediate_size")}


def _mixtral_like(r: _Reader, family: str) -> dict[str, Any]:
    # Mixtral / GPT-OSS: every layer is MoE; intermediate_size is the expert width.
    expert = r.get_int("intermediate_size")
    moe = MoeSpec(
        num_experts=r.get_int("num_local_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        expert_ffn_hidden_size=expert,
    )
    return {"ffn_hidden_size": expert, "moe": moe}


def _qwen_moe(r: _Reader, family: str) -> dict[str, Any]:
    # HF Qwen2MoE/Qwen3MoE: layer i is MoE iff i not in mlp_only_layers and
    # (i + 1) % decoder_sparse_step == 0.
    layers = r.get_int("num_hidden_layers")
    step = r.get_int("decoder_sparse_step", 1)
    dense_only = set(r.int_list("mlp_only_layers"))
    is_moe = [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]
    key = "mlp_only_layers" if dense_only else "decoder_sparse_step"
    first_k, freq = _moe_pattern(is_moe, r, key)
    expert = r.get_int("moe_intermediate_size")
    moe = MoeSpec(
        num_experts=r.get_int("num_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        expert_ffn_hidden_size=expert,
        shared_expert_ffn_hidden_size=r.get_int("shared_expert_intermediate_size", 0, minimum=0),
        first_k_dense=first_k,
        layer_freq=freq,
    )
    return {"ffn_hidden_size": r.get_int("intermediate_size", expert), "moe": moe}


def _group_limit(r: _Reader) -> dict[str, int]:
    """Group-limited routing of a DeepSeek-style config (``n_group`` / ``topk_group``;
    ``topk_method: greedy`` ignores the groups)."""
    groups = r.get_int("n_group", 1)
    chosen = r.get_int("topk_group", groups)
    if groups <= 1 or r.data.get("topk_method") == "greedy":
        return {}
    return {"router_num_groups": groups, "router_group_topk": chosen}


def _deepseek(r: _Reader, family: str) -> dict[str, Any]:
    # HF DeepseekV3: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0.
    layers = r.get_int("num_hidden_layers")
    first = r.get_int("first_k_dense_replace", 0, minimum=0)
    freq = r.get_int("moe_layer_freq", 1)
    is_moe = [i >= first and i % freq == 0 for i in range(layers)]
    first_k, layer_freq = _moe_pattern(is_moe, r, "moe_layer_freq")
    expert = r.get_int("moe_intermediate_size")
    moe = MoeSpec(
        num_experts=r.get_int("n_routed_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        expert_ffn_hidden_size=expert,
        shared_expert_ffn_hidden_size=r.get_int("n_shared_experts", 0, minimum=0) * expert,
        first_k_dense=first_k,
        layer_freq=layer_freq,
        **_group_limit(r),
    )
    mla = MlaSpec(
        kv_lora_rank=r.get_int("kv_lora_rank"),
        qk_nope_head_dim=r.get_int("qk_nope_head_dim"),
        qk_rope_head_dim=r.get_int("qk_rope_head_dim"),
        v_head_dim=r.get_int("v_head_dim"),
        q_lora_rank=r.get_int("q_lora_rank", 0, minimum=0),
    )
    heads = r.get_int("num_attention_heads")
    return {
        "ffn_hidden_size": r.get_int("intermediate_size"),
        "moe": moe,
        "mla": mla,
        "mtp_layers": r.get_int("num_nextn_predict_layers", 0, minimum=0),
        # MLA: every head has its own K/V; head_dim is the value head size (MCORE kv_channels).
        "num_query_groups": heads,
        "head_dim": mla.v_head_dim,
        "qkv_bias": False,
    }


_FAMILIES: dict[str, Callable[[_Reader, str], dict[str, Any]]] = {
    "llama": _dense,
    "mistral": _dense,
    "qwen2": _dense,
    "qwen3": _dense,
    "mixtral": _mixtral_like,
    "gpt_oss": _mixtral_like,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def _family(r: _Reader) -> str:
    model_type = r.data.get("model_type")
    if model_type is None:
        archs = r.data.get("architectures")
        if not isinstance(archs, list) or not archs:
            raise SpecError(f"{r.where}: key 'architectures' = {archs!r}: expected a list")
        known = [_ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in _ARCHITECTURES]
        if not known:
            raise SpecError(
                f"{r.where}: unsupported architecture {archs[0]!r}; supported: "
                f"{', '.join(sorted(_ARCHITECTURES))}"
            )
        return known[0]
    if not isinstance(model_type, str):
        raise SpecError(f"{r.where}: key 'model_type' = {model_type!r}: expected a string")
    if model_type not in _FAMILIES:
        raise SpecError(
            f"{r.where}: unsupported model_type {model_type!r}; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return model_type


def hf_config_to_spec(data: Config, name: str, where: str) -> ModelSpec:
    """Map a parsed HF ``config.json`` to a :class:`ModelSpec` (``where`` names it in errors)."""
    r = _Reader(data, where)
    family = _family(r)
    try:
        fields = _attention_fields(r, family)
        fields["mlp_activation"] = _activation(r, family)
        fields.update(_FAMILIES[family](r, family))
        fields.update(_unfused_features(r, family))
        if "head_dim" not in fields:
            fields["head_dim"] = _head_dim(r, fields["hidden_size"], fields["num_attention_heads"])
        return ModelSpec(name=name, norm="rmsnorm", source=f"{where} ({family})", **fields)
    except SpecError as exc:
        raise SpecError(with_where(str(exc), where)) from exc
    except (KeyError, TypeError, ValueError) as exc:  # defensive: never leak a traceback
        raise SpecError(f"{where}: invalid config: {one_line(str(exc))}") from exc


def with_where(message: str, where: str) -> str:
    return message if message.startswith(where) else f"{where}: {message}"


def default_name(path: Path) -> str:
    return path.parent.name if path.stem == "config" and path.parent.name else path.stem


def load_hf_config(path: str | Path) -> ModelSpec:
    """Load a Hugging Face ``config.json`` (llama, mistral, mixtral, qwen2/3(-moe), deepseek_v3,
    kimi_k2, gpt_oss)."""
    path = Path(path)
    data = parse_mapping_file(path)
    return hf_config_to_spec(data, default_name(path), str(path))

