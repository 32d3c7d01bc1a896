"""``parsearch explain`` (one layout's time and memory) and ``parsearch validate``."""

from __future__ import annotations

import argparse
import math
from typing import Any

from parsearch.cli.common import (
    add_cluster_option,
    add_cost_options,
    add_format_option,
    add_model_option,
    add_training_options,
    cost_model_from_args,
    layout_from_args,
    model_from_args,
    positive_int,
    print_json,
    print_table,
    stack_note,
    training_from_args,
)
from parsearch.cost.coverage import coverage_note
from parsearch.errors import SpecError


def register(subparsers: argparse._SubParsersAction) -> None:
    explain = subparsers.add_parser(
        "explain", help="time, memory and their breakdown for one layout",
        description="Predict the step time, throughput and memory per GPU of one layout, "
        "with where the time goes (exposed seconds per step) and what fills memory.",
    )
    add_model_option(explain)
    add_cluster_option(explain)
    explain.add_argument("--gpus", type=positive_int, required=True, metavar="N")
    explain.add_argument("--layout", required=True, metavar="L",
                         help='e.g. "tp=8,pp=4,vpp=5,sp=true,mbs=1,recompute=selective"')
    add_training_options(explain)
    add_cost_options(explain)
    add_format_option(explain, ("table", "json"))
    explain.set_defaults(handler=run_explain)

    validate = subparsers.add_parser(
        "validate", help="predictions against published training runs",
        description="Predict every usable published run (its model, cluster, layout, batch "
        "and precision) and compare tokens/s/GPU with the measurement: per-row error, MAPE, "
        "median APE and Spearman rank correlation within each (model, GPU) group. A layout "
        "measured in several software releases counts once, with its latest measurement, "
        "and the rows of a release line that a newer one superseded (the same model, GPU "
        "and precision re-measured) are scored apart and kept out of the summary, as the "
        "calibration leaves them out; --all-releases scores every row together.",
    )
    validate.add_argument("--data", metavar="FILE", default=None,
                          help="a CSV in the published-runs format (default: the bundled one)")
    validate.add_argument("--all-releases", action="store_true",
                          help="score every release's measurement of a layout (default: only "
                          "the latest release of each model/GPU/precision/layout)")
    validate.add_argument("--include-partial", action="store_true",
                          help="also score rows marked verified=partial: a field inferred, a table "
                               "the release's recipe contradicts, or a regression its "
                               "maintainers documented (reasons: data/run_corrections.csv)")
    validate.add_argument("--cv", choices=("family", "source"), default=None,
                          help="out-of-sample accuracy: per GPU generation, calibrate on all "
                          "runs but one model family (or source) and predict the held-out "
                          "ones; reports MAPE out of and in sample, pairwise order accuracy, "
                          "error bands and the folds that put a factor on a bound (takes a "
                          "few minutes)")
    add_format_option(validate, ("table", "json"))
    validate.set_defaults(handler=run_validate)


def run_explain(args: argparse.Namespace) -> int:
    from parsearch.cost.analytic import estimate
    from parsearch.cost.coverage import uncovered_features
    from parsearch.cost.ep_overlap import pinned_feature_flags
    from parsearch.cost.stacks import DEFAULT_STACK, get_stack, stack_training
    from parsearch.launch import launch_for_cluster
    from parsearch.launch.plan import priced_features
    from parsearch.layout.rules import check_layout
    from parsearch.layout.soft_rules import soft_rule_flags

    model = model_from_args(args)
    training = training_from_args(args)
    layout = layout_from_args(args)
    # The layout given is the one to explain: admit its own mbs and recompute.
    from dataclasses import replace

    training = replace(training, micro_batch_sizes=(layout.mbs,),
                       recompute_modes=(layout.recompute,))
    # the layout's own recompute and sequence parallelism, asked of --stack as a flag would be
    stack = get_stack(getattr(args, "stack", None) or DEFAULT_STACK)
    training = stack_training(stack, replace(training, sequence_parallel="on" if layout.sp
                                             else training.sequence_parallel),
                              explicit=frozenset({"recompute_modes", "sequence_parallel"}))
    violations = check_layout(model, training, layout)
    if violations:
        raise SpecError(f"layout {layout.key()} is invalid: {violations[0]}"
                        + (f" (and {len(violations) - 1} more; see `parsearch check`)"
                           if len(violations) > 1 else ""))
    cm = cost_model_from_args(args, model, training, args.gpus)
    result = estimate(cm, layout)
    document = result.to_dict()
    document["bottleneck"] = result.bottleneck
    document["slowest_stage"] = result.slowest_stage
    document["peak_memory_stage"] = result.peak_memory_stage
    document["flags"] = soft_rule_flags(layout, cm.fabric, training.global_batch, training)
    document["flags"] += _host_memory_flags(cm, layout)
    document["flags"] += pinned_feature_flags(model, cm.options, layout)
    document["flags"] += _offload_residue_flags(cm, layout, result.options or cm.options)
    # what the number assumes, from the same plan the launch settings are written from
    priced = result.options or cm.options  # with searched features: the ones chosen
    plan = launch_for_cluster(model, training, layout, cm.fabric.cluster, options=priced,
                              gpu=cm.fabric.gpu).plan
    features = list(priced_features(plan))
    if model.moe is not None:
        from parsearch.cost.analytic import layout_columns
        from parsearch.cost.routing import priced_imbalance

        imbalance = float(priced_imbalance(model, training, priced,
                                           layout_columns([layout]))[0])
        document["moe_imbalance"] = imbalance
        features = [f"{f} (busiest EP rank {imbalance:.2f}x the mean)"
                    if f.startswith(("trained-router", "forced-balance", "capacity")) else f
                    for f in features]
    document["priced_features"] = features
    note = stack_note(args)
    if note:
        document["software_stack"] = note
    document["outside_calibration"] = list(uncovered_features(model, cm.profile.coverage))
    if args.format == "json":
        print_json(document)
        return 0
    _print_explain(model.name, args.cluster, document)
    return 0


def _host_memory_flags(cm: Any, layout: Any) -> list[str]:
    """A note where the offloaded layers the user pinned need more host memory per GPU than
    the cluster file states (the layout is then priced as not fitting)."""
    from parsearch.cost.analytic import layout_columns
    from parsearch.cost.offload import host_bytes_needed

    k = cm.training.activation_offload_layers
    modules = cm.training.offload_modules
    cap = cm.fabric.cluster.host_memory_per_gpu_bytes
    if not (k or modules) or cap is None:
        return []
    need = float(host_bytes_needed(cm.model, cm.training, cm.options.memory,
                                   layout_columns([layout]))[0])
    if need <= cap:
        return []
    what = (f"the offloaded inputs of {', '.join(modules)}" if modules
            else f"the {k} offloaded layers' activations")
    fewer = "fewer modules (--offload-modules)" if modules else (
        "fewer layers (--activation-offload-layers)")
    return [f"{what} need {need / 1e9:.0f} GB of host memory "
            f"per GPU; cluster {cm.fabric.cluster.name} has {cap / 1e9:.0f} GB per GPU "
            f"(host_memory_GB over its GPUs per node): offload {fewer} or use a smaller "
            "micro-batch"]


def _offload_residue_flags(cm: Any, layout: Any, priced: Any) -> list[str]:
    """What the offloaded layers leave in HBM, where that is not nothing: the tensors
    Transformer Engine's offload does not move (``offload_kept_bytes``)."""
    from parsearch.cost.analytic import layout_columns
    from parsearch.cost.memory.options import FP32_BYTES, TE_OFFLOAD_MIN_ELEMENTS
    from parsearch.cost.offload import kept_bytes_per_layer

    k = priced.activation_offload_layers or cm.training.activation_offload_layers
    if not k or layout.pp != 1 or layout.recompute != "none":
        return []
    kept = kept_bytes_per_layer(cm.model, cm.training, priced.memory, layout_columns([layout]))
    # under a floor of one tensor's worth that TE >= 2.10 would move: nothing worth saying
    floor = TE_OFFLOAD_MIN_ELEMENTS * FP32_BYTES
    parts = [f"{'MoE' if is_moe else 'dense'} {float(b[0]) / 2**30:.2f} GiB"
             for is_moe, b in kept.items() if float(b[0]) >= floor]
    if not parts:
        return []
    return [f"each of the {k} offloaded layers keeps part of its activations in HBM "
            f"({', '.join(parts)} per layer): Transformer Engine before 2.10 offloads only "
            "the tensors marked for it, and Megatron's MLP activation function (the experts' "
            "always, the dense MLP's before Megatron-Core 0.13) and the router's logits "
            "are not"]


def _print_explain(model: str, cluster: str, d: dict[str, Any]) -> None:
    lay = d["layout"]
    print(f"{model} on {d['num_gpus']} GPUs of {cluster}: tp={lay['tp']} pp={lay['pp']} "
          f"vpp={lay['vpp']} cp={lay['cp']} ep={lay['ep']} etp={lay['etp']} dp={lay['dp']} "
          f"edp={lay['edp']} mbs={lay['mbs']} sp={'on' if lay['sp'] else 'off'} "
          f"recompute={lay['recompute']}")
    print(f"  step time {d['step_time_s']:.3f} s, {d['tokens_per_s']:,.0f} tokens/s "
          f"({d['tokens_per_s_per_gpu']:,.0f} per GPU), {d['model_tflops_per_gpu']:.0f} "
          f"model TFLOP/s per GPU, MFU {d['mfu']:.1%} of the BF16 peak")
    if d.get("tokens_per_s_per_gpu_range"):
        low, high = d["tokens_per_s_per_gpu_range"]
        basis = d.get("tokens_per_s_per_gpu_range_basis") or ""
        kind = (basis if basis.startswith("no ") else
                "out-of-sample error band of this kind of prediction")
        print(f"  likely {low:,.0f} .. {high:,.0f} tokens/s per GPU ({kind})")
    if d.get("outside_calibration"):
        print("  " + coverage_note(tuple(d["outside_calibration"])))
    if d.get("priced_features"):
        print("  priced with: " + ", ".join(d["priced_features"]))
    if d.get("software_stack"):
        print(d["software_stack"])
    total = d["step_time_s"]
    print_table(("time per step", "seconds", "share"),
                [(k, f"{v:.4f}", f"{v / total:.1%}") for k, v in d["time_s"].items()])
    mem = d["memory_gib_per_gpu"]
    verdict = "fits" if d["fits"] else "DOES NOT FIT"
    print(f"  memory per GPU (stage {d['peak_memory_stage']}): {mem['total']:.1f} of "
          f"{mem['capacity']:.1f} GiB, {verdict}")
    print_table(("memory", "GiB"),
                [(k, f"{mem[k]:.2f}") for k in ("weights", "gradients", "optimizer",
                                                 "activations", "other", "total")])
    print(f"  bottleneck: {d['bottleneck']}; slowest pipeline stage: {d['slowest_stage']}")
    for flag in d["flags"]:
        print(f"  note: {flag}")


def run_validate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from parsearch.validation.published.published_runs import read_published_runs
    from parsearch.validation.published.runs import validate_runs

    data = read_published_runs(args.data)
    runs = data.runs
    if args.cv:
        return _run_cross_validation(args, runs)
    report = validate_runs(runs, deduplicate=not args.all_releases,
                           include_partial=args.include_partial)
    # Rows that could not be read at all are skipped rows too, each with its reason.
    report = replace(report, skipped=data.unreadable + report.skipped)
    if args.format == "json":
        print_json(report.to_dict())
        return 0
    print_table(
        ("id", "model", "gpu", "gpus", "layout", "precision", "predicted", "measured", "APE",
         "assumed"),
        [(r.id, r.model, r.gpu, r.num_gpus, r.layout_key, r.precision,
          _num(r.predicted_tokens_per_s_per_gpu), _num(r.measured_tokens_per_s_per_gpu),
          _pct(r.ape, 1), r.assumed or "-") for r in report.rows],
    )
    summary = report.summary()
    print()
    print(f"rows: {summary['n']}  skipped: {summary['skipped']}  "
          f"MAPE: {_pct(summary['mape'], 1)}  median APE: {_pct(summary['median_ape'], 1)}  "
          f"Spearman (mean within {summary['spearman_groups']} model/GPU groups): "
          f"{_fmt(summary['spearman'])}  predicted out of memory: "
          f"{summary['predicted_out_of_memory']}")
    for reason, count in summary["skipped_by_reason"].items():
        print(f"  skipped {count}: {reason}")
    if summary["superseded"]:
        print(f"older release lines (a newer one re-measured the model, GPU and precision; "
              f"not fitted): {summary['superseded']} rows, MAPE "
              f"{_pct(summary['superseded_mape'], 1)}, median measured/predicted "
              f"{_fmt(summary['superseded_median_ratio'])}")
    return 0


def _run_cross_validation(args: argparse.Namespace, runs: Any) -> int:
    from parsearch.validation.fit.calibration import prepare_rows
    from parsearch.validation.fit.crossval import ORDER_MIN_GAP, cross_validate

    rows = prepare_rows(runs, include_partial=args.include_partial)
    if not rows:
        raise SpecError("no usable measured run in the data: nothing to cross-validate")
    cv = cross_validate(rows, by=args.cv)
    if args.format == "json":
        print_json(cv.to_dict())
        return 0
    print_table(
        ("id", "model", "gpu", "layout", "measured", "in-sample", "APE", "out-of-sample",
         "APE out"),
        [(r.id, r.model, r.gpu, r.layout, f"{r.measured:,.0f}", f"{r.in_sample:,.0f}",
          f"{r.ape_in:.1%}", f"{r.out_of_sample:,.0f}", f"{r.ape_out:.1%}") for r in cv.rows])
    print()
    print_table(
        ("generation", "runs", "held out", "MAPE out", "MAPE in", "median APE out",
         f"pairs >{ORDER_MIN_GAP:.0%}", "order out", "order in", "fits on a bound"),
        [(g.generation, g.n, f"{g.holdout} ({g.folds})", f"{g.mape_out:.1%}",
          f"{g.mape_in:.1%}", f"{g.median_ape_out:.1%}", g.order_pairs,
          _pct(g.order_accuracy_out), _pct(g.order_accuracy_in),
          f"{g.fits_on_bound} of {g.folds + 1}") for g in cv.generations])
    for generation, fit in cv.in_sample_profiles.items():
        if fit.on_bound:
            print(f"{generation}: on a bound of its cited range: {', '.join(fit.on_bound)}")
        if fit.unresolved:
            print(f"{generation}: held at the prior (no run resolves it apart from the others): "
                  f"{', '.join(fit.unresolved)}")
    for fold in cv.folds:
        if fold.on_bound:
            at = ", ".join(f"{n} = {fold.values[n]:.4g}" for n in fold.on_bound)
            print(f"{fold.generation} without {fold.held_out} (fitted on the others; "
                  f"{fold.mape_out:.1%} on its {fold.n_held_out} runs): on a bound: {at}")
    print()
    print("error bands of these folds (out-of-sample measured/predicted, 10th-90th percentile; "
          "the shipped profiles add the held-out Megatron-Bridge runs):")
    for key, band in cv.bands.items():
        lo, hi = band.interval(1.0)
        print(f"  {key}: {lo:.2f} .. {hi:.2f} of the prediction ({band.n} runs)")
    return 0


def _pct(value: float, digits: int = 0) -> str:
    return f"{value:.{digits}%}" if math.isfinite(value) else "n/a"


def _num(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else "n/a"


def _fmt(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "n/a"
