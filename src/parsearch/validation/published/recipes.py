"""What each published run turned on, read from its public recipe (``data/run_setups.csv``).

The file (provenance in ``data/RUN_SETUPS.md``) records, per published run
id, the Megatron-Bridge / Megatron-LM settings of the recipe that produced
it, each with its repository, commit and path.  :func:`apply_setup` turns a
run's record into the cost model's options and training setup, so
validation prices what ran instead of guessing what would fit.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

from parsearch.cost.communication import FLEX_DISPATCH_SMS
from parsearch.cost.kernels import CUDA_GRAPH_SCOPES
from parsearch.cost.options import CostOptions
from parsearch.errors import SpecError
from parsearch.model.pipeline_layout import layout_layer_counts
from parsearch.model.specs import RECOMPUTE_MODULES, TrainingSpec

SETUP_FILE = "run_setups.csv"


@dataclass(frozen=True)
class RunSetup:
    """The recipe settings of one published run (``None``: the recipe does not say)."""

    id: str
    moe_dispatcher: str | None
    moe_flex_backend: str | None
    tp_comm_overlap: bool | None
    moe_a2a_overlap: bool | None
    overlap_grad_reduce: bool | None
    overlap_param_gather: bool | None
    recompute: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    recompute_modules: tuple[str, ...]
    cpu_offloading: bool | None
    cpu_offloading_num_layers: int | None
    #: ``offload_modules`` with ``fine_grained_activation_offloading`` on (empty: off)
    offload_modules: tuple[str, ...]
    fsdp: bool | None
    #: Megatron-FSDP ``data_parallel_sharding_strategy`` of an FSDP recipe (None: unstated)
    fsdp_sharding: str | None
    cuda_graphs: bool | None
    cuda_graph_scope: tuple[str, ...]
    fp8_param_gather: bool | None
    fp8_recipe: str | None
    grad_reduce_in_fp32: bool | None
    pipeline_layout: str | None
    locator: str
    fp8_attention: bool | None = None
    fp8_output_proj: bool | None = None
    fused_expert_mlp: bool | None = None
    moe_shared_expert_overlap: bool | None = None
    force_balance: bool | None = None
    capacity_factor: float | None = None
    pad_to_capacity: bool = False
    #: ``--cuda-graph-impl`` (``full_iteration``: one graph of the whole forward-backward,
    #: without the per-layer graphs' static buffers)
    cuda_graph_impl: str = "transformer_engine"
    #: Adam state in BF16 (Megatron's precision-aware optimizer with BF16 moments, or Apex's
    #: distributed fused Adam with ``dtype: bf16``): priced as 8 bytes of state per parameter
    bf16_moments: bool | None = None
    #: parameters per gradient bucket the recipe fixed (Apex DistributedFusedAdam's
    #: ``bucket_cap_mb`` as gradient-sync elements, or ``--ddp-bucket-size``); None:
    #: Megatron-Core's default sizing by the DP group
    ddp_bucket_params: int | None = None
    #: gradients synced by Apex's DistributedFusedAdam (NeMo 1.0 ``distributed_fused_adam``)
    apex_distributed_adam: bool | None = None
    #: DeepSeek's DualPipe schedule (the all-to-all overlap under any pipeline)
    dualpipe: bool | None = None


def _capacity(text: str) -> tuple[float | None, bool]:
    """``moe_capacity_factor`` cell: ``"1.0 (pad to capacity)"`` / ``"1.0 (token drop)"``."""
    text = text.strip().lower()
    if not text:
        return None, False
    try:
        value = float(text.split()[0])
    except ValueError:
        return None, False
    return value, "pad" in text


def _flag(text: str) -> bool | None:
    text = text.strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    return None


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def graph_scope(text: str) -> tuple[str, ...]:
    """The Megatron-Core CUDA-graph scopes named in ``text`` (none named: the whole layer).

    >>> graph_scope("attn moe_router moe_preprocess")
    ('attn', 'moe_router', 'moe_preprocess')
    >>> graph_scope("per-layer (enable_cuda_graph)"), graph_scope("full_iteration")
    ((), ())
    """
    words = text.replace(",", " ").replace("[", " ").replace("]", " ").replace("'", " ").split()
    return tuple(w for w in words if w in CUDA_GRAPH_SCOPES)


def priced_fp8_recipe(text: str | None) -> str | None:
    """The cost model's FP8 recipe for a recipe or precision string (``None``: not stated).

    >>> priced_fp8_recipe("FP8-MX"), priced_fp8_recipe("tensorwise (presumed)")
    ('mxfp8', 'tensorwise')
    >>> priced_fp8_recipe("rowwise"), priced_fp8_recipe("unspecified"), priced_fp8_recipe("nvfp4")
    ('blockwise', None, None)
    """
    low = (text or "").strip().lower()
    if "mx" in low:
        return "mxfp8"
    # torchao rowwise scaling takes each row's amax inside the cast kernel, like blocks
    if "block" in low or "subchannel" in low or "rowwise" in low:
        return "blockwise"
    if "delayed" in low:
        return "delayed"
    if "tensorwise" in low or "current" in low or low.endswith("-cs"):
        return "tensorwise"
    return None


def _setup(row: dict[str, str]) -> RunSetup:
    cell = {k: (v or "").strip() for k, v in row.items()}
    granularity = cell.get("recompute_granularity", "").lower() or None
    graphs = cell.get("cuda_graphs", "").lower()
    listed = cell.get("recompute_modules", "").replace(",", " ").split()
    modules = tuple(m for m in listed if m in RECOMPUTE_MODULES)
    if granularity == "selective" and not listed:
        # The recipe set an empty module list: Megatron-Core fills in its default
        # (core_attn) only when the list is None (TransformerConfig.__post_init__), so
        # nothing is recomputed (RUN_SETUPS.md).
        granularity = "none"
    return RunSetup(
        id=cell["id"],
        moe_dispatcher=cell.get("moe_dispatcher") or None,
        # a recipe names a concrete backend: one whose SM budget the cost model prices
        moe_flex_backend=(backend if (backend := cell.get("moe_flex_backend", "").lower())
                          in FLEX_DISPATCH_SMS else None),
        tp_comm_overlap=_flag(cell.get("tp_comm_overlap", "")),
        moe_a2a_overlap=_flag(cell.get("moe_a2a_overlap", "")),
        overlap_grad_reduce=_flag(cell.get("overlap_grad_reduce", "")),
        overlap_param_gather=_flag(cell.get("overlap_param_gather", "")),
        recompute=granularity if granularity in ("none", "selective", "full") else None,
        recompute_method=cell.get("recompute_method", "").lower() or None,
        recompute_num_layers=_int(cell.get("recompute_num_layers", "")),
        recompute_modules=modules,
        cpu_offloading=_flag(cell.get("cpu_offloading", "")),
        cpu_offloading_num_layers=_int(cell.get("cpu_offloading_num_layers", "")),
        offload_modules=tuple(m.strip() for m in cell.get("offload_modules", "").replace(
            ";", " ").replace(",", " ").split() if m.strip()),
        fsdp=_flag(cell.get("fsdp", "")),
        fsdp_sharding=cell.get("fsdp_sharding", "").strip() or None,
        cuda_graphs=(None if not graphs else graphs not in ("none", "false", "no")),
        cuda_graph_scope=graph_scope(cell.get("cuda_graph_scope", "")),
        fp8_param_gather=_flag(cell.get("fp8_param_gather", "")),
        fp8_recipe=priced_fp8_recipe(cell.get("fp8_recipe", "")),
        grad_reduce_in_fp32=_flag(cell.get("grad_reduce_in_fp32", "")),
        pipeline_layout=cell.get("pipeline_layout") or None,
        locator=cell.get("recipe_locator", ""),
        fp8_attention=_flag(cell.get("fp8_attention", "")),
        fp8_output_proj=_flag(cell.get("fp8_output_proj", "")),
        fused_expert_mlp=_flag(cell.get("fused_expert_mlp", "")),
        moe_shared_expert_overlap=_flag(cell.get("moe_shared_expert_overlap", "")),
        force_balance=_flag(cell.get("moe_router_force_load_balancing", "")),
        capacity_factor=_capacity(cell.get("moe_capacity_factor", ""))[0],
        pad_to_capacity=_capacity(cell.get("moe_capacity_factor", ""))[1],
        cuda_graph_impl=_graph_impl(graphs, cell.get("cuda_graph_scope", "")),
        bf16_moments=_flag(cell.get("bf16_moments", "")),
        ddp_bucket_params=_int(cell.get("ddp_bucket_params", "")),
        apex_distributed_adam=_flag(cell.get("apex_distributed_adam", "")),
        dualpipe=_flag(cell.get("dualpipe", "")),
    )


def _graph_impl(impl: str, scope: str) -> str:
    """The priced ``--cuda-graph-impl`` of a recipe's cells (the deprecated
    ``--cuda-graph-scope full_iteration`` of the local implementation is the full-iteration
    graph, Megatron-LM docs/user-guide/features/cuda_graph.md migration table).

    >>> _graph_impl("local", "full_iteration"), _graph_impl("transformer_engine", "attn")
    ('full_iteration', 'transformer_engine')
    """
    if "full_iteration" in impl or "full_iteration" in scope.lower():
        return "full_iteration"
    return "local" if impl.startswith("local") else "transformer_engine"


@cache
def load_run_setups() -> dict[str, RunSetup]:
    """Every recorded setup, by published run id."""
    text = resources.files("parsearch.data").joinpath(SETUP_FILE).read_text(encoding="utf-8")
    return {row["id"]: _setup(row) for row in csv.DictReader(text.splitlines())
            if row.get("id")}


def apply_setup(setup: RunSetup, training: TrainingSpec, options: CostOptions,
                *, moe: bool, precision: str,
                num_layers: int | None = None) -> tuple[TrainingSpec, CostOptions]:
    """Training setup and cost options with what the recipe states (the rest unchanged).

    The recipe's pipeline layout string is taken when it holds ``num_layers``
    transformer layers (a recipe for a variant with other layers is ignored).
    """
    changes: dict[str, object] = {}
    if moe and setup.moe_dispatcher in ("alltoall", "allgather", "flex"):
        changes["moe_dispatcher"] = setup.moe_dispatcher
        if setup.moe_dispatcher == "flex" and setup.moe_flex_backend is not None:
            changes["moe_flex_backend"] = setup.moe_flex_backend
    for name in ("tp_comm_overlap", "moe_a2a_overlap", "overlap_grad_reduce",
                 "overlap_param_gather", "cuda_graphs"):
        value = getattr(setup, name)
        if value is not None:
            changes[name] = value
    if setup.cuda_graphs:
        changes["cuda_graph_scope"] = setup.cuda_graph_scope
        changes["cuda_graph_impl"] = setup.cuda_graph_impl
    if setup.grad_reduce_in_fp32 is not None:
        changes["grad_reduce_bytes"] = 4.0 if setup.grad_reduce_in_fp32 else 2.0
    if setup.fp8_recipe is not None and precision == "fp8":
        changes["fp8_recipe"] = setup.fp8_recipe
    # FP8 attention runs inside the FP8/FP4 autocast only; the MXFP8 LM head only with
    # the MXFP8 recipe (Megatron-Core is_mxfp8_output_proj_active).
    if setup.fp8_attention is not None and precision != "bf16":
        changes["fp8_attention"] = setup.fp8_attention
    if setup.fp8_output_proj is not None and precision == "fp8":
        changes["fp8_output_proj"] = (setup.fp8_output_proj
                                      and changes.get("fp8_recipe", options.fp8_recipe)
                                      in ("mxfp8", "auto"))
    if moe and setup.force_balance is not None:
        # the recipe's --moe-router-force-load-balancing: forced uniform, or its router's own
        changes["routing"] = "balanced" if setup.force_balance else "trained"
        changes["moe_imbalance"] = None if not setup.force_balance else options.moe_imbalance
    if moe and setup.capacity_factor is not None:
        changes["moe_capacity_factor"] = setup.capacity_factor
        changes["moe_pad_to_capacity"] = setup.pad_to_capacity
    if moe and setup.moe_shared_expert_overlap is not None:
        changes["moe_shared_expert_overlap"] = setup.moe_shared_expert_overlap
    if moe and setup.fused_expert_mlp is not None and precision != "bf16":
        changes["fused_expert_mlp"] = setup.fused_expert_mlp
    if setup.fp8_param_gather is not None and precision != "bf16":
        changes["param_gather_bytes"] = 1.0 if setup.fp8_param_gather else 2.0
        changes["memory"] = replace(options.memory, fp8_param_gather=setup.fp8_param_gather)
    if setup.bf16_moments is not None:
        changes["bf16_moments"] = setup.bf16_moments
    if setup.ddp_bucket_params is not None:
        changes["ddp_bucket_params"] = setup.ddp_bucket_params
    if setup.apex_distributed_adam is not None:
        changes["apex_distributed_adam"] = setup.apex_distributed_adam
    if setup.dualpipe is not None:
        changes["dualpipe"] = setup.dualpipe
    options = replace(options, **changes)  # type: ignore[arg-type]
    train: dict[str, object] = {}
    if setup.fsdp is not None:
        train["fsdp"] = setup.fsdp
    if setup.fsdp and setup.fsdp_sharding is not None:
        train["fsdp_strategy"] = setup.fsdp_sharding
    if setup.recompute == "selective" and setup.recompute_modules:
        train["recompute_modules"] = setup.recompute_modules
    # Only Megatron's block method counts recomputed layers; with the uniform method
    # --recompute-num-layers is the size of each checkpointed group (every layer recomputed).
    if (setup.recompute == "full" and setup.recompute_method == "block"
            and setup.recompute_num_layers):
        train["recompute_num_layers"] = setup.recompute_num_layers
    if setup.cpu_offloading and setup.cpu_offloading_num_layers:
        train["activation_offload_layers"] = setup.cpu_offloading_num_layers
    if setup.offload_modules:  # fine-grained activation offloading (model.offload_modules)
        train["offload_modules"] = setup.offload_modules
    if setup.pipeline_layout and num_layers is not None:
        try:
            layers = sum(layout_layer_counts(setup.pipeline_layout))
        except SpecError:
            layers = -1
        if layers == num_layers:
            train["pipeline_layout"] = setup.pipeline_layout
    if setup.grad_reduce_in_fp32 is not None:
        train["grad_bytes"] = 4.0 if setup.grad_reduce_in_fp32 else 2.0
    return replace(training, **train), options  # type: ignore[arg-type]
