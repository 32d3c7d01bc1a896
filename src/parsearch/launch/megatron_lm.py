"""Megatron-LM ``pretrain_gpt.py`` arguments for a :class:`~parsearch.launch.plan.LaunchPlan`.

Names and value forms are those of Megatron-LM's own parser at the commit
recorded in ``data/launch_names.json`` (``tests/test_launch_names.py`` checks
every emitted flag against that record).  The model's architecture is
written out too, so the argument file trains the model that was priced.
"""

from __future__ import annotations

from parsearch.cost.communication import FLEX_DISPATCH_SMS
from parsearch.launch.plan import LaunchPlan
from parsearch.layout.rank_split import RankSplit
from parsearch.model.specs import ModelSpec


def model_args(model: ModelSpec) -> list[str]:
    """Architecture arguments (``megatron/training/arguments.py``, network size group)."""
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.ffn_hidden_size),
            "--num-attention-heads", str(model.num_attention_heads),
            "--kv-channels", str(model.head_dim),
            "--vocab-size", str(model.vocab_size),
            "--position-embedding-type", "rope",
            "--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
            "--disable-bias-linear"]
    if model.num_query_groups != model.num_attention_heads and model.mla is None:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    if model.mlp_activation == "swiglu":
        args.append("--swiglu")
    elif model.mlp_activation == "squared_relu":
        args.append("--squared-relu")
    if model.qkv_bias:
        args.append("--add-qkv-bias")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if model.mla is not None:
        mla = model.mla
        args += ["--multi-latent-attention", "--kv-lora-rank", str(mla.kv_lora_rank),
                 "--qk-head-dim", str(mla.qk_nope_head_dim),
                 "--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim),
                 "--v-head-dim", str(mla.v_head_dim)]
        if mla.q_lora_rank:
            args += ["--q-lora-rank", str(mla.q_lora_rank)]
    if model.moe is not None:
        moe = model.moe
        pattern = [0 if i < moe.first_k_dense or (i - moe.first_k_dense) % moe.layer_freq
                   else 1 for i in range(model.num_layers)]
        args += ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
                 "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size),
                 "--moe-grouped-gemm"]
        if any(p == 0 for p in pattern):
            # Megatron's --moe-layer-freq takes a Python list expression, one 0/1 per layer
            args += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
        if moe.group_limited:
            args += ["--moe-router-num-groups", str(moe.router_num_groups),
                     "--moe-router-group-topk", str(moe.router_group_topk)]
        if moe.shared_expert_ffn_hidden_size:
            args += ["--moe-shared-expert-intermediate-size",
                     str(moe.shared_expert_ffn_hidden_size)]
    if model.mtp_layers:
        args += ["--mtp-num-layers", str(model.mtp_layers)]
    return args


def _rank_split_args(split: RankSplit, vpp: int) -> list[str]:
    """Megatron-Core <= 0.12's flags for a split (``parsearch.layout.rank_split``): other
    counts on the first/last rank, or the embedding/loss counted as layers (core_v0.11.0
    ``arguments.py``: uneven stages need ``--num-virtual-stages-per-pipeline-rank``)."""
    if split.first_last:
        args = ["--decoder-first-pipeline-num-layers", str(split.first),
                "--decoder-last-pipeline-num-layers", str(split.last)]
        return args + (["--num-virtual-stages-per-pipeline-rank", str(vpp)] if vpp > 1 else [])
    args = ["--account-for-embedding-in-pipeline-split"] if split.account_embedding else []
    args += ["--account-for-loss-in-pipeline-split"] if split.account_loss else []
    if vpp > 1:  # layers (embedding and loss included) per model chunk
        args += ["--num-layers-per-virtual-pipeline-stage", str(split.middle // vpp)]
    return args


def _parallel_args(plan: LaunchPlan) -> list[str]:
    lay = plan.layout
    args = ["--tensor-model-parallel-size", str(lay.tp),
            "--pipeline-model-parallel-size", str(lay.pp),
            "--context-parallel-size", str(lay.cp)]
    if plan.is_moe:
        args += ["--expert-model-parallel-size", str(lay.ep),
                 "--expert-tensor-parallel-size", str(lay.etp)]
    if plan.pipeline_layout is not None:
        # the layout fixes the virtual stages too; Megatron derives vpp from it
        args += ["--pipeline-model-parallel-layout", plan.pipeline_layout]
    elif plan.rank_split is not None:
        args += _rank_split_args(plan.rank_split, lay.vpp)
    elif lay.vpp > 1 and plan.layers_per_virtual_stage is not None:
        args += ["--num-layers-per-virtual-pipeline-stage", str(plan.layers_per_virtual_stage)]
    if lay.pp > 1 and lay.vpp > 1 and not plan.overlap_p2p:
        # waited interleaved sends, as priced (pp_p2p_overlap off: Megatron-LM before
        # f9283c5a8a); Megatron-LM overlaps them by default for vpp > 1
        args.append("--no-overlap-p2p-communication")
    if lay.sp:
        args.append("--sequence-parallel")
    args += ["--micro-batch-size", str(lay.mbs), "--global-batch-size", str(plan.global_batch),
             "--seq-length", str(plan.seq_len), "--max-position-embeddings", str(plan.seq_len)]
    return args


def _memory_args(plan: LaunchPlan) -> list[str]:
    args: list[str] = []
    if plan.recompute_granularity is not None:
        args += ["--recompute-granularity", plan.recompute_granularity]
        if plan.recompute_granularity == "full":
            args += ["--recompute-method", str(plan.recompute_method),
                     "--recompute-num-layers", str(plan.recompute_num_layers)]
        else:
            args += ["--recompute-modules", *plan.recompute_modules]
    if plan.offload_layers:
        args += ["--cpu-offloading-num-layers", str(plan.offload_layers)]
    if plan.offload_modules:
        args += ["--fine-grained-activation-offloading", "--offload-modules",
                 *plan.offload_modules]
    if plan.fsdp:
        # Megatron-FSDP optim_grads_params (ZeRO-3) or optim_grads (ZeRO-2); validate_args
        # requires fsdp_dtensor
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", plan.fsdp_strategy,
                 "--ckpt-format", "fsdp_dtensor"]
    elif plan.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if plan.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if plan.overlap_param_gather:
        args.append("--overlap-param-gather")
    if plan.ddp_bucket_size is not None:
        args += ["--ddp-bucket-size", str(plan.ddp_bucket_size)]
    if not plan.grad_reduce_in_fp32:
        args.append("--grad-reduce-in-bf16")
    if plan.optimizer != "adam":
        args += ["--optimizer", plan.optimizer]
    if plan.main_grads_dtype or plan.moment_dtype:
        args.append("--use-precision-aware-optimizer")
    if plan.main_grads_dtype:
        args += ["--main-grads-dtype", plan.main_grads_dtype]
    if plan.moment_dtype:
        args += ["--exp-avg-dtype", plan.moment_dtype, "--exp-avg-sq-dtype", plan.moment_dtype]
    return args


def _precision_args(plan: LaunchPlan) -> list[str]:
    args = ["--bf16"]
    if plan.precision == "fp8":
        # e4m3 forward and backward for MXFP8 (Bridge bf16_with_mxfp8_mixed), hybrid otherwise
        fmt = "e4m3" if plan.fp8_recipe == "mxfp8" else "hybrid"
        args += ["--fp8-format", fmt, "--fp8-recipe", str(plan.fp8_recipe)]
        if plan.fp8_param_gather:
            args.append("--fp8-param-gather")
        if plan.fp8_output_proj:
            # generated from TransformerConfig.fp8_output_proj (arguments.py
            # ArgumentGroupFactory over TransformerConfig)
            args.append("--fp8-output-proj")
    elif plan.precision == "fp4":
        args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
        if plan.fp8_param_gather:
            args.append("--fp4-param-gather")
    return args


def _feature_args(plan: LaunchPlan) -> list[str]:
    args: list[str] = []
    if plan.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if plan.moe_dispatcher is not None:
        args += ["--moe-token-dispatcher-type", plan.moe_dispatcher]
        if plan.flex_backend is not None:
            # the SMs the time model gives the flex kernels (communication.FLEX_DISPATCH_SMS);
            # Megatron-Core's default (None) leaves each back end its own
            args += ["--moe-flex-dispatcher-backend", plan.flex_backend,
                     "--moe-flex-dispatcher-num-sms", str(FLEX_DISPATCH_SMS[plan.flex_backend])]
        # the fused permute the compute model prices (compute.py per_routed_copy); off in
        # Megatron-LM unless asked (store_true); the router stays unfused, as priced
        args.append("--moe-permute-fusion")
    if plan.moe_a2a_overlap:
        args.append("--overlap-moe-expert-parallel-comm")
    if plan.moe_shared_expert_overlap:
        args.append("--moe-shared-expert-overlap")
    if plan.force_balanced_routing:
        args.append("--moe-router-force-load-balancing")
    if plan.capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", f"{plan.capacity_factor:g}"]
        if plan.pad_to_capacity:
            args.append("--moe-pad-expert-input-to-capacity")
    if plan.cuda_graphs:
        args += ["--cuda-graph-impl", plan.cuda_graph_impl]
        if plan.cuda_graph_scope:
            # --cuda-graph-scope is the hidden, deprecated spelling at the recorded commit
            # (arguments.py: "--cuda-graph-scope is deprecated, use --cuda-graph-modules")
            args += ["--cuda-graph-modules", *plan.cuda_graph_scope]
        if plan.cuda_graph_impl == "full_iteration":
            # validate_args: "--no-check-for-nan-in-loss-and-grad should be set with
            # --cuda-graph-impl=full_iteration for training" (a NaN check syncs the host)
            args.append("--no-check-for-nan-in-loss-and-grad")
        elif plan.recompute_granularity == "selective":
            # TransformerConfig.__post_init__ refuses dropout inside graphed recomputation
            # ("attention dropout is not supported with graphed attention recomputation");
            # Megatron-LM defaults both to 0.1, the priced models train without dropout
            args += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    if not plan.flash_attention:
        args += ["--attention-backend", "unfused"]
    if plan.fused_expert_mlp:
        # TransformerConfig fields, generated as arguments (arguments.py ArgumentGroupFactory)
        args += ["--use-transformer-engine-op-fuser", "--moe-mlp-glu-interleave-size", "32"]
    # the compute model prices the fused cross-entropy (cost/compute.py "output": one read
    # of the logits, one write of their gradient); Megatron-LM leaves it off unless asked
    # (arguments.py --cross-entropy-loss-fusion, store_true; Bridge writes the same field)
    args.append("--cross-entropy-loss-fusion")
    return args


def megatron_lm_args(model: ModelSpec, plan: LaunchPlan) -> tuple[str, ...]:
    """The full ``pretrain_gpt.py`` argument list for ``plan`` (architecture included)."""
    return tuple(model_args(model) + _parallel_args(plan) + _memory_args(plan)
                 + _precision_args(plan) + _feature_args(plan))


__all__ = ["megatron_lm_args", "model_args"]
