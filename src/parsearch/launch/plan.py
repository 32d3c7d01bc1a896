"""What was priced, in launch terms: one plan that every launch spelling is generated from.

:func:`launch_plan` reads the same inputs the cost model priced — the model,
the training spec, the layout and the :class:`~parsearch.cost.options.CostOptions`
— and resolves them into the concrete switches a framework needs: the
pipeline split (an even split, or Megatron's layout string for an uneven
one), the recompute method, the precision recipe, the optimizer sharding, the
MoE dispatcher, the overlap features, CUDA graphs, activation offloading and
``CUDA_DEVICE_MAX_CONNECTIONS``.  Megatron-LM arguments
(:mod:`parsearch.launch.megatron_lm`) and Megatron-Bridge overrides
(:mod:`parsearch.launch.bridge`) are both written from this plan, so the
two spellings cannot disagree with each other or with the price.

Where Megatron cannot run what was priced (e.g. whole-layer CPU offloading
with pipeline parallelism), the plan says so in ``conflicts`` instead of
printing a launch that would run something else.
"""

from __future__ import annotations

from dataclasses import dataclass

from parsearch.cost.communication import flex_backend
from parsearch.cost.ep_overlap import layout_a2a_schedulable, shared_expert_overlap_on
from parsearch.cost.fused_mlp import fused_mlp_rows
from parsearch.cost.memory_features import effective_training
from parsearch.cost.options import CostOptions
from parsearch.cost.quantization import FP8_RECIPE_CHOICES, resolve_fp8_recipe
from parsearch.cost.stages import effective_split, priced_rank_split, virtual_stage_layer_counts
from parsearch.errors import SpecError
from parsearch.launch.environment import PINNED_ENV, hybridep_topology, launch_env
from parsearch.layout import Layout
from parsearch.layout.rank_split import RankSplit
from parsearch.model.offload_modules import graph_conflict
from parsearch.model.pipeline_layout import format_pipeline_layout
from parsearch.model.specs import TORCHTITAN_OP_SAC, ModelSpec, TrainingSpec

#: FP8 recipes of Megatron-LM's ``--fp8-recipe`` that parsearch launches; ``auto`` is the
#: one NVIDIA's performance recipes use per generation — per-tensor current scaling on
#: Hopper, MXFP8 on Blackwell (MXFP8 needs Blackwell tensor cores; Transformer Engine
#: docs, "Using FP8 and FP4 with Transformer Engine").


@dataclass(frozen=True)
class LaunchPlan:
    """The concrete switches of one priced layout (framework-neutral)."""

    layout: Layout
    seq_len: int
    global_batch: int
    is_moe: bool
    # pipeline: a Megatron layout string for an uneven split, else layers per virtual stage
    pipeline_layout: str | None
    layers_per_virtual_stage: int | None
    # Megatron-Core <= 0.12 (--pipeline-split first-last): the ranks' layers and flags
    rank_split: RankSplit | None
    # recompute
    recompute_granularity: str | None  # None | "selective" | "full"
    recompute_method: str | None  # "uniform" | "block"
    recompute_num_layers: int | None
    recompute_modules: tuple[str, ...]
    # precision
    precision: str  # bf16 | fp8 | fp4
    fp8_recipe: str | None
    fp8_param_gather: bool
    grad_reduce_in_fp32: bool
    # data parallel
    distributed_optimizer: bool
    fsdp: bool
    fsdp_strategy: str
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    #: parameters per gradient bucket the pricing assumed when it is not Megatron-Core's
    #: default (``--ddp-bucket-size``)
    ddp_bucket_size: int | None
    #: interleaved pipeline sends overlapped with compute (Megatron-LM's default for vpp > 1;
    #: ``False``: ``--no-overlap-p2p-communication``, as priced with ``pp_p2p_overlap`` off)
    overlap_p2p: bool
    # features
    tp_comm_overlap: bool
    moe_dispatcher: str | None
    flex_backend: str | None
    moe_a2a_overlap: bool
    moe_shared_expert_overlap: bool
    force_balanced_routing: bool
    capacity_factor: float | None
    pad_to_capacity: bool
    cuda_graphs: bool
    cuda_graph_scope: tuple[str, ...]
    flash_attention: bool
    fp8_attention: bool
    fp8_output_proj: bool
    fused_expert_mlp: bool
    offload_layers: int
    optimizer: str
    # precision-aware optimizer: dtypes of main grads and Adam moments (None: fp32 default)
    main_grads_dtype: str | None
    moment_dtype: str | None
    env: tuple[tuple[str, str], ...]
    conflicts: tuple[str, ...]
    # priced settings the Megatron-LM command line cannot express (Bridge can)
    megatron_lm_gaps: tuple[str, ...] = ()
    # fine-grained activation offloading: module inputs kept on host (--offload-modules)
    offload_modules: tuple[str, ...] = ()
    # --cuda-graph-impl when cuda_graphs (per-layer transformer_engine / local, or one
    # full_iteration graph)
    cuda_graph_impl: str = "transformer_engine"
    # memory features the search chose (not given): recompute_modules, bf16_moments,
    # fp8_param_gather (cost/memory_features.py)
    chosen_features: tuple[str, ...] = ()
    # the model's MLP is gated (SwiGLU / GPT-OSS's quick-GEGLU): its activation is priced as
    # Megatron's fused bias-activation kernel (cost/compute.py memory_bound_bytes_per_token)
    gated_mlp: bool = True
    # multi-latent attention: Megatron-Core fuses its RoPE only with YaRN, which the model
    # spec does not record, so the launch leaves apply_rope_fusion to the recipe
    mla: bool = False


def _pipeline(model: ModelSpec, training: TrainingSpec, lay: Layout
              ) -> tuple[str | None, int | None]:
    """(layout string, layers per virtual stage): exactly one is set when pp > 1."""
    if lay.pp == 1:
        return None, None
    if training.pipeline_split == "first-last":  # no layout strings: the ranks' flags
        return None, None
    split = effective_split(model, training, lay.pp, lay.vpp)
    if split not in ("even", "uneven"):  # a layout string (the recipe's or work-balanced)
        return split, None
    text = pipeline_layout_string(model, lay.pp, lay.vpp, split)
    return (text, None) if text else (None, model.num_layers // (lay.pp * lay.vpp))


def priced_features(plan: LaunchPlan) -> tuple[str, ...]:
    """The features a plan prices, in words, for a reader checking what a number assumes.

    >>> from parsearch.model.presets import get_preset
    >>> from parsearch.model.specs import TrainingSpec
    >>> plan = launch_plan(get_preset("llama3-8b"), TrainingSpec(seq_len=4096, global_batch=64),
    ...                    Layout(num_gpus=16, tp=2, sp=True, mbs=1))
    >>> priced_features(plan)
    ('BF16', 'TP comm overlap', 'grad-reduce overlap', 'param-gather overlap')
    """
    out = [{"fp8": f"FP8 ({plan.fp8_recipe})", "fp4": "NVFP4"}.get(plan.precision, "BF16")]
    named = (
        (plan.fp8_attention, "FP8 attention"),
        (plan.fp8_output_proj, "MXFP8 LM head"),
        (plan.fp8_param_gather, "FP8 parameter gather" + _chosen(plan, "fp8_param_gather")),
        (plan.moe_dispatcher is not None,
         f"{plan.moe_dispatcher} dispatcher"
         + (f" ({plan.flex_backend})" if plan.flex_backend else "")),
        (plan.moe_dispatcher is not None,
         "forced-balance routing (benchmark)" if plan.force_balanced_routing
         else "trained-router imbalance"),
        (plan.capacity_factor is not None,
         f"capacity factor {plan.capacity_factor or 0:g}"
         + (" (padded)" if plan.pad_to_capacity else " (token drop)")),
        (plan.fused_expert_mlp, "fused expert MLP"),
        (plan.tp_comm_overlap, "TP comm overlap"),
        (plan.moe_a2a_overlap, "EP all-to-all overlap"),
        (plan.moe_shared_expert_overlap, "shared-expert overlap"),
        (plan.overlap_grad_reduce, "grad-reduce overlap"),
        (plan.overlap_param_gather, "param-gather overlap"),
        (plan.cuda_graphs, "CUDA graphs"
         + (f" ({', '.join(plan.cuda_graph_scope)})" if plan.cuda_graph_scope
            else " (full iteration)" if plan.cuda_graph_impl == "full_iteration"
            else " (whole layers)")),
        (plan.moment_dtype == "bf16", "BF16 Adam moments (precision-aware optimizer)"
         + _chosen(plan, "bf16_moments")),
        (plan.recompute_granularity == "selective",
         f"selective recompute ({', '.join(plan.recompute_modules)})"),
        (plan.fsdp, "Megatron-FSDP"),
        (plan.offload_layers > 0, f"activation offload ({plan.offload_layers} layers"
         + (", chosen by the search: the fewest that fit; pin with --activation-offload-layers"
            if "activation_offload_layers" in plan.chosen_features else "") + ")"),
        (bool(plan.offload_modules),
         f"fine-grained activation offload ({', '.join(plan.offload_modules)}"
         + ("; chosen by the search (--offload-modules auto) where memory forced more "
            "recompute or nothing fit; pin with --offload-modules LIST or none"
            if "offload_modules" in plan.chosen_features else "") + ")"),
        (not plan.flash_attention, "unfused attention"),
        # the uneven split the launch passes (a recipe's layout string, Megatron's
        # accounting or the work-balanced split: cost/stages.py)
        (plan.pipeline_layout is not None, f"pipeline layout {plan.pipeline_layout}"),
    )
    return tuple(out + [text for on, text in named if on])


def _chosen(plan: LaunchPlan, feature: str) -> str:
    """" (chosen ...)" where the search turned a numerics-changing feature on."""
    return (" (chosen by the search: needed to fit or >= 1% faster; changes numerics, pin "
            "it off with --no-" + feature.replace("_", "-") + ")"
            if feature in plan.chosen_features else "")


def pipeline_layout_string(model: ModelSpec, pp: int, vpp: int, split: str) -> str | None:
    """Megatron's ``--pipeline-model-parallel-layout`` for a split mode's layer counts where
    they are uneven, else ``None`` (where no Megatron accounting divides the layers the
    launch uses :func:`effective_split`'s work-balanced string instead).

    >>> m = ModelSpec("toy", 30, 1024, 4096, 16, 16, 64, 32000)
    >>> pipeline_layout_string(m, 4, 1, "uneven")
    'Et*7|(t*8|)*2t*7L'
    >>> pipeline_layout_string(m, 4, 2, "uneven")
    'Et*3|(t*4|)*6t*3L'
    >>> pipeline_layout_string(m, 3, 1, "uneven") is None
    True
    """
    counts = virtual_stage_layer_counts(model.num_layers, pp, vpp, split)
    if len(set(counts)) == 1:
        return None
    return format_pipeline_layout(counts, model.mtp_layers)


def _recompute(training: TrainingSpec, lay: Layout
               ) -> tuple[str | None, str | None, int | None, tuple[str, ...]]:
    if lay.recompute == "selective":
        # Megatron-Core recompute_modules (transformer_config.py); priced per module
        # by parsearch.cost.recompute.
        if TORCHTITAN_OP_SAC in training.recompute_modules:
            raise SpecError(
                f"recompute module {TORCHTITAN_OP_SAC!r} prices torchtitan's op-level "
                "checkpointing, which Megatron-LM has no flag for: launch with Megatron "
                "modules (e.g. core_attn, layernorm, mlp) or recompute full")
        return "selective", None, None, tuple(training.recompute_modules)
    if lay.recompute == "full":
        if training.recompute_num_layers is None:
            # every layer: uniform method with one layer per checkpoint group
            return "full", "uniform", 1, ()
        return "full", "block", training.recompute_num_layers, ()
    return None, None, None, ()


def _optimizer_state(training: TrainingSpec, conflicts: list[str]
                     ) -> tuple[str | None, str | None]:
    """Megatron's precision-aware optimizer dtypes for the priced bytes per parameter.

    Gradients: 4 bytes is Megatron's fp32 main-grad buffer, 2 is
    ``--main-grads-dtype bf16``.  Adam state: 12 bytes is fp32 master weights plus
    fp32 moments; 8 keeps the fp32 master and stores both moments in BF16
    (``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``, Megatron-Core
    ``OptimizerConfig`` precision-aware optimizer).  Weights: 2 bytes (BF16).
    """
    grads = {4.0: None, 2.0: "bf16"}
    moments = {12.0: None, 8.0: "bf16"}
    if training.weight_bytes != 2.0:
        conflicts.append(f"weight_bytes={training.weight_bytes:g}: Megatron's --bf16 training "
                         "keeps 2-byte weights")
    if float(training.grad_bytes) not in grads:
        conflicts.append(f"grad_bytes={training.grad_bytes:g}: Megatron keeps main gradients in "
                         "fp32 (4) or bf16 (2, --main-grads-dtype bf16)")
    if training.optimizer == "adam" and float(training.optimizer_bytes) not in moments:
        conflicts.append(f"optimizer_bytes={training.optimizer_bytes:g}: Megatron's Adam keeps "
                         "12 (fp32 master and moments) or 8 (bf16 moments) bytes per parameter")
    return (grads.get(float(training.grad_bytes)),
            moments.get(float(training.optimizer_bytes)) if training.optimizer == "adam"
            else None)


def launch_plan(model: ModelSpec, training: TrainingSpec, layout: Layout,
                options: CostOptions | None = None, *, compute_capability: float | None = None,
                nvlink_domain_size: int = 8, gpus_per_node: int = 8,
                fp8_recipe: str = "auto") -> LaunchPlan:
    """Resolve what the cost model priced for ``layout`` into launch switches."""
    opt = options if options is not None else CostOptions()
    # the memory features the search chose (recompute modules, BF16 moments) as priced
    training = effective_training(training, opt)
    lay = layout
    pipeline, per_stage = _pipeline(model, training, lay)
    granularity, method, rec_layers, modules = _recompute(training, lay)
    moe = model.is_moe
    ep_comm = moe and lay.ep > 1
    # the EP all-to-all overlap only where Megatron runs it, as it was priced (Megatron
    # launches no DualPipe, so never on the strength of ``opt.dualpipe``)
    a2a_overlap = bool(moe and opt.moe_a2a_overlap and layout_a2a_schedulable(lay))
    backend = None
    if moe and opt.moe_dispatcher == "flex":
        # the back end the cost model priced; auto: HybridEP spans a multi-node NVLink
        # domain (GB200/GB300 NVL72), DeepEP is the InfiniBand back end (Megatron-Bridge
        # perf recipes, deepseek/common.py)
        backend = flex_backend(opt, nvlink_domain_size, gpus_per_node)
    fp8_gather = training.precision != "bf16" and opt.memory.fp8_param_gather
    conflicts: list[str] = []
    if (model.moe is not None and opt.moe_imbalance is not None
            and not (opt.routing == "balanced" and opt.moe_imbalance == 1.0)):
        conflicts.append(f"expert-load imbalance fixed at {opt.moe_imbalance:g} "
                         "(--moe-imbalance): no launch setting makes the router produce it; "
                         "the run's own routing decides")
    if training.precision == "bf16" and opt.memory.fp8_param_gather:
        conflicts.append("FP8 parameter gather was asked for with BF16 GEMMs; Megatron only "
                         "gathers FP8 weights when training in FP8 (use --precision fp8)")
    offload = training.activation_offload_layers
    if offload:
        # Megatron-Core TransformerConfig.__post_init__: whole-layer CPU offloading
        # (--cpu-offloading-num-layers) supports neither PP nor recompute, and at most L-1.
        if lay.pp > 1:
            conflicts.append(f"activation offloading of {offload} layers with pp={lay.pp}: "
                             "Megatron's --cpu-offloading-num-layers does not support pipeline "
                             "parallelism")
        if granularity is not None:
            conflicts.append("activation offloading with recompute: Megatron's CPU offloading "
                             "does not work with activation recomputation")
        if offload >= model.num_layers:
            conflicts.append(f"activation offloading of {offload} layers: Megatron offloads at "
                             f"most num_layers-1 = {model.num_layers - 1}")
    main_grads, moments = _optimizer_state(training, conflicts)
    if opt.fp8_dispatch and training.precision != "bf16" and moe and lay.ep > 1:
        conflicts.append("FP8 token dispatch was priced (fp8_dispatch), but Megatron-LM has no "
                         "switch for it; the launch dispatches BF16 tokens")
    if not opt.tp_async_grad_comm and lay.tp > 1:
        conflicts.append("exposed backward TP collectives were priced (tp_async_grad_comm "
                         "off, Megatron-LM before September 2021), but current Megatron "
                         "always runs them beside the backward GEMMs")
    if opt.pp_scatter_gather and lay.pp > 1 and lay.tp > 1 and not lay.sp:
        conflicts.append("pipeline scatter/gather was priced (pp_scatter_gather, Megatron-LM "
                         "before Megatron-Core), but current Megatron sends each TP rank's full "
                         "activation; turn sequence parallelism on for split sends")
    # TE userbuffers overlap needs SP and an NVLink-local TP group; the time model
    # prices it only then (parsearch.cost.communication)
    tp_overlap = (opt.tp_comm_overlap and lay.tp > 1 and lay.sp
                  and lay.tp <= nvlink_domain_size)
    shared_overlap = shared_expert_overlap_on(model, opt, "moe") and ep_comm
    if shared_overlap and "shared_experts" in (modules or ()):
        # Megatron-Core TransformerConfig: "shared_experts recompute cannot work with
        # --moe-shared-expert-overlap".
        conflicts.append("recompute module shared_experts with --moe-shared-expert-overlap: "
                         "Megatron-Core refuses the pair; drop one of them")
    if shared_overlap and tp_overlap:
        # Megatron-Core SharedExpertMLP sets ub_overlap_* = False on the shared linears.
        conflicts.append("TP comm overlap with --moe-shared-expert-overlap: Megatron-Core "
                         "turns userbuffers off for the shared experts' linears, which the "
                         "time model still prices as overlapped; their TP traffic may be "
                         "more exposed than predicted")
    conflicts += _graph_conflicts(opt, training, granularity, modules)
    capability = compute_capability
    fp8_attention = opt.fp8_attention and training.precision != "bf16"
    gaps: list[str] = []
    if fp8_attention:
        # Megatron-LM's arguments.py lists fp8_dot_product_attention among the
        # TransformerConfig fields with no CLI argument; Megatron-Bridge sets it
        # (mixed_precision.fp8_dot_product_attention).
        gaps.append("FP8 attention (TransformerConfig.fp8_dot_product_attention=True) has no "
                    "Megatron-LM argument: set it in code, or use the Megatron-Bridge launch")
    # the layouts Megatron-Core runs it on (parsearch.cost.fused_mlp): etp = 1, no expert
    # input offloaded
    fused_mlp = (moe and training.precision != "bf16"
                 and bool(fused_mlp_rows(opt.fused_expert_mlp, lay.etp, training)))
    recipe = (resolve_fp8_recipe(opt.fp8_recipe if fp8_recipe == "auto" else fp8_recipe,
                                 capability)
              if training.precision == "fp8" else None)
    return LaunchPlan(
        layout=lay, seq_len=training.seq_len, global_batch=training.global_batch, is_moe=moe,
        pipeline_layout=pipeline, layers_per_virtual_stage=per_stage,
        rank_split=priced_rank_split(model, training, lay.pp, lay.vpp),
        recompute_granularity=granularity, recompute_method=method,
        recompute_num_layers=rec_layers, recompute_modules=modules,
        precision=training.precision,
        # the recipe the cost model priced unless the caller names one
        fp8_recipe=recipe,
        fp8_param_gather=fp8_gather,
        grad_reduce_in_fp32=opt.grad_reduce_bytes >= 4,
        distributed_optimizer=training.distributed_optimizer and not training.fsdp,
        fsdp=training.fsdp,
        fsdp_strategy=training.fsdp_strategy,
        overlap_grad_reduce=opt.overlap_grad_reduce and (lay.dp > 1 or training.fsdp),
        overlap_param_gather=(opt.overlap_param_gather and lay.dp > 1
                              and (training.distributed_optimizer or training.fsdp)),
        ddp_bucket_size=(opt.ddp_bucket_params if opt.overlap_grad_reduce and lay.dp > 1
                         and not training.fsdp else None),
        overlap_p2p=lay.pp > 1 and lay.vpp > 1 and opt.pp_p2p_overlap,
        tp_comm_overlap=tp_overlap,
        moe_dispatcher=opt.moe_dispatcher if moe else None,
        flex_backend=backend,
        moe_a2a_overlap=a2a_overlap,
        # priced only where there are shared experts and EP traffic to hide
        moe_shared_expert_overlap=shared_overlap,
        # Forced-uniform routing (--moe-router-force-load-balancing) only when priced so: it
        # is a benchmarking switch under which the router stops learning.
        force_balanced_routing=moe and opt.routing == "balanced",
        capacity_factor=opt.moe_capacity_factor if moe else None,
        pad_to_capacity=moe and opt.moe_pad_to_capacity,
        cuda_graphs=opt.cuda_graphs,
        cuda_graph_scope=opt.cuda_graph_scope if opt.cuda_graphs else (),
        flash_attention=opt.flash_attention,
        fp8_attention=fp8_attention,
        # Megatron-Core runs the MXFP8 LM head only with the MXFP8 recipe
        fp8_output_proj=opt.fp8_output_proj and recipe == "mxfp8",
        fused_expert_mlp=fused_mlp,
        offload_layers=offload,
        offload_modules=training.offload_modules,
        optimizer=training.optimizer,
        main_grads_dtype=main_grads, moment_dtype=moments,
        env=launch_env(lay, training.fsdp, a2a_overlap, capability,
                 fused_expert_mlp=fused_mlp, flex=backend,
                 nvlink_domain_size=nvlink_domain_size, gpus_per_node=gpus_per_node,
                 module_offload=bool(training.offload_modules)),
        conflicts=tuple(conflicts),
        megatron_lm_gaps=tuple(gaps),
        cuda_graph_impl=opt.cuda_graph_impl,
        chosen_features=opt.chosen_features,
        gated_mlp=model.mlp_activation == "swiglu",
        mla=model.mla is not None,
    )


def _graph_conflicts(opt: CostOptions, training: TrainingSpec, granularity: str | None,
                     modules: tuple[str, ...]) -> list[str]:
    """Why Megatron would refuse the priced CUDA graphs with this layout (Megatron-Core
    ``TransformerConfig.__post_init__`` at cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54); the
    search never chooses such graphs, a pinned ``--cuda-graphs`` may ask for them."""
    if not opt.cuda_graphs or opt.cuda_graph_impl == "full_iteration":
        return []
    out = []
    if granularity == "full":
        out.append("per-layer CUDA graphs with full recompute: Megatron-Core runs full "
                   "recompute only with --cuda-graph-impl full_iteration; drop --cuda-graphs "
                   "or recompute selectively")
    if training.activation_offload_layers:
        out.append("per-layer CUDA graphs with CPU activation offloading: Megatron-Core "
                   "refuses the pair (\"CUDA graphs not supported with CPU offloading\")")
    module_conflict = graph_conflict(training.offload_modules, opt.cuda_graph_impl,
                                     opt.cuda_graph_scope)
    if module_conflict is not None:
        out.append(module_conflict)
    if (granularity == "selective" and "moe" in (modules or ())
            and "moe_router" in opt.cuda_graph_scope
            and opt.cuda_graph_impl == "transformer_engine"):
        out.append("recompute module moe with a moe_router CUDA graph: Megatron-Core refuses "
                   "it with --cuda-graph-impl transformer_engine; drop one of them")
    return out


__all__ = ["FP8_RECIPE_CHOICES", "PINNED_ENV", "LaunchPlan", "hybridep_topology", "launch_plan",
           "pipeline_layout_string", "priced_features", "resolve_fp8_recipe"]
