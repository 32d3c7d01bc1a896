"""The fabric summary of a cluster file, computed from its fields without building the graph.

:func:`~parsearch.topology.fabric.build_fabric` expands the cluster into a
``networkx`` graph (one node per GPU, NIC and switch), validates it and
walks it once; on 16,384 GPUs that takes about half a second, and a Pareto
sweep needs one fabric per GPU count.  The graph of a cluster file is
regular (:func:`~parsearch.topology.graph.build_graph`: GPUs fill nodes,
NVLink domains, leaf groups and pods in order), so the per-GPU arrays the
walk produces follow from the fields directly:

* a GPU's node, domain, leaf group and pod are integer divisions of its rank;
* its NIC share is the NIC rate divided by the GPUs on that NIC (fewer on a
  partially filled last node), never above its own link rate;
* a leaf's uplink (design value of a full leaf: downlinks over the
  oversubscription) is shared by the GPUs present under it, a pod's core
  uplink by the GPUs present in the pod;
* tier latencies are the same sums of edge latencies as the walk's.

:func:`fabric_from_spec` returns a :class:`Fabric` with exactly these arrays
(the tests compare it with the graph walk, array for array).  When the graph
would be refused (a non-positive rate, a negative latency, GPUs that cannot
reach each other), it builds the graph instead, so the error is the graph's.
"""

from __future__ import annotations

import math

import numpy as np

from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.fabric import Fabric, build_fabric
from parsearch.topology.hardware import GpuProfile, load_gpu_profile


def _ok_rate(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _ok_latency(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def _regular(cluster: ClusterSpec, num_gpus: int) -> bool:
    """True when the graph of ``num_gpus`` GPUs would be built and accepted."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        return False
    if cluster.max_gpus is not None and num_gpus > cluster.max_gpus:
        return False
    if cluster.nvlink_domain_size > 1 and not (
            _ok_rate(cluster.nvlink_bandwidth_Bps) and _ok_latency(cluster.nvlink_latency_s / 2)):
        return False
    if not cluster.nics_per_node:
        # connected only when every GPU hangs off one NVSwitch
        return num_gpus == 1 or (cluster.nvlink_domain_size > 1
                                 and num_gpus <= cluster.job_domain_size)
    leaf_uplink = cluster.gpus_per_leaf / cluster.gpus_per_nic * cluster.nic_bandwidth_Bps
    leaf_uplink /= cluster.leaf_oversubscription
    return (_ok_rate(cluster.nic_bandwidth_Bps) and _ok_rate(leaf_uplink)
            and _ok_latency(cluster.network_latency_s / 2)
            and _ok_latency(cluster.switch_latency_s)
            and _ok_rate(leaf_uplink / cluster.spine_oversubscription))


def fabric_from_spec(cluster: ClusterSpec, num_gpus: int, *,
                     gpu: GpuProfile | None = None) -> Fabric:
    """The :class:`Fabric` of ``num_gpus`` GPUs of ``cluster``, without the graph walk.

    ``gpu``: the cluster's GPU profile, when already loaded (a sweep loads it once).
    """
    if not _regular(cluster, num_gpus):
        return build_fabric(cluster, num_gpus)
    n = num_gpus
    c = cluster
    index = np.arange(n, dtype=np.int64)
    node, local = np.divmod(index, c.gpus_per_node)
    summary: dict[str, object] = {
        "node_of": node,
        "domain_of": index // c.job_domain_size,
        "leaf_group_of": np.zeros(n, dtype=np.int64),
        "pod_of": np.zeros(n, dtype=np.int64),
        "nvlink_Bps": np.full(n, c.nvlink_bandwidth_Bps),
        "nic_share_Bps": np.zeros(n),
        "leaf_uplink_share_Bps": np.full(n, np.inf),
        "pod_uplink_share_Bps": np.full(n, np.inf),
    }
    nvlink_up = c.nvlink_latency_s / 2 if c.nvlink_domain_size > 1 else 0.0
    network_up = spine_up = core_up = 0.0
    if c.nics_per_node:
        nic_Bps = c.nic_bandwidth_Bps
        leaf_uplink = c.gpus_per_leaf / c.gpus_per_nic * nic_Bps
        leaf_uplink /= c.leaf_oversubscription
        per_pod = c.gpus_per_pod // c.gpus_per_leaf_group if c.gpus_per_pod else None
        rail = local // c.gpus_per_nic
        group = node // c.nodes_per_leaf_group
        pod = group // per_pod if per_pod else np.zeros(n, dtype=np.int64)
        # GPUs on each NIC, under each leaf and in each pod (those present)
        nic_key = node * c.nics_per_node + rail
        _, nic_inv, nic_users = np.unique(nic_key, return_inverse=True, return_counts=True)
        share = np.minimum(nic_Bps, nic_Bps / nic_users[nic_inv.reshape(-1)])
        leaf_key = group * c.nics_per_node + rail if c.rail_optimized else group
        _, leaf_inv, leaf_size = np.unique(leaf_key, return_inverse=True, return_counts=True)
        summary.update(
            nic_share_Bps=share, leaf_group_of=group, pod_of=pod,
            leaf_uplink_share_Bps=leaf_uplink / leaf_size[leaf_inv.reshape(-1)].astype(
                np.float64))
        network_up = c.network_latency_s / 2  # GPU-NIC edge (0) + NIC-leaf edge
        spine_up = c.switch_latency_s
        num_pods = int(pod.max()) + 1
        if num_pods > 1 and per_pod:
            leaves_per_group = c.nics_per_node if c.rail_optimized else 1
            pod_uplink = per_pod * leaves_per_group * leaf_uplink
            pod_uplink /= c.spine_oversubscription
            pod_gpus = np.bincount(pod, minlength=num_pods)
            summary["pod_uplink_share_Bps"] = pod_uplink / pod_gpus[pod].astype(np.float64)
            core_up = c.switch_latency_s
    summary["tier_latency_s"] = {
        "nvlink": 2 * nvlink_up,
        "leaf": 2 * network_up,
        "spine": 2 * (network_up + spine_up),
        "core": 2 * (network_up + spine_up + core_up),
    }
    return Fabric.from_summary(cluster, n, gpu or load_gpu_profile(cluster.gpu), summary)


__all__ = ["fabric_from_spec"]
