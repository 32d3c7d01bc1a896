"""The analytic cost model: step time, its breakdown and memory, for many layouts at once.

:func:`score_columns` works on numpy columns of layouts (a
:class:`~parsearch.space.LayoutTable`'s ``columns``); :func:`estimate` scores
one :class:`Layout` by calling the same code on one-row columns, so the two
can never disagree.

Per micro-batch, a pipeline stage's time is linear in what it holds: dense
layers, MoE layers, MTP layers, the embedding and the output layer.  Each of
these "units" is priced once per layout (compute and exposed TP/CP/EP
traffic), and a stage's time is the dot product of its unit counts with those
prices (:mod:`parsearch.cost.stages` gives the counts).  The schedule
(:mod:`parsearch.cost.schedule`) turns stage times into a step time; data
parallel gradient and parameter traffic and the optimizer step are added per
stage, and the slowest stage sets the pace.

Sources of the formulas: FLOPs :mod:`parsearch.cost.flops`; collectives
:mod:`parsearch.cost.collectives`; the communication volumes per layer are
formulas.md §7.2 (TP/SP), §7.3 (CP), §7.4 (PP), §7.5 (EP/ETP), §7.6 (DP) and
the overlap assumptions §6.3.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from parsearch.constraints import RECOMPUTE_CODES
from parsearch.cost.collectives import (
    LinkArrays,
    all_gather_time,
    all_reduce_time,
    p2p_time,
    reduce_scatter_time,
    token_dispatch_time,
)
from parsearch.cost.efficiency import EfficiencyProfile, efficiency_for_gpu
from parsearch.cost.flops import model_flops_per_token, stage_flops_core
from parsearch.cost.memory import MemoryOptions, memory_arrays
from parsearch.cost.schedule import pipeline_time
from parsearch.cost.stages import StageContent, rows_by_split, stage_contents
from parsearch.errors import SpecError
from parsearch.hardware import GpuProfile
from parsearch.layout import Layout
from parsearch.params import parameter_counts
from parsearch.placement import group_strides
from parsearch.topology.fabric import Fabric
from parsearch.workload import ModelSpec, TrainingSpec

GIB = float(2**30)
ACT_BYTES = 2.0  # bf16 activations and activation gradients on the wire
TIME_KEYS: tuple[str, ...] = (
    "compute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "pp_bubble", "dp_comm", "optimizer",
)
MEMORY_KEYS: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "other",
                                "total")
# Units a stage holds, in this order (the columns of a stage's feature row).
UNITS: tuple[str, ...] = ("dense", "moe", "mtp", "embedding", "output")
# Bytes the optimizer step reads and writes per (sharded) parameter: fp32 grad (4),
# master weight, Adam m and v read and written (3 x 4 x 2), bf16 weight written (2).
# Formulas.md §5.1 state sizes; the read/write count is ours.
OPTIMIZER_STEP_BYTES = 30.0


@dataclass(frozen=True)
class CostOptions:
    """Knobs of the time model that neither the training spec nor the profile carry.

    ``None`` means "take it from the efficiency profile".  ``grad_reduce_bytes``
    is the element size of the data-parallel gradient reduction (4: fp32,
    Megatron's ``accumulate_allreduce_grads_in_fp32``; 2: bf16 reduce);
    ``fp8_dispatch`` sends EP dispatch in FP8 when training in FP8
    (formulas.md §7.5/§7.7).  ``moe_dispatcher`` is ``"flex"`` (DeepEP/HybridEP:
    one network copy per remote domain, what NVIDIA's MoE recipes run) or
    ``"alltoall"`` (Megatron-Core's default: one copy per expert).
    ``memory_margin`` is the share of HBM a layout must leave free to count as
    fitting (allocator fragmentation and buffers not modelled; default 0).
    """

    def __post_init__(self) -> None:
        if not 0.0 <= self.memory_margin < 1.0:
            raise SpecError(
                f"memory_margin must be in [0, 1): the share of HBM kept free, got "
                f"{self.memory_margin!r}"
            )
        if self.moe_dispatcher not in ("flex", "alltoall"):
            raise SpecError(
                f"moe_dispatcher must be flex or alltoall, got {self.moe_dispatcher!r}"
            )

    causal: bool = True
    tp_overlap: float | None = None
    ep_overlap: float | None = None
    pp_overlap: float | None = None
    moe_imbalance: float | None = None
    grad_reduce_bytes: float = 4.0
    param_gather_bytes: float = 2.0
    fp8_dispatch: bool = False
    moe_dispatcher: str = "flex"
    memory_margin: float = 0.0
    memory: MemoryOptions = field(default_factory=MemoryOptions)

    def resolved(self, profile: EfficiencyProfile) -> CostOptions:
        """The options with every ``None`` filled in from ``profile``."""
        return replace(
            self,
            tp_overlap=profile.tp_overlap if self.tp_overlap is None else self.tp_overlap,
            ep_overlap=profile.ep_overlap if self.ep_overlap is None else self.ep_overlap,
            pp_overlap=profile.pp_overlap if self.pp_overlap is None else self.pp_overlap,
            moe_imbalance=(
                profile.moe_imbalance if self.moe_imbalance is None else self.moe_imbalance
            ),
        )


@dataclass(frozen=True)
class CostModel:
    """Everything the scorer needs besides the layouts: workload, fabric, profile, options."""

    model: ModelSpec
    training: TrainingSpec
    fabric: Fabric
    profile: EfficiencyProfile
    options: CostOptions


def build_cost_model(
    model: ModelSpec,
    training: TrainingSpec,
    fabric: Fabric,
    *,
    profile: EfficiencyProfile | None = None,
    options: CostOptions | None = None,
) -> CostModel:
    """Bundle the inputs; checks that the GPU can run the requested precision."""
    profile = profile or efficiency_for_gpu(fabric.gpu.name)
    if training.precision not in fabric.gpu.peak_flops:
        have = ", ".join(sorted(fabric.gpu.peak_flops))
        raise SpecError(
            f"precision {training.precision} is not supported by {fabric.gpu.name} "
            f"(cluster {fabric.cluster.name}); it supports {have}"
        )
    options = (options or CostOptions()).resolved(profile)
    if training.precision == "bf16" and options.memory.fp8_param_gather:
        raise SpecError("fp8 parameter gather needs --precision fp8 or fp4")
    return CostModel(model, training, fabric, profile, options)


def usable_memory_bytes(gpu: GpuProfile, options: CostOptions | None) -> float:
    """HBM a layout may fill: capacity less the requested safety margin."""
    margin = options.memory_margin if options is not None else 0.0
    return gpu.hbm_bytes * (1.0 - margin)


# --- unit prices -------------------------------------------------------------------------


def _unit_content(model: ModelSpec, unit: str) -> StageContent:
    last_is_moe = model.is_moe_layer(model.num_layers - 1)
    return StageContent(
        rank=0, pp=1, vpp=1, chunk_layer_indices=((),),
        num_dense_layers=int(unit == "dense"),
        num_moe_layers=int(unit == "moe"),
        has_embedding=unit == "embedding",
        has_output=unit == "output",
        num_mtp_layers=int(unit == "mtp"),
        mtp_is_moe=last_is_moe,
    )


def _gemm_efficiency(profile: EfficiencyProfile, precision: str, flops_per_call: Any) -> Any:
    """eta(F) = eta_max * F / (F + F_half): small GEMMs reach less of the peak.

    A smooth version of Calculon's size-stepped matrix efficiency
    (``systems/h100_80g_nvl8.json``: 0.95 >= 128 GFLOP, 0.9 >= 16, 0.6 >= 1).
    """
    f = np.maximum(np.asarray(flops_per_call, dtype=np.float64), 1.0)
    return profile.gemm_max_efficiency[precision] * f / (f + profile.gemm_half_flops)


@dataclass(frozen=True)
class _Links:
    tp: LinkArrays
    cp: LinkArrays
    dp: LinkArrays
    ep: LinkArrays
    etp: LinkArrays
    edp: LinkArrays
    pp: LinkArrays


def _links(fabric: Fabric, cols: dict[str, np.ndarray]) -> _Links:
    strides = group_strides(cols["tp"], cols["cp"], cols["pp"], cols["ep"], cols["etp"],
                            fabric.num_gpus)
    nvlink_latency = fabric.cluster.nvlink_latency_s
    out = {}
    for kind, (stride, size) in strides.items():
        stride_a, size_a = np.broadcast_arrays(np.asarray(stride), np.asarray(size))
        links = fabric.group_links(stride_a, size_a)
        out[kind] = LinkArrays.from_group_links(links, nvlink_latency, links["latency_s"])
    return _Links(**out)


def _unit_prices(cm: CostModel, cols: dict[str, np.ndarray], links: _Links,
                 unit: str) -> dict[str, np.ndarray]:
    """Per-micro-batch seconds of one unit on one GPU: compute and exposed comm."""
    model, training, profile, opt = cm.model, cm.training, cm.profile, cm.options
    gpu = cm.fabric.gpu
    tp, cp, ep, etp, mbs = (cols[k].astype(np.float64) for k in ("tp", "cp", "ep", "etp", "mbs"))
    sp = cols["sp"].astype(bool)
    code = cols["recompute"]
    s, h = training.seq_len, model.hidden_size
    flops = stage_flops_core(model, s, _unit_content(model, unit), tp=tp, cp=cp, ep=ep,
                             etp=etp, mbs=mbs, recompute_code=code, causal=opt.causal)
    precision = training.precision
    peak = gpu.peak_flops[precision]
    peak_bf16 = gpu.peak_flops["bf16"]
    imbalance = float(opt.moe_imbalance or 1.0)
    # Compute, forward pass (FLOPs / (peak * efficiency)); backward = 2x forward (NAR21).
    gemm_calls = 4.0  # QKV, attention output, FC1, FC2 per layer
    t_gemm = flops.dense_gemm_flops / (
        peak * _gemm_efficiency(profile, precision, flops.dense_gemm_flops / gemm_calls))
    local_experts = np.maximum(np.asarray(flops.gemm.local_experts, dtype=np.float64), 1.0)
    expert_call = flops.routed_expert_flops / (2.0 * local_experts)
    t_routed = imbalance * flops.routed_expert_flops / (
        peak * _gemm_efficiency(profile, precision, expert_call) * profile.grouped_gemm_factor)
    # Flash attention reaches less of the peak on short blocks; with CP each rank works
    # on blocks of s/cp tokens (the ring of Megatron-Core's p2p context parallelism).
    block = s / cp
    attention_eff = profile.attention_efficiency * block / (block + profile.attention_half_block)
    t_core = flops.core_attention_flops / (peak_bf16 * attention_eff)
    # The output layer stays BF16 by default (MCORE transformer_config fp8_output_proj).
    t_logits = flops.logits_flops / (
        peak_bf16 * _gemm_efficiency(profile, "bf16", flops.logits_flops))
    layer_forward = t_gemm + t_routed + t_core
    recompute = np.where(code == RECOMPUTE_CODES["full"], layer_forward,
                         np.where(code == RECOMPUTE_CODES["selective"], t_core, 0.0))
    # Non-GEMM kernels are HBM-bound: bytes / (bandwidth * efficiency).
    hbm = gpu.hbm_bandwidth_Bps * profile.hbm_efficiency
    layers = 1.0 if unit in ("dense", "moe", "mtp") else 0.0
    tokens_rank = mbs * s / (cp * np.where(sp, tp, 1.0))
    elementwise = layers * profile.elementwise_bytes_per_hidden * h * tokens_rank / hbm
    is_moe_unit = unit == "moe" or (unit == "mtp" and model.is_moe_layer(model.num_layers - 1))
    moe = model.moe
    routed_tokens = mbs * s / (tp * cp) * (moe.top_k if moe else 0)  # formulas.md §3.5
    if is_moe_unit:
        elementwise = elementwise + profile.moe_bytes_per_hidden * h * routed_tokens / hbm
    if precision != "bf16":  # formulas.md §7.7: quantize/transpose/amax kernels
        elementwise = elementwise + (
            layers * profile.quantize_bytes_per_hidden * h * tokens_rank / hbm)
    compute = 3.0 * (t_gemm + t_routed + t_core + t_logits) + recompute + elementwise
    compute = compute + layers * profile.layer_overhead_s

    # TP/SP (formulas.md §7.2): per block (attention or MLP) 2 collectives forward and 2
    # backward of b*(s/c)*h elements (all-reduce = RS + AG), plus with SP one more
    # all-gather in backward to rebuild the GEMM input for wgrad.  Full recompute
    # re-runs the forward pair.
    tp_bytes = mbs * (s / cp) * h * ACT_BYTES
    per_block = np.where(sp, 5.0, 4.0) + np.where(code == RECOMPUTE_CODES["full"], 2.0, 0.0)
    if unit == "dense" or (unit == "mtp" and not is_moe_unit):
        blocks = 2.0
    elif unit in ("moe", "mtp"):
        blocks = 1.0 + (1.0 if moe and moe.shared_expert_ffn_hidden_size else 0.0)
    elif unit == "output":
        blocks = 0.6  # AG of the input forward, RS backward (+AG with SP): ~3 of 5
    else:
        blocks = 0.0
    tp_time = blocks * per_block * reduce_scatter_time(links.tp, tp_bytes)
    # TP overlap (Megatron-Core --tp-comm-overlap, Transformer Engine userbuffers) needs
    # sequence parallelism and runs over NVLink only: a TP group that crosses NVLink
    # domains pays its collectives in full.
    tp_in_domain = np.asarray(links.tp.members_per_domain) >= np.asarray(links.tp.size)
    tp_exposed = tp_time * np.where(sp & tp_in_domain, 1.0 - float(opt.tp_overlap or 0.0), 1.0)

    # CP (formulas.md §7.3, p2p ring): ~3(c-1) transfers of this rank's K/V chunk per layer,
    # hidden behind the attention compute of the same layer when it is long enough.
    cp_exposed = np.zeros_like(tp)
    if layers:
        if model.mla is not None:
            kv_width = model.num_attention_heads * (
                model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim + model.mla.v_head_dim)
            kv_rank = kv_width / tp
        else:
            kv_width = 2.0 * model.num_query_groups * model.head_dim
            kv_rank = kv_width / np.minimum(tp, model.num_query_groups)
        kv_bytes = mbs * (s / cp) * kv_rank * ACT_BYTES
        cp_time = 3.0 * (cp - 1.0) * p2p_time(links.cp, kv_bytes)
        cp_exposed = np.maximum(0.0, cp_time - 3.0 * t_core)

    # EP / ETP (formulas.md §7.5): dispatch + combine all-to-all forward and backward of
    # T*k token copies of h elements; with ETP an all-gather / reduce-scatter of them.
    ep_exposed = np.zeros_like(tp)
    if is_moe_unit:
        dispatch_bytes = 1.0 if (opt.fp8_dispatch and precision != "bf16") else ACT_BYTES
        tokens = mbs * s / (tp * cp)  # tokens entering the MoE on this rank (SP layout)
        dedupe = opt.moe_dispatcher == "flex"
        k = moe.top_k if moe else 1
        a2a = (token_dispatch_time(links.ep, tokens, h * dispatch_bytes, k, dedupe)
               + 3.0 * token_dispatch_time(links.ep, tokens, h * ACT_BYTES, k, dedupe))
        etp_time = 4.0 * reduce_scatter_time(links.etp, etp * routed_tokens * h * ACT_BYTES)
        ep_exposed = imbalance * (a2a + etp_time) * (1.0 - float(opt.ep_overlap or 0.0))
    return {"compute": compute, "tp_comm": tp_exposed, "cp_comm": cp_exposed,
            "ep_comm": ep_exposed, "forward": t_gemm + t_routed + t_core + t_logits}


def _unit_params(cm: CostModel, cols: dict[str, np.ndarray]) -> dict[str, tuple[Any, Any]]:
    """(dense-class, expert-class) parameters per GPU of each unit (formulas.md §4, §5.2)."""
    model = cm.model
    pc = parameter_counts(model)
    tp = cols["tp"].astype(np.float64)
    expert_shards = (cols["ep"] * cols["etp"]).astype(np.float64)
    # A tied output layer still needs a copy on the last stage when pp > 1 (MCORE
    # embedding group), so the output unit always holds V*h/tp.
    output = pc.output if pc.output else pc.embedding
    mtp_routed = pc.routed_experts_per_layer if model.is_moe_layer(model.num_layers - 1) else 0
    mtp_routed *= model.mtp_layers
    per_mtp = max(model.mtp_layers, 1)
    return {
        "dense": ((pc.attention_per_layer + pc.dense_mlp_per_layer) / tp
                  + pc.replicated_per_layer_dense, 0.0 * tp),
        "moe": ((pc.attention_per_layer + pc.shared_experts_per_layer) / tp
                + pc.replicated_per_layer_moe, pc.routed_experts_per_layer / expert_shards),
        "mtp": ((pc.mtp - mtp_routed) / per_mtp / tp, mtp_routed / per_mtp / expert_shards),
        "embedding": (pc.embedding / tp, 0.0 * tp),
        "output": (output / tp + pc.final_norm, 0.0 * tp),
    }


def _stage_features(model: ModelSpec, pp: int, vpp: int, split: str) -> np.ndarray:
    """Unit counts per pipeline rank: shape (pp, len(UNITS))."""
    rows = []
    for c in stage_contents(model, pp, vpp, split):
        rows.append((c.num_dense_layers, c.num_moe_layers, c.num_mtp_layers,
                     float(c.has_embedding), float(c.has_output)))
    return np.asarray(rows, dtype=np.float64)


# --- scoring -------------------------------------------------------------------------------


def score_columns(cm: CostModel, cols: dict[str, np.ndarray], *,
                  with_memory: bool = True) -> dict[str, np.ndarray]:
    """Score every layout given as columns (``tp pp cp ep etp vpp mbs sp recompute dp edp``).

    Returns arrays: ``step_time_s``, ``tokens_per_s``, ``tokens_per_s_per_gpu``,
    ``model_tflops_per_gpu``, ``mfu``, ``fits``, ``time_<key>`` for each of
    :data:`TIME_KEYS`, ``mem_<key>`` for each of :data:`MEMORY_KEYS` (bytes),
    ``capacity_bytes``, ``slowest_stage``, ``peak_memory_stage``.
    ``with_memory=False`` skips the memory model (time only).
    """
    model, training, fabric = cm.model, cm.training, cm.fabric
    n = len(cols["tp"])
    cols = {k: np.asarray(v) for k, v in cols.items()}
    if "m" not in cols:
        cols["m"] = training.global_batch // (cols["mbs"] * cols["dp"])
    links = _links(fabric, cols)
    prices = {unit: _unit_prices(cm, cols, links, unit) for unit in UNITS}
    params = _unit_params(cm, cols)
    # PP p2p (formulas.md §7.4): one activation forward and one gradient backward per
    # micro-batch and model chunk, b*(s/c)*h (/tp with SP) elements.
    tp_f, cp_f = cols["tp"].astype(np.float64), cols["cp"].astype(np.float64)
    pp_bytes = (cols["mbs"] * training.seq_len / cp_f * model.hidden_size * ACT_BYTES
                / np.where(cols["sp"], tp_f, 1.0))
    pp_time = (2.0 * cols["vpp"] * p2p_time(links.pp, pp_bytes)
               * (1.0 - float(cm.options.pp_overlap or 0.0)))

    out = {f"time_{k}": np.zeros(n) for k in TIME_KEYS}
    slowest_stage = np.zeros(n, dtype=np.int64)
    for pp, vpp, idx in rows_by_split(cols["pp"], cols["vpp"]):
        feats = _stage_features(model, pp, vpp, training.pipeline_split)
        _score_group(cm, cols, idx, feats, prices, params, pp_time, links, out, slowest_stage)
    step = sum(out[f"time_{k}"] for k in TIME_KEYS)
    tokens = float(training.global_batch * training.seq_len)
    tokens_per_s = tokens / step
    flops_per_token = model_flops_per_token(model, training.seq_len, cm.options.causal)
    model_flops = flops_per_token.model_flops * tokens_per_s / fabric.num_gpus
    capacity = fabric.gpu.hbm_bytes
    if with_memory:
        mem = memory_arrays(model, training, cols["tp"], cols["cp"], cols["pp"], cols["ep"],
                            cols["etp"], cols["vpp"], cols["mbs"], cols["dp"], cols["edp"],
                            cols["recompute"], cols["sp"], cm.options.memory)
        out.update({f"mem_{k}": np.asarray(getattr(mem, k), dtype=np.float64)
                    for k in MEMORY_KEYS})
        peak_stage = np.asarray(mem.peak_stage)
    else:  # time only (calibration): memory reported as NaN, "fits" as True
        out.update({f"mem_{k}": np.full(n, np.nan) for k in MEMORY_KEYS})
        peak_stage = np.zeros(n, dtype=np.int64)
    out.update(
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / fabric.num_gpus,
        model_tflops_per_gpu=model_flops / 1e12,
        mfu=model_flops / fabric.gpu.peak_flops["bf16"],
        fits=(out["mem_total"] <= usable_memory_bytes(fabric.gpu, cm.options)
              if with_memory else np.ones(n, dtype=bool)),
        capacity_bytes=np.full(n, capacity),
        slowest_stage=slowest_stage,
        peak_memory_stage=peak_stage,
    )
    return out


def _score_group(cm: CostModel, cols: dict[str, np.ndarray], idx: np.ndarray,
                 feats: np.ndarray, prices: dict[str, dict[str, np.ndarray]],
                 params: dict[str, tuple[Any, Any]], pp_time: np.ndarray, links: _Links,
                 out: dict[str, np.ndarray], slowest_stage: np.ndarray) -> None:
    """Fill the time breakdown of the rows ``idx`` that share one (pp, vpp) split."""
    def per_stage(component: str) -> np.ndarray:  # (rows, pp)
        coef = np.stack([np.broadcast_to(prices[u][component], cols["tp"].shape)[idx]
                         for u in UNITS], axis=1)
        return coef @ feats.T

    parts = {k: per_stage(k) for k in ("compute", "tp_comm", "cp_comm", "ep_comm")}
    p2p = pp_time[idx][:, None] * np.ones((1, feats.shape[0]))
    stage_time = sum(parts.values()) + p2p
    m = cols["m"][idx].astype(np.float64)
    _busy, bubble = pipeline_time(stage_time, m, cols["vpp"][idx])
    worst = np.argmax(stage_time, axis=1)
    rows = np.arange(len(idx))
    for key, values in parts.items():
        out[f"time_{key}"][idx] = m * values[rows, worst]
    out["time_pp_p2p"][idx] = m * p2p[rows, worst]
    out["time_pp_bubble"][idx] = bubble
    slowest_stage[idx] = worst
    dp_exposed, optimizer = _data_parallel(cm, cols, idx, feats, params, parts, links)
    out["time_dp_comm"][idx] = dp_exposed
    out["time_optimizer"][idx] = optimizer


def _data_parallel(cm: CostModel, cols: dict[str, np.ndarray], idx: np.ndarray,
                   feats: np.ndarray, params: dict[str, tuple[Any, Any]],
                   parts: dict[str, np.ndarray], links: _Links) -> tuple[np.ndarray, np.ndarray]:
    """Exposed DP traffic and optimizer time of the stage where they are largest.

    Distributed optimizer (formulas.md §7.6): reduce-scatter of gradients and
    all-gather of parameters over DP*CP (dense) and EDP (experts); without it an
    all-reduce of gradients.  Overlap (§6.3): the gradient reduction runs during
    the last micro-batch's backward, the parameter gather during the first
    forward; only what sticks out is exposed.
    """
    opt, training = cm.options, cm.training

    def stage_params(cls: int) -> np.ndarray:
        coef = np.stack([np.broadcast_to(np.asarray(params[u][cls], dtype=np.float64),
                                         cols["tp"].shape)[idx] for u in UNITS], axis=1)
        return coef @ feats.T  # (rows, pp)

    dense, expert = stage_params(0), stage_params(1)

    def sub(link: LinkArrays) -> LinkArrays:
        return LinkArrays(*(np.asarray(getattr(link, f))[idx][:, None]
                            if np.ndim(getattr(link, f)) else getattr(link, f)
                            for f in ("size", "members_per_domain", "nvlink_bandwidth_Bps",
                                      "network_bandwidth_Bps", "nvlink_latency_s",
                                      "network_latency_s")))

    dp_link, edp_link = sub(links.dp), sub(links.edp)
    grad = opt.grad_reduce_bytes
    compute = parts["compute"]  # per micro-batch, per stage: fwd + bwd (+ recompute)
    if training.fsdp:
        # ZeRO-3 / Megatron-FSDP (formulas.md §7.6; ZeRO §7: 3 Psi): every micro-batch
        # all-gathers the parameters for forward and again for backward and
        # reduce-scatters its gradients; prefetching hides them behind that
        # micro-batch's compute.
        gather = (all_gather_time(dp_link, dense * opt.param_gather_bytes)
                  + all_gather_time(edp_link, expert * opt.param_gather_bytes))
        reduce = (reduce_scatter_time(dp_link, dense * grad)
                  + reduce_scatter_time(edp_link, expert * grad))
        m = cols["m"][idx][:, None].astype(np.float64)
        exposed = m * np.maximum(0.0, 2.0 * gather + reduce - compute)
    elif training.distributed_optimizer:
        reduce = (reduce_scatter_time(dp_link, dense * grad)
                  + reduce_scatter_time(edp_link, expert * grad))
        gather = (all_gather_time(dp_link, dense * opt.param_gather_bytes)
                  + all_gather_time(edp_link, expert * opt.param_gather_bytes))
    else:
        reduce = all_reduce_time(dp_link, dense * grad) + all_reduce_time(edp_link, expert * grad)
        gather = np.zeros_like(reduce)
    if not training.fsdp:
        exposed = np.maximum(0.0, reduce - compute * (2.0 / 3.0)) + np.maximum(
            0.0, gather - compute / 3.0)
    shards_dense = (cols["dp"] * cols["cp"])[idx][:, None].astype(np.float64)
    shards_expert = cols["edp"][idx][:, None].astype(np.float64)
    if not (training.distributed_optimizer or training.fsdp):
        shards_dense = shards_expert = np.ones_like(shards_dense)
    hbm = cm.fabric.gpu.hbm_bandwidth_Bps * cm.profile.hbm_efficiency
    optimizer = (dense / shards_dense + expert / shards_expert) * OPTIMIZER_STEP_BYTES / hbm
    total = exposed + optimizer
    worst = np.argmax(total, axis=1)
    rows = np.arange(len(idx))
    return exposed[rows, worst], optimizer[rows, worst] + cm.profile.step_overhead_s


# --- one layout ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """Predicted time and memory of one layout (the ``explain`` JSON of the CLI contract)."""

    layout: Layout
    is_moe: bool
    fits: bool
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    memory_bytes: dict[str, float]
    capacity_bytes: float
    time_s: dict[str, float]
    slowest_stage: int
    peak_memory_stage: int

    @property
    def bottleneck(self) -> str:
        """The largest exposed time component (``compute`` when nothing else dominates)."""
        return max(self.time_s, key=lambda k: self.time_s[k])

    def to_dict(self) -> dict[str, Any]:
        memory = {k: self.memory_bytes[k] / GIB for k in MEMORY_KEYS}
        memory["capacity"] = self.capacity_bytes / GIB
        return {
            "layout": self.layout.to_dict(moe=self.is_moe),
            "num_gpus": self.layout.num_gpus,
            "fits": self.fits,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "memory_gib_per_gpu": memory,
            "time_s": dict(self.time_s),
        }


def layout_columns(layouts: list[Layout]) -> dict[str, np.ndarray]:
    """Columns for :func:`score_columns` from a list of layouts (same GPU count)."""
    cols: dict[str, np.ndarray] = {}
    for name in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "dp", "edp"):
        cols[name] = np.asarray([getattr(x, name) for x in layouts], dtype=np.int64)
    cols["sp"] = np.asarray([x.sp for x in layouts], dtype=bool)
    cols["recompute"] = np.asarray([RECOMPUTE_CODES[x.recompute] for x in layouts])
    return cols


def estimate_from_row(cm: CostModel, scores: dict[str, np.ndarray], i: int,
                      layout: Layout) -> Estimate:
    """Row ``i`` of :func:`score_columns` output as an :class:`Estimate`."""
    return Estimate(
        layout=layout,
        is_moe=cm.model.is_moe,
        fits=bool(scores["fits"][i]),
        step_time_s=float(scores["step_time_s"][i]),
        tokens_per_s=float(scores["tokens_per_s"][i]),
        tokens_per_s_per_gpu=float(scores["tokens_per_s_per_gpu"][i]),
        model_tflops_per_gpu=float(scores["model_tflops_per_gpu"][i]),
        mfu=float(scores["mfu"][i]),
        memory_bytes={k: float(scores[f"mem_{k}"][i]) for k in MEMORY_KEYS},
        capacity_bytes=float(scores["capacity_bytes"][i]),
        time_s={k: float(scores[f"time_{k}"][i]) for k in TIME_KEYS},
        slowest_stage=int(scores["slowest_stage"][i]),
        peak_memory_stage=int(scores["peak_memory_stage"][i]),
    )


def estimate(cm: CostModel, layout: Layout) -> Estimate:
    """Score one layout (it must be valid: run :func:`parsearch.constraints.check_layout`)."""
    if layout.num_gpus != cm.fabric.num_gpus:
        raise SpecError(
            f"layout is for {layout.num_gpus} GPUs but the fabric has {cm.fabric.num_gpus}"
        )
    scores = score_columns(cm, layout_columns([layout]))
    return estimate_from_row(cm, scores, 0, layout)
