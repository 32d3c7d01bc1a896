"""Load a :class:`ModelSpec` from a HF ``config.json``, a parsearch model file or a preset.

Every problem is a :class:`SpecError` with one line of text that names the
file and, where there is one, the key; no ``KeyError``/``TypeError``/
``ValueError`` escapes.  Hugging Face configs are mapped in
:mod:`parsearch.model.hf_config`; this module reads parsearch's own model files
and resolves a name or path.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parsearch.errors import SpecError
from parsearch.files import path_exists
from parsearch.model.config_text import one_line, parse_mapping_file
from parsearch.model.hf_config import (
    SUPPORTED_MODEL_TYPES,
    default_name,
    hf_config_to_spec,
    is_hf_config,
    load_hf_config,
    with_where,
)
from parsearch.model.presets import PRESETS, get_preset
from parsearch.model.specs import MlaSpec, ModelSpec, MoeSpec

__all__ = ["SUPPORTED_MODEL_TYPES", "hf_config_to_spec", "load_hf_config", "load_model_file",
           "model_file_to_spec", "model_to_dict", "resolve_model"]

Config = Mapping[str, Any]


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
    for key in ("tied_embeddings", "qkv_bias", "expert_bias", "yarn_rope",
                "attention_unquantized"):
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
        raise SpecError(with_where(str(exc), where)) from exc
    except (KeyError, TypeError, ValueError) as exc:  # defensive: never leak a traceback
        raise SpecError(f"{where}: invalid model file: {one_line(str(exc))}") from exc


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
    data = parse_mapping_file(path)
    return model_file_to_spec(data, default_name(path), str(path))


def model_to_dict(model: ModelSpec) -> dict[str, Any]:
    """The model-file mapping of ``model`` (inverse of :func:`load_model_file`)."""
    return dataclasses.asdict(model)


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name, else a file: an HF config if it has ``model_type``/``architectures``."""
    key = name_or_path.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path)
    if not path_exists(path):
        looks_like_path = path.suffix.lower() in {".json", ".yaml", ".yml"} or "/" in name_or_path
        if looks_like_path:
            raise SpecError(
                f"model file not found: {path} (nor is it a preset; `parsearch models` lists them)"
            )
        get_preset(name_or_path)  # raises the unknown-preset error with suggestions
    data = parse_mapping_file(path)
    if is_hf_config(data):
        return hf_config_to_spec(data, default_name(path), str(path))
    return model_file_to_spec(data, default_name(path), str(path))
