"""Per-micro-batch prices of the model's units (layers, embedding, output) on one GPU.

A pipeline stage's time is linear in the units it holds (:mod:`parsearch.cost.analytic`);
this module prices each unit once per layout: compute (:mod:`parsearch.cost.compute`),
exposed TP/CP/EP traffic on the placed process groups
(:mod:`parsearch.cost.communication`, :mod:`parsearch.topology.placement`), activation
offload, the pipeline send and the per-unit parameter counts the data-parallel traffic
and optimizer step need.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parsearch.cost.collectives import LinkArrays, all_gather_time, p2p_time
from parsearch.cost.communication import (
    Groups,
    deepep_forward_Bps,
    deepep_rdma_share,
    ep_sm_share,
    flex_backend,
    unit_comm,
)
from parsearch.cost.compute import UnitCompute, is_moe_unit, unit_compute
from parsearch.cost.cost_model import CostModel
from parsearch.cost.offload import offload_exposed
from parsearch.cost.options import CostOptions
from parsearch.cost.recompute import LayerShares, RecomputeShares
from parsearch.cost.routing import priced_imbalance
from parsearch.cost.stages import stage_contents
from parsearch.model.params import parameter_counts
from parsearch.model.specs import ModelSpec
from parsearch.topology.fabric import Fabric
from parsearch.topology.placement import group_strides

# The embedding and the output layer are never recomputed (Megatron checkpoints layers).
_NO_RECOMPUTE = LayerShares(*(np.zeros(()) for _ in range(6)))


def process_groups(fabric: Fabric, cols: dict[str, np.ndarray],
                   experts_follow_tp: bool = False) -> Groups:
    """Where each layout's TP, CP, PP, EP, ETP, DP and EDP groups sit, and their links
    (``experts_follow_tp``: a stack before MoE parallel folding, whose EP ranks are DP
    ranks: :func:`~parsearch.topology.placement.group_strides`)."""
    strides = group_strides(cols["tp"], cols["cp"], cols["pp"], cols["ep"], cols["etp"],
                            fabric.num_gpus, experts_fold=not experts_follow_tp)
    nvlink_latency = fabric.cluster.nvlink_latency_s
    out = {}
    for kind, (stride, size) in strides.items():
        stride_a, size_a = np.broadcast_arrays(np.asarray(stride), np.asarray(size))
        links = fabric.group_links(stride_a, size_a)
        out[kind] = LinkArrays.from_group_links(links, nvlink_latency, links["latency_s"])
    return Groups(**out)


def priced_unit_compute(cm: CostModel, cols: dict[str, np.ndarray], unit: str,
                        recompute: LayerShares,
                        imbalance: np.ndarray | None = None) -> UnitCompute:
    """:func:`unit_compute` of ``unit`` under the cost model's options (``imbalance``: the
    rows' :func:`~parsearch.cost.routing.priced_imbalance`, when already known)."""
    opt = cm.options
    if imbalance is None:
        imbalance = priced_imbalance(cm.model, cm.training, opt, cols)
    return unit_compute(cm.model, cm.training, cm.fabric.gpu, cm.profile, cols, unit,
                        recompute=recompute, causal=opt.causal, imbalance=imbalance,
                        cuda_graphs=opt.cuda_graphs, cuda_graph_scope=opt.cuda_graph_scope,
                        fp8_recipe=opt.fp8_recipe, moe_dispatcher=opt.moe_dispatcher,
                        flash_attention=opt.flash_attention,
                        fp8_attention=opt.fp8_attention,
                        fp8_output_proj=opt.fp8_output_proj,
                        fused_expert_mlp=opt.fused_expert_mlp)


def cached_unit_compute(cm: CostModel, cols: dict[str, np.ndarray], unit: str,
                        recompute: LayerShares, cache: dict[tuple[object, ...], Any] | None
                        ) -> UnitCompute:
    """:func:`priced_unit_compute`, reused from ``cache`` (for the same rows) when priced
    before under options that agree on every field it reads."""
    opt = cm.options
    # the dispatcher prices only MoE units' kernels (unit_compute: the FP32 probabilities
    # and the second sort by local expert act on routed copies, which other units have none of)
    dispatcher = opt.moe_dispatcher if is_moe_unit(cm.model, unit) else None
    key = (unit, opt.causal, opt.routing, opt.moe_imbalance, opt.moe_capacity_factor,
           opt.moe_pad_to_capacity, opt.cuda_graphs, opt.cuda_graph_scope, opt.fp8_recipe,
           dispatcher, opt.flash_attention, opt.fp8_attention, opt.fp8_output_proj,
           opt.fused_expert_mlp)
    if cache is not None and key in cache:
        return cache[key]
    if cache is None:
        return priced_unit_compute(cm, cols, unit, recompute)
    # the routing imbalance reads the routing options only: one per those, for every unit
    routing = ("imbalance", opt.routing, opt.moe_imbalance, opt.moe_capacity_factor,
               opt.moe_pad_to_capacity)
    if routing not in cache:
        cache[routing] = priced_imbalance(cm.model, cm.training, opt, cols)
    cache[key] = compute = priced_unit_compute(cm, cols, unit, recompute, cache[routing])
    return compute


def flex_rates(cm: CostModel) -> tuple[float | None, float]:
    """DeepEP's figures on this cost model's GPU and flex backend: its internode NVLink
    forwarding rate (:func:`parsearch.cost.communication.deepep_forward_Bps`) and its RDMA
    stage's share of the network rate (:func:`parsearch.cost.communication.deepep_rdma_share`)."""
    cluster = cm.fabric.cluster
    backend = flex_backend(cm.options, cluster.nvlink_domain_size, cluster.gpus_per_node)
    capability = cm.fabric.gpu.compute_capability
    return (deepep_forward_Bps(cm.options, backend, capability),
            deepep_rdma_share(cm.options, backend, capability))


def unit_prices(cm: CostModel, cols: dict[str, np.ndarray], groups: Groups, unit: str,
                 shares: RecomputeShares,
                 compute_cache: dict[tuple[object, ...], Any] | None = None
                 ) -> dict[str, np.ndarray]:
    """Per-micro-batch seconds of one unit on one GPU, by stage part.

    ``compute_cache``: compute and EP traffic already priced for these rows under options
    that agree on every field they read (feature sets differing only in overlaps share
    them)."""
    opt = cm.options
    layer = unit in ("dense", "moe", "mtp")
    recompute = shares.of(is_moe_unit(cm.model, unit)) if layer else _NO_RECOMPUTE
    compute = cached_unit_compute(cm, cols, unit, recompute, compute_cache)
    cluster = cm.fabric.cluster
    backend = flex_backend(opt, cluster.nvlink_domain_size, cluster.gpus_per_node)
    forward, rdma_share = flex_rates(cm)
    comm = unit_comm(cm.model, cm.training, cm.profile, opt, cols, groups, unit, compute,
                     recompute, ep_share=ep_sm_share(opt, cm.profile, cm.fabric.gpu.sm_count,
                                                     backend),
                     traffic_cache=compute_cache, forward_Bps=forward, rdma_share=rdma_share)
    offload = (offload_exposed(cm.model, cm.training, cm.fabric.gpu, opt.memory, cols,
                               unit == "moe", compute.total)
               if unit in ("dense", "moe") else 0.0 * compute.total)
    return {
        "compute": compute.gemm + compute.routed + compute.attention + compute.logits
        + comm.sm_slowdown,
        "memory_bound": compute.memory_bound,
        "overhead": compute.overhead,
        "tp_comm": comm.tp,
        "cp_comm": comm.cp,
        "ep_comm": comm.ep,
        "offload": offload,
    }


def pp_send_time(groups: Groups, size_bytes: np.ndarray, cols: dict[str, np.ndarray],
                  options: CostOptions) -> np.ndarray:
    """One pipeline send of ``size_bytes`` per TP rank, without its latency constant.

    Megatron-Core: every TP rank sends its copy to its peer in the next stage (b*s*h each
    without SP, NAR21 §3.2).  With ``options.pp_scatter_gather`` (Megatron-LM's
    ``--scatter-gather-tensors-in-pipeline``, NAR21 §4.1; formulas.md §7.4) and no SP,
    each rank sends 1/t of it over its own link and the receiving stage all-gathers the
    pieces over its TP group.
    """
    direct = p2p_time(groups.pp, size_bytes)
    if not options.pp_scatter_gather:
        return direct
    tp = cols["tp"].astype(np.float64)
    split = ~cols["sp"].astype(bool) & (tp > 1)
    scattered = p2p_time(groups.pp, size_bytes / tp) + all_gather_time(groups.tp, size_bytes)
    return np.where(split, scattered, direct)


def unit_params(cm: CostModel, cols: dict[str, np.ndarray]) -> dict[str, tuple[Any, Any]]:
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


def stage_features(model: ModelSpec, pp: int, vpp: int, split: str) -> np.ndarray:
    """Unit counts per pipeline rank: shape (pp, len(UNITS))."""
    rows = []
    for c in stage_contents(model, pp, vpp, split):
        rows.append((c.num_dense_layers, c.num_moe_layers, c.num_mtp_layers,
                     float(c.has_embedding), float(c.has_output)))
    return np.asarray(rows, dtype=np.float64)
