"""Options shared by several commands, and turning them into specs."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from parsearch.cli.input_checks import finite_float
from parsearch.cost.kernels import CUDA_GRAPH_SCOPES
from parsearch.cost.options import (
    DEFAULT_MEMORY_MARGIN,
    DEFAULT_SEARCHED_FEATURES,
    SEARCHABLE_FEATURES,
)
from parsearch.cost.options import FLEX_BACKENDS as FLEX_BACKEND_CHOICES
from parsearch.cost.options import MOE_DISPATCHERS as MOE_DISPATCHER_CHOICES
from parsearch.cost.quantization import FP8_RECIPE_CHOICES
from parsearch.cost.routing import ROUTING_MODES
from parsearch.cost.stacks import DEFAULT_STACK, STACKS_BY_NAME
from parsearch.errors import SpecError
from parsearch.layout import Layout, parse_layout_string
from parsearch.model.offload_modules import OFFLOAD_MODULES
from parsearch.model.specs import (
    FSDP_STRATEGIES,
    MAX_MICRO_BATCH,
    PIPELINE_SPLITS,
    PRECISIONS,
    RECOMPUTE_MODES,
    RECOMPUTE_MODULES,
    SEQUENCE_PARALLEL_MODES,
    ModelSpec,
    TrainingSpec,
    short_repr,
)
from parsearch.strict_json import strict_json
from parsearch.topology.cluster import MAX_GPUS


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{short_repr(value)} must be {what}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


#: Most values in one comma-separated list option.
MAX_LIST_VALUES = 64


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: ``"1,2,4"`` -> ``(1, 2, 4)``, each a positive integer."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if len(parts) > MAX_LIST_VALUES:
        raise argparse.ArgumentTypeError(f"{len(parts)} values; give at most {MAX_LIST_VALUES}")
    values = [positive_int(part) for part in parts]
    if not values:
        raise argparse.ArgumentTypeError("give at least one value, e.g. 1,2,4")
    return tuple(values)


def choice_list(choices: Sequence[str]):  # type: ignore[no-untyped-def]
    """argparse type factory: a comma-separated subset of ``choices``."""

    def parse(text: str) -> tuple[str, ...]:
        values = tuple(p.strip().lower() for p in text.split(",") if p.strip())
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {', '.join(choices)} (comma-separated)"
            )
        return values

    return parse


def offload_module_list(text: str) -> tuple[str, ...] | str:
    """argparse type of ``--offload-modules``: a comma-separated subset of the modules,
    ``none`` (pinned off, the default) or ``auto`` (chosen per layout by the search)."""
    if text.strip().lower() == "none":
        return ()
    if text.strip().lower() == "auto":
        return "auto"
    parse: Callable[[str], tuple[str, ...]] = choice_list((*OFFLOAD_MODULES,))
    try:
        return parse(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}, or none, or auto") from None


def add_model_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        metavar="M",
        help="preset name (see `parsearch models`) or path to a Hugging Face config.json "
        "or a parsearch model file",
    )


def add_training_options(parser: argparse.ArgumentParser, *, batch_required: bool = True) -> None:
    """``--global-batch``, ``--seq-len`` and the candidate-set and accounting options."""
    group = parser.add_argument_group("training setup")
    group.add_argument("--global-batch", type=positive_int, required=batch_required,
                       metavar="B", help="global batch size in sequences")
    group.add_argument("--seq-len", type=positive_int, required=batch_required, metavar="S",
                       help="sequence length in tokens")
    group.add_argument("--micro-batch-sizes", type=int_list, default=(1, 2, 4, 8),
                       metavar="LIST", help="micro-batch candidates (default 1,2,4,8)")
    group.add_argument("--recompute", type=choice_list(RECOMPUTE_MODES),
                       default=RECOMPUTE_MODES, metavar="LIST",
                       help="recompute candidates among none,selective,full (default all)")
    group.add_argument("--pipeline-split", choices=PIPELINE_SPLITS, default=None,
                       help="even: pp*vpp divides the layers; uneven (default) also allows "
                       "uneven stages (Megatron layout strings); first-last: the splits "
                       "Megatron-Core <= 0.12 builds (every rank's layers divide by vpp; "
                       "the default of --stack mcore-0.9 to mcore-0.12)")
    group.add_argument("--sequence-parallel", choices=SEQUENCE_PARALLEL_MODES, default="both",
                       help="both (default): sp on and off where tp>1; on: sp exactly when "
                       "tp>1; off: never")
    group.add_argument("--max-vpp", type=positive_int, default=None, metavar="V",
                       help="largest interleaving degree to consider (default: no cap)")
    group.add_argument("--max-cp", type=positive_int, default=None, metavar="C",
                       help="largest context-parallel degree to consider (default: no cap)")
    group.add_argument("--stack", default=None, metavar="NAME",
                       help="software stack the job runs: only the layouts and features it "
                       "has are searched, and the kernels it runs are priced "
                       f"({', '.join(STACKS_BY_NAME)}; default {DEFAULT_STACK})")
    group.add_argument("--precision", choices=PRECISIONS, default="bf16",
                       help="GEMM precision: bf16, fp8 (tensor/block/MX scaling) or fp4 (NVFP4)")
    mem = parser.add_argument_group("memory accounting")
    mem.add_argument("--weight-bytes", type=non_negative_float, default=2.0,
                     help="bytes per parameter for weights (default 2)")
    mem.add_argument("--grad-bytes", type=non_negative_float, default=4.0,
                     help="bytes per parameter for gradients (default 4, fp32 main grads)")
    mem.add_argument("--optimizer-bytes", type=non_negative_float, default=12.0,
                     help="optimizer state bytes per parameter (default 12: fp32 master + "
                     "Adam m, v)")
    mem.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction,
                     default=True, help="shard optimizer state over data-parallel ranks "
                     "(default on)")
    mem.add_argument("--fsdp", action="store_true",
                     help="fully sharded data parallel (Megatron-FSDP optim_grads_params): "
                     "weights, gradients and optimizer state sharded over DP*CP")
    mem.add_argument("--fsdp-strategy", choices=FSDP_STRATEGIES, default="optim_grads_params",
                     help="with --fsdp, Megatron-FSDP's --data-parallel-sharding-strategy: "
                     "optim_grads_params (ZeRO-3, default) or optim_grads (ZeRO-2: weights "
                     "whole, gradients reduce-scattered every micro-batch)")
    mem.add_argument("--recompute-num-layers", type=positive_int, default=None, metavar="N",
                     help="with recompute=full: recompute only the first N layers of each "
                     "model chunk (Megatron --recompute-method block); default all")
    mem.add_argument("--recompute-modules", type=choice_list(RECOMPUTE_MODULES),
                     default=None, metavar="LIST",
                     help="with recompute=selective: modules to recompute among "
                     f"{','.join(RECOMPUTE_MODULES)} (default: chosen per layout, the first "
                     "of core_attn, +moe_act,layernorm, +mla_up_proj, +shared_experts, "
                     "+mlp,moe that fits)")
    mem.add_argument("--bf16-moments", action=argparse.BooleanOptionalAction, default=None,
                     help="Adam moments in BF16 (Megatron --use-precision-aware-optimizer "
                     "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16: 8 bytes of optimizer "
                     "state per parameter instead of 12; distributed optimizer only); default: "
                     "chosen per layout only where it is needed to fit or saves >= 1%% of "
                     "the step")
    mem.add_argument("--activation-offload-layers", type=non_negative_int, default=None,
                     metavar="K", help="offload the activations of the first K layers of "
                     "each model chunk to host memory (Megatron --cpu-offloading-num-layers; "
                     "only pp=1 without recompute); default: chosen per layout, the fewest "
                     "layers that make a pp=1, recompute-none layout fit, 0 where it fits")
    mem.add_argument("--offload-modules", type=offload_module_list, default=None,
                     metavar="LIST",
                     help="fine-grained activation offloading (Megatron-Core 0.16+ "
                     "--fine-grained-activation-offloading --offload-modules): the inputs of "
                     f"these submodules of every layer go to host memory, among "
                     f"{','.join(OFFLOAD_MODULES)}; any pp and recompute; not with "
                     "--activation-offload-layers; 'auto': chosen per layout where memory "
                     "forces a slower setting and it is faster (stacks that have it); "
                     "default none")


def add_cluster_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster",
        required=True,
        metavar="C",
        help="cluster preset (see `parsearch clusters`) or path to a cluster YAML file",
    )
    from parsearch.cli.gpu_variant_options import add_gpu_variant_options

    add_gpu_variant_options(parser)  # --gpu-power-limit, --gpu-memory-gib, ...


def add_cost_options(parser: argparse.ArgumentParser) -> None:
    """Options of the time model that are not part of the training setup."""
    group = parser.add_argument_group("cost model")
    group.add_argument("--efficiency", metavar="NAME|FILE", default=None,
                       help="efficiency profile (default: the one covering the cluster's GPU)")
    group.add_argument("--routing", choices=ROUTING_MODES, default="trained",
                       help="MoE routing priced: trained (default: a trained router's expert-"
                       "load imbalance, growing with EP) or balanced (forced uniform routing, "
                       "--moe-router-force-load-balancing: for benchmarks only, the router "
                       "stops learning; the launch settings turn it on only then)")
    group.add_argument("--moe-imbalance", type=non_negative_float, default=None, metavar="X",
                       help="max/mean tokens per expert rank, fixed for every layout (>= 1; "
                       "default: from --routing)")
    group.add_argument("--moe-capacity-factor", type=non_negative_float, default=None,
                       metavar="C", help="Megatron's --moe-expert-capacity-factor: tokens past "
                       "C times the mean per expert are dropped (>= 1; default: dropless)")
    group.add_argument("--moe-pad-to-capacity", action="store_true",
                       help="pad every expert's input to the capacity factor "
                       "(--moe-pad-expert-input-to-capacity)")
    group.add_argument("--grad-reduce-bytes", type=non_negative_float, default=4.0,
                       metavar="B", help="bytes per gradient element in the DP reduction "
                       "(default 4: fp32; 2: bf16)")
    group.add_argument("--moe-dispatcher", choices=MOE_DISPATCHER_CHOICES, default=None,
                       help="MoE token dispatcher priced (Megatron --moe-token-dispatcher-type): "
                       "alltoall (one copy per routed expert), allgather (Megatron-Core's own "
                       "default), flex (DeepEP/HybridEP: one network copy per remote NVLink "
                       "domain; Hopper and newer); default: chosen per layout")
    group.add_argument("--moe-flex-backend", choices=FLEX_BACKEND_CHOICES, default="auto",
                       help="flex dispatcher kernels (Megatron --moe-flex-dispatcher-backend): "
                       "deepep (20 SMs) or hybridep (32 SMs, Bridge recipes); default auto: "
                       "hybridep where the NVLink domain spans nodes (NVL72), else deepep")
    group.add_argument("--tp-comm-overlap", action=argparse.BooleanOptionalAction, default=True,
                       help="Transformer Engine TP communication overlap (needs SP and TP "
                       "inside an NVLink domain; default on)")
    group.add_argument("--moe-a2a-overlap", action=argparse.BooleanOptionalAction,
                       default=None, help="overlap the MoE all-to-all of one micro-batch with "
                       "another's compute (--overlap-moe-expert-parallel-comm; needs EP > 1, "
                       "no full recompute, PP 1 or interleaved; interleaved, one more warm-up "
                       "chunk); "
                       "default: chosen per layout")
    group.add_argument("--moe-shared-expert-overlap", action=argparse.BooleanOptionalAction,
                       default=None, help="run the shared experts beside the same "
                       "micro-batch's dispatch and combine (--moe-shared-expert-overlap; "
                       "models with shared experts, alltoall or flex dispatcher); default: "
                       "chosen per layout")
    group.add_argument("--no-feature-search", action="store_true",
                       help="price every feature left unset at its fixed default (alltoall, "
                       "no overlaps, no CUDA graphs, recompute modules core_attn, FP32 Adam "
                       "moments, BF16 parameter gather) instead of choosing it per layout")
    group.add_argument("--overlap-grad-reduce", action=argparse.BooleanOptionalAction,
                       default=True, help="overlap the DP gradient reduce-scatter with "
                       "backward (default on)")
    group.add_argument("--overlap-param-gather", action=argparse.BooleanOptionalAction,
                       default=True, help="overlap the DP parameter all-gather with forward "
                       "(default on)")
    group.add_argument("--ddp-bucket-size", type=positive_int, default=None, metavar="PARAMS",
                       help="parameters per DP gradient bucket, one collective call each "
                       "(Megatron --ddp-bucket-size; Apex DistributedFusedAdam bucket_cap_mb "
                       "x 2^20 / 2 with BF16 gradient sync); default: Megatron-Core's "
                       "max(40M, 1M x DP)")
    group.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                       help="per-layer Transformer Engine CUDA graphs: no host launch cost for "
                       "what they capture, static buffers per layer and micro-batch in flight "
                       "(not with full recompute or CPU offloading); default: chosen per "
                       "layout (the fastest scope, or none, that runs and fits)")
    group.add_argument("--fp8-recipe", choices=FP8_RECIPE_CHOICES, default="auto",
                       help="FP8 scaling priced and launched with --precision fp8 (default "
                       "auto: mxfp8 on Blackwell, tensorwise current scaling before; "
                       "tensorwise pays an extra amax read per cast)")
    group.add_argument("--fp8-attention", action=argparse.BooleanOptionalAction, default=False,
                       help="with --precision fp8/fp4: fused attention in FP8 (Megatron "
                       "fp8_dot_product_attention; both attention matmuls at the FP8 rate; "
                       "default off)")
    group.add_argument("--fp8-output-proj", action=argparse.BooleanOptionalAction,
                       default=False, help="with --precision fp8 and the mxfp8 recipe: the "
                       "output layer (LM head) GEMM in MXFP8 (Megatron fp8_output_proj; "
                       "default off: BF16)")
    group.add_argument("--fused-expert-mlp", action=argparse.BooleanOptionalAction,
                       default=None, help="MoE experts through Transformer Engine's op "
                       "fuser: SwiGLU and its casts in the grouped GEMM epilogues (Blackwell, "
                       "mxfp8 or fp4, etp=1, Megatron Core 0.18+; Megatron "
                       "--use-transformer-engine-op-fuser; default: on wherever it runs)")
    group.add_argument("--cuda-graph-scope", type=choice_list(CUDA_GRAPH_SCOPES), default=(),
                       metavar="LIST",
                       help="pin CUDA graphs on with these parts of each layer captured, "
                       f"among {','.join(CUDA_GRAPH_SCOPES)} (Megatron --cuda-graph-modules; "
                       "with --cuda-graphs and no list: the whole layer)")
    group.add_argument("--memory-margin", type=_fraction, default=DEFAULT_MEMORY_MARGIN,
                       metavar="F", help="share of GPU memory a layout must leave free to "
                       "count as fitting (default 0.05: allocator fragmentation and "
                       "workspaces the memory model does not count)")
    group.add_argument("--fp8-param-gather", action=argparse.BooleanOptionalAction,
                       default=None, help="FP8 primary weights (Megatron --fp8-param-gather; "
                       "--precision fp8/fp4 only): no BF16 weight copy, FP8 parameter "
                       "all-gather; default: chosen per layout only where it is needed to fit "
                       "or saves >= 1%% of the step")


def _fraction(text: str) -> float:
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1")
    return value


def add_format_option(parser: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    parser.add_argument("--format", choices=formats, default=formats[0],
                        help=f"output format (default {formats[0]})")


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    from parsearch.model.files import resolve_model

    return resolve_model(args.model)


def training_from_args(args: argparse.Namespace) -> TrainingSpec:
    """The training setup the flags give, bounded to what ``--stack`` can run."""
    from parsearch.cost.stacks import DEFAULT_STACK, get_stack, stack_training

    stack = get_stack(getattr(args, "stack", None) or DEFAULT_STACK)
    explicit = frozenset(name for name, given in (
        ("sequence_parallel", args.sequence_parallel != "both"),
        ("recompute_modes", tuple(args.recompute) != tuple(RECOMPUTE_MODES)),
        ("max_cp", getattr(args, "max_cp", None) is not None),
        ("max_vpp", getattr(args, "max_vpp", None) is not None),
        ("pipeline_split", args.pipeline_split is not None)) if given)
    return stack_training(stack, _training_as_given(args), explicit=explicit)


def _training_as_given(args: argparse.Namespace) -> TrainingSpec:
    return TrainingSpec(
        seq_len=args.seq_len,
        global_batch=args.global_batch,
        micro_batch_sizes=tuple(args.micro_batch_sizes),
        precision=args.precision,
        recompute_modes=tuple(args.recompute),
        pipeline_split=args.pipeline_split or "uneven",
        distributed_optimizer=args.distributed_optimizer,
        weight_bytes=args.weight_bytes,
        grad_bytes=args.grad_bytes,
        optimizer_bytes=(8.0 if getattr(args, "bf16_moments", None) else args.optimizer_bytes),
        sequence_parallel=args.sequence_parallel,
        max_vpp=args.max_vpp,
        max_cp=getattr(args, "max_cp", None),
        fsdp=args.fsdp,
        fsdp_strategy=args.fsdp_strategy,
        recompute_num_layers=args.recompute_num_layers,
        recompute_modules=tuple(args.recompute_modules or ("core_attn",)),
        activation_offload_layers=args.activation_offload_layers or 0,
        offload_modules=pinned_offload_modules(args),
    )


def pinned_offload_modules(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--offload-modules`` the user pinned (none where unset or ``auto``)."""
    value = getattr(args, "offload_modules", None)
    return () if value is None or value == "auto" else tuple(value)


def searched_features(args: argparse.Namespace) -> tuple[str, ...]:
    """The features the user left unset (MoE dispatcher and overlaps, CUDA graphs, the
    memory features): chosen per layout by the search (none with ``--no-feature-search``).
    Fine-grained offload modules are chosen only on request (``--offload-modules auto``;
    ``DEFAULT_SEARCHED_FEATURES``)."""
    if getattr(args, "no_feature_search", False):
        return ()
    return tuple(name for name in SEARCHABLE_FEATURES if (
        getattr(args, name, None) == "auto" if name not in DEFAULT_SEARCHED_FEATURES
        else getattr(args, name, None) is None)
                 and not (name == "cuda_graphs" and getattr(args, "cuda_graph_scope", ()))
                 # --optimizer-bytes other than 12 states the optimizer state: pinned
                 and not (name == "bf16_moments"
                          and getattr(args, "optimizer_bytes", 12.0) != 12.0))


def cost_model_from_args(args: argparse.Namespace, model: ModelSpec, training: TrainingSpec,
                         num_gpus: int):  # type: ignore[no-untyped-def]
    """The :class:`~parsearch.cost.analytic.CostModel` for ``--cluster`` on ``num_gpus`` GPUs."""
    from parsearch.cli.gpu_variant_options import cluster_from_args
    from parsearch.cost.analytic import CostOptions, build_cost_model
    from parsearch.cost.efficiency import load_efficiency_profile
    from parsearch.cost.memory import MemoryOptions
    from parsearch.cost.stack_speed import stack_profile_or_default
    from parsearch.cost.stacks import DEFAULT_STACK, get_stack
    from parsearch.topology.summary import fabric_from_spec

    if args.moe_imbalance is not None and args.moe_imbalance < 1:
        raise SpecError(f"--moe-imbalance {args.moe_imbalance} must be >= 1 (max/mean)")
    cluster = cluster_from_args(args)  # with the GPU variant options applied
    # the per-GPU arrays from the cluster fields: equal to the graph walk, array for array
    # (tests/test_search.py), without building a graph of every GPU, NIC and switch
    fabric = fabric_from_spec(cluster, num_gpus)
    profile = load_efficiency_profile(args.efficiency) if args.efficiency else None
    stack = get_stack(getattr(args, "stack", None) or DEFAULT_STACK)
    profile = stack_profile_or_default(stack.name, profile, fabric.gpu.name)  # its kernels
    if args.moe_capacity_factor is not None and args.moe_capacity_factor < 1:
        raise SpecError(f"--moe-capacity-factor {args.moe_capacity_factor} must be >= 1 "
                        "(tokens kept per expert, as a multiple of the mean)")
    if args.moe_pad_to_capacity and args.moe_capacity_factor is None:
        raise SpecError("--moe-pad-to-capacity needs --moe-capacity-factor C (Megatron pads "
                        "expert inputs to the capacity factor)")
    options = CostOptions(
        search_features=searched_features(args),
        routing=args.routing,
        moe_imbalance=args.moe_imbalance,
        moe_capacity_factor=args.moe_capacity_factor,
        moe_pad_to_capacity=args.moe_pad_to_capacity,
        tp_comm_overlap=args.tp_comm_overlap,
        moe_a2a_overlap=bool(args.moe_a2a_overlap),
        moe_shared_expert_overlap=bool(args.moe_shared_expert_overlap),
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather,
        ddp_bucket_params=getattr(args, "ddp_bucket_size", None),
        # a scope pins graphs on (feature_search.py chooses them when both are unset)
        cuda_graphs=bool(args.cuda_graphs) or bool(args.cuda_graph_scope),
        cuda_graph_scope=tuple(args.cuda_graph_scope),
        fp8_recipe=args.fp8_recipe,
        fp8_attention=args.fp8_attention,
        fp8_output_proj=args.fp8_output_proj,
        fused_expert_mlp=bool(args.fused_expert_mlp),
        grad_reduce_bytes=args.grad_reduce_bytes,
        moe_dispatcher=args.moe_dispatcher or "alltoall",
        moe_flex_backend=args.moe_flex_backend,
        memory_margin=args.memory_margin,
        param_gather_bytes=1.0 if args.fp8_param_gather else 2.0,
        memory=MemoryOptions(fp8_param_gather=bool(args.fp8_param_gather),
                             moe_imbalance=args.moe_imbalance or 1.0),
    )
    return build_cost_model(model, training, fabric, profile=profile,
                            options=_stack_bounded(args, options, model))


def stack_note(args: argparse.Namespace) -> str:
    """One line naming a non-default ``--stack`` and what it leaves out ("" by default)."""
    from parsearch.cost.stacks import DEFAULT_STACK, get_stack

    name = getattr(args, "stack", None)
    if not name or name == DEFAULT_STACK:
        return ""
    from parsearch.cost.stack_speed import load_stack_speed

    stack = get_stack(name)
    missing = ", ".join(stack.missing()) or "nothing"
    note = f"  software stack {stack.name} ({stack.source}): without {missing}"
    speed = load_stack_speed(stack.name)
    if speed is not None:
        rates = ", ".join(f"{gen} {rate.value:g}" for gen, rate in
                          sorted(speed.attention_rate.items()))
        note += (f"; attention priced at its own kernel's rate, as a fraction of the "
                 f"Megatron-Core one ({rates}; cost_models/stacks/{stack.name}.yaml)")
    if stack.fsdp_only:
        note += ("; launch settings spell the degrees as Megatron-LM flags (the same "
                 "degrees go in the stack's own configuration)")
    return note


def _stack_bounded(args: argparse.Namespace, options,  # type: ignore[no-untyped-def]
                   model: ModelSpec):
    """``options`` bounded to what ``--stack`` can run; a feature flag the stack lacks errs,
    and so does a model it cannot build."""
    from parsearch.cost.stacks import (
        DEFAULT_STACK,
        get_stack,
        require_model_support,
        stack_options,
    )

    stack = get_stack(getattr(args, "stack", None) or DEFAULT_STACK)
    require_model_support(stack, model)
    # asked for: a value other than auto, or auto for a feature searched only on request
    on_request = set(SEARCHABLE_FEATURES) - set(DEFAULT_SEARCHED_FEATURES)
    explicit = frozenset(name for name in (*SEARCHABLE_FEATURES, "moe_flex_backend")
                         if getattr(args, name, None) not in (None, "auto")
                         or (name in on_request and getattr(args, name, None) == "auto")
                         or (name == "cuda_graphs" and getattr(args, "cuda_graph_scope", ())))
    return stack_options(stack, options, explicit=explicit)


def layout_from_args(args: argparse.Namespace) -> Layout:
    if args.layout is None:
        raise SpecError("--layout is required, e.g. --layout \"tp=8,pp=4,sp=true\"")
    layout = parse_layout_string(args.layout, num_gpus=args.gpus)
    for name in ("tp", "pp", "cp", "ep", "etp", "vpp"):  # no degree beyond the largest job
        value = getattr(layout, name)
        if value > MAX_GPUS:
            raise SpecError(f"--layout: {name}={short_repr(value)} exceeds the largest "
                            f"supported degree, {MAX_GPUS:,}")
    if layout.mbs > MAX_MICRO_BATCH:
        raise SpecError(f"--layout: mbs={short_repr(layout.mbs)} exceeds the largest supported "
                        f"micro-batch, {MAX_MICRO_BATCH:,}")
    return layout


def print_json(document: Any, out: TextIO | None = None) -> None:
    """Print ``document`` as strict JSON (RFC 8259: no NaN or Infinity), see :func:`strict_json`."""
    out = out or sys.stdout
    json.dump(strict_json(document), out, indent=2, allow_nan=False)
    out.write("\n")


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                out: TextIO | None = None) -> None:
    """Left-aligned text columns; numbers right-aligned."""
    out = out or sys.stdout
    rows = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    out.write("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip() + "\n")
    for row in rows:
        cells = [
            c.rjust(w) if _is_number(c) else c.ljust(w)
            for c, w in zip(row, widths, strict=True)
        ]
        out.write("  ".join(cells).rstrip() + "\n")


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a" if value != value else "unbounded"
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
