"""Accuracy against published training runs: predicted vs measured tokens/s per GPU.

Each usable run of the dataset (:mod:`parsearch.validation.published.published_runs`) is scored
with the analytic cost model on its own cluster preset, precision, layout and
batch, with the efficiency profile of its GPU generation (one set per
generation, never per run).  The report gives each row's absolute percentage
error (APE), the mean and median APE, and Spearman's rank correlation within
each (model, GPU) group, i.e. whether the model orders the layouts that
experts tried the way the measurements do.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from parsearch.cost.analytic import CostModel, CostOptions, Estimate, build_cost_model, estimate
from parsearch.cost.stack_speed import stack_profile_or_default
from parsearch.cost.stacks import get_stack
from parsearch.errors import ParsearchError
from parsearch.layout import Layout
from parsearch.layout.rules import check_layout
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import Fabric, build_fabric
from parsearch.validation.published.published_runs import (
    PublishedRun,
    base_model,
    current_releases,
    dedupe,
    dev_rows,
    training_spec,
)
from parsearch.validation.published.recipes import apply_setup, load_run_setups, priced_fp8_recipe
from parsearch.validation.published.run_conventions import (
    BLOOM_TRIAL,
    MBRIDGE,
    MBRIDGE_AB,
    MBRIDGE_CARD,
    MBRIDGE_USER,
    offload_of_source,
    stack_of_source,
)

#: Sources that state their data-parallel sharding (so no heavier one is assumed): the
#: BLOOM trial's script sets DeepSpeed ZeRO stage 1 (ZERO_STAGE=1).
_DP_SHARDING_STATED = frozenset({BLOOM_TRIAL})


@dataclass(frozen=True)
class ValidationRow:
    """One published run next to its prediction."""

    id: str
    model: str
    gpu: str
    num_gpus: int
    layout_key: str
    precision: str
    predicted_tokens_per_s_per_gpu: float
    measured_tokens_per_s_per_gpu: float
    ape: float
    fits: bool
    memory_gib: float
    bottleneck: str
    source: str
    assumed: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "layout": self.layout_key,
            "precision": self.precision,
            "predicted_tokens_per_s_per_gpu": self.predicted_tokens_per_s_per_gpu,
            "measured_tokens_per_s_per_gpu": self.measured_tokens_per_s_per_gpu,
            "ape": self.ape,
            "fits": self.fits,
            "memory_gib": self.memory_gib,
            "bottleneck": self.bottleneck,
            "source": self.source,
            "assumed": self.assumed,
        }


@dataclass(frozen=True)
class GroupCorrelation:
    """Spearman's rho of predicted vs measured throughput within one (model, GPU) group."""

    model: str
    gpu: str
    n: int
    spearman: float


@dataclass(frozen=True)
class ValidationReport:
    """Rows, skipped rows with reasons, and the summary statistics."""

    rows: tuple[ValidationRow, ...]
    skipped: tuple[tuple[str, str], ...]
    groups: tuple[GroupCorrelation, ...] = field(default=())
    #: Rows of release lines a newer one superseded (``current_releases``): scored,
    #: never fitted, kept out of the summary statistics.
    superseded: tuple[ValidationRow, ...] = field(default=())

    @property
    def mape(self) -> float:
        return float(np.mean([r.ape for r in self.rows])) if self.rows else math.nan

    @property
    def median_ape(self) -> float:
        return float(np.median([r.ape for r in self.rows])) if self.rows else math.nan

    @property
    def spearman(self) -> float:
        """Within-group rho averaged over the groups, weighted by their number of layouts.

        Groups need at least 3 distinct layouts (latest release of each) with distinct
        measurements and predictions.  A 3-layout group's rho can only be -1, -0.5, 0.5
        or 1, so larger groups carry more weight; :attr:`spearman_unweighted` is the
        plain mean.
        """
        valid = [g for g in self.groups if not math.isnan(g.spearman)]
        if not valid:
            return math.nan
        return float(sum(g.spearman * g.n for g in valid) / sum(g.n for g in valid))

    @property
    def spearman_unweighted(self) -> float:
        """Plain mean of the within-group rho values."""
        values = [g.spearman for g in self.groups if not math.isnan(g.spearman)]
        return float(np.mean(values)) if values else math.nan

    @property
    def out_of_memory(self) -> tuple[ValidationRow, ...]:
        return tuple(r for r in self.rows if not r.fits)

    def summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = defaultdict(int)
        for _id, reason in self.skipped:
            reasons[reason] += 1
        return {
            "n": len(self.rows),
            "skipped": len(self.skipped),
            "mape": self.mape,
            "median_ape": self.median_ape,
            "spearman": self.spearman,
            "spearman_unweighted": self.spearman_unweighted,
            "spearman_groups": len([g for g in self.groups if not math.isnan(g.spearman)]),
            "predicted_out_of_memory": len(self.out_of_memory),
            "skipped_by_reason": dict(sorted(reasons.items())),
            "superseded": len(self.superseded),
            "superseded_mape": (float(np.mean([r.ape for r in self.superseded]))
                                if self.superseded else math.nan),
            "superseded_median_ratio": (float(np.median(
                [r.measured_tokens_per_s_per_gpu / r.predicted_tokens_per_s_per_gpu
                 for r in self.superseded])) if self.superseded else math.nan),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "summary": self.summary(),
            "groups": [g.__dict__ for g in self.groups],
            "skipped": [{"id": i, "reason": r} for i, r in self.skipped],
            "superseded": [r.to_dict() for r in self.superseded],
        }


def source_accounting(run: PublishedRun, training: TrainingSpec,
                      options: CostOptions) -> tuple[TrainingSpec, CostOptions]:
    """The run's setup with the accounting its source used, where it differs from ours.

    NVIDIA's Megatron-Bridge performance recipes reduce (and keep) gradients in
    BF16 (``grad_reduce_in_fp32=False`` in their perf configs) and, for FP8/FP4
    recipes, gather FP8 primary weights; the Folding paper used Megatron-Core's fp32
    gradients and all-to-all token dispatcher (no DeepEP deduplication).  NAR21 and
    KOR22 ran Megatron-LM before its distributed optimizer: optimizer state replicated
    on every DP rank and one gradient all-reduce per step, NAR21's in FP16 (2 bytes),
    KOR22's in FP32 (4 bytes).
    """
    if run.source_tag == "FOLD":
        return training, replace(options, moe_dispatcher="alltoall")
    if run.source_tag in ("NAR21", "KOR22"):
        # Both papers predate FlashAttention (arXiv 2205.14135, May 2022): Megatron ran
        # attention as batched GEMMs with a fused scale-mask-softmax kernel.  They also
        # predate Transformer Engine's userbuffers TP overlap (2023): Megatron-LM then
        # overlapped only the backward TP collectives with the weight-gradient GEMM
        # (LinearWithGradAccumulationAndAsyncCommunication), the non-userbuffers path.
        # Pipeline sends were split over the TP group (--scatter-gather-tensors-in-pipeline,
        # default on; NAR21 §4.1), which matters for NAR21's layouts without SP.  NAR21's
        # Megatron-LM (its sc21 scripts date from August 2021) also predates the async
        # backward TP all-reduce (Megatron-LM commit 16c90445, 2021-09-02): it ran exposed.
        # Neither ran the distributed optimizer: it reached Megatron-LM main on 2022-06-08
        # (merge d07d29df14, branch lmcafee/distrib-opt-nodupe), after NAR21 (sc21 scripts
        # 2021-08) and KOR22 (arXiv v1 2022-05-10), whose §6.3 prices its DP overhead as
        # "the gradient all-reduce required between the data parallel groups".  So each
        # DP rank keeps the whole optimizer state and the gradients are all-reduced once
        # per step (no parameter all-gather).  Both predate --overlap-p2p-comm (Megatron-LM
        # f9283c5a8a, 2023-05-31): every interleaved send was waited on.
        # Gradient bytes: NAR21's sc21 CONFIG.sh trains with --fp16 and no
        # --accumulate-allreduce-grads-in-fp32 (Megatron-LM @de7dc40f883c
        # megatron/arguments.py: only --bf16 forces FP32), so its FP16 gradients are kept
        # and all-reduced in 2 bytes.  KOR22 states only "mixed precision" (§6); its
        # Megatron-LM defaults to gradient-accumulation fusion, which runs only with FP32
        # gradient accumulation and all-reduce (commit 83b1e42f30, 2022-02-13, by a KOR22
        # author; --bf16 forces it), so its gradients are read as FP32 (4 bytes, the default).
        grad_reduce_bytes = 2.0 if run.source_tag == "NAR21" else 4.0
        training = replace(training, distributed_optimizer=False, grad_bytes=grad_reduce_bytes)
        return training, replace(options, flash_attention=False, tp_comm_overlap=False,
                                 pp_scatter_gather=True,
                                 tp_async_grad_comm=run.source_tag != "NAR21",
                                 grad_reduce_bytes=grad_reduce_bytes, pp_p2p_overlap=False)
    if run.source_tag == "MEGASCALE":
        # MegaScale's Megatron-LM baseline (arXiv 2402.15627 §6.1): §3.2 presents the
        # overlap of DP all-gather / reduce-scatter, PP send/receive and TP/SP
        # all-gather / reduce-scatter with the GEMMs as MegaScale's own additions, so
        # the baseline ran them exposed.  §3.3 likewise presents FlashAttention-2 as its
        # own; the baseline's Megatron-LM commit (285068c8, 2023-01-11) has FlashAttention
        # only behind the opt-in --use-flash-attn, so it ran Megatron's unfused attention.
        # Its interleaved sends were waited on (no --overlap-p2p-comm before f9283c5a8a).
        return training, replace(options, tp_comm_overlap=False, overlap_grad_reduce=False,
                                 overlap_param_gather=False, flash_attention=False,
                                 pp_p2p_overlap=False)
    if run.source_tag == BLOOM_TRIAL:
        # The trial's script (bigscience tr11-200B-ml.slurm @f658243409, 2022-02-17;
        # INDEPENDENT_RUNS.md): Megatron-DeepSpeed with DeepSpeed ZeRO-1 and --fp16, so FP16
        # gradients are kept and reduced (2 bytes); no overlap_comm, so the gradient
        # reduction and the ZeRO all-gather run after the last micro-batch; it predates
        # FlashAttention (May 2022) and Transformer Engine's TP overlap (2023).
        return (replace(training, grad_bytes=2.0),
                replace(options, flash_attention=False, tp_comm_overlap=False,
                        overlap_grad_reduce=False, overlap_param_gather=False,
                        grad_reduce_bytes=2.0, param_gather_bytes=2.0))
    if run.source_tag not in (MBRIDGE, MBRIDGE_AB, MBRIDGE_CARD, MBRIDGE_USER):  # Bridge's defaults
        return training, options
    low_precision = run.precision != "bf16"
    memory = replace(options.memory, fp8_param_gather=True) if low_precision else options.memory
    options = replace(options, grad_reduce_bytes=2.0, memory=memory,
                      param_gather_bytes=1.0 if low_precision else 2.0)
    return replace(training, grad_bytes=2.0), options


def recipe_accounting(run: PublishedRun, training: TrainingSpec,
                      options: CostOptions) -> tuple[TrainingSpec, CostOptions]:
    """The source's accounting, then what the run's public recipe states on top.

    MoE rows are read with forced-balance routing unless the recipe says otherwise: NVIDIA's
    tables force it (or drop to a capacity factor of 1) and state so (PROVENANCE.md, "Load
    balance"); a recipe with ``moe_router_force_load_balancing=false`` is read with its
    trained router (:mod:`parsearch.cost.routing`).
    """
    if options.routing == "trained" and options.moe_imbalance is None:
        options = replace(options, routing="balanced")
    training, options = source_accounting(run, training, options)
    stated = priced_fp8_recipe(run.fp8_recipe) if run.precision == "fp8" else None
    if stated is not None:  # the precision the table names (FP8-CS, FP8-MX, ...)
        options = replace(options, fp8_recipe=stated)
    setup = load_run_setups().get(run.id)
    if setup is None:
        return training, options
    return apply_setup(setup, training, options, moe=run.is_moe, precision=run.precision,
                       num_layers=run.model_spec.num_layers if run.model_spec else None)


def fabric_for(cache: dict[tuple[str, int], Fabric], cluster: str, num_gpus: int) -> Fabric:
    """The fabric of ``cluster`` on ``num_gpus`` GPUs, built once per ``cache``."""
    key = (cluster, num_gpus)
    if key not in cache:
        cache[key] = build_fabric(load_cluster(cluster), num_gpus)
    return cache[key]


def run_cost_model(run: PublishedRun, fabric: Fabric, options: CostOptions,
                   training: TrainingSpec) -> CostModel:
    """The cost model for ``run`` under ``training``, with its source's accounting."""
    assert run.model_spec is not None
    training, options = recipe_accounting(run, training, options)
    stack = stack_of_source(run.source)
    moves_mlp, moves_every = offload_of_source(run.source)
    options = replace(options, memory=replace(
        options.memory, offload_moves_mlp_activation_input=moves_mlp,
        offload_moves_every_saved_tensor=moves_every))
    if run.model_spec.moe is not None and not get_stack(stack).expert_tensor_parallel:
        # before MoE parallel folding the EP ranks were DP ranks (placement.group_strides)
        training = replace(training, experts_follow_tp=True)
    # the kernels of the stack that measured it (cost_models/stacks; none: the profiles')
    profile = stack_profile_or_default(stack, None, fabric.gpu.name)
    return build_cost_model(run.model_spec, training, fabric, profile=profile,
                            options=options)


def memory_saving_candidates(run: PublishedRun) -> list[tuple[TrainingSpec, Layout, str]]:
    """The run's setup, then ever heavier memory savings the source leaves unstated.

    Sources often omit activation recompute and the data-parallel sharding
    (a blank cell means "not stated").  A run that was measured did fit, so
    when the stated setup does not fit, the lightest unstated saving that does
    is the best reading: recompute none -> selective -> full (only if the row
    does not state it), then fully sharded data parallelism (unless stated).
    """
    base = training_spec(run)
    setup = load_run_setups().get(run.id)
    recompute_stated = not any(a.startswith("recompute not stated") for a in run.assumptions)
    if setup is not None and setup.recompute is not None:
        # The public recipe says what ran: no guessing.
        recompute_stated = True
        run = replace(run, layout=replace(run.layout, recompute=setup.recompute))
        base = replace(base, recompute_modes=(setup.recompute,))
    modes = [run.layout.recompute] if recompute_stated else ["none", "selective", "full"]
    fsdp_stated = (base.fsdp or (setup is not None and setup.fsdp is not None)
                   or run.source_tag in _DP_SHARDING_STATED)
    if setup is not None and setup.fsdp is not None:
        base = replace(base, fsdp=setup.fsdp)
    fsdp_options = [base.fsdp] if fsdp_stated else [False, True]
    out = []
    for fsdp in fsdp_options:
        for mode in modes:
            layout = replace(run.layout, recompute=mode)
            training = replace(base, recompute_modes=(mode,), fsdp=fsdp)
            notes = [f"assumed recompute={mode}"] if mode != run.layout.recompute else []
            notes += ["assumed FSDP"] if fsdp and not base.fsdp else []
            out.append((training, layout, "; ".join(notes)))
    return out


@dataclass(frozen=True)
class Reading:
    """How a run is read: its training setup and layout (with any assumed savings)."""

    training: TrainingSpec
    layout: Layout
    note: str
    estimate: Estimate


def best_reading(run: PublishedRun, fabric: Fabric, options: CostOptions) -> Reading:
    """The first memory-saving reading that fits (else the stated one), with its estimate."""
    first: Reading | None = None
    for training, layout, note in memory_saving_candidates(run):
        est = estimate(run_cost_model(run, fabric, options, training), layout)
        reading = Reading(training, layout, note, est)
        if first is None:
            first = reading
        if est.fits:
            return reading
    assert first is not None
    return first


def validate_runs(
    runs: Iterable[PublishedRun],
    *,
    options: CostOptions | None = None,
    deduplicate: bool = True,
    include_partial: bool = False,
) -> ValidationReport:
    """Predict every usable run and compare with its measurement.

    ``deduplicate`` keeps the latest release's measurement of each (model, GPU,
    precision, layout, batch, sequence): NVIDIA's tables repeat layouts across
    container releases whose throughput differs by up to 1.5x (data README); and it
    scores the rows of release lines a newer one superseded (``current_releases``)
    apart, in ``superseded``, as the calibration sets them aside.
    """
    # A published run did run: judge its memory against the whole HBM, not the safety
    # margin a recommendation keeps.
    options = replace(options or CostOptions(), memory_margin=0.0)
    all_runs = list(runs)
    usable = [
        r for r in all_runs
        if r.skip_reason is None and r.measured_tokens_per_s_per_gpu
        and r.model_spec is not None and r.cluster is not None
        and (r.verified == "yes" or (include_partial and r.verified == "partial"))
    ]
    if not include_partial:
        usable = dev_rows(usable)
    older: list[PublishedRun] = []
    if deduplicate:
        usable = dedupe(usable)
        current = {id(run) for run in current_releases(usable)}
        older = [run for run in usable if id(run) not in current]
        usable = [run for run in usable if id(run) in current]
    kept = {r.id for r in usable} | {r.id for r in older}
    skipped = [(r.id, r.skip_reason or _why_unusable(r)) for r in all_runs if r.id not in kept]
    fabrics: dict[tuple[str, int], Fabric] = {}
    rows = _score_all(usable, fabrics, options, skipped)
    superseded = _score_all(older, fabrics, options, skipped)
    # Rank agreement is judged on one measurement per layout (the latest release):
    # repeated measurements of one layout across software releases differ by up to
    # 1.5x and would only add ties that no layout model can order.  The superseded
    # release lines are ranked too: their layouts competed within their own release.
    latest = {run.id for run in dedupe([*usable, *older])}
    ranked = [row for row in [*rows, *superseded] if row.id in latest]
    return ValidationReport(tuple(rows), tuple(skipped), _group_correlations(ranked),
                            tuple(superseded))


def _score_all(runs: list[PublishedRun], fabrics: dict[tuple[str, int], Fabric],
               options: CostOptions, skipped: list[tuple[str, str]]) -> list[ValidationRow]:
    """The scored rows of ``runs``; the unscorable ones go to ``skipped`` with the reason."""
    rows = []
    for run in runs:
        scored = _score(run, fabrics, options)
        if isinstance(scored, str):
            skipped.append((run.id, scored))
        else:
            rows.append(scored)
    return rows


def _score(run: PublishedRun, fabrics: dict[tuple[str, int], Fabric],
           options: CostOptions) -> ValidationRow | str:
    """One run's prediction against its measurement, or why it cannot be scored."""
    assert run.model_spec is not None and run.cluster is not None
    training = training_spec(run)
    violations = check_layout(run.model_spec, training, run.layout)
    if violations:
        return f"layout breaks {violations[0].rule}"
    try:
        fabric = fabric_for(fabrics, run.cluster, run.num_gpus)
        reading = best_reading(run, fabric, options)
    except ParsearchError as error:
        return f"cannot score: {error}"
    est, measured = reading.estimate, float(run.measured_tokens_per_s_per_gpu or 0.0)
    return ValidationRow(
        id=run.id, model=run.model, gpu=run.gpu, num_gpus=run.num_gpus,
        layout_key=run.layout.key(), precision=run.precision_raw,
        predicted_tokens_per_s_per_gpu=est.tokens_per_s_per_gpu,
        measured_tokens_per_s_per_gpu=measured,
        ape=abs(est.tokens_per_s_per_gpu - measured) / measured,
        fits=est.fits, memory_gib=est.memory_bytes["total"] / 2**30,
        bottleneck=est.bottleneck, source=run.source_tag, assumed=reading.note,
    )


def _why_unusable(run: PublishedRun) -> str:
    if run.verified != "yes":
        return f"verified={run.verified}"
    if not run.measured_tokens_per_s_per_gpu:
        return "no measurement"
    if run.model_spec is None:
        return "no architecture"
    if run.cluster is None:
        return f"no cluster preset for GPU {run.gpu}"
    if run.release is None:  # a paper or benchmark file lists the layout twice
        return ("duplicate layout (the source lists the same model, GPU, precision, layout, "
                "batch and sequence again; its first row is scored)")
    return "duplicate layout (older release)"


def _group_correlations(rows: list[ValidationRow]) -> tuple[GroupCorrelation, ...]:
    groups: dict[tuple[str, str], list[ValidationRow]] = defaultdict(list)
    for row in rows:
        groups[(base_model(row.model), row.gpu)].append(row)
    out = []
    for (model, gpu), members in sorted(groups.items()):
        measured = [r.measured_tokens_per_s_per_gpu for r in members]
        predicted = [r.predicted_tokens_per_s_per_gpu for r in members]
        if len(members) < 3 or len(set(measured)) < 2:
            continue
        if len(set(predicted)) < 2:  # rank correlation undefined: report it as such
            out.append(GroupCorrelation(model, gpu, len(members), math.nan))
            continue
        rho = spearmanr(predicted, measured).statistic
        out.append(GroupCorrelation(model, gpu, len(members), float(rho)))
    return tuple(out)


