"""``parsearch serve``: serving layouts (TP, PP, EP, attention DP, replicas) under targets."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from parsearch.cli.common import (
    add_cluster_option,
    add_format_option,
    add_model_option,
    model_from_args,
    non_negative_float,
    positive_int,
    print_json,
    print_table,
)
from parsearch.cli.gpu_variant_options import cluster_from_args
from parsearch.errors import SpecError
from parsearch.query import Query
from parsearch.serve.api import ServeResult, serve_layouts
from parsearch.serve.engines import tensorrt_engine_release
from parsearch.serve.explain import ServingExplanation, explain_serving, parse_serving_layout
from parsearch.serve.spec import (
    KV_PRECISIONS,
    SERVING_ENGINES,
    SERVING_MODES,
    SPEC_METHODS,
    WEIGHT_PRECISIONS,
    LengthClass,
    ServingWorkload,
    SlidingWindow,
)

_HEADERS = ("rank", "tp", "adp", "pp", "ep", "replicas", "gpus", "batch", "running", "tok/s",
            "tok/s/gpu", "tok/s/user", "ttft_ms", "queue_ms", "tpot_ms", "kv_GiB/gpu",
            "mem_GiB/gpu", "bound")


def _positive_number(text: str) -> float:
    value = non_negative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def _fraction(text: str) -> float:
    value = _positive_number(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{value:g} must be in (0, 1], a share of GPU memory")
    return value


def _unit_interval(text: str) -> float:
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{value:g} must be in [0, 1]")
    return value


#: Largest share of one length class in --mix (shares are relative; their sum must be finite).
MAX_SHARE = 1e6


def _mix(text: str) -> tuple[LengthClass, ...]:
    """argparse type: ``I:O[:W],...`` -> length classes (weight 1 when omitted)."""
    classes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        fields = part.split(":")
        try:
            if len(fields) not in (2, 3):
                raise ValueError
            isl, osl = int(fields[0]), int(fields[1])
            weight = float(fields[2]) if len(fields) == 3 else 1.0
            if not weight <= MAX_SHARE:  # NaN too; a sum of shares must stay finite
                raise ValueError
            classes.append(LengthClass(isl, osl, weight))
        except (ValueError, SpecError):
            raise argparse.ArgumentTypeError(
                f"{part!r} is not input:output[:share] with positive integers and share > 0 "
                f"(at most {MAX_SHARE:g})"
            ) from None
    if not classes:
        raise argparse.ArgumentTypeError("give at least one class, e.g. 1000:200")
    return tuple(classes)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="best serving layouts and replicas under latency targets",
        description="Find the serving layouts (TP, PP, EP, attention DP per instance, replicas, "
        "batch) of a model on a GPU budget: throughput of the whole group, per GPU and per "
        "user, TTFT, TPOT, memory, the Pareto front and vLLM/SGLang launch lines.",
    )
    add_model_option(parser)
    add_cluster_option(parser)
    parser.add_argument("--gpus", type=positive_int, required=True, metavar="N",
                        help="GPU budget")
    parser.add_argument("--isl", type=positive_int, default=None, metavar="I",
                        help="input tokens per request (or --mix)")
    parser.add_argument("--osl", type=positive_int, default=None, metavar="O",
                        help="output tokens per request (or --mix)")
    parser.add_argument("--mix", type=_mix, default=None, metavar="I:O[:W],...",
                        help="request lengths as classes of input:output tokens with "
                        "request shares, e.g. 1000:200:0.7,8000:500:0.3 (instead of --isl/--osl)")
    parser.add_argument("--ttft-ms", type=_positive_number, default=None, metavar="X",
                        help="time-to-first-token target (ms)")
    parser.add_argument("--tpot-ms", type=_positive_number, default=None, metavar="Y",
                        help="time-per-output-token target (ms)")
    parser.add_argument("--precision", choices=WEIGHT_PRECISIONS, default="bf16",
                        help="weight precision (default bf16)")
    parser.add_argument("--kv-precision", choices=KV_PRECISIONS, default=None,
                        help="KV-cache precision (default: bf16 for bf16 weights, else fp8)")
    parser.add_argument("--mode", choices=SERVING_MODES, default="aggregated",
                        help="aggregated continuous batching (default) or disaggregated "
                        "prefill/decode instances")
    parser.add_argument("--concurrency", type=positive_int, default=None, metavar="C",
                        help="requests in flight over the whole group; those the KV cache "
                        "or --max-batch cannot run at once queue, and TTFT includes the wait "
                        "(default: choose)")
    parser.add_argument("--request-rate", type=_positive_number, default=None, metavar="R",
                        help="requests/s to carry: rank by the fewest GPUs that carry it")
    parser.add_argument("--ep-overlap", action="store_true",
                        help="overlap MoE all-to-alls with a second micro-batch's compute "
                        "(SGLang --enable-two-batch-overlap)")
    parser.add_argument("--eplb", action="store_true",
                        help="MoE experts placed by an expert-parallel load balancer (vLLM/"
                        "SGLang --enable-eplb): no EP load imbalance")
    parser.add_argument("--max-instance-gpus", type=positive_int, default=128, metavar="G",
                        help="largest serving instance to consider (default 128)")
    parser.add_argument("--engine", choices=SERVING_ENGINES, default="vllm",
                        help="serving engine whose memory rules size the KV pool "
                        "(default vllm)")
    parser.add_argument("--engine-release", default=None, metavar="V",
                        help="the engine's release, where pricing depends on it: TensorRT-LLM "
                        "before 1.0 serves TensorRT engines (trtllm-build; no attention DP, "
                        "no overlap scheduler); default: today's releases")
    parser.add_argument("--moe-runner-backend", choices=("auto", "flashinfer_trtllm"),
                        default="auto",
                        help="SGLang's MoE runner (its flag of that name): flashinfer_trtllm "
                        "runs TensorRT-LLM's fused MoE kernels, priced at TensorRT-LLM's "
                        "grouped-GEMM factor with the routing glue fused; auto (default): "
                        "DeepGEMM for 8- and 16-bit experts, TensorRT-LLM's kernels for FP4")
    parser.add_argument("--memory-fraction", type=_fraction, default=None, metavar="F",
                        help="the engine's memory fraction: vLLM --gpu-memory-utilization "
                        "(default 0.9 of total), SGLang --mem-fraction-static (0.79-0.88 by "
                        "GPU count), TensorRT-LLM kv_cache_free_gpu_memory_fraction (0.9 of "
                        "free memory)")
    parser.add_argument("--spec-decode", choices=SPEC_METHODS, default="none",
                        help="speculative decoding: mtp (DeepSeek-V3 MTP module), eagle "
                        "(EAGLE draft head) or draft (separate draft model); default none")
    parser.add_argument("--spec-tokens", type=positive_int, default=None, metavar="K",
                        help="draft tokens per verify step (default: mtp 1, eagle 3, draft 4)")
    parser.add_argument("--acceptance-rate", type=_unit_interval, default=None, metavar="A",
                        help="chance each draft token is accepted, in [0, 1] (default: mtp "
                        "0.85, DeepSeek-V3 report; eagle 0.75, EAGLE paper; draft: required)")
    parser.add_argument("--draft-cost", type=_unit_interval, default=None, metavar="C",
                        help="one draft forward's time over one target decode step, in [0, 1] "
                        "(default for mtp/eagle: one layer plus the output head; draft: "
                        "required)")
    parser.add_argument("--prefix-cache-hit", type=_unit_interval, default=0.0, metavar="H",
                        help="share of prompt tokens found in the prefix cache, in [0, 1): "
                        "prefill computes the rest (default 0)")
    parser.add_argument("--max-batch", type=positive_int, default=1024, metavar="B",
                        help="most requests per instance (vLLM --max-num-seqs; default 1024)")
    parser.add_argument("--sliding-window", type=positive_int, default=None, metavar="W",
                        help="sliding-window size in tokens (with --windowed-layers)")
    parser.add_argument("--windowed-layers", type=positive_int, default=None, metavar="L",
                        help="number of layers that use the sliding window")
    parser.add_argument("--layout", default=None, metavar="L",
                        help='price one instance layout instead of searching, with where its '
                        'time and memory go, e.g. "tp=4,pp=1" (keys tp, pp, ep, adp, replicas, '
                        'batch; replicas default: fill --gpus)')
    parser.add_argument("--batch", type=positive_int, default=None, metavar="B",
                        help="with --layout: requests in flight per instance (default: "
                        "--concurrency over the replicas, else the most the KV cache holds)")
    parser.add_argument("--top", type=positive_int, default=10, metavar="K",
                        help="layouts to list (default 10)")
    parser.add_argument("--diverse", action=argparse.BooleanOptionalAction, default=True,
                        help="one row per instance shape (tp, attention DP, pp, ep; with "
                        "--mode disaggregated the prefill shape too) at its best batch "
                        "(default); --no-diverse lists every batch of every shape.  The "
                        "Pareto front lists the batches either way")
    add_format_option(parser, ("table", "json"))
    parser.set_defaults(handler=run)


def _window(args: argparse.Namespace) -> SlidingWindow | None:
    if (args.sliding_window is None) != (args.windowed_layers is None):
        raise SpecError("--sliding-window and --windowed-layers go together "
                        "(window in tokens and how many layers use it)")
    if args.sliding_window is not None:
        return SlidingWindow(args.sliding_window, args.windowed_layers)
    return None  # the model's own window (from its config.json or preset)


def workload_from_args(args: argparse.Namespace) -> ServingWorkload:
    kv = args.kv_precision or ("bf16" if args.precision == "bf16" else "fp8")
    fields = {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms, "precision": args.precision,
              "kv_precision": kv, "mode": args.mode, "concurrency": args.concurrency,
              "request_rate": args.request_rate, "max_batch": args.max_batch,
              "ep_overlap": args.ep_overlap, "max_instance_gpus": args.max_instance_gpus,
              "engine": args.engine, "memory_fraction": args.memory_fraction,
              "spec_decode": args.spec_decode, "spec_tokens": args.spec_tokens,
              "acceptance_rate": args.acceptance_rate, "draft_cost": args.draft_cost,
              "prefix_cache_hit": args.prefix_cache_hit, "eplb": args.eplb}
    if args.moe_runner_backend != "auto":
        if args.engine != "sglang":
            raise SpecError(f"--moe-runner-backend {args.moe_runner_backend} is SGLang's MoE "
                            f"runner; use it with --engine sglang (got --engine {args.engine})")
        fields["fused_moe_runner"] = True
    if args.engine_release is not None:
        try:
            fields["tensorrt_engine"] = tensorrt_engine_release(args.engine, args.engine_release)
        except ValueError as error:
            raise SpecError(f"--engine-release: {error}") from None
    if args.mix is not None:
        if args.isl is not None or args.osl is not None:
            raise SpecError("give either --isl/--osl or --mix, not both")
        return ServingWorkload.from_mix(args.mix, **fields)
    if args.isl is None or args.osl is None:
        raise SpecError("--isl and --osl are required (or --mix I:O[:W],...)")
    return ServingWorkload(isl=args.isl, osl=args.osl, **fields)


def run(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    if args.moe_runner_backend != "auto" and model.moe is None:
        raise SpecError(f"--moe-runner-backend {args.moe_runner_backend}: {model.name} has "
                        "no MoE layers; drop the flag")
    if args.layout is not None:
        return _run_layout(args, model)
    if args.batch is not None:
        raise SpecError("--batch goes with --layout (the search chooses the batch itself)")
    query = Query(model, clusters=cluster_from_args(args))
    result = serve_layouts(query, num_gpus=args.gpus, workload=workload_from_args(args),
                           window=_window(args), top=args.top, diverse=args.diverse)
    if args.format == "json":
        print_json(result.to_dict())
    else:
        _print(result)
    return 0


def _run_layout(args: argparse.Namespace, model: Any) -> int:
    fields = parse_serving_layout(args.layout)
    if args.batch is not None:
        if "batch" in fields:
            raise SpecError("give the batch once: in --layout or as --batch")
        fields["batch"] = args.batch
    workload = workload_from_args(args)
    if workload.mode != "aggregated":
        raise SpecError("--layout prices aggregated serving; drop --mode disaggregated")
    result = explain_serving(model=model, cluster=cluster_from_args(args), num_gpus=args.gpus,
                             workload=workload, layout=fields, window=_window(args))
    if args.format == "json":
        print_json(result.to_dict())
    else:
        _print_explanation(result)
    return 0


def _print_explanation(result: ServingExplanation) -> None:
    out = sys.stdout
    e = result.estimate
    out.write(f"{e.layout.label()} ({e.gpus} GPUs): {e.tokens_per_s:,.1f} tok/s, "
              f"{e.tokens_per_s_per_gpu:,.1f} tok/s/GPU, {e.tokens_per_s_per_user:,.2f} "
              f"tok/s/user, TTFT {e.ttft_ms:,.1f} ms, TPOT {e.tpot_ms:,.2f} ms\n")
    for title, part, unit in (("memory per GPU", result.memory, "GiB"),
                              ("decode step", result.decode, "ms"),
                              ("prefill and first token", result.prefill, "ms"),
                              ("batch and queue", result.queue, "")):
        out.write(f"\n{title}{f' ({unit})' if unit else ''}:\n")
        print_table(("part", "value"), [[k.replace("_", " "), v] for k, v in part.items()])


def _row(rank: Any, d: dict[str, Any]) -> list[Any]:
    lay = d["layout"]
    row = [rank, lay["tp"], lay["attention_dp"], lay["pp"], lay["ep"], lay["replicas"],
           d["gpus"], d["batch"], d["running_batch"], d["tokens_per_s"],
           d["tokens_per_s_per_gpu"], d["tokens_per_s_per_user"], d["ttft_ms"], d["queue_ms"],
           d["tpot_ms"],
           d["kv_cache_gib_per_gpu"], d["memory_gib_per_gpu"], d["bottleneck"]]
    pre = d.get("prefill_layout")
    if pre is not None:
        row.append(f"tp{pre['tp']} adp{pre['attention_dp']} pp{pre['pp']} ep{pre['ep']} "
                   f"x{pre['replicas']}")
    return row


def _print(result: ServeResult) -> None:
    q = result.query
    out = sys.stdout
    lengths = f"isl {q['isl']} osl {q['osl']}" + (" (mean of the mix)" if q["mix"] else "")
    out.write(f"{q['model']} on {q['num_gpus']} x {q['gpu']} ({q['cluster']}), {lengths}, "
              f"weights {q['precision']}, KV {q['kv_precision']}, {q['mode']}; "
              f"{result.considered} layouts, {result.fitting} fit\n")
    headers = _HEADERS + (("prefill",) if q["mode"] == "disaggregated" else ())
    rows = [_row(f"{e.rank}~" if e.tied else e.rank, e.estimate.to_dict())
            for e in result.entries]
    print_table(headers, rows)
    if q["diverse"]:
        out.write("(one row per instance shape, at its best batch; --no-diverse lists every "
                  "batch)\n")
    if result.tie_note:
        out.write(result.tie_note + "\n")
    best = result.best
    if q["mode"] == "disaggregated":
        out.write("(the layout columns are the decode instances; prefill: their own shape)\n")
    out.write("\nPareto front (tokens/s per GPU vs tokens/s per user):\n")
    print_table(headers, [_row("-", e.to_dict()) for e in result.front])
    if best is not None:
        launch = best.launch
        out.write(f"\nlaunch (best, x{launch.replicas}):\n  {' '.join(launch.vllm)}\n"
                  f"  {' '.join(launch.sglang)}\n  {' '.join(launch.trtllm)}\n")
        for line in launch.trtllm_options:
            out.write(f"    {line}\n")
        if launch.prefill_replicas:
            out.write(f"prefill (x{launch.prefill_replicas}):\n  "
                      f"{' '.join(launch.prefill_vllm)}\n  {' '.join(launch.prefill_sglang)}\n")
        for note in launch.notes:
            out.write(f"  note: {note}\n")
