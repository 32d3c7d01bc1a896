"""``parsearch calibrate`` (fit a profile to your runs) and ``parsearch plan-profiling``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from parsearch.cli.common import (
    add_cluster_option,
    add_cost_options,
    add_format_option,
    add_model_option,
    add_training_options,
    cost_model_from_args,
    model_from_args,
    non_negative_int,
    positive_int,
    print_json,
    print_table,
    training_from_args,
)
from parsearch.cli.left_out import nothing_usable, print_left_out
from parsearch.errors import SpecError
from parsearch.model.specs import PRECISIONS, short_repr


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_calibrate(subparsers)
    _register_plan(subparsers)


def _register_calibrate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="fit an efficiency profile to measured runs of your cluster",
        description="Read measured runs (Megatron-LM / Megatron-Bridge training logs, or a "
        "CSV/YAML with columns model, cluster, num_gpus, global_batch, seq_len, precision, "
        "layout and tokens_per_s_per_gpu or step_time_s, plus optional feature columns), fit "
        "the residual factors of the GPU generation's efficiency profile to them (bounded by "
        "the cited ranges, pulled toward the shipped values; fewer factors with few runs), "
        "report the leave-one-run-out error before and after, and write a profile that "
        "search, pareto and explain take with --efficiency FILE.  When the runs cross nodes "
        "enough, the cluster's delivered inter-node (and NVLink) bandwidth is fitted too, "
        "and a corrected cluster file PROFILE.cluster.yaml is written beside the profile for "
        "--cluster FILE.  When the runs are slower or faster than the cited ranges allow "
        "(power caps, clocks, another software stack), a cluster-level speed factor is "
        "fitted, said so, and written into the profile; exit 0 unless no input is usable.")
    parser.add_argument("--measurements", nargs="+", required=True, metavar="FILE",
                        help=".csv / .yaml tables; any other file is read as a Megatron log")
    parser.add_argument("--model", metavar="M", default=None,
                        help="the model of measurements that do not name one (logs never do)")
    parser.add_argument("--cluster", metavar="C", default=None,
                        help="the cluster of measurements that do not name one; rows naming "
                        "another cluster are left out")
    parser.add_argument("--efficiency", metavar="NAME|FILE", default=None,
                        help="profile to start from (default: the one covering the GPU)")
    parser.add_argument("--out", required=True, metavar="PROFILE.yaml",
                        help="where to write the calibrated profile (and, when the "
                        "network is fitted, PROFILE.cluster.yaml beside it)")
    hints = parser.add_argument_group("what a log may not say")
    hints.add_argument("--layout", metavar="L", default=None,
                       help="layout string for logs without an arguments block "
                       "(Megatron-Bridge), e.g. \"tp=4,pp=2,sp=true\"")
    hints.add_argument("--gpus", type=positive_int, default=None, metavar="N",
                       help="world size for logs that do not state it")
    hints.add_argument("--seq-len", type=positive_int, default=None, metavar="S")
    hints.add_argument("--precision", choices=PRECISIONS, default=None)
    hints.add_argument("--warmup-iterations", type=non_negative_int, default=None,
                       metavar="W", help="iterations dropped at the start of each run (counted "
                       "in its own iteration numbers) and after a batch-size change "
                       "(default 10)")
    parser.add_argument("--no-leave-one-out", action="store_true",
                        help="skip the leave-one-run-out accuracy (one fit instead of n+1)")
    add_format_option(parser, ("table", "json"))
    parser.set_defaults(handler=run_calibrate)


def _candidates_value(text: str) -> int | str:
    """``--candidates``: a count of shapes (a positive integer) or a runnable-layouts file."""
    if text.strip().lstrip("+-").isdigit():
        return positive_int(text)
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of shapes nor a file of runnable layouts")
    return text


def _register_plan(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan-profiling", help="the layouts worth measuring next, with launch files",
        description="Among the best predicted layouts (one per shape), pick K whose "
        "measurement, once `parsearch calibrate` fits the factors they move, leaves the "
        "fewest expected misordered pairs in the top of the ranking plus the least "
        "prediction error over the candidates (greedy choice, then exchange).  The cluster's "
        "delivered network bandwidth counts as one more loose factor, so a set that pins it "
        "(layouts whose groups cross nodes) is preferred when it matters.  Gives the "
        "iterations each needs and, with --launch-dir, a launch script per layout.")
    add_model_option(parser)
    add_cluster_option(parser)
    parser.add_argument("--gpus", type=positive_int, required=True, metavar="N")
    add_training_options(parser)
    add_cost_options(parser)
    parser.add_argument("--k", type=positive_int, default=5, metavar="K",
                        help="layouts to measure (default 5)")
    parser.add_argument("--candidates", type=_candidates_value, default=None,
                        metavar="M|FILE",
                        help="shapes considered from the top of the ranking (default 30), "
                        "or a file of the layouts you can run, one per line (tp=8,pp=4,... or "
                        "a layout key): the plan then chooses only among those")
    parser.add_argument("--measurements", nargs="+", default=(), metavar="FILE",
                        help="runs already measured (logs or tables) on this cluster: the "
                        "plan conditions on them (pass those a --efficiency profile was "
                        "calibrated on, so the plan knows what they settled)")
    parser.add_argument("--launch-dir", metavar="DIR", default=None,
                        help="write one launch script per planned layout into DIR")
    add_format_option(parser, ("table", "json"))
    parser.set_defaults(handler=run_plan)


def _defaults(args: argparse.Namespace) -> Any:
    from parsearch.validation.user.measurements import WARMUP_ITERATIONS, Defaults

    warmup = args.warmup_iterations if getattr(args, "warmup_iterations", None) is not None \
        else WARMUP_ITERATIONS
    return Defaults(model=args.model, cluster=args.cluster, layout=getattr(args, "layout", None),
                    num_gpus=getattr(args, "gpus", None), seq_len=getattr(args, "seq_len", None),
                    precision=getattr(args, "precision", None), warmup_iterations=warmup)


def _load_rows(args: argparse.Namespace, profile: Any) -> tuple[list[Any], list[str]]:
    """Prepared rows of the measurements, and one line per input left out."""
    from parsearch.validation.user.measurements import load_measurements
    from parsearch.validation.user.user_calibration import prepare_measurements

    loaded = load_measurements(args.measurements, _defaults(args))
    problems = list(loaded.problems)
    kept = []
    for m in loaded.measurements:
        if args.cluster and m.cluster and m.cluster != args.cluster:
            problems.append(f"{m.source}: cluster {m.cluster}, not --cluster {args.cluster}; "
                            "left out")
            continue
        kept.append(m)
    rows, bad = prepare_measurements(kept, profile)
    if not rows:  # the error first, then why each input was left out
        raise nothing_usable(args.measurements, [*problems, *bad], loaded.notes)
    for line in loaded.notes:
        print(f"parsearch {args.command}: note: {line}", file=sys.stderr)
    print_left_out(args.command, [*problems, *bad], len(rows))
    return rows, problems + bad


def run_calibrate(args: argparse.Namespace) -> int:
    from parsearch.cost.efficiency import load_efficiency_profile, profile_to_yaml
    from parsearch.validation.user.user_calibration import calibrate_user

    profile = load_efficiency_profile(args.efficiency) if args.efficiency else None
    rows, problems = _load_rows(args, profile)
    result = calibrate_user(rows, profile, leave_one_out=not args.no_leave_one_out)
    out = Path(args.out)
    cluster_out = _cluster_out(out) if result.cluster else None
    header = (f"# Efficiency profile calibrated by `parsearch calibrate` to {len(rows)} "
              f"measured run(s).\n# {result.why}.\n# Leave-one-run-out MAPE: shipped "
              f"{result.mape_before:.1%}, calibrated {_pct(result.mape_after)}; ranking: "
              f"shipped {result.ranking_before.text()}, calibrated "
              f"{result.ranking_after.text()}.\n"
              + (f"# Fitted together with the cluster's delivered bandwidth: use it with "
                 f"--cluster {cluster_out}.\n" if cluster_out else "")
              + "".join(f"# run: {r.source} {r.layout} on {r.num_gpus} GPUs\n"
                        for r in result.rows))
    _write(out, "--out", profile_to_yaml(result.profile, header))
    if cluster_out is not None:
        _write(cluster_out, "--out", _cluster_text(result, out))
    warnings = _warnings(result)
    if args.format == "json":
        # "failed": the input could not be used (never, once a profile is written).
        print_json({**result.to_dict(), "out": str(out),
                    "cluster_out": str(cluster_out) if cluster_out else None,
                    "left_out": problems, "warnings": warnings, "failed": False})
        _print_warnings(warnings)
        return 0
    print_table(("run", "layout", "gpus", "measured", "shipped", "err before", "loo pred",
                 "err after"),
                [(r.source, r.layout, r.num_gpus, r.measured, r.shipped,
                  f"{r.error_before:+.1%}",
                  r.leave_one_out if r.leave_one_out == r.leave_one_out else "-",
                  _pct(r.error_after, sign=True))
                 for r in result.rows])
    print(f"\n{result.why}")
    for name in result.fitted:
        prior = result.prior(name)
        mark = "  (on its bound: the structure misses something)" if name in result.on_bound \
            else ""
        print(f"  {name}: {result.shipped(name):.4g} -> {result.value(name):.4g} "
              f"(range {prior.low:.4g}..{prior.high:.4g}){mark}")
    if result.speed is not None:
        print(f"cluster-level factor: {result.speed.sentence()}")
    if result.on_bound:
        print("a factor on its bound means the runs differ from the model in something no "
              "factor represents; check the cluster file (NIC and NVLink bandwidth, "
              "efficiency: nccl-tests on your nodes) and the features the runs used")
    for name, value in result.cluster.items():
        if name == "compute_clock_factor" and value < 0.95:
            print(f"the GPUs sustain {value:.0%} of their rated clock: check power caps and "
                  "clocks under load (nvidia-smi -q -d POWER,CLOCK)")
        elif value < 0.8 and name == "spine_bandwidth_factor":
            print(f"traffic between leaf groups gets {value:.0%} of what cluster "
                  f"{result.cluster_file} says: check the leaf uplinks and ECMP balance "
                  "(nccl-tests between nodes under different leaf switches)")
        elif value < 0.8 and name != "compute_clock_factor":
            tier = "inter-node network" if name == "network_bandwidth_factor" else "NVLink"
            print(f"the {tier} delivers {value:.0%} of what cluster {result.cluster_file} says: "
                  "check link rates (ibstat), GPUDirect RDMA and nccl-tests across nodes")
    print(f"leave-one-run-out MAPE: shipped {result.mape_before:.1%} -> calibrated "
          f"{_pct(result.mape_after)} (in sample {result.mape_in_sample:.1%}); "
          f"{len(problems)} input(s) left out")
    after = result.ranking_after.text() if result.ranking_after.jobs else \
        "n/a (no leave-one-run-out predictions)"
    print(f"ranking (measured fastest predicted first; Spearman within jobs): shipped "
          f"{result.ranking_before.text()} -> calibrated {after}")
    if cluster_out is not None:
        print(f"wrote {out} and {cluster_out} (the cluster file with the fitted bandwidth; the "
              f"profile was fitted with it): use them together with --efficiency {out} "
              f"--cluster {cluster_out}")
    else:
        print(f"wrote {out}: use it with --efficiency {out}")
    _print_warnings(warnings)
    return 0


def _warnings(result: Any) -> list[str]:
    """One line per factor on a bound (cluster factors included) and per speed factor fitted.

    Calibration never turns a user away (issue 33): a fit the cited ranges cannot hold
    takes the cluster-level speed factor and says so; the bounds stay as warnings.
    """
    out = []
    if result.speed is not None:
        out.append(f"{result.speed.reason}: cluster_speed={result.speed.value:.3f} was "
                   "fitted to take the rest (the profile is usable; check power caps, "
                   "clocks and the software stack if that is not expected)")
    if result.on_bound:
        out.append(f"{', '.join(result.on_bound)} ended on the bound of its cited range: the runs "
                   "differ from the model in something no factor represents")
    return out


def _print_warnings(warnings: list[str]) -> None:
    for line in warnings:
        print(f"parsearch calibrate: warning: {line}", file=sys.stderr)


def _cluster_out(out: Path) -> Path:
    """``PROFILE.yaml`` -> ``PROFILE.cluster.yaml``."""
    return out.with_name(f"{out.with_suffix('').name}.cluster.yaml")


def _cluster_text(result: Any, out: Path) -> str:
    from parsearch.validation.fit.network_calibration import corrected_cluster_yaml

    fitted = ", ".join(f"{n} {v:.3f}" for n, v in result.cluster.items())
    header = (f"# Cluster file {result.cluster_file} with the bandwidth fitted by `parsearch "
              f"calibrate` to {len(result.rows)} measured run(s): {fitted}.\n"
              f"# Use it with --efficiency {out} (fitted together).\n")
    return corrected_cluster_yaml(result.cluster_file, result.cluster, header)


def _write(path: Path, option: str, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise SpecError(f"{option} {path}: cannot write it: {error.strerror or error}") from None


def _pct(x: float, sign: bool = False) -> str:
    if x != x:  # NaN: not computed (--no-leave-one-out, or a single run)
        return "n/a"
    return f"{x:+.1%}" if sign else f"{x:.1%}"


def run_plan(args: argparse.Namespace) -> int:
    from parsearch.validation.planning.plan_launch import launch_script
    from parsearch.validation.planning.plan_profiling import CANDIDATES, TOP_PAIRS, plan_profiling

    model = model_from_args(args)
    training = training_from_args(args)
    cm = cost_model_from_args(args, model, training, args.gpus)
    measured: list[Any] = []
    if args.measurements:
        rows, _ = _load_rows(args, cm.profile)
        measured = [r for r in rows if r.generation == cm.profile.name]
    runnable = None
    count = args.candidates or CANDIDATES
    if isinstance(args.candidates, str):
        from parsearch.validation.planning.runnable import read_runnable_layouts

        runnable = read_runnable_layouts(args.candidates, args.gpus)
        count = CANDIDATES
    plan = plan_profiling(cm, k=args.k, measured=measured, candidates=count,
                          runnable=runnable)
    written = []
    if args.launch_dir:
        folder = Path(args.launch_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for pick in plan.picks:
                path = folder / f"profile_{pick.order:02d}_{pick.layout.key()}.sh"
                path.write_text(launch_script(pick, model.name), encoding="utf-8")
                path.chmod(0o755)
                written.append(str(path))
        except OSError as error:
            raise SpecError(f"--launch-dir {short_repr(str(folder))}: cannot write: "
                            f"{error.strerror or error}") from None
    if args.format == "json":
        print_json({**plan.to_dict(), "launch_files": written})
        return 0
    print_table(("#", "layout", "pred rank", "tokens/s/GPU", "step s", "iters", "minutes",
                 "why"),
                [(p.order, p.layout.key(), p.predicted_rank, p.tokens_per_s_per_gpu,
                  p.step_time_s, p.iterations, p.minutes, "; ".join(p.reasons[:-1]))
                 for p in plan.picks])
    if plan.runnable_source:
        print(f"chosen among the runnable layouts of {plan.runnable_source}"
              + (f"; not valid for this job, left out: {', '.join(plan.not_valid)}"
                 if plan.not_valid else ""))
    print(f"\nexpected misordered pairs among the top {min(TOP_PAIRS, plan.candidates)}: "
          f"{plan.misordered_before:.2f} -> {plan.misordered_after:.2f} after these "
          f"{len(plan.picks)} measurement(s); {plan.candidates} shapes considered")
    loose = [f"{n} {plan.factor_sd_before[n]:.2f}->{plan.factor_sd_after[n]:.2f}"
             for n in plan.factors]
    print("factor spread (sd, share of cited range): " + ", ".join(loose))
    if plan.spine is not None and plan.spine.get("changes_the_fastest"):
        state = "identified" if plan.spine.get("identified") else "not identified"
        print(f"spine (between leaf groups): {state} by these runs: {plan.spine['why']}")
    print("each run: --log-interval 1 --log-throughput; the first 10 iterations are warm-up")
    for path in written:
        print(f"wrote {path}")
    return 0
