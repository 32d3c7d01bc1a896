"""How ``parsearch search`` hands back its shortlist: table, JSON, CSV, JSON lines, launch files.

The launch settings of every entry come from the options the search priced
(:mod:`parsearch.launch`); ``--recipe`` and ``--fp8-recipe`` only choose how
they are spelled (which Bridge recipe to start from, which FP8 scaling).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from typing import Any, TextIO

from parsearch.launch import launch_for_cluster
from parsearch.launch.export import check_export_dir, export_shortlist
from parsearch.search.results import SearchEntry, SearchResult
from parsearch.strict_json import strict_json

SEARCH_FORMATS: tuple[str, ...] = ("table", "json", "csv", "jsonl")
CSV_COLUMNS: tuple[str, ...] = (
    "rank", "key", "tp", "pp", "cp", "ep", "etp", "vpp", "dp", "mbs", "sp", "recompute",
    "tokens_per_s", "tokens_per_s_per_gpu", "step_time_s", "mfu", "memory_gib_per_gpu",
    "headroom_gib_per_gpu", "tied_with_best", "bottleneck", "nodes", "env", "megatron_lm_args",
    "megatron_bridge_overrides",
)


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """``--launch``, ``--export DIR`` and ``--recipe NAME`` (``--fp8-recipe`` is a cost option)."""
    group = parser.add_argument_group("launch settings")
    group.add_argument("--launch", action="store_true",
                       help="table format: also print a ready shell snippet per layout "
                       "(environment, torchrun geometry, Megatron-LM and Bridge lines)")
    group.add_argument("--export", default=None, metavar="DIR",
                       help="write one folder of launch files per listed layout into DIR "
                       "(launch.sh, megatron_lm_args.sh, bridge_overrides.yaml, estimate.json)")
    group.add_argument("--recipe", default=None, metavar="NAME",
                       help="Megatron-Bridge recipe function the overrides start from, "
                       "e.g. llama3_70b_pretrain_32gpu_gb200_bf16_config (checked against "
                       "Bridge v0.6.0)")


def prepare_export(args: argparse.Namespace) -> None:
    """Check ``--export`` and ``--recipe`` before any work starts."""
    if getattr(args, "recipe", None):
        from parsearch.launch.names import check_recipe

        check_recipe(args.recipe)
    if getattr(args, "export", None):
        check_export_dir(args.export)


def with_launch_choices(result: SearchResult, model: Any, training: Any, cluster: Any,
                        options: Any, args: argparse.Namespace) -> SearchResult:
    """``result`` with each entry's launch spelled with ``--recipe`` / ``--fp8-recipe``."""
    if args.recipe is None and args.fp8_recipe == "auto":
        return result
    from parsearch.topology.hardware import load_gpu_profile

    gpu = load_gpu_profile(cluster.gpu)
    entries = tuple(dataclasses.replace(e, launch=launch_for_cluster(
        model, training, e.layout, cluster, options=e.estimate.options or options,
        fp8_recipe=args.fp8_recipe,
        recipe=args.recipe, gpu=gpu)) for e in result.entries)
    return dataclasses.replace(result, entries=entries)


def csv_row(e: SearchEntry) -> dict[str, Any]:
    est, lay, launch = e.estimate, e.layout, e.launch
    return {
        "rank": e.rank, "key": lay.key(), "tp": lay.tp, "pp": lay.pp, "cp": lay.cp,
        "ep": lay.ep, "etp": lay.etp, "vpp": lay.vpp, "dp": lay.dp, "mbs": lay.mbs,
        "sp": lay.sp, "recompute": lay.recompute, "tokens_per_s": est.tokens_per_s,
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu, "step_time_s": est.step_time_s,
        "mfu": est.mfu, "memory_gib_per_gpu": est.memory_bytes["total"] / 2**30,
        "headroom_gib_per_gpu": e.headroom_bytes / 2**30, "tied_with_best": e.tied,
        "bottleneck": est.bottleneck,
        "nodes": launch.nodes,
        "env": " ".join(f"{k}={v}" for k, v in launch.env),
        "megatron_lm_args": launch.command_line(),
        "megatron_bridge_overrides": launch.bridge_command_line(),
    }


def write_csv(result: SearchResult, out: TextIO) -> None:
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for e in result.entries:
        row = strict_json(csv_row(e))
        row.pop("null_reasons", None)  # a CSV cell left empty says it was not computed
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def write_jsonl(result: SearchResult, out: TextIO) -> None:
    for e in result.entries:
        out.write(json.dumps(strict_json(e.to_dict()), allow_nan=False) + "\n")


def print_launch(result: SearchResult) -> None:
    for e in result.entries:
        print(f"\n#{e.rank} {e.layout.key()} on {e.launch.nodes} nodes "
              f"({e.launch.num_gpus} GPUs)")
        for flag in e.flags:  # soft rules it breaks, pinned features it runs without
            print(f"# note: {flag}")
        print(e.launch.shell_snippet())


def export(result: SearchResult, folder: str) -> None:
    model = result.query.get("model", "model")
    items = [(f"{e.rank:02d}-{e.layout.key()}",
              f"{model} on {result.query.get('cluster')}, rank {e.rank}: {e.layout.key()}",
              e.launch, e.to_dict()) for e in result.entries]
    written = export_shortlist(check_export_dir(folder), items)
    print(f"wrote launch files for {len(written)} layouts to {folder}", file=sys.stderr)


__all__ = ["SEARCH_FORMATS", "add_launch_options", "export", "prepare_export", "print_launch",
           "with_launch_choices", "write_csv", "write_jsonl"]
