"""The analytic cost model: step time, its breakdown and memory, for many layouts at once.

:func:`score_columns` works on numpy columns of layouts (a
:class:`~parsearch.layout.space.LayoutTable`'s ``columns``); :func:`estimate` scores
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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from parsearch.cost.collectives import LinkArrays
from parsearch.cost.compute import ACT_BYTES, is_moe_unit
from parsearch.cost.cost_model import CostModel
from parsearch.cost.efficiency import EfficiencyProfile, band_for, efficiency_for_gpu
from parsearch.cost.ep_overlap import a2a_schedulable
from parsearch.cost.feature_search import (
    cheapest_unit_prices,
    feature_variants,
    score_fitting_variants,
    score_graph_levels,
    searches_graphs,
    with_schedule_memory,
)
from parsearch.cost.fused_mlp import fused_mlp_runnable
from parsearch.cost.memory import memory_arrays
from parsearch.cost.memory_features import (
    apply_setting,
    effective_training,
    optimizer_step_bytes,
    score_memory_features,
    searches_memory_features,
    setting_of,
)
from parsearch.cost.offload import host_memory_fits
from parsearch.cost.offload_choice import choose_offload
from parsearch.cost.option_checks import check_precision_options
from parsearch.cost.options import DEFAULT_MEMORY_MARGIN, MOE_DISPATCHERS, CostOptions
from parsearch.cost.recompute import recompute_shares
from parsearch.cost.stage_time import (
    StageSettings,
    score_split,
    stage_coefficients,
)
from parsearch.cost.stages import effective_split, rows_by_split
from parsearch.cost.token_flops import model_flops_per_token
from parsearch.cost.unit_prices import (
    pp_send_time,
    process_groups,
    stage_features,
    unit_params,
    unit_prices,
)
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.layout.rules import RECOMPUTE_CODES
from parsearch.model.offload_modules import EXPERT_OFFLOAD_MODULES
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.fabric import Fabric
from parsearch.topology.hardware import GpuProfile

__all__ = [
    "MOE_DISPATCHERS",
    "TIME_KEYS",
    "UNITS",
    "CostModel",
    "CostOptions",
    "Estimate",
    "build_cost_model",
    "estimate",
    "group_rows",
    "layout_columns",
    "process_groups",
    "score_columns",
    "stage_features",
    "wide_columns",
]

GIB = float(2**30)
TIME_KEYS: tuple[str, ...] = (
    "compute", "memory_bound", "overhead", "tp_comm", "cp_comm", "ep_comm", "offload",
    "pp_p2p", "pp_bubble", "stage_imbalance", "dp_comm", "optimizer",
)
MEMORY_KEYS: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "other",
                                "total")
# Units a stage holds, in this order (the columns of a stage's feature row).
UNITS: tuple[str, ...] = ("dense", "moe", "mtp", "embedding", "output")


def scaled_network(link: LinkArrays, factor: float) -> LinkArrays:
    """``link`` with its inter-node bandwidth times ``factor`` (the same object for 1)."""
    if factor == 1.0:
        return link
    return replace(link, network_bandwidth_Bps=link.network_bandwidth_Bps * factor)


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
    options = (options or CostOptions()).resolved(profile)
    if "fused_expert_mlp" in options.search_features:
        # it only removes work: on wherever the job runs it (parsearch.cost.fused_mlp)
        options = replace(options, fused_expert_mlp=fused_mlp_runnable(
            model, training, fabric.gpu.compute_capability, options.fp8_recipe))
    options = check_precision_options(training, fabric.gpu, fabric.cluster.name, profile,
                                      options)
    if model.moe is not None:  # the merged schedule exists for MoE layers only
        options = with_schedule_memory(options)
    experts = sorted(EXPERT_OFFLOAD_MODULES & set(training.offload_modules))
    if experts and model.moe is None:
        raise SpecError(f"offload_modules {', '.join(experts)} offload expert inputs, and "
                        f"{model.name} has no MoE layers: drop them from --offload-modules")
    variants = feature_variants(model, options, fabric.gpu.compute_capability)
    return CostModel(model, training, fabric, profile, options, variants)


def usable_memory_bytes(gpu: GpuProfile, options: CostOptions | None) -> float:
    """HBM a layout may fill: capacity less the requested safety margin."""
    margin = options.memory_margin if options is not None else DEFAULT_MEMORY_MARGIN
    return gpu.hbm_bytes * (1.0 - margin)


# --- scoring -------------------------------------------------------------------------------

def wide_columns(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns as arrays, integers widened to 64 bits (tables may store 32)."""
    out = {}
    for k, v in cols.items():
        a = np.asarray(v)
        out[k] = a.astype(np.int64) if a.dtype.kind in "iu" and a.dtype != np.int64 else a
    return out


#: The columns unit prices, process groups and per-unit parameters depend on.
PRICE_KEY: tuple[str, ...] = ("tp", "cp", "pp", "ep", "etp", "mbs", "sp", "recompute")
#: Also constant per price row (DP shards and micro-batches follow from the degrees and
#: the GPU count), part of the key so that a price row stands for its rows exactly.
_ALSO_KEYED: tuple[str, ...] = ("dp", "edp", "m")


def _price_rows(training: TrainingSpec, cols: dict[str, np.ndarray],
                variants: tuple[CostOptions, ...] = ()
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """``(representatives, position)``: one row per distinct price key, and each row's.

    ``None`` when pricing every row is as cheap (few rows, or keys all distinct).
    The key is :data:`PRICE_KEY`, plus ``vpp`` with ``--recompute-num-layers``
    (which recomputes layers per model chunk), plus whether the schedule can overlap the
    expert all-to-all (no pipeline, or an interleaved one) when a feature set among
    ``variants`` does: which sets a layout may run is part of its price.
    """
    n = len(cols["tp"])
    if n < 256:
        return None
    by_chunk = training.recompute_num_layers is not None or training.activation_offload_layers
    keys = PRICE_KEY + (("vpp",) if by_chunk else ())
    keys += tuple(k for k in _ALSO_KEYED if k in cols)
    if not by_chunk and any(v.moe_a2a_overlap for v in variants):
        # where Megatron runs the all-to-all overlap (pp == 1 or vpp > 1) is part of the price
        cols = {**cols, "a2a_schedulable": a2a_schedulable(cols).astype(np.uint8)}
        keys += ("a2a_schedulable",)
    grouped = group_rows(cols, keys)
    if grouped is None or len(grouped[0]) > n // 2:
        return None
    return grouped


def group_rows(cols: Mapping[str, np.ndarray],
               keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(representatives, position)``: one row per distinct value of the ``keys`` columns
    (non-negative integers), and each row's position among them; ``None`` if the
    values are too large to code."""
    n = len(cols[keys[0]])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    def column(name: str) -> np.ndarray:
        values = np.asarray(cols[name])
        return values.view(np.uint8) if values.dtype == bool else values

    ranks = []
    size = 1
    for name in keys:  # first the radices (small tables), then the codes in one narrow array
        values = column(name)
        top = int(values.max())
        if int(values.min()) < 0 or top > (1 << 22):
            return None
        present = np.zeros(top + 1, dtype=bool)
        present[values] = True
        rank = np.cumsum(present) - 1  # dense rank of each value present
        radix = int(rank[-1]) + 1
        if size * radix > (1 << 40):
            return None
        ranks.append((rank, radix))
        size *= radix
    del values
    code_type = np.int32 if size < 2**31 else np.int64
    code = np.zeros(n, dtype=code_type)
    for name, (rank, radix) in zip(keys, ranks, strict=True):
        code *= radix
        code += rank.astype(code_type)[column(name)]
    if size <= 4 * n:  # dense table of codes
        present = np.zeros(size, dtype=bool)
        present[code] = True
        position = (np.cumsum(present, dtype=np.int32 if size < 2**31 else np.int64) - 1)[code]
        count = int(position.max()) + 1
    else:
        _, position = np.unique(code, return_inverse=True)
        position = position.reshape(-1)
        count = int(position.max()) + 1
    representatives = np.empty(count, dtype=np.int64)
    block = 1 << 20  # in order, so the last row of each group is its representative
    for start in range(0, n, block):
        stop = min(start + block, n)
        representatives[position[start:stop]] = np.arange(start, stop, dtype=np.int64)
    return representatives, position



def score_columns(cm: CostModel, cols: dict[str, np.ndarray], *,
                  with_memory: bool = True) -> dict[str, np.ndarray]:
    """Score every layout given as columns (``tp pp cp ep etp vpp mbs sp recompute dp edp``).

    Returns arrays: ``step_time_s``, ``tokens_per_s``, ``tokens_per_s_per_gpu``,
    ``model_tflops_per_gpu``, ``mfu``, ``fits``, ``time_<key>`` for each of
    :data:`TIME_KEYS`, ``mem_<key>`` for each of :data:`MEMORY_KEYS` (bytes),
    ``capacity_bytes``, ``slowest_stage``, ``peak_memory_stage``.
    ``with_memory=False`` skips the memory model (time only).
    """
    if searches_memory_features(cm):  # recompute modules, BF16 moments, FP8 gather per layout
        return score_memory_features(cm, cols, with_memory, score_columns,
                                     usable_memory_bytes(cm.fabric.gpu, cm.options),
                                     choose_offload)
    training = effective_training(cm.training, cm.options)  # the memory features chosen
    if training is not cm.training:
        cm = replace(cm, training=training)
    if searches_graphs(cm):  # CUDA graphs chosen per layout, then the rest (feature_search.py)
        return score_graph_levels(cm, cols, with_memory, score_columns, memory_scores)
    if cm.variants and with_memory:
        return score_fitting_variants(cm, cols, _score_fastest_features, memory_scores)
    return _score_fastest_features(cm, cols, with_memory=with_memory)


def _score_fastest_features(cm: CostModel, cols: dict[str, np.ndarray], *,
                            with_memory: bool = True) -> dict[str, np.ndarray]:
    """:func:`score_columns`, each layout's MoE units priced with its fastest feature set
    (``cm.variants``; memory under ``cm.options``)."""
    model, training, fabric = cm.model, cm.training, cm.fabric
    n = len(cols["tp"])
    cols = wide_columns(cols)
    if "m" not in cols:
        cols["m"] = training.global_batch // (cols["mbs"] * cols["dp"])
    # Unit prices, groups and parameters depend on the price key only (not on vpp unless
    # partial recompute counts layers per model chunk): they are computed once per
    # distinct key and looked up by each row (the same elementwise arithmetic, so the
    # same numbers as pricing every row).
    # the base options count: a pinned overlap is priced only where the layout runs it
    price_of = _price_rows(training, cols, (cm.options, *cm.variants))
    pcols = cols if price_of is None else {k: v[price_of[0]] for k, v in cols.items()}
    groups = process_groups(fabric, pcols, training.experts_follow_tp)
    shares = recompute_shares(model, training, pcols["recompute"], pp=pcols["pp"],
                              vpp=pcols["vpp"], tp=pcols["tp"], sp=pcols["sp"])
    prices: dict[str, dict[str, np.ndarray]] = {}
    choice = None
    cache: dict[tuple[object, ...], Any] = {}
    for unit in UNITS:
        if cm.variants and is_moe_unit(model, unit):
            prices[unit], choice = cheapest_unit_prices(
                cm, pcols, unit,
                lambda c, u=unit, g=groups: unit_prices(c, pcols, g, u, shares, cache), choice)
        else:
            prices[unit] = unit_prices(cm, pcols, groups, unit, shares)
    params = unit_params(cm, pcols)
    # PP p2p (formulas.md §7.4): one activation forward and one gradient backward per
    # micro-batch and model chunk, b*(s/c)*h (/tp with SP) elements.
    tp_f, cp_f = pcols["tp"].astype(np.float64), pcols["cp"].astype(np.float64)
    pp_bytes = (pcols["mbs"] * training.seq_len / cp_f * model.hidden_size * ACT_BYTES
                / np.where(pcols["sp"], tp_f, 1.0))
    pp_send = np.where(pcols["pp"] > 1, pp_send_time(groups, pp_bytes, pcols, cm.options)
                       + cm.profile.collective_latency_s, 0.0)
    pshape = pcols["tp"].shape
    opt = cm.options
    # Data-parallel collectives cross nodes at the share of line rate NCCL's rings reach
    # on this fabric (the cluster's network_collective_efficiency, nccl-tests busbw), which
    # can sit far below what pipeline sends reach (BigScience's Jean Zay all-reduce: 0.10).
    collective = fabric.cluster.collective_efficiency / fabric.cluster.network_efficiency
    coef = stage_coefficients(
        prices, params, UNITS, pshape, pp_send, scaled_network(groups.dp, collective),
        scaled_network(groups.edp, collective),
        ((pcols["dp"] * pcols["cp"]).astype(np.float64), pcols["edp"].astype(np.float64)),
        grad_bytes=opt.grad_reduce_bytes, gather_bytes=opt.param_gather_bytes,
        distributed_optimizer=training.distributed_optimizer, fsdp=training.fsdp,
        hbm_Bps=fabric.gpu.hbm_bandwidth_Bps * cm.profile.hbm_efficiency,
        optimizer_step_bytes=optimizer_step_bytes(training),
        bucketed=opt.overlap_grad_reduce, fixed_bucket_params=opt.ddp_bucket_params)
    settings = StageSettings(opt.overlap_grad_reduce, opt.overlap_param_gather, training.fsdp,
                             cm.profile.step_overhead_s, cm.profile.comm_sm_share,
                             fsdp_weights_sharded=training.fsdp_shards_weights,
                             megatron_buckets=not opt.apex_distributed_adam,
                             overlap_p2p=opt.pp_p2p_overlap)
    del prices, params, groups
    out = {f"time_{k}": np.zeros(n) for k in TIME_KEYS}
    slowest_stage = np.zeros(n, dtype=np.int64)
    m_all = cols["m"]
    splits = list(rows_by_split(cols["pp"], cols["vpp"]))
    # The mean stage (all units / pp) is shared by every split of a pp: its part times
    # are computed once per distinct mean stage.
    mean_parts: dict[bytes, np.ndarray] = {}
    for pp, vpp, idx in splits:
        feats = stage_features(model, pp, vpp, effective_split(model, training, pp, vpp))
        pidx = idx if price_of is None else price_of[1][idx]
        mean_feats = feats.mean(axis=0)
        mean_key = mean_feats.tobytes()
        if mean_key not in mean_parts:
            mean_parts[mean_key] = coef.mean_stage_parts(mean_feats)
        part = score_split(coef, pidx, feats, vpp, m_all[idx].astype(np.float64), settings,
                           mean_parts[mean_key])
        slowest_stage[idx] = part.pop("slowest_stage")
        for key, values in part.items():
            out[key][idx] = values
    del coef
    if cm.profile.cluster_speed != 1.0:  # a calibrated cluster's speed (efficiency.py)
        for key in TIME_KEYS:
            out[f"time_{key}"] = out[f"time_{key}"] / cm.profile.cluster_speed
    step = sum(out[f"time_{k}"] for k in TIME_KEYS)
    tokens = float(training.global_batch * training.seq_len)
    tokens_per_s = tokens / step
    flops_per_token = model_flops_per_token(model, training.seq_len, cm.options.causal)
    model_flops = flops_per_token.model_flops * tokens_per_s / fabric.num_gpus
    if with_memory:
        out.update(memory_scores(cm, cols, splits=splits, degree_rows=price_of))
    else:  # time only (calibration): memory reported as NaN, "fits" as True
        out.update({f"mem_{k}": np.full(n, np.nan) for k in MEMORY_KEYS})
        out.update(fits=np.ones(n, dtype=bool), peak_memory_stage=np.zeros(n, dtype=np.int64))
    out.update(
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / fabric.num_gpus,
        model_tflops_per_gpu=model_flops / 1e12,
        mfu=model_flops / fabric.gpu.peak_flops["bf16"],
        capacity_bytes=np.full(n, usable_memory_bytes(fabric.gpu, cm.options)),
        slowest_stage=slowest_stage,
    )
    if cm.variants:
        out["feature_variant"] = (np.zeros(n, dtype=np.int64) if choice is None
                                  else choice if price_of is None else choice[price_of[1]])
    return out


def memory_scores(cm: CostModel, cols: dict[str, np.ndarray], *,
                  splits: list[tuple[int, int, np.ndarray]] | None = None,
                  degree_rows: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> dict[str, np.ndarray]:
    """The memory part of :func:`score_columns`' answer under ``cm.options.memory``:
    ``mem_<key>`` for each of :data:`MEMORY_KEYS`, ``fits`` and ``peak_memory_stage``
    (``splits`` and ``degree_rows``: the time pass's row groupings, reused)."""
    cols = wide_columns(cols)
    mem = memory_arrays(cm.model, cm.training, cols["tp"], cols["cp"], cols["pp"], cols["ep"],
                        cols["etp"], cols["vpp"], cols["mbs"], cols["dp"], cols["edp"],
                        cols["recompute"], cols["sp"], cm.options.memory, splits=splits,
                        degree_rows=degree_rows)
    out = {f"mem_{k}": np.asarray(getattr(mem, k), dtype=np.float64) for k in MEMORY_KEYS}
    out["fits"] = out["mem_total"] <= usable_memory_bytes(cm.fabric.gpu, cm.options)
    if cm.training.activation_offload_layers or cm.training.offload_modules:  # host memory
        out["fits"] &= host_memory_fits(cm.model, cm.training, cm.options.memory, cols,
                                        cm.fabric.cluster.host_memory_per_gpu_bytes)
    out["peak_memory_stage"] = np.asarray(mem.peak_stage)
    return out


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
    tokens_per_s_per_gpu_range: tuple[float, float] | None = None
    #: How the range was made: the band's method, or why it is an extrapolation.
    range_basis: str = ""
    #: the features this number was priced with (a searched feature: the one chosen)
    options: CostOptions | None = field(default=None, compare=False, repr=False)

    @property
    def bottleneck(self) -> str:
        """The largest part of the step: compute, memory-bound work, overhead, a named
        communication kind, the pipeline bubble or stage imbalance."""
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
            # Out-of-sample 10th-90th percentile of measured/predicted for this kind of
            # prediction (the profile's `uncertainty`), applied to this prediction.
            "tokens_per_s_per_gpu_range": (list(self.tokens_per_s_per_gpu_range)
                                           if self.tokens_per_s_per_gpu_range else None),
            "tokens_per_s_per_gpu_range_basis": self.range_basis or None,
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
    band, _ = band_for(cm.profile.uncertainty, cm.model.is_moe, cm.training.precision)
    predicted = float(scores["tokens_per_s_per_gpu"][i])
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
        tokens_per_s_per_gpu_range=band.interval(predicted) if band else None,
        range_basis=band.method if band else "",
        options=_row_options(cm, scores, i),
    )


def _row_options(cm: CostModel, scores: dict[str, np.ndarray], i: int) -> CostOptions:
    """The features row ``i`` was priced with (a searched feature: the one chosen)."""
    options = (cm.variants[int(scores["feature_variant"][i])] if "feature_variant" in scores
               else cm.options)
    if "memory_setting" in scores:
        options = apply_setting(options, setting_of(cm, int(scores["memory_setting"][i])))
    return options


def estimate(cm: CostModel, layout: Layout) -> Estimate:
    """Score one layout (it must be valid: run :func:`parsearch.layout.rules.check_layout`)."""
    if layout.num_gpus != cm.fabric.num_gpus:
        raise SpecError(
            f"layout is for {layout.num_gpus} GPUs but the fabric has {cm.fabric.num_gpus}"
        )
    scores = score_columns(cm, layout_columns([layout]))
    return estimate_from_row(cm, scores, 0, layout)
