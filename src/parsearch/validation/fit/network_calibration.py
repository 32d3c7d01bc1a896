"""The bandwidth a cluster really delivers, as two calibration factors.

A cluster file states each tier's line rate and the share of it collectives
achieve (``nvlink_efficiency``, ``network_efficiency``).  What a cluster
delivers can be less: a NIC that trained at half its rate, GPUDirect RDMA
off, a slow node, congestion.  No efficiency-profile factor represents that,
so :mod:`parsearch.validation.user.user_calibration` fits it here:

* :data:`NETWORK_FACTOR`: delivered inter-node (scale-out, per NIC) bandwidth
  over what the cluster file says (line rate x ``network_efficiency``);
* :data:`NVLINK_FACTOR`: the same for the NVLink (scale-up) domain.

Both start at (and are pulled toward) 1.0, the cluster file taken at its
word, and are bounded by cited ranges (:func:`network_priors`).  A fitted
factor is applied by a corrected :class:`~parsearch.topology.cluster.ClusterSpec`
(the efficiency scaled, every other field kept), so the cost model prices it
with no change of its own, and :func:`corrected_cluster_yaml` writes that
cluster as a file ``--cluster FILE`` loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from parsearch.cost.analytic import CostModel
from parsearch.cost.efficiency import Prior
from parsearch.errors import TopologyError
from parsearch.files import is_file
from parsearch.topology.cluster import ClusterSpec, load_cluster, topologies_dir
from parsearch.topology.summary import fabric_from_spec
from parsearch.validation.fit.calibration import PreparedRow

NETWORK_FACTOR = "network_bandwidth_factor"
NVLINK_FACTOR = "nvlink_bandwidth_factor"
#: The cluster factors, in the order they are considered.
CLUSTER_FACTORS: tuple[str, ...] = (NETWORK_FACTOR, NVLINK_FACTOR)
#: Lowest delivered share of the cluster file's inter-node bandwidth.  nccl-tests
#: all_reduce busbw between pairs of nodes of one fabric: 49 GB/s with one slow node
#: against 86-88 GB/s for the others (0.56; NVIDIA/nccl-tests #106); 50 GB/s where the
#: four NICs of a node promised 200 GB/s (0.25; NVIDIA/nccl-tests #232).  A NIC trained
#: at HDR 200 Gb/s on an NDR 400 Gb/s cluster file delivers 0.5.
NETWORK_LOW = 0.25
#: Lowest achieved NVLink efficiency (busbw / per-direction line rate): A100 8-GPU
#: all-reduce 200-230 of 300 GB/s (0.67-0.77, NVIDIA/nccl-tests #149); the CALC H100
#: preset uses 0.65 (formulas.md §9).
NVLINK_LOW_EFFICIENCY = 0.65
#: The whole range of a cluster factor must move the runs' log throughput by this much
#: (mean over the runs) before it is fitted: 2.5 times the 2 % run-to-run spread of a
#: measured step time, so that the runs carry more of it than noise (runs that barely
#: cross nodes cannot tell a slow network from a slow GEMM).
MIN_NETWORK_SENSITIVITY = 0.05


def network_priors(cluster: ClusterSpec) -> dict[str, Prior]:
    """The cited range of each cluster factor of ``cluster`` (value 1.0: the file's word).

    The upper end is the line rate (delivered busbw cannot exceed it: nccl-tests
    ``doc/PERFORMANCE.md`` defines busbw against the link's peak), i.e.
    ``1 / efficiency``; ClusterSpec keeps an efficiency at most 1.
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
    return out


def corrected_cluster(cluster: ClusterSpec, factors: Mapping[str, float],
                      name: str | None = None) -> ClusterSpec:
    """``cluster`` with its achievable bandwidths scaled by ``factors`` (capped at line rate)."""
    changes: dict[str, Any] = {}
    if factors.get(NETWORK_FACTOR, 1.0) != 1.0:
        changes["network_efficiency"] = min(1.0, cluster.network_efficiency
                                            * factors[NETWORK_FACTOR])
    if factors.get(NVLINK_FACTOR, 1.0) != 1.0:
        changes["nvlink_efficiency"] = min(1.0, cluster.nvlink_efficiency
                                           * factors[NVLINK_FACTOR])
    if name is not None:
        changes["name"] = name
    return replace(cluster, **changes) if changes else cluster


def with_cluster_factors(cm: CostModel, factors: Mapping[str, float]) -> CostModel:
    """``cm`` priced on its cluster corrected by ``factors`` (same GPUs, same layouts)."""
    if all(v == 1.0 for v in factors.values()):
        return cm
    fabric = cm.fabric
    cluster = corrected_cluster(fabric.cluster, factors)
    return replace(cm, fabric=fabric_from_spec(cluster, fabric.num_gpus, gpu=fabric.gpu))


def rows_with_cluster_factors(rows: Sequence[PreparedRow],
                              factors: Mapping[str, float]) -> list[PreparedRow]:
    """``rows`` each priced on its cluster corrected by ``factors``."""
    if all(v == 1.0 for v in factors.values()):
        return list(rows)
    models: dict[int, CostModel] = {}
    out = []
    for row in rows:
        key = id(row.cost_model)
        if key not in models:
            models[key] = with_cluster_factors(row.cost_model, factors)
        out.append(replace(row, cost_model=models[key]))
    return out


def cluster_file_path(name_or_path: str) -> Path:
    """The file ``load_cluster(name_or_path)`` reads."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or is_file(path):
        return path
    return topologies_dir() / f"{name_or_path}.yaml"


def corrected_cluster_yaml(name_or_path: str, factors: Mapping[str, float],
                           header: str = "") -> str:
    """The cluster file ``name_or_path`` with its efficiencies scaled by ``factors``.

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
    data["name"] = f"{original.name}-calibrated"
    data["sources"] = sources
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return header + text


__all__ = [
    "CLUSTER_FACTORS", "MIN_NETWORK_SENSITIVITY", "NETWORK_FACTOR", "NVLINK_FACTOR",
    "cluster_file_path", "corrected_cluster", "corrected_cluster_yaml", "network_priors",
    "rows_with_cluster_factors", "with_cluster_factors",
]
