"""The model of a published run: a preset when one matches its name, else the row's columns.

:func:`resolve_model` tries the presets a model name maps to (checking them
against the row's architecture columns), then builds a
:class:`~parsearch.model.specs.ModelSpec` from those columns (with cited
public-config fills for blank cells), and otherwise says why there is none.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache

from parsearch.errors import ParsearchError
from parsearch.model.specs import ModelSpec, MoeSpec
from parsearch.validation.published.run_cells import Row, cell_int, cell_text

# Model name (without its parenthesised variant) -> preset names to try, in order.
_PRESET_CANDIDATES: dict[str, tuple[str, ...]] = {
    "LLAMA3_8B": ("llama3-8b",),
    "LLAMA3-8B": ("llama3-8b",),
    "LLAMA3_70B": ("llama3-70b",),
    "DeepSeekV3": ("deepseek-v3",),
    "Qwen3_30B_a3B": ("qwen3-30b-a3b",),
    "Kimi_K2": ("kimi-k2",),
    "Mixtral-8x22B": ("mixtral-8x22b",),
    "Qwen2-57B-A14B": ("qwen2-57b-a14b",),
    "GPT-175B": ("gpt3-175b", "gpt-175b"),
    "GPT-174.6B": ("gpt3-175b", "gpt-174.6b", "gpt-175b"),
    "GPT-22B": ("kor22-22b", "gpt-22b"),
    "GPT-530B": ("mt-nlg-530b", "gpt-529.6b", "gpt-530b"),
    "GPT-529.6B": ("gpt-529.6b", "gpt-530b"),
    "GPT-1008B": ("gpt-1t", "gpt-1008b"),
    "GPT-1T": ("gpt-1t",),
    # Independent references: Llama 3.1 8B/70B keep Llama 3's dimensions (Llama 3 paper Table 3).
    "Llama-3-8B": ("llama3-8b",),
    "Llama-3.1-8B": ("llama3-8b",),
    "Llama-3-70B": ("llama3-70b",),
    "Llama-3.1-70B": ("llama3-70b",),
    "Llama-3.1-405B": ("llama3.1-405b",),
    "DeepSeek-V3": ("deepseek-v3",),
    # Megatron-Bridge verification cards: head_dim != h/a (and gpt-oss's sliding-window
    # layers) are beyond the CSV columns, so these rows need their presets.
    "Qwen3-235B-A22B": ("qwen3-235b-a22b",),
    "gpt-oss-120b": ("gpt-oss-120b",),
    # NVIDIA's DGX Cloud recipes: the squared-ReLU MLP is beyond the CSV columns.
    "Nemotron-4-15B": ("nemotron4-15b",),
    "Nemotron-4-340B": ("nemotron4-340b",),
    "Grok-1": ("grok-1",),
}

# Fields the CSV leaves blank, filled from the model's public config when no
# preset exists (Hugging Face config.json of the named checkpoint).
_PUBLIC_CONFIG_FILLS: dict[str, dict[str, int]] = {
    "LLAMA3_8B": {"vocab_size": 128256},  # meta-llama/Meta-Llama-3-8B
    "LLAMA3-8B": {"vocab_size": 128256},
    "LLAMA3_70B": {"vocab_size": 128256},  # meta-llama/Meta-Llama-3-70B
    "Mixtral-8x22B": {"vocab_size": 32000},  # mistralai/Mixtral-8x22B-v0.1
    "Qwen3_30B_a3B": {"head_dim": 128},  # Qwen/Qwen3-30B-A3B (head_dim != h/a)
}

# Models whose attention is MLA: the CSV columns cannot describe them.
_NEEDS_PRESET: frozenset[str] = frozenset({"DeepSeekV3", "Kimi_K2"})

_VARIANT_RE = re.compile(r"^(?P<base>.*?)\s*\((?P<variant>[^)]*)\)\s*$")


def split_model_name(model: str) -> tuple[str, str | None]:
    """``"DeepSeekV3 (w/o MTP)"`` -> ``("DeepSeekV3", "w/o MTP")``.

    >>> split_model_name("GPT-175B (GPT-3)")
    ('GPT-175B', 'GPT-3')
    >>> split_model_name("LLAMA3_70B")
    ('LLAMA3_70B', None)
    """
    match = _VARIANT_RE.match(model.strip())
    if match is None:
        return model.strip(), None
    return match.group("base"), match.group("variant")


@cache
def _preset(name: str) -> ModelSpec | None:
    """The preset called ``name``, or ``None`` if there is none (or no preset module)."""
    try:
        from parsearch.model.presets import get_preset
    except ModuleNotFoundError as exc:
        if exc.name in ("parsearch.model.presets", "parsearch"):
            return None
        raise
    try:
        return get_preset(name)
    except (ParsearchError, KeyError, ValueError, LookupError):
        return None


def _preset_candidates(base: str) -> tuple[str, ...]:
    if base in _PRESET_CANDIDATES:
        return _PRESET_CANDIDATES[base]
    if base.startswith("GPT-"):
        return (base.lower(),)
    return ()


def _preset_mismatches(spec: ModelSpec, row: Row) -> list[str]:
    """Row architecture columns that contradict the preset (blank cells are not checked)."""
    checks: list[tuple[str, int | None]] = [
        ("num_layers", spec.num_layers),
        ("hidden_size", spec.hidden_size),
        ("num_attention_heads", spec.num_attention_heads),
        ("vocab_size", spec.vocab_size),
    ]
    if spec.mla is None:
        checks.append(("num_query_groups", spec.num_query_groups))
    if spec.moe is None or spec.has_dense_mlp:
        checks.append(("ffn_hidden_size", spec.ffn_hidden_size))
    if spec.moe is not None:
        checks += [
            ("num_experts", spec.moe.num_experts),
            ("moe_topk", spec.moe.top_k),
            ("moe_ffn_hidden_size", spec.moe.expert_ffn_hidden_size),
        ]
    mismatches = []
    for column, value in checks:
        stated = cell_int(row, column)
        if stated is not None and stated != value:
            mismatches.append(f"{column} {stated} vs preset {value}")
    return mismatches


def _apply_variant(spec: ModelSpec, variant: str | None) -> ModelSpec:
    """Model changes a name variant implies (DeepSeek-V3 with / without MTP)."""
    if variant == "w/o MTP":
        return replace(spec, mtp_layers=0)
    if variant == "w/ MTP":
        return replace(spec, mtp_layers=max(1, spec.mtp_layers))
    return spec


def _model_from_columns(row: Row, base: str) -> ModelSpec | None:
    """A :class:`ModelSpec` from the row's architecture columns, or ``None`` if incomplete."""
    fills = _PUBLIC_CONFIG_FILLS.get(base, {})
    values = {
        column: cell_int(row, column) or fills.get(column)
        for column in (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "vocab_size",
        )
    }
    if base in _NEEDS_PRESET or any(v is None for v in values.values()):
        return None
    gpt = base.startswith("GPT-")
    heads = values["num_attention_heads"]
    groups = cell_int(row, "num_query_groups") or (heads if gpt else None)
    if groups is None:
        return None
    moe = _moe_from_columns(row) if cell_text(row, "arch_kind") == "moe" else None
    if cell_text(row, "arch_kind") == "moe" and moe is None:
        return None
    return ModelSpec(
        name=base,
        num_layers=values["num_layers"],
        hidden_size=values["hidden_size"],
        ffn_hidden_size=values["ffn_hidden_size"],
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=fills.get("head_dim", values["hidden_size"] // heads),
        vocab_size=values["vocab_size"],
        tied_embeddings=gpt,
        mlp_activation="gelu" if gpt else "swiglu",
        norm="layernorm" if gpt else "rmsnorm",
        qkv_bias=gpt,
        moe=moe,
        source=f"published_runs.csv row {cell_text(row, 'id')} architecture columns",
    )


def _moe_from_columns(row: Row) -> MoeSpec | None:
    experts = cell_int(row, "num_experts")
    top_k = cell_int(row, "moe_topk")
    expert_ffn = cell_int(row, "moe_ffn_hidden_size")
    shared = cell_int(row, "num_shared_experts")
    if experts is None or top_k is None or expert_ffn is None or shared is None:
        return None
    return MoeSpec(
        num_experts=experts,
        top_k=top_k,
        expert_ffn_hidden_size=expert_ffn,
        shared_expert_ffn_hidden_size=shared * expert_ffn,
    )


def megascale_block(row: Row) -> str | None:
    """Why a MegaScale-method row is not the standard GPT block (``None`` for Megatron-LM)."""
    if not cell_text(row, "notes").startswith("method=MegaScale"):
        return None
    return ("MegaScale's own model block: parallel attention+MLP and sliding-window "
            "attention (MegaScale §3.1, arXiv 2402.15627); the cost model prices the "
            "standard serial block, so only the Megatron-LM baseline rows are scored")


def resolve_model(row: Row) -> tuple[ModelSpec | None, str | None, str | None]:
    """(model, where it came from, why there is none) for one CSV row."""
    base, variant = split_model_name(cell_text(row, "model"))
    if base.startswith("Nemotron_3"):
        return None, None, "architecture unknown (hybrid Mamba: Nemotron 3)"
    disagreement = ""
    for name in _preset_candidates(base):
        spec = _preset(name)
        if spec is None:
            continue
        mismatches = _preset_mismatches(spec, row)
        if not mismatches:
            return _apply_variant(spec, variant), f"preset:{name}", None
        disagreement = f"preset {name} disagrees with row ({'; '.join(mismatches)})"
    spec = _model_from_columns(row, base)
    if spec is not None:
        return spec, "row columns", None
    return None, None, disagreement or f"no preset/arch for {base}"
