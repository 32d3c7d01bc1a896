"""``parsearch search`` and ``parsearch pareto``: the best layouts, and throughput against GPUs."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from parsearch.cli.common import (
    add_cluster_option,
    add_cost_options,
    add_format_option,
    add_model_option,
    add_training_options,
    cost_model_from_args,
    model_from_args,
    positive_int,
    print_json,
    print_table,
    stack_note,
    training_from_args,
)
from parsearch.cli.search_output import (
    SEARCH_FORMATS,
    add_launch_options,
    export,
    prepare_export,
    print_launch,
    with_launch_choices,
    write_csv,
    write_jsonl,
)
from parsearch.cli.signals import sigterm_as_interrupt
from parsearch.cost.coverage import coverage_note
from parsearch.errors import ParsearchError, SpecError
from parsearch.files import is_file
from parsearch.query import Query
from parsearch.search.api import METHODS
from parsearch.search.results import ParetoResult, SearchResult


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_search(subparsers)
    _register_pareto(subparsers)


def _common(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    add_cluster_option(parser)
    add_training_options(parser)
    add_cost_options(parser)
    add_format_option(parser, ("table", "json"))
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: only when stderr is a terminal)")


def _register_search(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search", help="the best layouts on N GPUs",
        description="Score every valid layout on exactly N GPUs and list the best K that fit "
        "in memory, with their predicted throughput, memory, bottleneck and launch settings.")
    _common(parser)
    parser.add_argument("--gpus", type=positive_int, required=True, metavar="N",
                        help="number of GPUs (world size)")
    parser.add_argument("--top", type=positive_int, default=10, metavar="K",
                        help="how many layouts to list (default 10)")
    parser.add_argument("--diverse", action=argparse.BooleanOptionalAction, default=True,
                        help="at most one layout per (tp, pp, cp, ep, etp) shape: the best of "
                             "its vpp / micro-batch / recompute variants (default; "
                             "--no-diverse lists every variant, which often differ by "
                             "less than the model's error)")
    for action in parser._actions:  # search also writes CSV and JSON lines
        if action.dest == "format":
            action.choices = SEARCH_FORMATS
            action.help = "output format: table (default), json, csv or jsonl"
    add_launch_options(parser)
    parser.set_defaults(handler=run_search)


def _register_pareto(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pareto", help="throughput against GPU count",
        description="The best layout at each GPU count from --min-gpus to --max-gpus and the "
        "Pareto front of throughput against GPUs, with scaling efficiency.  Several clusters "
        "(--cluster a,b): a front per cluster and the overall front (which cluster, and how "
        "many GPUs).")
    _common(parser)
    for action in parser._actions:  # pareto also takes several clusters
        if action.dest == "cluster":
            action.help = ("cluster preset (see `parsearch clusters`) or path to a cluster YAML "
                           "file; several separated by commas compare clusters "
                           "(e.g. dgx-h100,gb200-nvl72)")
    parser.add_argument("--max-gpus", type=positive_int, required=True, metavar="N",
                        help="largest GPU count")
    parser.add_argument("--min-gpus", type=positive_int, default=None, metavar="N",
                        help="smallest GPU count (default: one --gpu-step)")
    parser.add_argument("--gpu-step", type=positive_int, default=None, metavar="S",
                        help="GPU count step (default: GPUs per node of each cluster)")
    parser.add_argument("--method", choices=METHODS, default="auto",
                        help="exhaustive (exact: a bounded scan that skips only shapes that "
                        "cannot win), optuna (a sampled study, seeded with exact answers; says "
                        "how much it covered) or auto (default: exhaustive)")
    study = parser.add_argument_group("optuna study")
    study.add_argument("--n-trials", type=positive_int, default=None, metavar="T",
                       help="trial budget of the study, completed trials in the storage "
                       "included (default 2000)")
    study.add_argument("--seed", type=int, default=None, help="sampler seed")
    study.add_argument("--storage", default=None, metavar="URL",
                       help="optuna storage: sqlite:///study.db, postgresql://..., or "
                       "journal:FILE (default: in memory); rerun to resume")
    study.add_argument("--study-name", default=None, metavar="NAME",
                       help="study to create or resume (default: derived from the query)")
    study.add_argument("--sampler", choices=("nsga2", "tpe"), default="nsga2",
                       help="optuna sampler (default nsga2)")
    study.add_argument("--stop-after", type=positive_int, default=None, metavar="T",
                       help=argparse.SUPPRESS)
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="write the front to FILE: .png (matplotlib) or .html "
                        "(self-contained, interactive)")
    parser.set_defaults(handler=run_pareto)


def _progress(args: argparse.Namespace) -> bool:
    return sys.stderr.isatty() if args.progress is None else bool(args.progress)


def _cost_inputs(args: argparse.Namespace, model: Any, training: Any, num_gpus: int
                 ) -> tuple[Any, Any, Any]:
    """Profile and options exactly as ``cost_model_from_args`` builds them, and the cluster."""
    cm = cost_model_from_args(args, model, training, num_gpus)
    return cm.fabric.cluster, cm.profile, cm.options


# --- search -------------------------------------------------------------------------------------


def run_search(args: argparse.Namespace) -> int:
    from parsearch.search.api import search_layouts

    prepare_export(args)
    model = model_from_args(args)
    training = training_from_args(args)
    cluster, profile, options = _cost_inputs(args, model, training, args.gpus)
    query = Query(model, training, cluster, options=options, profile=profile)
    result = search_layouts(query, num_gpus=args.gpus, top=args.top, diverse=args.diverse,
                            progress=_progress(args))
    result = with_launch_choices(result, model, training, cluster, options, args)
    if not result.entries:
        raise ParsearchError(
            f"none of the {result.valid:,} valid layouts of {model.name} on {args.gpus} GPUs "
            f"fits in memory on {cluster.name}: the leanest needs "
            f"{result.smallest_memory_gib:.1f} GiB per GPU; use more GPUs, --recompute full "
            "or smaller --micro-batch-sizes")
    if args.export:
        export(result, args.export)
    if args.format == "json":
        print_json(result.to_dict())
    elif args.format == "csv":
        write_csv(result, sys.stdout)
    elif args.format == "jsonl":
        write_jsonl(result, sys.stdout)
    else:
        _search_table(result, show_launch=args.launch, precision=training.precision)
        note = stack_note(args)
        if note:
            print(note.strip())
    print(_summary(result.considered, result.valid, result.feasible, result.elapsed_s,
                   examined=result.examined),
          file=sys.stderr)
    return 0


def _summary(considered: int, valid: int, feasible: int, seconds: float,
             evaluated: int | None = None, examined: int | None = None) -> str:
    if examined is not None and examined < valid:
        # the bounded scan stops once no remaining shape can enter the answer (exact)
        text = (f"{considered:,} layouts considered, {valid:,} valid, {examined:,} examined "
                f"(the rest bounded out), {feasible:,} of those fit")
    else:
        text = f"{considered:,} layouts considered, {valid:,} valid, {feasible:,} feasible"
    if evaluated is not None:
        text += f", {evaluated:,} evaluated"
    return text + f" ({seconds:.1f} s)"


def moe_feature_label(plan: Any) -> str:
    """The MoE features a launch plan runs, in a few characters (``flex+a2a``)."""
    if plan.moe_dispatcher is None:
        return "-"
    return (plan.moe_dispatcher + ("+a2a" if plan.moe_a2a_overlap else "")
            + ("+shexp" if plan.moe_shared_expert_overlap else ""))


#: Short names of the CUDA-graph scopes in the features column.
_SCOPE_SHORT = {"attn": "attn", "mlp": "mlp", "moe": "moe", "moe_router": "router",
                "moe_preprocess": "pre"}


def feature_label(plan: Any) -> str:
    """The searched features a launch plan runs, in a few characters: the MoE ones, then
    ``cg`` for whole-layer CUDA graphs or ``cg:attn,router,pre`` for a scope."""
    parts = [moe_feature_label(plan)] if plan.moe_dispatcher is not None else []
    if plan.cuda_graphs:
        scope = ",".join(_SCOPE_SHORT.get(s, s) for s in plan.cuda_graph_scope)
        parts.append("cg" + (f":{scope}" if scope else ""))
    if plan.recompute_granularity == "selective" and plan.recompute_modules != ("core_attn",):
        parts.append("rc:" + ",".join(plan.recompute_modules))  # memory_features.py
    parts += [label for on, label in ((plan.fused_expert_mlp, "fused-mlp"),
                                      (plan.moment_dtype == "bf16", "bf16-moments"),
                                      (plan.fp8_param_gather, "fp8-gather"),
                                      (plan.offload_layers > 0,
                                       f"offload:{plan.offload_layers}"),
                                      (bool(plan.offload_modules),
                                       "offload:" + ",".join(plan.offload_modules))) if on]
    return "+".join(parts) or "-"


def _flags_by_text(result: SearchResult) -> dict[str, list[int]]:
    """Each note the listed layouts carry (soft rules they break, pinned features they run
    without), with the ranks that carry it, in order of first appearance."""
    out: dict[str, list[int]] = {}
    for e in result.entries:
        for flag in e.flags:
            out.setdefault(flag, []).append(e.rank)
    return out


def _search_table(result: SearchResult, *, show_launch: bool, precision: str = "bf16") -> None:
    moe = any(e.estimate.is_moe for e in result.entries)
    headers = ("#", "tp", "pp", "cp", "ep", "etp", "vpp", "dp", "mbs", "sp", "recompute",
               "tokens/s", "step_s", "mfu%", "mem_GiB", "free_GiB", "bottleneck", "nodes",
               "features")
    rows = []
    for e in result.entries:
        est, lay = e.estimate, e.layout
        rank = f"{e.rank}~" if e.tied else e.rank
        rows.append((rank, lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.vpp, lay.dp, lay.mbs,
                     lay.sp, lay.recompute, est.tokens_per_s, est.step_time_s,
                     100 * est.mfu, est.memory_bytes["total"] / 2**30, e.headroom_bytes / 2**30,
                     est.bottleneck, e.launch.nodes,
                     feature_label(e.launch.plan)))
    print_table(headers, rows)
    print(("features: the token dispatcher (flex: DeepEP/HybridEP), +a2a: EP all-to-all "
           "overlap, +shexp: shared-expert overlap; " if moe else "features: ")
          + ("fused-mlp: the fused expert MLP (Transformer Engine op fuser; etp=1 only); "
             if moe else "")
          + "cg: CUDA graphs of whole layers, cg:attn,router,pre: of those parts; rc: selective "
          "recompute modules beyond core_attn; bf16-moments: BF16 Adam moments; fp8-gather: "
          "FP8 parameter gather (these two change numerics: chosen only to fit or for >= 1% "
          "speed); chosen per layout unless given ("
          + ("--moe-dispatcher, --[no-]moe-a2a-overlap, --[no-]fused-expert-mlp, " if moe
             else "")
          + "--[no-]cuda-graphs, --cuda-graph-scope, --recompute-modules, --[no-]bf16-moments, "
          "--[no-]fp8-param-gather)")
    if any(e.launch is not None and e.launch.plan.offload_layers for e in result.entries):
        print("offload:K: activations of the first K layers go to host memory (Megatron "
              "--cpu-offloading-num-layers K; pp=1 without recompute only); chosen per layout, "
              "the fewest layers that make it fit, unless --activation-offload-layers is given")
    if any(e.launch is not None and e.launch.plan.offload_modules for e in result.entries):
        print("offload:MODULES: the inputs of those submodules of every layer go to host "
              "memory (Megatron-Core --fine-grained-activation-offloading --offload-modules); "
              "as given, or with --offload-modules auto chosen per layout where memory forced "
              "more recompute or nothing fit and it is faster")
    if precision != "bf16":
        print(f"mfu%: model FLOPs over the GPU's dense BF16 peak; {precision} GEMMs run at a "
              "higher peak, so it can pass what a BF16 run could reach.")
    if result.tie_note:
        print(result.tie_note)
    if result.tied_unlisted:
        kind = "shapes" if result.query.get("diverse") else "layouts"
        print(f"  {result.tied_total} {kind} tie with the best; {result.tied_unlisted} more "
              f"than listed (--top {result.tied_total} lists them all).")
    for flag, ranks in _flags_by_text(result).items():
        print(f"note (#{', #'.join(str(r) for r in ranks)}): {flag}")
    if result.outside_calibration:
        print(coverage_note(result.outside_calibration))
    if show_launch:
        print_launch(result)


# --- pareto -------------------------------------------------------------------------------------


def cluster_names(text: str) -> list[str]:
    """``--cluster``: one preset or file, or several separated by commas."""
    if "," not in text or is_file(text):
        return [text]
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise SpecError(f"--cluster {text!r} has an empty name in its list; separate cluster "
                        "names with single commas, e.g. --cluster dgx-h100,gb200-nvl72")
    return names


def _multi_cost_inputs(args: argparse.Namespace, model: Any, training: Any,
                       names: list[str]) -> tuple[list[Any], Any, Any, list[int]]:
    """Clusters, profile and options of a multi-cluster front, checked on every cluster.

    The options go out unresolved (``None`` where the efficiency profile
    decides), so each cluster fills them from its own GPU's profile; the
    profile is ``None`` unless ``--efficiency`` names one for all clusters.
    """
    from parsearch.cli.gpu_variant_options import cluster_from_args
    from parsearch.search.arguments import gpu_counts_by_cluster

    clusters = [cluster_from_args(args, name) for name in names]  # GPU variant applied
    counts_by = gpu_counts_by_cluster(clusters=clusters, max_gpus=args.max_gpus,
                                      min_gpus=args.min_gpus, gpu_step=args.gpu_step)
    models = [cost_model_from_args(argparse.Namespace(**{**vars(args), "cluster": name}),
                                   model, training, counts_by[cluster.name][0])
              for name, cluster in zip(names, clusters, strict=True)]
    options = dataclasses.replace(models[0].options, moe_imbalance=args.moe_imbalance)
    profile = models[0].profile if args.efficiency else None
    counts = sorted({n for values in counts_by.values() for n in values})
    return clusters, profile, options, counts


def run_pareto(args: argparse.Namespace) -> int:
    from parsearch.search.api import pareto_front
    from parsearch.search.arguments import gpu_counts_for
    from parsearch.search.plot import PLOT_SUFFIXES, write_plot

    if args.plot is not None and not args.plot.lower().endswith(PLOT_SUFFIXES):
        raise SpecError(f"--plot {args.plot!r}: the file name must end in .png or .html")
    if args.method == "exhaustive" and (args.storage or args.study_name or args.n_trials):
        raise SpecError("--storage, --study-name and --n-trials apply to --method optuna "
                        "(or auto); drop them or use --method optuna")
    model = model_from_args(args)
    training = training_from_args(args)
    from parsearch.topology.cluster import load_cluster

    names = cluster_names(args.cluster)
    if len(names) > 1:
        cluster, profile, options, counts = _multi_cost_inputs(args, model, training, names)
    else:
        counts = list(gpu_counts_for(cluster=load_cluster(args.cluster),
                                     max_gpus=args.max_gpus, min_gpus=args.min_gpus,
                                     gpu_step=args.gpu_step))
        cluster, profile, options = _cost_inputs(args, model, training, counts[0])
    query = Query(model, training, cluster, options=options, profile=profile)
    try:
        with sigterm_as_interrupt():
            result = pareto_front(
                query, max_gpus=args.max_gpus, min_gpus=args.min_gpus, gpu_step=args.gpu_step,
                method=args.method, n_trials=args.n_trials, seed=args.seed,
                storage=args.storage, study_name=args.study_name, sampler=args.sampler,
                progress=_progress(args), stop_after=args.stop_after)
    except KeyboardInterrupt:
        if args.storage:
            from parsearch.search.storage import redact  # imports optuna: only here

            print(f"parsearch pareto: interrupted; completed trials are kept in "
                  f"{redact(args.storage)}; rerun the same command to resume", file=sys.stderr)
        raise
    if args.plot is not None:
        write_plot(result, args.plot)
    if args.format == "json":
        print_json(result.to_dict())
    else:
        _pareto_table(result)
    print(_summary(result.considered, result.valid, result.feasible, result.elapsed_s,
                   result.evaluations) + f", method {result.method}", file=sys.stderr)
    if not result.front:
        print(f"parsearch pareto: no layout of {model.name} fits on {counts[0]}..{counts[-1]} "
              "GPUs", file=sys.stderr)
    if args.plot is not None:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


_PARETO_HEADERS: tuple[str, ...] = ("gpus", "nodes", "tokens/s", "tokens/s/gpu", "mfu%",
                                     "speedup", "efficiency%", "layout", "bottleneck")


def _pareto_table(result: ParetoResult) -> None:
    """The front; over several clusters, the overall front then each cluster's.  Below
    it, each note the front's layouts carry (pinned features they run without), with the
    GPU counts that carry it."""
    if not result.multi_cluster:
        print_table(_PARETO_HEADERS, [_pareto_row(p) for p in result.front])
    else:
        print_table(("cluster", *_PARETO_HEADERS),
                    [(p.cluster, *_pareto_row(p)) for p in result.front])
        for name, sub in result.by_cluster.items():
            print(f"\nfront on {name}:")
            print_table(_PARETO_HEADERS, [_pareto_row(p) for p in sub.front])
    notes: dict[str, list[str]] = {}
    for p in result.front:
        for flag in p.flags:
            notes.setdefault(flag, []).append(f"{p.num_gpus}"
                                              + (f" on {p.cluster}" if p.cluster else ""))
    for flag, where in notes.items():
        print(f"note ({', '.join(where)} GPUs): {flag}")


def _pareto_row(p: Any) -> tuple[Any, ...]:
    return (p.num_gpus, p.launch.nodes, p.tokens_per_s, p.estimate.tokens_per_s_per_gpu,
            100 * p.estimate.mfu, p.speedup, 100 * p.scaling_efficiency, p.layout.key(),
            p.estimate.bottleneck)
