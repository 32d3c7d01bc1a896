"""``parsearch layouts``: every valid layout of a model on N GPUs."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from parsearch.cli.common import (
    add_format_option,
    add_model_option,
    add_training_options,
    model_from_args,
    positive_int,
    training_from_args,
)
from parsearch.layout import min_gpus_for
from parsearch.layout.space import LayoutTable, require_layouts
from parsearch.model.specs import RECOMPUTE_MODES

_FIELDS = ("tp", "pp", "cp", "ep", "etp", "vpp", "dp", "edp", "mbs", "sp", "recompute",
           "min_gpus")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "layouts", help="list every valid layout",
        description="List every layout (tp, pp, cp, ep, etp, vpp, mbs, sp, recompute) that "
        "satisfies the layout rules for a model on N GPUs.",
    )
    add_model_option(parser)
    parser.add_argument("--gpus", type=positive_int, required=True, metavar="N",
                        help="number of GPUs (world size)")
    add_training_options(parser)
    add_format_option(parser, ("table", "jsonl", "csv"))
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="print at most this many layouts (the count is still reported)")
    parser.set_defaults(handler=run)


def _sorted_rows(table: LayoutTable) -> np.ndarray:
    c = table.columns
    return np.lexsort(tuple(c[name] for name in reversed(
        ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp", "recompute"))))


def run(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    training = training_from_args(args)
    table = require_layouts(model, training, args.gpus)
    order = _sorted_rows(table)
    if args.limit is not None:
        order = order[: args.limit]
    c = table.columns
    out = sys.stdout
    if args.format == "csv":
        out.write(",".join(_FIELDS) + "\n")
    elif args.format == "table":
        out.write(" ".join(f"{name:>9}" for name in _FIELDS) + "\n")
    for i in order:
        values = {name: int(c[name][i]) for name in ("tp", "pp", "cp", "ep", "etp", "vpp",
                                                     "dp", "edp", "mbs")}
        values["sp"] = bool(c["sp"][i])
        values["recompute"] = RECOMPUTE_MODES[int(c["recompute"][i])]
        values["min_gpus"] = min_gpus_for(values["tp"], values["cp"], values["pp"],
                                          values["ep"], values["etp"])
        if args.format == "jsonl":
            sp = "true" if values["sp"] else "false"
            out.write(
                '{{"tp": {tp}, "pp": {pp}, "cp": {cp}, "ep": {ep}, "etp": {etp}, "vpp": {vpp}, '
                '"dp": {dp}, "edp": {edp}, "mbs": {mbs}, "sp": {sp}, "recompute": "{recompute}", '
                '"min_gpus": {min_gpus}}}\n'.format(**{**values, "sp": sp})
            )
        elif args.format == "csv":
            out.write(",".join(str(values[name]).lower() if name == "sp" else str(values[name])
                               for name in _FIELDS) + "\n")
        else:
            out.write(" ".join(f"{_text(values[name]):>9}" for name in _FIELDS) + "\n")
    shown = len(order)
    print(f"{len(table)} valid layouts of {model.name} on {args.gpus} GPUs"
          + (f" ({shown} shown)" if shown < len(table) else ""), file=sys.stderr)
    return 0


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
