"""``parsearch models``: the model presets, one line each."""

from __future__ import annotations

import argparse

from parsearch.cli.common import add_format_option, print_json, print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models", help="list the model presets",
        description="List the built-in model presets with their size and source.",
    )
    add_format_option(parser, ("table", "json"))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from parsearch.model.params import parameter_counts
    from parsearch.model.presets import PRESETS

    rows = []
    for name, model in PRESETS.items():
        counts = parameter_counts(model)
        rows.append({
            "name": name,
            "kind": "moe" if model.is_moe else "dense",
            "layers": model.num_layers,
            "hidden": model.hidden_size,
            "total_params_b": round(counts.total / 1e9, 2),
            "active_params_b": round(counts.active / 1e9, 2),
            "source": model.source,
        })
    if args.format == "json":
        print_json({"models": rows})
    else:
        print_table(
            ("name", "kind", "layers", "hidden", "total (B)", "active (B)", "source"),
            [tuple(r.values()) for r in rows],
        )
    return 0
