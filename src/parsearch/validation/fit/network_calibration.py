"""The bandwidth and compute clock a cluster really delivers, as calibration factors.

A cluster file states each tier's line rate and the share of it collectives
achieve (``nvlink_efficiency``, ``network_efficiency``).  What a cluster
delivers can be less: a NIC that trained at half its rate, GPUDirect RDMA
off, a slow node, congestion.  No efficiency-profile factor represents that,
so :mod:`parsearch.validation.user.user_calibration` fits it here:

* :data:`NETWORK_FACTOR`: delivered inter-node (scale-out, per NIC) bandwidth
  over what the cluster file says (line rate x ``network_efficiency``);
* :data:`SPINE_FACTOR`: delivered bandwidth of the leaves' uplinks into the spine (what
  groups spanning several leaf groups, or rail-optimized scalable units, pay:
  :mod:`parsearch.topology.fabric`) over what the file's ``leaf_oversubscription``
  says, on top of :data:`NETWORK_FACTOR`: an oversubscribed or congested spine, not
  slow NICs.  Fitted only where the runs tell it apart from the leaf tier
  (:mod:`parsearch.validation.fit.spine_tier`); otherwise tied to it (1.0: the spine
  delivers what the leaf tier does, times the file's oversubscription).  Applied as
  ``leaf_oversubscription / factor``; on clusters with pods the core uplinks, which the
  graph sizes from the leaves' (:mod:`parsearch.topology.graph`), scale with it, so the
  factor is everything above the leaves;
* :data:`NVLINK_FACTOR`: the same for the NVLink (scale-up) domain;
* :data:`COMPUTE_FACTOR`: the SM clock the GPUs sustain over the clock their
  hardware profile says they sustain at rated power (the clock the efficiency
  profiles were fitted at): a power cap, a clock lock, thermal throttling.  The
  tensor-core and special-function rates scale with it, HBM bandwidth does not
  (:mod:`parsearch.topology.power`), so it slows GEMMs, attention and grouped
  GEMMs together and leaves communication and memory-bound work alone: the
  runs can tell it from a slow network (which moves only the layouts whose
  groups cross nodes) where no GEMM efficiency inside its cited range, nor the
  whole-step ``cluster_speed``, can (issue 33: a cluster at 0.85x compute and
  half the inter-node bandwidth).

All start at (and are pulled toward) 1.0, the cluster file taken at its
word, and are bounded by cited ranges (:func:`network_priors`).  A fitted
factor is applied by a corrected :class:`~parsearch.topology.cluster.ClusterSpec`
(the efficiency scaled, or the GPU given a clock lock, ``gpu_sm_clock_MHz``;
every other field kept), so the cost model prices it with no change of its own,
and :func:`corrected_cluster_yaml` writes that cluster as a file ``--cluster
FILE`` loads.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from parsearch.cost.analytic import CostModel
from parsearch.cost.efficiency import Prior
from parsearch.errors import SpecError, TopologyError
from parsearch.files import is_file
from parsearch.topology.cluster import ClusterSpec, load_cluster, topologies_dir
from parsearch.topology.fabric import Fabric
from parsearch.topology.gpu_profile import GpuProfile
from parsearch.topology.hardware import load_gpu_profile
from parsearch.topology.power import compute_speed
from parsearch.topology.summary import fabric_from_spec
from parsearch.topology.variants import apply_variant, variant_name
from parsearch.validation.fit.calibration import PreparedRow

NETWORK_FACTOR = "network_bandwidth_factor"
SPINE_FACTOR = "spine_bandwidth_factor"
NVLINK_FACTOR = "nvlink_bandwidth_factor"
COMPUTE_FACTOR = "compute_clock_factor"
#: The cluster factors, in the order they are considered.
CLUSTER_FACTORS: tuple[str, ...] = (NETWORK_FACTOR, NVLINK_FACTOR, SPINE_FACTOR, COMPUTE_FACTOR)
#: Lowest board power, as a share of the rated power, down to which the clock law
#: ``f ~ P ** 0.30`` was fitted (300 of 700 W on the H100: parsearch.topology.power; below
#: it memory's own share of the budget is no longer small, Ujeniya et al., arXiv
#: 2604.11391).  The clock factor's range stops there; a cluster slower still is
#: cluster_speed's (parsearch.validation.fit.cluster_speed).
LAW_POWER_SHARE = 300.0 / 700.0
#: Lowest delivered share of the cluster file's inter-node bandwidth.  nccl-tests
#: all_reduce busbw between pairs of nodes of one fabric: 49 GB/s with one slow node
#: against 86-88 GB/s for the others (0.56; NVIDIA/nccl-tests #106); 50 GB/s where the
#: four NICs of a node promised 200 GB/s (0.25; NVIDIA/nccl-tests #232).  A NIC trained
#: at HDR 200 Gb/s on an NDR 400 Gb/s cluster file delivers 0.5.
NETWORK_LOW = 0.25
#: Lowest delivered share of the spine (leaf uplink) bandwidth the cluster file states, over
#: what the leaf tier delivers.  ECMP hash collisions put two cross-leaf flows on one uplink
#: and halve it (Baidu AIPod, "How to eliminate network hash collisions in large-model
#: training": ~70 of 100 Gb/s on average, 50 where two flows collide); Meta's RoCE training
#: fabric gained up to 40 % on AllReduce once its ECMP hashing was fixed (SIGCOMM 2024,
#: "RDMA over Ethernet for Distributed AI Training at Meta Scale": baseline 1/1.4 = 0.71);
#: a leaf with half as many uplinks as downlinks (2:1, a common cost-saving design:
#: topologies/dgx-h100-oversub.yaml) described as non-blocking delivers 0.5, and both
#: together 0.25.
SPINE_LOW = 0.25
#: Lowest achieved NVLink efficiency (busbw / per-direction line rate): A100 8-GPU
#: all-reduce 200-230 of 300 GB/s (0.67-0.77, NVIDIA/nccl-tests #149); the CALC H100
#: preset uses 0.65 (formulas.md §9).
NVLINK_LOW_EFFICIENCY = 0.65
#: The whole range of a cluster factor must move the runs' log throughput by this much
#: (mean over the runs) before it is fitted: 2.5 times the 2 % run-to-run spread of a
#: measured step time, so that the runs carry more of it than noise (runs that barely
#: cross nodes cannot tell a slow network from a slow GEMM).
MIN_NETWORK_SENSITIVITY = 0.05


def network_priors(cluster: ClusterSpec, gpu: GpuProfile | None = None) -> dict[str, Prior]:
    """The cited range of each cluster factor of ``cluster`` (value 1.0: the file's word).

    The bandwidths' upper end is the line rate (delivered busbw cannot exceed it:
    nccl-tests ``doc/PERFORMANCE.md`` defines busbw against the link's peak), i.e.
    ``1 / efficiency``; ClusterSpec keeps an efficiency at most 1.  The compute clock's
    range is :func:`compute_prior` (``gpu``: the cluster's GPU, loaded when not given).
    """
    out = {}
    if cluster.nics_per_node:
        out[NETWORK_FACTOR] = Prior(
            1.0, NETWORK_LOW, 1.0 / cluster.network_efficiency,
            "delivered / cluster-file inter-node bandwidth: 0.25-0.56 on faulty or "
            "misdescribed fabrics (nccl-tests #232, #106) up to the NIC line rate")
    if cluster.nvlink_domain_size > 1:
        low = min(1.0, NVLINK_LOW_EFFICIENCY / cluster.nvlink_efficiency)
        out[NVLINK_FACTOR] = Prior(
            1.0, low, 1.0 / cluster.nvlink_efficiency,
            "delivered / cluster-file NVLink bandwidth: busbw 0.65-0.82 of line rate "
            "(nccl-tests #149, #212; formulas.md §9) up to the line rate")
    if cluster.nics_per_node:
        out[SPINE_FACTOR] = spine_prior(cluster)
    compute = compute_prior(gpu if gpu is not None else _gpu_named(cluster.gpu))
    if compute is not None:
        out[COMPUTE_FACTOR] = compute
    return out


def spine_prior(cluster: ClusterSpec) -> Prior:
    """The range of :data:`SPINE_FACTOR`: :data:`SPINE_LOW` up to the file's
    ``leaf_oversubscription`` (a non-blocking leaf: above it the NICs, priced by
    :data:`NETWORK_FACTOR`, are the bottleneck, and ClusterSpec keeps the
    oversubscription at least 1)."""
    high = cluster.leaf_oversubscription
    return Prior(1.0, min(SPINE_LOW, high), high,
                 "delivered / cluster-file spine (leaf uplink) bandwidth over the leaf tier's: "
                 "0.25 (an undeclared 2:1 leaf with ECMP collisions halving cross-leaf flows: "
                 "Baidu AIPod, Meta SIGCOMM 2024 RoCE paper) up to a non-blocking leaf")


@functools.lru_cache(maxsize=16)
def _gpu_named(name: str) -> GpuProfile | None:
    """The hardware profile of a cluster's ``gpu`` (``None``: it cannot be loaded)."""
    try:
        return load_gpu_profile(name)
    except (SpecError, TopologyError, OSError):
        return None


def compute_prior(gpu: GpuProfile | None) -> Prior | None:
    """The range of :data:`COMPUTE_FACTOR` for ``gpu`` (``None``: its hardware profile
    states no sustained clock and rated power, so a clock cannot be priced).

    Low: the clock sustained at the lowest power the clock law was fitted at,
    ``(P_low / P_rated) ** gamma`` (parsearch.topology.power: gamma 0.30 from the H100
    SXM / NVL datasheet pair, fitted 300-700 W; :data:`LAW_POWER_SHARE`, or the board's
    own lowest power limit if higher): 0.775 on an H100 SXM.  High: 1.0, the clock at rated power: a
    lock above it changes nothing (the part throttles there, power.py), and GEMMs
    faster than the profile's are the GEMM efficiency's range, not the clock's.
    """
    if gpu is None or gpu.sustained_clock_MHz is None or gpu.tdp_W is None:
        return None
    low_power = min(max(gpu.min_power_W or 0.0, LAW_POWER_SHARE * gpu.tdp_W), gpu.tdp_W)
    low = compute_speed(gpu, power_limit_W=low_power)
    if low >= 1.0:
        return None
    return Prior(1.0, low, 1.0,
                 f"sustained SM clock / the hardware profile's at rated power: {low:.3f} at "
                 f"{low_power:g} of {gpu.tdp_W:g} W (clock ~ power^0.30, fitted 300-700 W: "
                 "parsearch.topology.power) up to 1.0 (a clock above the sustained one "
                 "changes nothing)")


def _clocked(gpu: GpuProfile, factor: float) -> GpuProfile:
    """``gpu`` locked at ``factor`` of its sustained clock: tensor-core and SFU rates x
    ``factor``, HBM unchanged (parsearch.topology.variants.apply_variant)."""
    assert gpu.sustained_clock_MHz is not None
    return apply_variant(gpu, {"sm_clock_MHz": factor * gpu.sustained_clock_MHz})


def corrected_cluster(cluster: ClusterSpec, factors: Mapping[str, float],
                      name: str | None = None) -> ClusterSpec:
    """``cluster`` with its achievable bandwidths scaled by ``factors`` (capped at line rate)
    and its GPU's clock locked at :data:`COMPUTE_FACTOR` of the sustained clock."""
    changes: dict[str, Any] = {}
    if factors.get(NETWORK_FACTOR, 1.0) != 1.0:
        changes["network_efficiency"] = min(1.0, cluster.network_efficiency
                                            * factors[NETWORK_FACTOR])
    if factors.get(NVLINK_FACTOR, 1.0) != 1.0:
        changes["nvlink_efficiency"] = min(1.0, cluster.nvlink_efficiency
                                           * factors[NVLINK_FACTOR])
    if factors.get(SPINE_FACTOR, 1.0) != 1.0:
        changes["leaf_oversubscription"] = _oversubscription(cluster, factors[SPINE_FACTOR])
    clock = _clock_MHz(cluster, factors)
    if clock is not None:
        changes["gpu"] = variant_name(cluster.gpu, {"sm_clock_MHz": clock})
    if name is not None:
        changes["name"] = name
    return replace(cluster, **changes) if changes else cluster


def _oversubscription(cluster: ClusterSpec, spine: float) -> float:
    """The ``leaf_oversubscription`` that makes the leaves' uplinks deliver ``spine`` times
    the file's (at least 1: a non-blocking leaf)."""
    return max(1.0, cluster.leaf_oversubscription / spine)


def _clock_MHz(cluster: ClusterSpec, factors: Mapping[str, float]) -> float | None:
    """The SM clock lock :data:`COMPUTE_FACTOR` sets (``None``: none)."""
    factor = min(factors.get(COMPUTE_FACTOR, 1.0), 1.0)
    gpu = _gpu_named(cluster.gpu) if factor != 1.0 else None
    if gpu is None or gpu.sustained_clock_MHz is None:
        return None
    return factor * gpu.sustained_clock_MHz


def with_cluster_factors(cm: CostModel, factors: Mapping[str, float]) -> CostModel:
    """``cm`` priced on its cluster corrected by ``factors`` (same GPUs, same layouts)."""
    if all(v == 1.0 for v in factors.values()):
        return cm
    fabric = cm.fabric
    cluster = corrected_cluster(fabric.cluster,
                                {k: v for k, v in factors.items() if k != COMPUTE_FACTOR})
    gpu = fabric.gpu
    factor = min(factors.get(COMPUTE_FACTOR, 1.0), 1.0)
    if factor != 1.0 and gpu.sustained_clock_MHz is not None:
        gpu = _clocked(gpu, factor)
        cluster = replace(cluster, gpu=variant_name(
            cluster.gpu, {"sm_clock_MHz": factor * fabric.gpu.sustained_clock_MHz}))
    return replace(cm, fabric=fabric_from_spec(cluster, fabric.num_gpus, gpu=gpu))


def rows_with_cluster_factors(rows: Sequence[PreparedRow],
                              factors: Mapping[str, float]) -> list[PreparedRow]:
    """``rows`` each priced on its cluster corrected by ``factors`` (one corrected fabric per
    fabric the rows share, so rows of one cluster stay priced together)."""
    if all(v == 1.0 for v in factors.values()):
        return list(rows)
    fabrics: dict[int, Fabric] = {}
    out = []
    for row in rows:
        cm = row.cost_model
        key = id(cm.fabric)
        if key not in fabrics:
            fabrics[key] = with_cluster_factors(cm, factors).fabric
        out.append(replace(row, cost_model=replace(cm, fabric=fabrics[key])))
    return out


def cluster_file_path(name_or_path: str) -> Path:
    """The file ``load_cluster(name_or_path)`` reads."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or is_file(path):
        return path
    return topologies_dir() / f"{name_or_path}.yaml"


def corrected_cluster_yaml(name_or_path: str, factors: Mapping[str, float],
                           header: str = "") -> str:
    """The cluster file ``name_or_path`` with its efficiencies scaled by ``factors`` (and its
    GPU's sustained clock, ``gpu_sm_clock_MHz``, when :data:`COMPUTE_FACTOR` is fitted).

    Every other field is copied as written; ``name`` gets ``-calibrated``, and
    ``sources`` say what changed.  The text loads with ``--cluster FILE``.
    """
    path = cluster_file_path(name_or_path)
    original = load_cluster(name_or_path)
    data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: expected a mapping of fields")
    fixed = corrected_cluster(original, factors)
    sources = dict(data.get("sources") or {})
    for field, factor in ((("network_efficiency", NETWORK_FACTOR),
                           ("nvlink_efficiency", NVLINK_FACTOR))):
        if factors.get(factor, 1.0) == 1.0:
            continue
        before, after = getattr(original, field), getattr(fixed, field)
        # Four significant digits, and never above the line rate (ClusterSpec's rule).
        data[field] = min(1.0, float(f"{after:.4g}"))
        sources[field] = (f"parsearch calibrate: {factor} {factors[factor]:.3f} x {before:g} "
                          f"(the cluster file {path.name}) fitted to measured runs")
    if factors.get(SPINE_FACTOR, 1.0) != 1.0:
        # The leaves' uplinks deliver SPINE_FACTOR of the file's: an oversubscription that
        # prices exactly that (parsearch.topology.fabric: leaf uplink share).
        data["leaf_oversubscription"] = float(f"{fixed.leaf_oversubscription:.4g}")
        sources["leaf_oversubscription"] = (
            f"parsearch calibrate: {SPINE_FACTOR} {factors[SPINE_FACTOR]:.3f}: the spine "
            f"(leaf uplinks) delivers that share of {original.leaf_oversubscription:g}:1 "
            f"(the cluster file {path.name}), fitted to measured runs that cross leaf groups")
    clock = _clock_MHz(original, factors)
    if clock is not None:
        # A clock lock (parsearch.topology.variants): tensor and SFU rates x the factor.
        data["gpu_sm_clock_MHz"] = round(clock, 1)
        sources["gpu_sm_clock_MHz"] = (
            f"parsearch calibrate: {COMPUTE_FACTOR} {factors[COMPUTE_FACTOR]:.3f} x the "
            f"sustained SM clock of {original.gpu} fitted to measured runs (a power cap, "
            "clock lock or throttling)")
    data["name"] = f"{original.name}-calibrated"
    data["sources"] = sources
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return header + text


__all__ = [
    "CLUSTER_FACTORS", "COMPUTE_FACTOR", "MIN_NETWORK_SENSITIVITY", "NETWORK_FACTOR",
    "NVLINK_FACTOR", "SPINE_FACTOR", "SPINE_LOW", "cluster_file_path", "compute_prior",
    "corrected_cluster", "corrected_cluster_yaml", "network_priors",
    "rows_with_cluster_factors", "spine_prior", "with_cluster_factors",
]
