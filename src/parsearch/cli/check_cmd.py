"""``parsearch check``: is one layout valid, and if not, which rules does it break."""

from __future__ import annotations

import argparse

from parsearch.cli.common import (
    add_format_option,
    add_model_option,
    add_training_options,
    layout_from_args,
    model_from_args,
    positive_int,
    print_json,
    training_from_args,
)
from parsearch.layout.rules import check_layout


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check", help="check one layout against the layout rules",
        description="Say whether a layout is valid for a model on N GPUs, or list every rule "
        "it breaks with the values that break it. Exits 0 when valid, 1 when not.",
    )
    add_model_option(parser)
    parser.add_argument("--gpus", type=positive_int, required=True, metavar="N")
    parser.add_argument("--layout", required=True, metavar="L",
                        help='e.g. "tp=8,pp=4,cp=1,ep=1,etp=1,vpp=1,mbs=1,sp=true,'
                        'recompute=selective"')
    add_training_options(parser)
    add_format_option(parser, ("text", "json"))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    training = training_from_args(args)
    layout = layout_from_args(args)
    violations = check_layout(model, training, layout)
    if args.format == "json":
        print_json({
            "layout": layout.to_dict(moe=model.is_moe),
            "num_gpus": layout.num_gpus,
            "valid": not violations,
            "violations": [
                {"rule": v.rule, "name": v.name, "message": v.message} for v in violations
            ],
        })
    elif violations:
        print(f"invalid: {layout.key()} on {layout.num_gpus} GPUs breaks "
              f"{len(violations)} rule(s):")
        for violation in violations:
            print(f"  {violation}")
    else:
        print(f"valid: {layout.key()} on {layout.num_gpus} GPUs "
              f"(dp={layout.dp}, edp={layout.to_dict(moe=model.is_moe)['edp']}, "
              f"min_gpus={layout.min_gpus})")
    return 1 if violations else 0
