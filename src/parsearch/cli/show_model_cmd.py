"""``parsearch show-model M``: what parsearch read from a preset or a config.json.

A user checks the input before trusting a search: every architecture field
the cost model uses, the MoE and MLA blocks, which layers have experts, and
the parameter counts (total, active per token, embedding).
"""

from __future__ import annotations

import argparse
from typing import Any

from parsearch.cli.common import add_format_option, print_json, print_table
from parsearch.model.specs import ModelSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "show-model", help="print what was parsed from a model preset or config.json",
        description="Print the architecture parsearch uses for a model (a preset name or a "
        "Hugging Face config.json path): layers, widths, heads and groups, experts, MLA, "
        "biases, MTP layers and parameter counts — check it before trusting a search.")
    parser.add_argument("model", metavar="M", help="model preset or path to a config.json")
    add_format_option(parser, ("table", "json"))
    parser.set_defaults(handler=run)


def _window(model: ModelSpec) -> str:
    if not model.sliding_window_layers:
        return "none"
    # training prices the windowed layers' attention, serving also their KV cache
    return (f"{model.sliding_window} tokens, {model.sliding_window_layers}/{model.num_layers} "
            "layers")


def model_fields(model: ModelSpec, source: str = "") -> dict[str, Any]:
    """The parsed architecture and its parameter counts, as plain values."""
    from parsearch.model.params import parameter_counts

    counts = parameter_counts(model)
    out: dict[str, Any] = {
        "name": model.name,
        "kind": "moe" if model.is_moe else "dense",
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.num_query_groups,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "tied_embeddings": model.tied_embeddings,
        "mlp_activation": model.mlp_activation,
        "norm": model.norm,
        "qkv_bias": model.qkv_bias,
        "mtp_layers": model.mtp_layers,
        "sliding_window": _window(model),
    }
    if model.moe is not None:
        moe = model.moe
        out.update({
            "moe.num_experts": moe.num_experts, "moe.top_k": moe.top_k,
            "moe.expert_ffn_hidden_size": moe.expert_ffn_hidden_size,
            "moe.shared_expert_ffn_hidden_size": moe.shared_expert_ffn_hidden_size,
            "moe.first_k_dense": moe.first_k_dense, "moe.layer_freq": moe.layer_freq,
            "moe.router_num_groups": moe.router_num_groups,
            "moe.router_group_topk": moe.router_group_topk,
            "moe.layers_with_experts": model.num_moe_layers,
        })
    if model.mla is not None:
        mla = model.mla
        out.update({
            "mla.kv_lora_rank": mla.kv_lora_rank, "mla.q_lora_rank": mla.q_lora_rank,
            "mla.qk_nope_head_dim": mla.qk_nope_head_dim,
            "mla.qk_rope_head_dim": mla.qk_rope_head_dim, "mla.v_head_dim": mla.v_head_dim,
        })
    out.update({
        "params.total_b": round(counts.total / 1e9, 3),
        "params.active_b": round(counts.active / 1e9, 3),
        "params.embedding_b": round(counts.embedding / 1e9, 3),
        "source": model.source,
    })
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,}" if isinstance(value, int) else str(value)


def run(args: argparse.Namespace) -> int:
    from parsearch.model.files import resolve_model

    fields = model_fields(resolve_model(args.model), args.model)
    if args.format == "json":
        print_json(fields)
    else:
        print_table(("field", "value"), [(k, _text(v)) for k, v in fields.items()])
    return 0
