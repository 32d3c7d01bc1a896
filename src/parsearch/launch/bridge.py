"""Megatron-Bridge recipe overrides for a :class:`~parsearch.launch.plan.LaunchPlan`.

Overrides are Hydra ``group.field=value`` strings applied to a recipe's
``ConfigContainer`` (``scripts/training/run_recipe.py`` →
``process_config_with_overrides``, Megatron-Bridge v0.6.0).  Every key is
checked against ``data/launch_names.json`` when the overrides are generated
(:func:`check_key`), so a misspelled field is refused here, not at launch.

``model.*`` keys are written with Hydra's force-add prefix, ``++model.X=v``,
because the model has two layouts.  Bridge v0.6.0 recipes hold a flat
``GPTModelProvider``; on Bridge main (067f987d) the Llama recipes hold
``AutoBridge...get_model_config()``, a ``BridgeGPTModelConfig``
(``src/megatron/bridge/models/gpt/model_config.py``) whose Megatron-Core base
``GPTModelConfig`` (Megatron-LM ``megatron/training/models/gpt.py``) keeps
the ``TransformerConfig`` fields — parallel sizes, recompute, precision —
under ``transformer`` and proxies attribute get/set to it.
``process_config_with_overrides``
(``src/megatron/bridge/training/utils/omegaconf_utils.py``) turns the config
into a nested dict, so those fields sit at ``model.transformer.X``, sets
struct mode and applies the overrides with Hydra's parser: a plain
``model.tensor_model_parallel_size=2`` fails there ("not in struct").
``++`` adds the flat key when it is absent and overrides it when present, and
``_apply_overrides`` then sets it with ``setattr`` (the proxy, after the
untouched ``transformer`` values), so one string resolves on both layouts;
writing ``model.transformer.X`` instead would need to know the recipe's
layout and fails on the flat one.  What ``++`` gives up is Bridge's own
refusal of an unknown model key (it logs "not found ... Skipping" and goes
on), hence the check at generation (and, in the tests, against the nested
fields recorded from main: ``nested_model`` in the record).  The YAML form
(:func:`nested`) keeps flat keys too: ``OmegaConf.merge`` of a config file is
not in struct mode and adds them the same way.  Other groups have one layout and keep plain keys,
so Bridge still refuses a key its release lacks.  Checked against Bridge
v0.6.0 and main in ``tests/test_launch_bridge_integration.py``.

A recipe brings its own settings, and some of them fight a layout override:
its virtual pipeline size, its ``account_for_*_in_pipeline_split`` flags or
first/last-stage layer counts (rejected together with a layout string by
Megatron-Core's ``TransformerConfig``), its recompute method, its CPU
offloading, its mixed-precision recipe and communication-overlap object
(both copied over the model, optimizer and DDP fields at validation,
``ConfigContainer.validate``).  Every such field is written explicitly —
reset where the plan does not use it — so the resolved config is the
priced layout whatever recipe it is applied to.  Precision is written field
by field with ``mixed_precision=null`` (the fields
``MixedPrecisionConfig.setup`` would copy, to every group that has them),
and overlap the same way with ``comm_overlap=null``, because a recipe may
hold either as a name or as an object and Hydra cannot edit a field of a
name.  Features some recipe turns on that the cost model does not price are
written off too (:func:`_unpriced_resets`), and kernel switches (fusions, the
flex dispatcher's SM count, per-step ``empty_cache``, the userbuffers config)
are pinned to the kernels the cost model counts (:func:`kernel_pins`); the
environment a recipe's ``env_vars`` would set is written from the plan
(``launch/plan.py`` ``_env``), which the shell snippet exports too.

Not pinned, and why (recipe ``env_vars`` and fields left as the recipe sets them):
``NVTE_FWD/BWD_LAYERNORM_SM_MARGIN`` (SMs a memory-bound norm leaves to an
overlapped collective; the norms are priced by their bytes at HBM rate, which a
20-SM margin does not bound), ``NVTE_NORM_*_USE_CUDNN`` and ``NVTE_USE_FAST_MATH``
(other kernels for the same bytes), ``PYTORCH_CUDA_ALLOC_CONF`` (allocator
fragmentation: the memory model's ``memory_margin``),
``TORCH_NCCL_AVOID_RECORD_STREAMS``, ``NCCL_GRAPH_REGISTER``, ``NCCL_P2P_NET_CHUNKSIZE``,
``NCCL_IGNORE_CPU_AFFINITY``, ``NCCL_CTA_POLICY`` and ``TORCH_NCCL_HIGH_PRIORITY``
(NCCL and host tuning below the alpha-beta model's resolution),
``moe_hybridep_num_sms_preprocessing`` (HybridEP's metadata scan),
``persist_layer_norm`` (Apex's persistent LayerNorm, ``core/fusions/fused_layer_norm.py``;
the Transformer Engine layer specs norm with ``TENorm``) and ``train.manual_gc`` (host
pauses: the profile's step overhead).
"""

from __future__ import annotations

import re
from typing import Any

from parsearch.cost.communication import FLEX_DISPATCH_SMS
from parsearch.launch.names import bridge_top_level
from parsearch.launch.plan import LaunchPlan

#: Values ``MixedPrecisionConfig`` takes for BF16 mixed precision (``bf16_mixed()``,
#: Megatron-Bridge ``training/mixed_precision.py``), before the FP8/FP4 fields.
_BF16_BASE: dict[str, Any] = {
    "bf16": True, "fp16": False, "params_dtype": "bfloat16", "pipeline_dtype": "bfloat16",
    "autocast_enabled": False, "fp8": None, "fp4": None, "first_last_layers_bf16": False,
    "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0,
    "fp8_param": False, "fp8_param_gather": False, "fp4_param": False,
    "fp4_param_gather": False, "reuse_grad_buf_for_mxfp8_param_ag": False,
    "fp8_dot_product_attention": False,
}
#: Groups ``MixedPrecisionConfig.setup`` copies its fields into.
PRECISION_GROUPS: tuple[str, ...] = ("model", "optimizer", "ddp")
_TORCH_DTYPE: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16"}
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")
#: ConfigContainer fields whose keys are written with Hydra's force-add ``++``
FORCE_ADD: frozenset[str] = frozenset({"model", "env_vars"})


def hydra_value(value: Any) -> str:
    """A value in Hydra override grammar: null, true/false, numbers, lists, quoted strings.

    >>> hydra_value(None), hydra_value(True), hydra_value(3), hydra_value(["core_attn", "mlp"])
    ('null', 'true', '3', '[core_attn,mlp]')
    >>> hydra_value("Et*7|(t*8|)*2t*7L")
    '"Et*7|(t*8|)*2t*7L"'
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _SAFE.match(text) and text not in ("null", "true", "false"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def precision_fields(plan: LaunchPlan) -> dict[str, Any]:
    """``MixedPrecisionConfig`` field values that reproduce the priced precision."""
    fields = dict(_BF16_BASE)
    fields["grad_reduce_in_fp32"] = plan.grad_reduce_in_fp32
    if plan.precision == "fp8":
        mx = plan.fp8_recipe == "mxfp8"
        fields.update(fp8="e4m3" if mx else "hybrid", fp8_recipe=plan.fp8_recipe,
                      fp8_param=plan.fp8_param_gather, fp8_param_gather=plan.fp8_param_gather,
                      # Bridge requires it for MXFP8 param gather without FSDP (config.py)
                      reuse_grad_buf_for_mxfp8_param_ag=mx and plan.fp8_param_gather
                      and not plan.fsdp)
    elif plan.precision == "fp4":
        fields.update(fp4="e2m1", fp4_recipe="nvfp4", fp4_param=plan.fp8_param_gather,
                      fp4_param_gather=plan.fp8_param_gather)
    fields["fp8_dot_product_attention"] = plan.fp8_attention
    return fields


def _precision_overrides(plan: LaunchPlan, groups: dict[str, set[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {"mixed_precision": None}
    for group in PRECISION_GROUPS:
        have = groups.get(group, set())
        for name, value in precision_fields(plan).items():
            if name in have:
                out[f"{group}.{name}"] = value
    return out


def _pipeline_overrides(plan: LaunchPlan) -> dict[str, Any]:
    lay = plan.layout
    vpp = lay.vpp if lay.vpp > 1 else None
    split = plan.rank_split  # Megatron-Core <= 0.12's split flags, where priced so
    first_last = split is not None and split.first_last
    return {
        "model.pipeline_model_parallel_layout": plan.pipeline_layout,
        "model.virtual_pipeline_model_parallel_size": vpp,
        # rejected with a layout string, and they change an even split's stages
        "model.account_for_embedding_in_pipeline_split": bool(split and
                                                              split.account_embedding),
        "model.account_for_loss_in_pipeline_split": bool(split and split.account_loss),
        "model.num_layers_in_first_pipeline_stage": split.first if first_last else None,
        "model.num_layers_in_last_pipeline_stage": split.last if first_last else None,
    }


def _unpriced_resets(plan: LaunchPlan) -> dict[str, Any]:
    """Recipe features the cost model does not price, set to what it priced.

    Each is turned on by some Bridge v0.6.0 or main recipe (``perf_recipes``).
    """
    lay = plan.layout
    return {
        # what CommOverlapConfig sets for PP (dropped with comm_overlap=null), as priced:
        # p2p hidden behind compute on interleaved schedules (Megatron-LM's default too)
        # unless waited sends were priced (pp_p2p_overlap off)
        "model.overlap_p2p_comm": plan.overlap_p2p,
        "model.batch_p2p_comm": lay.pp > 1 and not plan.overlap_p2p,
        # the interleaved schedule's micro-batch group; null: pipeline size, as priced
        "model.microbatch_group_size_per_vp_stage": None,
        # deprecated graph switches: TransformerConfig.__post_init__ turns them into
        # cuda_graph_impl (and refuses them next to it); the Qwen3 GB200 recipe sets one
        "model.enable_cuda_graph": False,
        "model.external_cuda_graph": False,
        # module-wise offload to host as priced (TrainingSpec.offload_modules, or off);
        # its tuning knobs at Megatron-Core's defaults, which the cost model prices
        "model.fine_grained_activation_offloading": bool(plan.offload_modules),
        "model.offload_modules": list(plan.offload_modules),
        "model.min_offloaded_tensor_size": 1024 * 1024,
        "model.activation_offload_fraction": 1.0,
        "model.delta_offload_bytes_across_pp_ranks": 0,
        # deterministic mode (Llama ..._deterministic recipes) also turns the fused
        # cross-entropy off, which the compute model prices (cost/compute.py "output")
        "model.deterministic_mode": False,
        "model.cross_entropy_loss_fusion": True,
        # CP is priced as the p2p ring of K/V blocks (cost/communication.py); recipes
        # pick a2a or all_gather too (Megatron-LM's default is p2p)
        "model.cp_comm_type": "p2p",
        # optimizer state on the host (DeepSeek-V4 recipe) / one copy per instance
        # (HSDP-style, DeepSeek-V3 GB300): the cost model shards it over all of DP
        "optimizer.optimizer_cpu_offload": False,
        "ddp.num_distributed_optimizer_instances": 1,
        "ddp.outer_dp_sharding_strategy": "no_shard",
    }


#: Megatron-LM commit whose defaults the kernel pins cite (``megatron/core/transformer/
#: transformer_config.py``, TC; ``megatron/core/model_parallel_config.py``, MPC).
_MCORE = "d98e8a64"


def kernel_pins(plan: LaunchPlan) -> dict[str, Any]:
    """Kernel switches pinned to the kernels the cost model prices (issue 32 item 6).

    The byte and kernel counts of :mod:`parsearch.cost.compute` and
    :mod:`parsearch.cost.kernels` are those of Megatron-Core's fused kernels: a
    recipe that turns one off runs slower than priced, one that turns on a fusion
    the counts do not include runs something else.  Each entry names where the
    field is defined (Megatron-LM at :data:`_MCORE`, Megatron-Bridge main 067f987d)
    and its default there; a field a MoE or flex-dispatcher launch needs only is
    written for those launches only.
    """
    pins: dict[str, Any] = {
        # TC bias_activation_fusion=False (Bridge GPTModelProvider: not set; Megatron-LM's
        # --no-bias-swiglu-fusion leaves it on).  Priced: the fused gated activation (SwiGLU
        # reads 2f, writes f: compute.py per_ffn 16f; GPT-OSS's clamp on top,
        # unfused_ops.py).  Bridge main's GPT-OSS H100 recipe turns it off.  Not gated (GeLU
        # without bias): TransformerConfig refuses True, and the unfused GeLU moves the
        # priced 10f.  TC use_te_activation_func=False is refused beside it (Kimi K3 bridge).
        "model.bias_activation_fusion": plan.gated_mlp,
        # TC bias_dropout_fusion=False; priced: one fused residual add (read 2h, write h,
        # compute.py per_hidden); unfused it adds a dropout kernel's pass over h
        "model.bias_dropout_fusion": True,
        # MPC gradient_accumulation_fusion=False (Bridge: True where Transformer Engine
        # imports); priced: wgrad GEMMs accumulate into the fp32 main_grad in place (no
        # per-micro-batch add pass or bf16 wgrad buffer in compute.py or memory/); Gemma 4's
        # recipe turns it off
        "model.gradient_accumulation_fusion": True,
        # MPC cross_entropy_fusion_impl="native"; the fused cross-entropy is priced
        # (cross_entropy_loss_fusion, below) and Megatron-LM at d98e8a64 refuses "te" beside
        # it ("disabled due to stability issues", arguments.py validate_args), so both
        # launches run native; perf_recipes/_common.py and many recipes set "te"
        "model.cross_entropy_fusion_impl": "native",
        # Bridge train.empty_unused_memory_level (Megatron-LM megatron/training/config/
        # training_config.py) = 0; >= 1 calls torch.cuda.empty_cache() every step
        # (Bridge training/train.py), a host sync and re-allocation the cost model does
        # not price; the memory model counts peak bytes, which emptying the cache does
        # not lower.  The Nemotron-3 Nano H100 recipe sets 2.
        "train.empty_unused_memory_level": 0,
        # Bridge GPTModelProvider tp_comm_overlap_cfg=None: Transformer Engine's default
        # userbuffers config (SMs per overlapped collective), what the Megatron-LM launch
        # runs (no --tp-comm-overlap-cfg).  The time model charges TP overlap the
        # profile's fitted comm_sm_share (cost/communication.py), not a recipe's tuned SM
        # counts; comm_overlap=null already drops the recipe's CommOverlapConfig copy
        "model.tp_comm_overlap_cfg": None,
    }
    if plan.gated_mlp:
        pins["model.use_te_activation_func"] = False
    if not plan.mla:
        # TC apply_rope_fusion=False (Megatron-LM's --no-rope-fusion leaves it on); priced:
        # the fused RoPE kernel (8 B per Q/K element, unfused_ops.FUSED_ROPE_BYTES).  Where
        # Megatron cannot fuse (YaRN, not rope) Bridge turns it off itself
        # (utils/fusions.py validate_rope_fusion_compatibility) and the cost model prices
        # the unfused path (rope_extra_bytes).  MLA: Megatron-Core refuses the fusion
        # unless rope_type is yarn (MLATransformerConfig.__post_init__), which the model
        # spec does not record; left to the recipe.
        pins["model.apply_rope_fusion"] = True
    if not plan.flash_attention:
        # Bridge GPTModelProvider masked_softmax_fusion=True (TC False); the unfused
        # attention's score bytes are those of the fused scale-mask-softmax
        # (compute.py UNFUSED_SCORE_BYTES_*).  With fused attention the field is unused.
        pins["model.masked_softmax_fusion"] = True
    if plan.is_moe:
        pins.update({
            # TC moe_permute_fusion=False (Megatron-LM --moe-permute-fusion, store_true);
            # priced: one read and one write of h per routed copy each way
            # (compute.py per_routed_copy 16h), the fused permute; most MoE recipes set it
            "model.moe_permute_fusion": True,
            # TC moe_router_fusion=False; priced: the unfused router's kernels
            # (kernels.py KERNELS_ROUTER: gate GEMM, score function, top-k, aux loss, ~15
            # ops forward); Bridge's DeepSeek perf_recipes/deepseek/common.py sets True
            "model.moe_router_fusion": False,
            # TC moe_router_padding_for_quantization=False (and its alias
            # moe_router_padding_for_fp8, which turns it on in __post_init__): pads every
            # expert's routed tokens to 16/32 before dispatch, extra copies on the EP
            # network and a device-to-host sync the cost model does not price (it rounds
            # expert GEMM rows to the tile only, compute.py tile_padding); set by the
            # DeepSeek GB200/GB300 and GPT-OSS perf_recipes
            "model.moe_router_padding_for_quantization": False,
            "model.moe_router_padding_for_fp8": False,
        })
    if plan.flex_backend is not None:
        # TC moe_flex_dispatcher_num_sms=None (each back end's own default; the deprecated
        # moe_deepep_num_sms / moe_hybridep_num_sms, None, are routed to it and refused
        # when they differ).  The time model takes FLEX_DISPATCH_SMS (DeepEP 20,
        # HybridEP 32) from the GPU's SMs beside the overlapped compute
        # (communication.ep_sm_share); recipes set 16, 32 or None.
        pins.update({
            "model.moe_flex_dispatcher_num_sms": FLEX_DISPATCH_SMS[plan.flex_backend],
            "model.moe_deepep_num_sms": None,
            "model.moe_hybridep_num_sms": None,
        })
    return pins


def bridge_fields(plan: LaunchPlan, groups: dict[str, set[str]]) -> dict[str, Any]:
    """``group.field`` -> value for every ConfigContainer field the priced layout fixes."""
    lay = plan.layout
    fields: dict[str, Any] = {
        "model.tensor_model_parallel_size": lay.tp,
        "model.pipeline_model_parallel_size": lay.pp,
        "model.context_parallel_size": lay.cp,
        "model.expert_model_parallel_size": lay.ep if plan.is_moe else 1,
        "model.expert_tensor_parallel_size": lay.etp if plan.is_moe else None,
        **_pipeline_overrides(plan),
        "model.sequence_parallel": lay.sp,
        "train.micro_batch_size": lay.mbs,
        "train.global_batch_size": plan.global_batch,
        # the dataset owns the length; run_recipe.py syncs model.seq_length from it
        "dataset.seq_length": plan.seq_len,
        "model.seq_length": plan.seq_len,
        "model.recompute_granularity": plan.recompute_granularity,
        "model.recompute_method": plan.recompute_method,
        "model.recompute_num_layers": plan.recompute_num_layers,
        "model.recompute_modules": (list(plan.recompute_modules)
                                    if plan.recompute_granularity == "selective" else None),
        "model.cpu_offloading": plan.offload_layers > 0,
        "model.cpu_offloading_num_layers": plan.offload_layers,
        "ddp.use_distributed_optimizer": plan.distributed_optimizer,
        "optimizer.use_distributed_optimizer": plan.distributed_optimizer,
        "ddp.use_megatron_fsdp": plan.fsdp,
        "ddp.data_parallel_sharding_strategy": plan.fsdp_strategy if plan.fsdp else "no_shard",
        "ddp.overlap_grad_reduce": plan.overlap_grad_reduce,
        "ddp.overlap_param_gather": plan.overlap_param_gather,
        # None keeps Megatron-Core's default sizing by the DP group
        "ddp.bucket_size": plan.ddp_bucket_size,
        "comm_overlap": None,
        "model.tp_comm_overlap": plan.tp_comm_overlap,
        "model.cuda_graph_impl": plan.cuda_graph_impl if plan.cuda_graphs else "none",
        # cuda_graph_modules is the field at the recorded commit; the deprecated
        # cuda_graph_scope a recipe may set is reset (TransformerConfig.__post_init__:
        # "cuda_graph_scope and cuda_graph_modules cannot be set together"); an empty list
        # captures the whole layer
        "model.cuda_graph_modules": list(plan.cuda_graph_scope) if plan.cuda_graphs else [],
        "model.cuda_graph_scope": None,
        **_unpriced_resets(plan),
        **kernel_pins(plan),
    }
    if plan.cuda_graphs:
        # Megatron-Core GPT finalize requires it for graphs; Bridge's validate syncs
        # rng.te_rng_tracker from it
        fields["model.use_te_rng_tracker"] = True
    if plan.fsdp:
        fields["checkpoint.ckpt_format"] = "fsdp_dtensor"
    if not plan.flash_attention:
        fields["model.attention_backend"] = "unfused"
    if plan.precision == "fp8":
        fields["model.fp8_output_proj"] = plan.fp8_output_proj
    if plan.fused_expert_mlp:
        # both are needed: without the 32-wide GLU interleave Transformer Engine declines
        # the fusion silently (Megatron-Core moe_mlp_glu_interleave_size docstring)
        fields["model.use_transformer_engine_op_fuser"] = True
        fields["model.moe_mlp_glu_interleave_size"] = 32
    if plan.is_moe:
        fields.update({
            "model.moe_token_dispatcher_type": plan.moe_dispatcher,
            "model.moe_flex_dispatcher_backend": plan.flex_backend,
            "model.overlap_moe_expert_parallel_comm": plan.moe_a2a_overlap,
            "model.moe_shared_expert_overlap": plan.moe_shared_expert_overlap,
            "model.moe_router_force_load_balancing": plan.force_balanced_routing,
            "model.moe_expert_capacity_factor": plan.capacity_factor,
            "model.moe_pad_expert_input_to_capacity": plan.pad_to_capacity,
            # fields a recipe may turn on that the cost model does not price: reset, so the
            # run is the one priced (the DeepSeek-V3 GB300 FP8 recipe's full-iteration
            # graph path sets both; Megatron-Bridge v0.6.0 perf_recipes/deepseek/common.py)
            "model.use_transformer_engine_op_fuser": plan.fused_expert_mlp,
            "model.moe_paged_stash": False,
            "model.moe_expert_rank_capacity_factor": None,
        })
    if plan.optimizer != "adam":
        fields["optimizer.optimizer"] = plan.optimizer
    # precision-aware optimizer dtypes (torch dtypes: Bridge converts the names back)
    fields["optimizer.use_precision_aware_optimizer"] = bool(plan.main_grads_dtype
                                                             or plan.moment_dtype)
    fields["optimizer.main_grads_dtype"] = _TORCH_DTYPE[plan.main_grads_dtype or "fp32"]
    fields["optimizer.exp_avg_dtype"] = _TORCH_DTYPE[plan.moment_dtype or "fp32"]
    fields["optimizer.exp_avg_sq_dtype"] = _TORCH_DTYPE[plan.moment_dtype or "fp32"]
    fields.update(_precision_overrides(plan, groups))
    fields.update({f"env_vars.{name}": value for name, value in plan.env})
    return fields


def check_key(key: str, groups: dict[str, set[str]], top: set[str]) -> str:
    """``key`` if it names a recorded ConfigContainer field (``env_vars.*``: any name).

    >>> check_key("model.sequence_parallel", {"model": {"sequence_parallel"}}, {"model"})
    'model.sequence_parallel'
    >>> check_key("model.sequence_paralel", {"model": {"sequence_parallel"}}, {"model"})
    Traceback (most recent call last):
    ...
    ValueError: model.sequence_paralel is not a field of Megatron-Bridge's model config
    """
    head, _, field = key.partition(".")
    if head not in top:
        raise ValueError(f"{head} is not a Megatron-Bridge ConfigContainer field")
    if field and head != "env_vars" and field not in groups.get(head, set()):
        raise ValueError(f"{key} is not a field of Megatron-Bridge's {head} config")
    return key


def override(key: str, value: Any) -> str:
    """One Hydra override; ``model.*`` and ``env_vars.*`` keys are force-added (``++``).

    ``++`` on ``model.*`` resolves on both model layouts (module docstring);
    on ``env_vars.*`` it adds a key the recipe's dict may not hold yet.

    >>> override("model.tensor_model_parallel_size", 2), override("train.micro_batch_size", 1)
    ('++model.tensor_model_parallel_size=2', 'train.micro_batch_size=1')
    >>> override("mixed_precision", None)
    'mixed_precision=null'
    """
    prefix = "++" if key.split(".", 1)[0] in FORCE_ADD else ""
    return f"{prefix}{key}={hydra_value(value)}"


def bridge_overrides(plan: LaunchPlan, groups: dict[str, set[str]],
                     top: set[str] | None = None) -> tuple[str, ...]:
    """Hydra overrides that turn any GPT recipe into the priced layout and features.

    ``top``: the ConfigContainer's fields (default: the recorded ones).
    """
    top = bridge_top_level() if top is None else top
    return tuple(override(check_key(key, groups, top), value)
                 for key, value in bridge_fields(plan, groups).items())


def nested(fields: dict[str, Any]) -> dict[str, Any]:
    """``{"model.tp": 2}`` -> ``{"model": {"tp": 2}}`` (the YAML form Bridge merges).

    >>> nested({"model.a": 1, "mixed_precision": None, "model.b": 2})
    {'model': {'a': 1, 'b': 2}, 'mixed_precision': None}
    """
    out: dict[str, Any] = {}
    for key, value in fields.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return out


__all__ = ["FORCE_ADD", "PRECISION_GROUPS", "bridge_fields", "bridge_overrides", "check_key",
           "hydra_value", "kernel_pins", "nested", "override", "precision_fields"]
