"""Software stacks: which parallelism and features a training stack can run.

The layout and the features a team can choose are bounded by the software it runs:
Megatron-LM of 2021 had no sequence parallelism, no selective recompute, no context
parallelism, no sharded optimizer and no fused (flash) attention; the MoE all-to-all
overlap arrived in 2025.  A search that prices layouts a stack cannot run recommends
what the team cannot launch, and ranks the layouts experts chose with older software
behind layouts their software lacked.  ``--stack NAME`` bounds the layout space and the
searched features to what that stack has; the default is the current Megatron-Core,
which has everything the cost model prices.

Each stack names its sources: the paper whose runs used it, or the release notes that
introduced a feature (Megatron-LM ``CHANGELOG.md``: context parallelism in Megatron-Core
0.4.0, shared-expert overlap 0.9.0, DeepEP flex dispatcher 0.12.0, HybridEP 0.15.0;
Megatron-Bridge ``CHANGELOG.md`` 0.1.0rc3: "EP A2A communication overlap with
computation in both 1F1B pipelining and non-pipelined training", the NeMo 25.09 era).

Only what a stack *can* run is recorded here; its speed (kernel efficiency) is the
efficiency profile's job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from parsearch.cost.memory import MemoryOptions
from parsearch.cost.options import CostOptions
from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec, TrainingSpec


@dataclass(frozen=True)
class SoftwareStack:
    """What one training stack can run (``True``: available)."""

    name: str
    released: str
    source: str
    context_parallel: bool
    sequence_parallel: bool
    selective_recompute: bool
    distributed_optimizer: bool
    flash_attention: bool
    tp_comm_overlap: bool  # Transformer Engine userbuffers overlap of the TP collectives
    tp_async_grad_comm: bool  # backward TP all-reduce overlapped with the wgrad GEMM
    moe_dispatchers: tuple[str, ...]
    moe_a2a_overlap: bool
    moe_shared_expert_overlap: bool
    hybridep: bool
    #: per-layer CUDA graphs of Transformer Engine (``--cuda-graph-impl transformer_engine``)
    cuda_graphs: bool = True
    #: ``--recompute-modules`` beyond core attention (Megatron-LM commit 3b141a2471,
    #: 2025-04-05, "Add output-discarding recomputation method")
    recompute_modules: bool = True
    #: the precision-aware optimizer's BF16 Adam moments (``--use-precision-aware-optimizer``,
    #: Megatron-LM commit 47a175b4c4, 2024-12-19)
    precision_aware_optimizer: bool = True
    #: FP8 primary weights gathered in FP8 (``--fp8-param-gather``, Megatron-LM commit
    #: 033d8b0de5, 2024-09-05)
    fp8_param_gather: bool = True
    #: CPU activation offloading (``--cpu-offloading``, ``--cpu-offloading-num-layers``:
    #: Megatron-LM commit c59ac8b4d3, 2023-12-14, "CPU Offload initial commit")
    cpu_offloading: bool = True
    #: ``--cpu-offloading`` moves the dense MLP's SwiGLU input to host: Megatron marks it for
    #: Transformer Engine's offload from Megatron-Core 0.13 (``cpu_offload_input``, Megatron-LM
    #: commit 0bbcbb1157, 2025-06-13); before, it stays in HBM
    #: (:func:`~parsearch.cost.memory.activations.offload_kept_bytes`)
    offload_moves_mlp_activation_input: bool = True
    #: its Transformer Engine offloads every saved tensor of a layer that is not a parameter
    #: (TE 2.10 on, :data:`~parsearch.cost.memory.options.TE_OFFLOAD_MIN_ELEMENTS`), not only
    #: the marked ones: Megatron-Bridge pins TE 2.12 from 0.3.0 (NeMo 26.02) on, and TE 2.9
    #: in 0.2.0 (NeMo 25.11; Megatron-Bridge ``pyproject.toml`` and ``uv.lock`` at v0.2.0 and
    #: v0.3.0)
    offload_moves_every_saved_tensor: bool = False
    #: fine-grained activation offloading (``--fine-grained-activation-offloading
    #: --offload-modules``, Megatron-Core 0.16.0: Megatron-LM commit b97184db56, 2026-01-16)
    fine_grained_offloading: bool = False
    #: how it splits layers over pipeline stages (``TrainingSpec.pipeline_split``):
    #: ``uneven`` with ``--pipeline-model-parallel-layout`` (Megatron-Core 0.13.0 on),
    #: ``first-last`` for Megatron-Core 0.9-0.12 (:mod:`parsearch.layout.rank_split`),
    #: ``even`` for Megatron-LM 2021-2022 (``num_layers`` divisible by pp and by the layers
    #: per virtual stage: Megatron-LM v2.5 ``arguments.py``, ``transformer.py``)
    pipeline_split: str = "uneven"
    #: the least pp an interleaved schedule runs with (3 before Megatron-LM 3ee489d9ea,
    #: 2024-05-31, "Enable virtual pipelining and P2P communication overlap at PP=2")
    min_interleaved_pp: int = 2
    #: an interleaved (virtual-pipeline) schedule at all (DeepSpeed's pipeline engine runs
    #: 1F1B over one chunk per stage: deepspeed/runtime/pipe/schedule.py ``TrainSchedule``)
    interleaved_schedule: bool = True
    #: interleaved pipeline sends overlapped with compute (``--overlap-p2p-comm``, Megatron-LM
    #: commit f9283c5a8a, 2023-05-31); before it every send was waited on
    #: (:attr:`~parsearch.cost.options.CostOptions.pp_p2p_overlap`)
    p2p_overlap: bool = True
    #: a separate expert TP (``--expert-tensor-parallel-size``, MoE parallel folding:
    #: Megatron-LM commit 7f22e210cd, 2024-11-23); without it the experts take the model's TP
    expert_tensor_parallel: bool = True
    #: data parallelism is always fully sharded (PyTorch FSDP2: parameters, gradients and
    #: optimizer state over the DP ranks), never replicated
    fsdp_only: bool = False
    #: the routed experts through Transformer Engine's op fuser
    #: (``--use-transformer-engine-op-fuser``: Megatron-LM commit 6815c0fefe, 2026-05-15,
    #: first in Megatron Core 0.18.0; :mod:`parsearch.cost.fused_mlp`)
    fused_expert_mlp: bool = False

    def missing(self) -> tuple[str, ...]:
        """What this stack lacks, in words (for messages and ``parsearch stacks``)."""
        names = (("context_parallel", "context parallelism"),
                 ("sequence_parallel", "sequence parallelism"),
                 ("selective_recompute", "selective recompute"),
                 ("distributed_optimizer", "the distributed optimizer"),
                 ("flash_attention", "fused (flash) attention"),
                 ("tp_comm_overlap", "TP communication overlap"),
                 ("moe_a2a_overlap", "the MoE all-to-all overlap"),
                 ("moe_shared_expert_overlap", "the shared-expert overlap"),
                 ("hybridep", "HybridEP"),
                 ("cuda_graphs", "per-layer CUDA graphs"),
                 ("recompute_modules", "recompute modules beyond core attention"),
                 ("precision_aware_optimizer", "BF16 Adam moments"),
                 ("fp8_param_gather", "FP8 parameter gather"),
                 ("cpu_offloading", "CPU activation offloading"),
                 ("interleaved_schedule", "the interleaved pipeline schedule"),
                 ("expert_tensor_parallel", "a separate expert TP (MoE parallel folding)"),
                 ("fused_expert_mlp", "the fused expert MLP (Transformer Engine op fuser)"))
        moe_only = {"moe_a2a_overlap", "moe_shared_expert_overlap", "hybridep",
                    "expert_tensor_parallel", "fused_expert_mlp"}
        out = [words for field_name, words in names if not getattr(self, field_name)
               and (self.moe_dispatchers or field_name not in moe_only)]
        if self.fsdp_only:
            out.append("data parallelism other than FSDP")
        if not self.moe_dispatchers:
            out.append("MoE layers")
        elif "flex" not in self.moe_dispatchers:
            out.append("the flex (DeepEP) dispatcher")
        return tuple(out)


# Each stack is the one before it plus what its release introduced.
_MEGATRON_2021 = SoftwareStack(
    # NAR21 (arXiv 2104.04473) and its sc21 scripts (August 2021): TP, PP with the
    # interleaved schedule, DP; activation checkpointing of whole layers only; the
    # optimizer state replicated over DP (ZeRO is compared in §5.2 as another system);
    # attention as batched GEMMs with a fused softmax (FlashAttention is arXiv 2205.14135,
    # May 2022); the backward TP all-reduce ran exposed until Megatron-LM commit 16c90445
    # (2021-09-02).
    name="megatron-lm-2021", released="2021-08",
    source="Narayanan et al. 2021, arXiv 2104.04473 (Megatron-LM sc21 scripts)",
    context_parallel=False, sequence_parallel=False, selective_recompute=False,
    distributed_optimizer=False, flash_attention=False, tp_comm_overlap=False,
    tp_async_grad_comm=False, moe_dispatchers=(), moe_a2a_overlap=False,
    moe_shared_expert_overlap=False, hybridep=False, cuda_graphs=False,
    recompute_modules=False, precision_aware_optimizer=False, fp8_param_gather=False,
    cpu_offloading=False, pipeline_split="even", min_interleaved_pp=3, p2p_overlap=False)
# KOR22 (arXiv 2205.05198) introduced sequence parallelism and selective recompute (§4.2,
# §5); still no fused attention, no context parallelism, and its memory analysis (§4.1)
# keeps the optimizer state unsharded.
_MEGATRON_2022 = replace(
    _MEGATRON_2021, name="megatron-lm-2022", released="2022-05",
    source="Korthikanti et al. 2022, arXiv 2205.05198",
    sequence_parallel=True, selective_recompute=True, tp_async_grad_comm=True)
# Megatron-LM at 285068c810 (2023-01-11), MegaScale's baseline (arXiv 2402.15627 §6.1): KOR22's
# features plus the distributed optimizer (``--use-distributed-optimizer``, merged 2022-06-08,
# d07d29df14) and FlashAttention behind ``--use-flash-attn`` (that very merge); still no
# context parallelism, no Transformer Engine overlap, even pipeline splits and interleaving
# only at ``pp > 2`` (its ``arguments.py``).
_MEGATRON_2023 = replace(
    _MEGATRON_2022, name="megatron-lm-2023", released="2023-01",
    source="Megatron-LM 285068c810 (2023-01-11), MegaScale's baseline (arXiv 2402.15627)",
    distributed_optimizer=True, flash_attention=True)
# Megatron-Core 0.11 (early 2025; MoE Parallel Folding, arXiv 2504.14960, and its ModelZoo
# recipes of 2025-04-03): context parallelism (0.4.0), the distributed optimizer, fused
# attention, TE's TP overlap, all-to-all and all-gather dispatchers, the shared-expert
# overlap (0.9.0); DeepEP only from 0.12.0, the EP all-to-all overlap later.
# Megatron-Core 0.9 (NeMo 24.09, 2024-09): the same, before MoE parallel folding
# (experts take the model's TP) and the precision-aware optimizer (Megatron-LM 47a175b4c4,
# 2024-12-19).
_MCORE_09 = replace(
    _MEGATRON_2022, name="mcore-0.9", released="2024-09",
    source="NeMo 24.09 container (Megatron Core 0.9.0); Megatron-LM 7f22e210cd (2024-11-23, "
           "MoE parallel folding) and 47a175b4c4 (2024-12-19) came after",
    context_parallel=True, distributed_optimizer=True, flash_attention=True,
    tp_comm_overlap=True, moe_dispatchers=("alltoall", "allgather"),
    moe_shared_expert_overlap=True, precision_aware_optimizer=False, fp8_param_gather=True,
    p2p_overlap=True,
    cpu_offloading=True, offload_moves_mlp_activation_input=False,
    expert_tensor_parallel=False, pipeline_split="first-last", min_interleaved_pp=2)
_MCORE_011 = replace(
    _MCORE_09, name="mcore-0.11", released="2025-02",
    source="Megatron-LM CHANGELOG.md (Megatron Core 0.9.0-0.12.0)",
    precision_aware_optimizer=True, expert_tensor_parallel=True)
# Megatron-Core 0.12.0: "DeepEP support, compatible with all the parallelisms".
_MCORE_012 = replace(
    _MCORE_011, name="mcore-0.12", released="2025-04",
    source="Megatron-LM CHANGELOG.md (Megatron Core 0.12.0, MoE features)",
    moe_dispatchers=("alltoall", "allgather", "flex"))
# Megatron-Core 0.14 / Megatron-Bridge 0.1.0rc3 (NeMo 25.09): the EP all-to-all overlap
# (--overlap-moe-expert-parallel-comm) in 1F1B and interleaved schedules; per-layer
# Transformer Engine CUDA graphs with scopes (NVIDIA "Transformer Engine and Megatron-LM CUDA
# Graph Support", written against Megatron-LM core_v0.14.0).
_MCORE_014 = replace(
    _MCORE_012, name="mcore-0.14", released="2025-09",
    source="Megatron-Bridge CHANGELOG.md 0.1.0rc3 (EP A2A communication overlap)",
    moe_a2a_overlap=True, cuda_graphs=True, recompute_modules=True,
    offload_moves_mlp_activation_input=True, pipeline_split="uneven")
# Megatron-Core 0.15.0: "Add HybridEP backend to Flex Dispatcher".  Megatron-Bridge 0.2.x (NeMo
# 25.11) pins Megatron-LM 0d8e0714 (2025-11-17), which has HybridEP and not the fine-grained
# activation offloading of b97184db56 (2026-01-15), and Transformer Engine 2.9, whose CPU
# offload moves only the tensors marked for it.
_MCORE_015 = replace(
    _MCORE_014, name="mcore-0.15", released="2025-11",
    source="Megatron-LM CHANGELOG.md (Megatron Core 0.15.0); Megatron-Bridge 0.2.0 "
           "3rdparty/Megatron-LM @ 0d8e0714 (NeMo 25.11)",
    hybridep=True)
# Megatron-Bridge 0.3.0 (NeMo 26.02): Megatron-LM b0cc2706 (Megatron Core 0.16, with
# fine-grained activation offloading) and Transformer Engine >= 2.10 (its CPU offload moves
# every saved tensor).  Bridge 0.4.x (NeMo 26.04, 26.04.01) pins Megatron Core 0.17
# (d7288711, 2edffadb), which adds nothing the cost model prices: it has no fused expert MLP.
_MCORE_016 = replace(
    _MCORE_015, name="mcore-0.16", released="2026-02",
    source="Megatron-Bridge 0.3.0 3rdparty/Megatron-LM @ b0cc2706 (NeMo 26.02; Megatron Core "
           "0.16: fine-grained activation offloading) and TE >= 2.10 offload; Bridge 0.4.x "
           "(NeMo 26.04) on Megatron Core 0.17",
    offload_moves_every_saved_tensor=True, fine_grained_offloading=True)
# Megatron-Bridge 0.5.0 (NeMo 26.06) on: Megatron-LM d0b3b775 (Megatron Core 0.18.0), with
# the routed experts through Transformer Engine's op fuser (6815c0fefe); Bridge 0.6.0 (NeMo
# 26.08) pins cd4afffa (Megatron Core 0.19), which keeps it.  Everything the cost model
# prices.
_MCORE_CURRENT = replace(
    _MCORE_016, name="mcore-current", released="2026-06",
    source="Megatron-Bridge 0.5.0 3rdparty/Megatron-LM @ d0b3b775 (NeMo 26.06; Megatron Core "
           "0.18.0: fused expert MLP, 6815c0fefe) and 0.6.0 @ cd4afffa (NeMo 26.08)",
    fused_expert_mlp=True)

# torchtitan (Liang et al., arXiv 2410.06511; its benchmark files of 2024-12 and 2025-06):
# PyTorch-native TP with sequence parallelism and async TP (torch symmetric memory), PP with
# interleaved schedules, context parallelism (ring attention through SDPA), data
# parallelism as FSDP2 only, torchao float8 with an FP8 all-gather.  No MoE layers priced,
# no CUDA graphs, no CPU activation offloading, no BF16 Adam moments.  Its selective
# checkpointing is op-level (every second matmul saved, parsearch.cost.titan_sac), which has
# no Megatron-LM launch flag: searched recompute is none or full, the op-level module is
# priced through the Python API (recompute module ``torchtitan_op_sac``).  Its attention
# kernel (PyTorch SDPA) runs at cost_models/stacks/torchtitan.yaml's rate.
_TORCHTITAN = SoftwareStack(
    name="torchtitan", released="2025-06",
    source="torchtitan, arXiv 2410.06511 and pytorch/torchtitan benchmarks/ (2024-12, "
           "2025-06)",
    context_parallel=True, sequence_parallel=True, selective_recompute=False,
    distributed_optimizer=True, flash_attention=True, tp_comm_overlap=True,
    tp_async_grad_comm=True, moe_dispatchers=(), moe_a2a_overlap=False,
    moe_shared_expert_overlap=False, hybridep=False, cuda_graphs=False,
    recompute_modules=False, precision_aware_optimizer=False, fp8_param_gather=True,
    cpu_offloading=False, expert_tensor_parallel=False, fsdp_only=True)

# Megatron-DeepSpeed as the BigScience BLOOM trial ran it (bigscience tr11-200B-ml.slurm
# @f658243409, 2022-02-17; INDEPENDENT_RUNS.md): Megatron-LM's TP and fused kernels of 2021,
# DeepSpeed's pipeline engine (1F1B, no interleaving; layers partitioned evenly by type) and
# ZeRO stage 1 (optimizer state sharded over DP, priced as the distributed optimizer); no
# sequence parallelism or selective recompute (KOR22, May 2022), no fused attention, no TE.
_MEGATRON_DEEPSPEED_2022 = replace(
    _MEGATRON_2021, name="megatron-deepspeed-2022", released="2022-02",
    source="bigscience-workshop/Megatron-DeepSpeed with DeepSpeed ZeRO-1 (BLOOM tr11 scripts, "
           "2022-02)",
    distributed_optimizer=True, interleaved_schedule=False)

#: Megatron-LM / Megatron-Core releases, oldest first: each has what the one before had.
MEGATRON_LINE: tuple[SoftwareStack, ...] = (_MEGATRON_2021, _MEGATRON_2022, _MEGATRON_2023,
                                            _MCORE_09,
                                            _MCORE_011, _MCORE_012, _MCORE_014, _MCORE_015,
                                            _MCORE_016, _MCORE_CURRENT)
#: The stacks parsearch knows: the Megatron line, then the others; the default is the
#: current Megatron-Core.
STACKS: tuple[SoftwareStack, ...] = (*MEGATRON_LINE, _TORCHTITAN, _MEGATRON_DEEPSPEED_2022)

STACKS_BY_NAME: dict[str, SoftwareStack] = {s.name: s for s in STACKS}
DEFAULT_STACK = _MCORE_CURRENT.name


def get_stack(name: str) -> SoftwareStack:
    """The stack called ``name``, or an error that lists the known ones."""
    try:
        return STACKS_BY_NAME[name]
    except KeyError:
        raise SpecError(f"--stack: unknown software stack {name!r}; choose from "
                        f"{', '.join(STACKS_BY_NAME)} (default {DEFAULT_STACK})") from None


def _refuse(stack: SoftwareStack, what: str, fix: str) -> SpecError:
    return SpecError(f"--stack {stack.name} does not have {what} ({stack.source}); {fix}")


def require_model_support(stack: SoftwareStack, model: ModelSpec) -> None:
    """Refuse a model whose layers the stack cannot build (MoE before Megatron-Core)."""
    if model.moe is not None and not stack.moe_dispatchers:
        raise _refuse(stack, f"MoE layers ({model.name} has experts)",
                      "choose a Megatron-Core stack (mcore-0.11 or later)")


def stack_training(stack: SoftwareStack, training: TrainingSpec, *,
                   explicit: frozenset[str] = frozenset()) -> TrainingSpec:
    """``training`` bounded to what ``stack`` can run.

    ``explicit`` names the fields the user set (``sequence_parallel``,
    ``recompute_modes``, ``distributed_optimizer``, ``max_cp``): asking a stack for what
    it lacks is an error, a default is narrowed quietly.
    """
    out = training
    if not stack.sequence_parallel and training.sequence_parallel != "off":
        if "sequence_parallel" in explicit and training.sequence_parallel == "on":
            raise _refuse(stack, "sequence parallelism", "use --sequence-parallel off")
        out = replace(out, sequence_parallel="off")
    if not stack.selective_recompute and "selective" in training.recompute_modes:
        modes = tuple(m for m in training.recompute_modes if m != "selective")
        if not modes or "recompute_modes" in explicit:
            raise _refuse(stack, "selective recompute", "use --recompute none,full")
        out = replace(out, recompute_modes=modes)
    if not stack.distributed_optimizer and (training.distributed_optimizer or training.fsdp):
        if "distributed_optimizer" in explicit or training.fsdp:
            raise _refuse(stack, "sharded optimizer state (distributed optimizer, FSDP)",
                          "use --no-distributed-optimizer without --fsdp")
        out = replace(out, distributed_optimizer=False)
    if not stack.cpu_offloading and training.activation_offload_layers:
        raise _refuse(stack, "CPU activation offloading", "drop --activation-offload-layers")
    if not stack.fine_grained_offloading and training.offload_modules:
        raise _refuse(stack, "fine-grained activation offloading", "drop --offload-modules")
    if not stack.context_parallel and (training.max_cp is None or training.max_cp > 1):
        if "max_cp" in explicit and training.max_cp is not None and training.max_cp > 1:
            raise _refuse(stack, "context parallelism", "use --max-cp 1")
        out = replace(out, max_cp=1)
    if not stack.expert_tensor_parallel and not training.experts_follow_tp:
        out = replace(out, experts_follow_tp=True)
    out = _pipeline_rules(stack, out, explicit)
    if stack.fsdp_only and not out.fsdp:
        # FSDP2 is the stack's only data parallelism (its optimizer state is never
        # replicated): price it whether or not --fsdp was given
        out = replace(out, fsdp=True)
    return out


#: each split mode's layer splits include those of the modes after it
_SPLIT_ORDER = ("uneven", "first-last", "even")


def _pipeline_rules(stack: SoftwareStack, training: TrainingSpec,
                    explicit: frozenset[str]) -> TrainingSpec:
    """The pipeline splits and interleaving ``stack`` builds: a looser split narrowed
    quietly, or refused where the user asked for it; a layout string refused."""
    out = training
    if _SPLIT_ORDER.index(training.pipeline_split) < _SPLIT_ORDER.index(stack.pipeline_split):
        if "pipeline_split" in explicit:
            raise _refuse(stack, f"the {training.pipeline_split} pipeline split",
                          f"use --pipeline-split {stack.pipeline_split}")
        out = replace(out, pipeline_split=stack.pipeline_split)  # type: ignore[arg-type]
    if training.pipeline_layout is not None and stack.pipeline_split != "uneven":
        raise _refuse(stack, "pipeline layout strings (--pipeline-model-parallel-layout)",
                      f"drop the layout and use --pipeline-split {stack.pipeline_split}")
    if out.min_interleaved_pp < stack.min_interleaved_pp:
        out = replace(out, min_interleaved_pp=stack.min_interleaved_pp)
    if not stack.interleaved_schedule and (out.max_vpp is None or out.max_vpp > 1):
        if "max_vpp" in explicit and out.max_vpp is not None and out.max_vpp > 1:
            raise _refuse(stack, "the interleaved pipeline schedule", "use --max-vpp 1")
        out = replace(out, max_vpp=1)
    return out


def stack_options(stack: SoftwareStack, options: CostOptions, *,
                  explicit: frozenset[str] = frozenset()) -> CostOptions:
    """``options`` bounded to what ``stack`` can run (see :func:`stack_training`).

    Searched features the stack lacks leave the search and stay off; a feature the user
    turned on that the stack lacks is an error.
    """
    searched = set(options.search_features)
    changes: dict[str, object] = {}
    for feature, available in (("cuda_graphs", stack.cuda_graphs),
                               ("moe_a2a_overlap", stack.moe_a2a_overlap),
                               ("moe_shared_expert_overlap", stack.moe_shared_expert_overlap),
                               ("tp_comm_overlap", stack.tp_comm_overlap),
                               ("flash_attention", stack.flash_attention),
                               ("tp_async_grad_comm", stack.tp_async_grad_comm),
                               ("pp_p2p_overlap", stack.p2p_overlap),
                               ("fused_expert_mlp", stack.fused_expert_mlp)):
        if available:
            continue
        searched.discard(feature)
        if not getattr(options, feature):
            continue
        if feature in explicit:
            raise _refuse(stack, feature.replace("_", " "),
                          f"drop --{feature.replace('_', '-')}")
        changes[feature] = False
        if feature == "cuda_graphs":
            changes["cuda_graph_scope"] = ()
    changes.update(_memory_features(stack, options, explicit, searched))
    if stack.moe_dispatchers:
        dispatchers = tuple(d for d in options.moe_dispatchers_available
                            if d in stack.moe_dispatchers)
        if options.moe_dispatcher not in dispatchers:
            if "moe_dispatcher" in explicit:
                raise _refuse(stack, f"the {options.moe_dispatcher} dispatcher",
                              f"choose --moe-dispatcher among {', '.join(dispatchers)}")
            changes["moe_dispatcher"] = dispatchers[0]
        changes["moe_dispatchers_available"] = dispatchers
    if not stack.hybridep and options.moe_flex_backend == "hybridep":
        if "moe_flex_backend" in explicit:
            raise _refuse(stack, "HybridEP", "use --moe-flex-backend deepep")
        changes["moe_flex_backend"] = "deepep"
    if not stack.hybridep and options.moe_flex_backend == "auto":
        changes["moe_flex_backend"] = "deepep"
    changes["search_features"] = tuple(f for f in options.search_features if f in searched)
    memory = changes.get("memory", options.memory)
    assert isinstance(memory, MemoryOptions)
    offload = stack_offload(stack)
    if (memory.offload_moves_mlp_activation_input,
            memory.offload_moves_every_saved_tensor) != offload:
        changes["memory"] = replace(memory, offload_moves_mlp_activation_input=offload[0],
                                    offload_moves_every_saved_tensor=offload[1])
    return replace(options, **changes)  # type: ignore[arg-type]


def stack_offload(stack: SoftwareStack) -> tuple[bool, bool]:
    """What ``--cpu-offloading`` moves under ``stack``, as :class:`MemoryOptions` takes it:
    ``(offload_moves_mlp_activation_input, offload_moves_every_saved_tensor)``."""
    return stack.offload_moves_mlp_activation_input, stack.offload_moves_every_saved_tensor


def _memory_features(stack: SoftwareStack, options: CostOptions, explicit: frozenset[str],
                     searched: set[str]) -> dict[str, object]:
    """The memory-saving features ``stack`` lacks: out of the search (``searched`` is
    updated), and off unless the user asked for them, which is an error."""
    changes: dict[str, object] = {}
    modules = options.recompute_modules
    checks = (  # (feature, the stack has it, on now, what it is, the fix, what turns it off)
        ("recompute_modules", stack.recompute_modules,
         modules is not None and tuple(modules) != ("core_attn",),
         "recompute modules beyond core_attn", "use --recompute-modules core_attn",
         {"recompute_modules": None}),
        ("bf16_moments", stack.precision_aware_optimizer, options.bf16_moments,
         "BF16 Adam moments", "drop --bf16-moments", {"bf16_moments": False}),
        ("fp8_param_gather", stack.fp8_param_gather, options.fp8_param_gather,
         "FP8 parameter gather", "drop --fp8-param-gather",
         {"memory": replace(options.memory, fp8_param_gather=False)}),
        ("activation_offload_layers", stack.cpu_offloading,
         bool(options.activation_offload_layers), "CPU activation offloading",
         "drop --activation-offload-layers", {"activation_offload_layers": None}),
        ("offload_modules", stack.fine_grained_offloading,
         bool(options.offload_modules) or "offload_modules" in options.search_features,
         "fine-grained activation offloading",
         "drop --offload-modules auto, or use --stack mcore-current",
         {"offload_modules": None}),
    )
    for feature, available, on, words, fix, off in checks:
        if available:
            continue
        searched.discard(feature)
        if not on:
            continue
        if feature in explicit:
            raise _refuse(stack, words, fix)
        changes.update(off)
    return changes
