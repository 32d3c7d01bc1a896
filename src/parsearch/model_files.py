"""Load a :class:`ModelSpec` from a HF ``config.json``, a parsearch model file or a preset.

Every problem is a :class:`SpecError` with one line of text that names the
file and, where there is one, the key; no ``KeyError``/``TypeError``/
``ValueError`` escapes.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from parsearch.errors import SpecError
from parsearch.presets import PRESETS, get_preset
from parsearch.workload import MAX_SIZES, MlaSpec, ModelSpec, MoeSpec, short_repr

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


# --------------------------------------------------------------------------- reading files


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


#: Largest model file read (a config.json is a few kB; this keeps a stray large file out).
MAX_FILE_BYTES = 16 * 2**20
#: Deepest nesting of lists/mappings accepted in a model file (real configs nest 3 deep).
MAX_NESTING = 64


def _read_text(path: Path) -> str:
    if not path.exists():
        raise SpecError(f"model file not found: {path}")
    if not path.is_file():
        raise SpecError(f"model file {path} is not a regular file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError(f"model file {path} is {size:,} bytes, over the largest accepted "
                            f"size of {MAX_FILE_BYTES:,} bytes; is it a config.json?")
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read model file {path}: {_one_line(exc.strerror or exc)}") \
            from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"model file {path} is not UTF-8 text (byte {exc.start}: "
                        f"{exc.reason}); save it as UTF-8 JSON or YAML") from None


def _nesting(text: str) -> int:
    """Deepest bracket nesting of ``text`` (an upper bound for JSON and flow-style YAML)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def _parse(path: Path) -> dict[str, Any]:
    """Parse ``path`` as JSON (``.json``) or YAML (otherwise); the top level must be a mapping."""
    text = _read_text(path)
    if _nesting(text) > MAX_NESTING:
        raise SpecError(f"{path}: lists or mappings nested deeper than {MAX_NESTING} levels; "
                        "a model config is a flat mapping")
    data: object
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(
                f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            ) from exc
        except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
            raise SpecError(f"{path}: invalid JSON: {_one_line(str(exc))[:200]}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise SpecError(f"{path}: invalid YAML{where}: {_one_line(problem)}") from exc
        except (ValueError, RecursionError) as exc:
            raise SpecError(f"{path}: invalid YAML: {_one_line(str(exc))[:200]}") from None
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: expected a mapping of keys to values at the top level, "
            f"got {type(data).__name__}"
        )
    return data


def _is_hf_config(data: Config) -> bool:
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
    }


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
        if "head_dim" not in fields:
            fields["head_dim"] = _head_dim(r, fields["hidden_size"], fields["num_attention_heads"])
        return ModelSpec(name=name, norm="rmsnorm", source=f"{where} ({family})", **fields)
    except SpecError as exc:
        raise SpecError(_with_where(str(exc), where)) from exc
    except (KeyError, TypeError, ValueError) as exc:  # defensive: never leak a traceback
        raise SpecError(f"{where}: invalid config: {_one_line(str(exc))}") from exc


def _with_where(message: str, where: str) -> str:
    return message if message.startswith(where) else f"{where}: {message}"


def _default_name(path: Path) -> str:
    return path.parent.name if path.stem == "config" and path.parent.name else path.stem


def load_hf_config(path: str | Path) -> ModelSpec:
    """Load a Hugging Face ``config.json`` (llama, mistral, mixtral, qwen2/3(-moe), deepseek_v3,
    kimi_k2, gpt_oss)."""
    path = Path(path)
    data = _parse(path)
    return hf_config_to_spec(data, _default_name(path), str(path))


# --------------------------------------------------------------------------- parsearch model files

_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelSpec)}


def _check_keys(data: Config, allowed: set[str], where: str, prefix: str = "") -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"; did you mean {prefix}{close[0]!r}?" if close else ""
            raise SpecError(f"{where}: unknown key {prefix}{key!r}{hint}")


def _required(cls: type) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _sub_spec(data: Config, key: str, where: str, cls: type) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SpecError(f"{where}: key {key!r} = {value!r}: expected a mapping")
    _check_keys(value, {f.name for f in dataclasses.fields(cls)}, where, prefix=f"{key}.")
    for name in _required(cls):
        if name not in value:
            raise SpecError(f"{where}: missing key '{key}.{name}'")
    return dict(value)


def model_file_to_spec(data: Config, name: str, where: str) -> ModelSpec:
    """Build a :class:`ModelSpec` from parsearch's own model-file mapping."""
    _check_keys(data, _MODEL_FIELDS, where)
    fields = dict(data)
    fields.setdefault("name", name)
    for key in ("tied_embeddings", "qkv_bias"):
        if key in fields and not isinstance(fields[key], bool):
            raise SpecError(f"{where}: key {key!r} = {fields[key]!r}: expected true or false")
    for key in ("name", "source", "mlp_activation", "norm"):
        if key in fields and not isinstance(fields[key], str):
            raise SpecError(f"{where}: key {key!r} = {fields[key]!r}: expected a string")
    try:
        moe = _sub_spec(data, "moe", where, MoeSpec)
        mla = _sub_spec(data, "mla", where, MlaSpec)
        fields["moe"] = MoeSpec(**moe) if moe is not None else None
        fields["mla"] = MlaSpec(**mla) if mla is not None else None
        _fill_defaults(fields, where)
        return ModelSpec(**fields)
    except SpecError as exc:
        raise SpecError(_with_where(str(exc), where)) from exc
    except (KeyError, TypeError, ValueError) as exc:  # defensive: never leak a traceback
        raise SpecError(f"{where}: invalid model file: {_one_line(str(exc))}") from exc


def _fill_defaults(fields: dict[str, Any], where: str) -> None:
    """Defaults a model file may omit: MHA groups, head_dim = h/a, ffn of an all-MoE model."""
    for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        if key not in fields:
            raise SpecError(f"{where}: missing key {key!r}")
    heads = fields["num_attention_heads"]
    fields.setdefault("num_query_groups", heads)
    if "head_dim" not in fields:
        hidden = fields["hidden_size"]
        if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
            fields["head_dim"] = hidden // heads
        else:
            raise SpecError(f"{where}: missing key 'head_dim' (hidden_size / heads is not whole)")
    moe = fields.get("moe")
    if "ffn_hidden_size" not in fields:
        if moe is None or moe.first_k_dense > 0 or moe.layer_freq > 1:
            raise SpecError(f"{where}: missing key 'ffn_hidden_size'")
        fields["ffn_hidden_size"] = moe.expert_ffn_hidden_size


def load_model_file(path: str | Path) -> ModelSpec:
    """Load parsearch's own model file: YAML or JSON with :class:`ModelSpec` field names."""
    path = Path(path)
    data = _parse(path)
    return model_file_to_spec(data, _default_name(path), str(path))


def model_to_dict(model: ModelSpec) -> dict[str, Any]:
    """The model-file mapping of ``model`` (inverse of :func:`load_model_file`)."""
    return dataclasses.asdict(model)


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name, else a file: an HF config if it has ``model_type``/``architectures``."""
    key = name_or_path.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path)
    if not path.exists():
        looks_like_path = path.suffix.lower() in {".json", ".yaml", ".yml"} or "/" in name_or_path
        if looks_like_path:
            raise SpecError(
                f"model file not found: {path} (nor is it a preset; `parsearch models` lists them)"
            )
        get_preset(name_or_path)  # raises the unknown-preset error with suggestions
    data = _parse(path)
    if _is_hf_config(data):
        return hf_config_to_spec(data, _default_name(path), str(path))
    return model_file_to_spec(data, _default_name(path), str(path))
