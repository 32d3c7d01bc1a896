"""What the time model prices besides the training spec: the features a run turns on.

Each switch names the Megatron-Core / Megatron-Bridge feature it stands for,
so the launch settings can turn on exactly what was priced.  Defaults follow
Megatron-Bridge's performance recipes (``scripts/performance`` and the
``CommOverlapConfig`` / DDP config defaults of NVIDIA-NeMo/Megatron-Bridge):
TP communication overlap on, overlapped gradient reduce and parameter gather
on, the ``alltoall`` token dispatcher, no MoE all-to-all overlap, no CUDA
graphs.  Overlap is never a free fraction: the time model hides
communication only where the feature is on, and only up to the independent
compute the schedule offers (:mod:`parsearch.cost.communication`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from parsearch.cost.kernels import CUDA_GRAPH_SCOPES
from parsearch.cost.memory import MemoryOptions
from parsearch.cost.memory.cuda_graph_memory import layer_graph_counts
from parsearch.cost.quantization import FP8_RECIPE_CHOICES
from parsearch.cost.routing import ROUTING_MODES
from parsearch.errors import SpecError
from parsearch.model.offload_modules import OFFLOAD_MODULES

if TYPE_CHECKING:
    from parsearch.cost.efficiency import EfficiencyProfile

#: Megatron-Core ``--moe-token-dispatcher-type`` values the model prices.
MOE_DISPATCHERS: tuple[str, ...] = ("alltoall", "allgather", "flex")
#: ``--moe-flex-dispatcher-backend`` of the flex dispatcher (``auto``: HybridEP where the
#: NVLink domain spans several nodes, DeepEP otherwise, as the launch settings choose).
FLEX_BACKENDS: tuple[str, ...] = ("auto", "deepep", "hybridep")
#: Features the search may choose per layout (``CostOptions.search_features``;
#: :mod:`parsearch.cost.feature_search`).
SEARCHABLE_FEATURES: tuple[str, ...] = ("moe_dispatcher", "moe_a2a_overlap",
                                        "moe_shared_expert_overlap", "cuda_graphs",
                                        "recompute_modules", "bf16_moments", "fp8_param_gather",
                                        "activation_offload_layers", "offload_modules",
                                        "fused_expert_mlp")
#: The features searched where the user leaves them unset (``parsearch search`` without the
#: flag).  Fine-grained offload modules are searched only on request (``--offload-modules
#: auto``): their host-side cost per offload group outside a CUDA graph, which Megatron-Core's
#: guide names but does not size, is not priced, and with them searched by default the
#: published shapes fell in the searched ranking (docs/accuracy.md, 2026-12-07).
DEFAULT_SEARCHED_FEATURES: tuple[str, ...] = tuple(
    f for f in SEARCHABLE_FEATURES if f != "offload_modules")
#: Megatron-Core ``--cuda-graph-impl`` values (besides ``none``) the model prices:
#: per-layer graphs from Transformer Engine's ``make_graphed_callables`` or Megatron's own
#: ``CudaGraphManager``, or one graph of the whole forward-backward (``full_iteration``).
CUDA_GRAPH_IMPLS: tuple[str, ...] = ("transformer_engine", "local", "full_iteration")
#: Default share of HBM a layout must leave free (allocator fragmentation, NCCL and
#: cuBLAS workspaces the memory model does not count; PyTorch's caching allocator
#: typically leaves several percent of HBM unusable).
DEFAULT_MEMORY_MARGIN = 0.05


@dataclass(frozen=True)
class CostOptions:
    """Features and accounting knobs of the time model.

    * ``moe_dispatcher``: ``alltoall`` (Megatron-Core ``MoEAlltoAllTokenDispatcher``:
      one copy per routed expert), ``allgather`` (Megatron-Core's default: all-gather
      of the hidden states over the TP×EP group, reduce-scatter on combine) or
      ``flex`` (DeepEP / HybridEP: one network copy per remote domain).
    * ``moe_flex_backend``: the flex dispatcher's kernels (``deepep``, ``hybridep``,
      ``auto``): how many SMs they hold while they run beside compute.
    * ``tp_comm_overlap``: Transformer Engine userbuffers overlap of the TP
      collectives with the GEMMs they feed (``--tp-comm-overlap``; needs SP and
      an NVLink-local TP group).
    * ``moe_a2a_overlap``: overlap of the EP all-to-all of one micro-batch with
      the compute of another (``--overlap-moe-expert-parallel-comm``).
    * ``moe_shared_expert_overlap``: the shared experts on a side stream beside the
      same micro-batch's dispatch and combine (``--moe-shared-expert-overlap``; models
      with shared experts, ``alltoall`` or ``flex`` dispatcher).
    * ``overlap_grad_reduce`` / ``overlap_param_gather``: Megatron DDP
      (``--overlap-grad-reduce``, ``--overlap-param-gather``).
    * ``ddp_bucket_params``: parameters per gradient bucket (``--ddp-bucket-size``, or
      Apex DistributedFusedAdam's ``bucket_cap_mb`` as elements); ``None``: Megatron-Core's
      default, ``max(40e6, 1e6 x DP)`` (:func:`parsearch.cost.stage_time.bucket_params`).
    * ``apex_distributed_adam``: the gradients synced by Apex's DistributedFusedAdam (NeMo
      1.0 recipes, ``optim.name: distributed_fused_adam``), which buckets every parameter of
      every pipeline stage, instead of Megatron-Core's DDP, which buckets only the first
      stage's first model chunk (:class:`parsearch.cost.stage_time.StageSettings`); read
      from published recipes, not a Megatron launch setting.
    * ``dualpipe``: DeepSeek's DualPipe schedule (DeepSeek-V3 technical report, arXiv
      2412.19437 §3.2.1), which overlaps a forward chunk's all-to-all with a backward
      chunk's computation inside a bidirectional pipeline, so the all-to-all overlap runs
      with any pipeline depth (Megatron's ``--overlap-moe-expert-parallel-comm`` needs no
      pipeline or an interleaved one); read from published reports, not a Megatron
      launch setting.
    * ``cuda_graphs``: kernels replayed from CUDA graphs (host launch cost gone).
    * ``cuda_graph_scope``: what the graphs capture (Megatron-Core ``--cuda-graph-modules``,
      formerly ``--cuda-graph-scope``: ``attn``, ``mlp``, ``moe``, ``moe_router``,
      ``moe_preprocess``); empty = the whole layer.  Kernels outside the scope are still
      issued one by one from the host.
    * ``cuda_graph_impl``: ``--cuda-graph-impl`` when graphs are on (:data:`CUDA_GRAPH_IMPLS`):
      per-layer graphs hold static buffers per micro-batch in flight
      (:mod:`parsearch.cost.memory.cuda_graph_memory`); ``full_iteration`` takes no scope.
    * ``flash_attention``: fused attention (FlashAttention / cuDNN); ``False`` prices
      Megatron's pre-2022 path (batched GEMMs over the full s x s scores plus the
      fused scale-mask-softmax and dropout kernels that read and write them).
    * ``tp_async_grad_comm``: without userbuffers, a linear's backward TP collectives run
      beside its dgrad/wgrad GEMMs (Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``,
      always on in current Megatron); ``False`` prices Megatron-LM before September 2021,
      whose backward all-reduce ran exposed on the compute stream.
    * ``pp_scatter_gather``: pipeline sends split over the TP group and all-gathered on
      arrival (Megatron-LM's ``--scatter-gather-tensors-in-pipeline``, on by default before
      Megatron-Core; NAR21 §4.1).  Only layouts without SP send less (with SP the tensor is
      already split); Megatron-Core dropped it, so the launch settings have no flag for it.
    * ``pp_p2p_overlap``: an interleaved schedule's pipeline sends run beside the next
      chunk's compute (``--overlap-p2p-comm``, Megatron-LM commit f9283c5a8a, 2023-05-31, on
      for interleaved schedules since).  ``False`` prices Megatron-LM before it, whose
      ``_communicate`` waited on every batched send/receive (``req.wait()``, then
      ``torch.cuda.synchronize()``: ``megatron/p2p_communication.py`` at 285068c810), so each
      send is on the step's critical path; MegaScale (arXiv 2402.15627 §3.2) lists the PP
      send/receive overlap as its own addition over that baseline.
    * ``routing``: ``trained`` (a trained router's expert-load imbalance, growing with EP:
      :mod:`parsearch.cost.routing`) or ``balanced`` (Megatron-Core
      ``--moe-router-force-load-balancing``, a benchmarking switch: every EP rank gets the
      mean; the launch settings turn it on only then).
    * ``moe_imbalance``: max/mean tokens per expert rank, fixed for every layout (``None``:
      from ``routing``; under ``balanced``, the profile's).
    * ``moe_capacity_factor``: Megatron-Core ``--moe-expert-capacity-factor`` (tokens past
      it are dropped: the imbalance is capped at it); ``moe_pad_to_capacity``:
      ``--moe-pad-expert-input-to-capacity`` (every expert runs exactly that many).
    * ``grad_reduce_bytes``: element size of the DP gradient reduction (4: fp32,
      2: bf16, ``grad_reduce_in_fp32=False``); ``param_gather_bytes``: of the
      parameter all-gather (1 with ``--fp8-param-gather``).
    * ``fp8_dispatch``: EP dispatch sent in FP8 when training in FP8.
    * ``fp8_recipe``: FP8 scaling (``tensorwise`` current scaling, ``delayed``, ``mxfp8``,
      ``blockwise``; ``auto``: MXFP8 on Blackwell, else tensorwise): what the casts
      cost (:mod:`parsearch.cost.quantization`) and what the launch settings ask for.
    * ``fp8_attention``: fused attention in FP8 when training in FP8 or FP4 (Megatron-Core
      ``fp8_dot_product_attention``, Transformer Engine ``fp8_dpa``: Q, K, V cast to FP8,
      both attention matmuls at the FP8 tensor rate, outputs cast back).
    * ``fp8_output_proj``: the LM-head (output layer) GEMM in MXFP8 (Megatron-Core
      ``fp8_output_proj``; only with the MXFP8 recipe).  Without it the output layer is BF16.
    * ``fused_expert_mlp``: MoE experts through Transformer Engine's op fuser (Megatron-Core
      ``use_transformer_engine_op_fuser`` with ``moe_mlp_glu_interleave_size=32``): the
      grouped FC1 GEMM applies SwiGLU and writes block-scaled FP8 in its epilogue, and FC2's
      dgrad GEMM applies the SwiGLU backward (``ForwardGroupedMLP_CuTeGEMMSwiGLU`` /
      ``BackwardGroupedMLP_CuTeGEMMDSwiGLU``, SM100+, block-scaled FP8/FP4 only).
    * ``memory_margin``: the share of HBM a layout must leave free to count as fitting.
    * ``search_features``: features (of :data:`SEARCHABLE_FEATURES`) the search chooses per
      layout instead of taking the value here (:mod:`parsearch.cost.feature_search`); empty:
      every feature as given.
    * ``moe_dispatchers_available``: the dispatchers the software stack has, which a
      searched dispatcher is chosen among (:mod:`parsearch.cost.stacks`).
    * ``recompute_modules``: the selective recompute modules priced (``None``: the training
      spec's); ``bf16_moments``: Adam moments in BF16 (precision-aware optimizer, 8 bytes of
      optimizer state per parameter instead of the training spec's 12).  Both are set by the
      memory-feature search (:mod:`parsearch.cost.memory_features`), which applies them to
      the training spec it prices; ``chosen_features`` names those of them it turned on
      (so the output can say a numerics-changing feature was chosen, not given).
    * ``activation_offload_layers``: the layers whose activations go to host memory as the
      search chose them for the layout (``None``: the training spec's); applied to the
      training spec like the memory features (:mod:`parsearch.cost.offload`).
    * ``offload_modules``: the submodules whose inputs go to host memory (fine-grained
      activation offloading) as the search chose them for the layout (``None``: the
      training spec's); applied to the training spec like the memory features
      (:func:`parsearch.cost.memory_features.module_offload_chain`).
    """

    causal: bool = True
    moe_dispatcher: str = "alltoall"
    moe_flex_backend: str = "auto"
    tp_comm_overlap: bool = True
    moe_a2a_overlap: bool = False
    moe_shared_expert_overlap: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    ddp_bucket_params: int | None = None
    apex_distributed_adam: bool = False
    dualpipe: bool = False
    cuda_graphs: bool = False
    cuda_graph_scope: tuple[str, ...] = ()
    cuda_graph_impl: str = "transformer_engine"
    flash_attention: bool = True
    tp_async_grad_comm: bool = True
    pp_scatter_gather: bool = False
    pp_p2p_overlap: bool = True
    routing: str = "trained"
    moe_imbalance: float | None = None
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool = False
    grad_reduce_bytes: float = 4.0
    param_gather_bytes: float = 2.0
    fp8_dispatch: bool = False
    fp8_recipe: str = "auto"
    fp8_attention: bool = False
    fp8_output_proj: bool = False
    fused_expert_mlp: bool = False
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    memory: MemoryOptions = field(default_factory=MemoryOptions)
    search_features: tuple[str, ...] = ()
    moe_dispatchers_available: tuple[str, ...] = MOE_DISPATCHERS
    recompute_modules: tuple[str, ...] | None = None
    bf16_moments: bool = False
    chosen_features: tuple[str, ...] = ()
    activation_offload_layers: int | None = None
    offload_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        unknown_features = [f for f in self.search_features if f not in SEARCHABLE_FEATURES]
        if unknown_features:
            raise SpecError(f"search_features: {unknown_features[0]!r} is not a searchable "
                            f"feature; choose from {', '.join(SEARCHABLE_FEATURES)}")
        if self.offload_modules is not None:
            bad = [m for m in self.offload_modules if m not in OFFLOAD_MODULES]
            if bad:
                raise SpecError(f"offload_modules: {bad[0]!r} is not an offload module; "
                                f"choose from {', '.join(OFFLOAD_MODULES)}")
        if self.ddp_bucket_params is not None and not (
                isinstance(self.ddp_bucket_params, int) and self.ddp_bucket_params > 0):
            raise SpecError(f"ddp_bucket_params must be a positive whole number of parameters "
                            f"per gradient bucket (or unset for Megatron-Core's default), got "
                            f"{self.ddp_bucket_params!r}")
        if not (isinstance(self.memory_margin, (int, float)) and math.isfinite(self.memory_margin)
                and 0.0 <= self.memory_margin < 1.0):
            raise SpecError(
                f"memory_margin must be in [0, 1): the share of HBM kept free, got "
                f"{self.memory_margin!r}"
            )
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise SpecError(
                f"moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, "
                f"got {self.moe_dispatcher!r}"
            )
        if (not self.moe_dispatchers_available
                or any(d not in MOE_DISPATCHERS for d in self.moe_dispatchers_available)):
            raise SpecError(f"moe_dispatchers_available must name some of "
                            f"{', '.join(MOE_DISPATCHERS)}, got {self.moe_dispatchers_available!r}")
        if self.fp8_recipe not in FP8_RECIPE_CHOICES:
            raise SpecError(f"fp8_recipe must be one of {', '.join(FP8_RECIPE_CHOICES)}, "
                            f"got {self.fp8_recipe!r}")
        unknown = [s for s in self.cuda_graph_scope if s not in CUDA_GRAPH_SCOPES]
        if unknown:
            raise SpecError(
                f"cuda_graph_scope: unknown scope {unknown[0]!r}; choose from "
                f"{', '.join(CUDA_GRAPH_SCOPES)} (or none for the whole layer)")
        if self.cuda_graph_scope and not self.cuda_graphs:
            raise SpecError("cuda_graph_scope is set but cuda_graphs is off: turn CUDA graphs "
                            "on (--cuda-graphs) or drop the scope")
        if self.cuda_graph_impl not in CUDA_GRAPH_IMPLS:
            raise SpecError(f"cuda_graph_impl must be one of {', '.join(CUDA_GRAPH_IMPLS)}, "
                            f"got {self.cuda_graph_impl!r}")
        if self.cuda_graph_impl == "full_iteration" and self.cuda_graph_scope:
            # Megatron-LM arguments.py validate_args (cd4afffa): "--cuda-graph-modules must be
            # empty when --cuda-graph-impl=full_iteration."
            raise SpecError("cuda_graph_scope must be empty with the full_iteration CUDA graph "
                            "(it captures the whole forward-backward): drop the scope")
        if "moe" in self.cuda_graph_scope and "moe_router" in self.cuda_graph_scope:
            # Megatron-Core TransformerConfig.__post_init__ (cd4afffa): "cuda_graph_modules
            # must not contain both moe and moe_router."
            raise SpecError("cuda_graph_scope: moe and moe_router cannot both be captured "
                            "(moe already holds the router); keep one")
        if "moe_preprocess" in self.cuda_graph_scope and "moe_router" not in self.cuda_graph_scope:
            raise SpecError("cuda_graph_scope: moe_preprocess must come with moe_router "
                            "(Megatron-Core captures the preprocessing only after the router)")
        if self.moe_shared_expert_overlap and self.moe_a2a_overlap:
            # Megatron-Core TransformerConfig: "disable moe_shared_expert_overlap when
            # enabling overlap_moe_expert_parallel_comm" (the merged schedule places the
            # shared experts itself).
            raise SpecError("moe_shared_expert_overlap and moe_a2a_overlap cannot both be on "
                            "(Megatron-Core refuses it; the all-to-all overlap schedules the "
                            "shared experts itself): drop --moe-shared-expert-overlap")
        if self.moe_shared_expert_overlap and self.moe_dispatcher == "allgather":
            raise SpecError("moe_shared_expert_overlap needs the alltoall or flex dispatcher "
                            "(Megatron-Core rejects it with allgather): choose "
                            "--moe-dispatcher alltoall or flex, or drop the overlap")
        if self.moe_flex_backend not in FLEX_BACKENDS:
            raise SpecError(f"moe_flex_backend must be one of {', '.join(FLEX_BACKENDS)}, "
                            f"got {self.moe_flex_backend!r}")
        if self.moe_imbalance is not None and not (
                math.isfinite(self.moe_imbalance) and self.moe_imbalance >= 1.0):
            raise SpecError(f"moe_imbalance must be a number >= 1 (max/mean tokens per expert "
                            f"rank), got {self.moe_imbalance!r}")
        if self.routing not in ROUTING_MODES:
            raise SpecError(f"routing must be one of {', '.join(ROUTING_MODES)} (trained: a "
                            f"trained router's imbalance; balanced: forced uniform routing, "
                            f"for benchmarks), got {self.routing!r}")
        if self.moe_capacity_factor is not None and not (
                math.isfinite(self.moe_capacity_factor) and self.moe_capacity_factor >= 1.0):
            raise SpecError(f"moe_capacity_factor must be a number >= 1 (tokens per expert "
                            f"kept, as a multiple of the mean), got {self.moe_capacity_factor!r}")
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise SpecError("moe_pad_to_capacity needs a capacity factor (Megatron-Core pads "
                            "expert inputs to --moe-expert-capacity-factor): set one or drop "
                            "the padding")
        for name in ("grad_reduce_bytes", "param_gather_bytes"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise SpecError(f"{name} must be a positive number of bytes, got {value!r}")
        self._route_memory()

    @property
    def fp8_param_gather(self) -> bool:
        """FP8 primary weights (``--fp8-param-gather``): the memory model's switch, named as
        the searched feature."""
        return self.memory.fp8_param_gather

    def _route_memory(self) -> None:
        """Give the memory model the routing the time model prices: one router loads the
        experts for both (a trained router's busiest EP rank holds more tokens, in time
        and in activation memory; a fixed ``moe_imbalance`` is fixed for both); and the
        per-layer CUDA graphs whose static buffers it holds."""
        memory = self.memory
        fixed = self.moe_imbalance
        routed = replace(
            memory, routing="balanced" if fixed is not None else self.routing,
            moe_imbalance=(fixed if fixed is not None
                           else memory.moe_imbalance if self.routing == "balanced" else 1.0),
            moe_capacity_factor=self.moe_capacity_factor,
            moe_pad_to_capacity=self.moe_pad_to_capacity,
            cuda_graph_layers=layer_graph_counts(self.cuda_graphs, self.cuda_graph_impl,
                                                 self.cuda_graph_scope))
        if routed != memory:
            object.__setattr__(self, "memory", routed)

    def resolved(self, profile: EfficiencyProfile) -> CostOptions:
        """The options with every ``None`` the profile decides filled in from ``profile``
        (the imbalance of balanced routing; a trained router's comes from the layout)."""
        if self.routing != "balanced" or self.moe_imbalance is not None:
            return self
        return replace(self, moe_imbalance=profile.moe_imbalance)
