"""Expand a cluster description into a ``networkx`` graph, and check it.

Nodes (``kind`` attribute, ids are readable strings):

* ``gpu/<i>``: GPU *i* (= rank *i* under block placement); attributes
  ``index``, ``node``, ``domain``, ``local`` (index inside its node).
* ``nvswitch/<d>``: the NVLink switch fabric of domain *d*, aggregated into
  one node (an 8-GPU NVSwitch board or the 18 switch chips of an NVL72 rack).
* ``nic/<n>/<j>``: NIC *j* of node *n*; attributes ``node``, ``rail``.
* ``leaf/<g>`` (one leaf per group) or ``leaf/<g>/<j>`` (rail-optimized: leaf
  of rail *j* in scalable unit *g*); attributes ``leaf_group``, ``pod``.
* ``spine/<p>``: the spine switches of pod *p*, aggregated.
* ``core``: the tier above the spines, only when there is more than one pod.

Edges carry ``bandwidth_Bps`` (per direction), ``latency_s`` and ``tier``
(``nvlink``, ``pcie``, ``network``).  Aggregating a tier of switches into one
node keeps every cut of the real fat-tree: a leaf's uplink edge holds the sum
of its uplinks, i.e. its downlink capacity divided by the oversubscription.

>>> from parsearch.topology.cluster import load_cluster
>>> g = build_graph(load_cluster("dgx-h100"), 16)
>>> validate_graph(g)
>>> g.edges["gpu/0", "nvswitch/0"]["bandwidth_Bps"] / 1e9
450.0
>>> g.edges["nic/1/0", "leaf/0/0"]["bandwidth_Bps"] / 1e9
50.0
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import networkx as nx

from parsearch.errors import TopologyError
from parsearch.model.specs import short_repr
from parsearch.topology.cluster_spec import MAX_GPUS, ClusterSpec

NODE_KINDS: tuple[str, ...] = ("gpu", "nvswitch", "nic", "leaf", "spine", "core")


def gpu_id(index: int) -> str:
    """Graph node id of GPU ``index``."""
    return f"gpu/{index}"


def _leaf_id(cluster: ClusterSpec, node: int, rail: int) -> tuple[str, int]:
    """The leaf serving NIC ``rail`` of ``node``, and its leaf group."""
    group = node // cluster.nodes_per_leaf_group
    if cluster.rail_optimized:
        return f"leaf/{group}/{rail}", group
    return f"leaf/{group}", group


def build_graph(cluster: ClusterSpec, num_gpus: int) -> nx.Graph:
    """The topology graph of ``num_gpus`` GPUs of ``cluster``.

    GPUs fill nodes in order (``ceil(num_gpus / gpus_per_node)`` nodes, the
    last one possibly partial); domains (``usable_domain_size`` GPUs each),
    leaf groups and pods are filled the same way.  Switch uplink capacities
    are the design values of a full switch, so a partially filled last leaf
    is not penalised.
    """
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise TopologyError(f"num_gpus must be a positive integer, got {short_repr(num_gpus)}")
    if num_gpus > MAX_GPUS:
        raise TopologyError(f"num_gpus={short_repr(num_gpus)} exceeds the largest supported job, "
                            f"{MAX_GPUS:,} GPUs")
    if cluster.max_gpus is not None and num_gpus > cluster.max_gpus:
        raise TopologyError(
            f"cluster '{cluster.name}' supports at most max_gpus={cluster.max_gpus} GPUs; "
            f"asked for {num_gpus}"
        )
    graph = nx.Graph(cluster=cluster.name, num_gpus=num_gpus)
    _add_nvlink(graph, cluster, num_gpus)
    if cluster.nics_per_node:
        _add_network(graph, cluster, num_gpus)
    return graph


def _add_nvlink(graph: nx.Graph, cluster: ClusterSpec, num_gpus: int) -> None:
    # One aggregated NVSwitch node per domain; each GPU links to it at its per-direction
    # NVLink bandwidth; a GPU-to-GPU NVLink step crosses two such edges.
    half_latency = cluster.nvlink_latency_s / 2
    for index in range(num_gpus):
        node, local = divmod(index, cluster.gpus_per_node)
        domain = index // cluster.job_domain_size
        graph.add_node(
            gpu_id(index), kind="gpu", index=index, node=node, domain=domain, local=local
        )
        if cluster.nvlink_domain_size > 1:
            switch = f"nvswitch/{domain}"
            if switch not in graph:
                graph.add_node(switch, kind="nvswitch", domain=domain)
            graph.add_edge(
                gpu_id(index),
                switch,
                bandwidth_Bps=cluster.nvlink_bandwidth_Bps,
                latency_s=half_latency,
                tier="nvlink",
            )


def _add_network(graph: nx.Graph, cluster: ClusterSpec, num_gpus: int) -> None:
    nic_Bps = cluster.nic_bandwidth_Bps
    # Design uplink capacity of one leaf: its downlinks (one NIC port each) / oversubscription.
    leaf_uplink_Bps = cluster.gpus_per_leaf / cluster.gpus_per_nic * nic_Bps
    leaf_uplink_Bps /= cluster.leaf_oversubscription
    leaf_groups_per_pod = (
        cluster.gpus_per_pod // cluster.gpus_per_leaf_group if cluster.gpus_per_pod else None
    )
    num_nodes = math.ceil(num_gpus / cluster.gpus_per_node)
    num_pods = 1
    half_latency = cluster.network_latency_s / 2
    for index in range(num_gpus):
        node, local = divmod(index, cluster.gpus_per_node)
        rail = local // cluster.gpus_per_nic
        nic = f"nic/{node}/{rail}"
        if nic not in graph:
            graph.add_node(nic, kind="nic", node=node, rail=rail)
            leaf, group = _leaf_id(cluster, node, rail)
            pod = group // leaf_groups_per_pod if leaf_groups_per_pod else 0
            num_pods = max(num_pods, pod + 1)
            if leaf not in graph:
                graph.add_node(leaf, kind="leaf", leaf_group=group, pod=pod)
                spine = f"spine/{pod}"
                if spine not in graph:
                    graph.add_node(spine, kind="spine", pod=pod)
                graph.add_edge(
                    leaf,
                    spine,
                    bandwidth_Bps=leaf_uplink_Bps,
                    latency_s=cluster.switch_latency_s,
                    tier="network",
                )
            graph.add_edge(nic, leaf, bandwidth_Bps=nic_Bps, latency_s=half_latency, tier="network")
        # GPU to NIC over PCIe: modelled at the NIC rate (PCIe Gen5 x16 ~64 GB/s is not the
        # bottleneck of a 400 Gb/s NIC); the latency is folded into network_latency_s.
        graph.add_edge(gpu_id(index), nic, bandwidth_Bps=nic_Bps, latency_s=0.0, tier="pcie")
    if num_pods > 1 and leaf_groups_per_pod:
        leaves_per_group = cluster.nics_per_node if cluster.rail_optimized else 1
        pod_uplink_Bps = leaf_groups_per_pod * leaves_per_group * leaf_uplink_Bps
        pod_uplink_Bps /= cluster.spine_oversubscription
        graph.add_node("core", kind="core")
        for pod in range(num_pods):
            graph.add_edge(
                f"spine/{pod}",
                "core",
                bandwidth_Bps=pod_uplink_Bps,
                latency_s=cluster.switch_latency_s,
                tier="network",
            )
    graph.graph["num_nodes"] = num_nodes


def validate_graph(graph: nx.Graph) -> None:
    """Raise :class:`TopologyError` unless the graph is a usable fabric.

    Checks: at least one GPU; every node has a known ``kind``; every edge has
    a positive, finite ``bandwidth_Bps`` and a non-negative ``latency_s``;
    the graph is connected, so every GPU reaches every other.  Errors name
    the node or edge.
    """
    gpus = [n for n, kind in graph.nodes(data="kind") if kind == "gpu"]
    if not gpus:
        raise TopologyError("topology graph has no GPU")
    for node, kind in graph.nodes(data="kind"):
        if kind not in NODE_KINDS:
            raise TopologyError(f"graph node {node}: unknown kind {kind!r}")
    for a, b, data in graph.edges(data=True):
        bandwidth = data.get("bandwidth_Bps")
        if not isinstance(bandwidth, int | float) or not math.isfinite(bandwidth) or bandwidth <= 0:
            raise TopologyError(f"edge {a} -- {b}: bandwidth_Bps must be positive, got {bandwidth}")
        latency = data.get("latency_s", 0.0)
        if not isinstance(latency, int | float) or not math.isfinite(latency) or latency < 0:
            raise TopologyError(f"edge {a} -- {b}: latency_s must be >= 0, got {latency}")
    if len(gpus) > 1 and not nx.is_connected(graph):
        reached = nx.node_connected_component(graph, gpus[0])
        stranded = [g for g in gpus if g not in reached]
        name = graph.graph.get("cluster", "?")
        raise TopologyError(
            f"cluster '{name}': fabric is disconnected: {stranded[0]} cannot reach {gpus[0]} "
            f"({len(stranded)} of {len(gpus)} GPUs unreachable); check nics_per_node and the "
            "network fields"
        )


def count_kinds(graph: nx.Graph) -> dict[str, int]:
    """Number of graph nodes of each kind, in :data:`NODE_KINDS` order."""
    counts = Counter(kind for _, kind in graph.nodes(data="kind"))
    return {kind: counts[kind] for kind in NODE_KINDS if counts[kind]}


def cut_bandwidth_per_member_Bps(
    graph: nx.Graph, sources: Iterable[int], sinks: Iterable[int]
) -> float:
    """Max-flow (= min-cut) bandwidth from GPUs ``sources`` to ``sinks``, per source GPU.

    The exact, slow reference for :mod:`parsearch.topology.fabric`: when all
    ``sources`` send to ``sinks`` at once, each gets at most this much per
    direction.  Uses raw (line-rate) capacities, no efficiency factor.
    """
    src, dst = list(sources), list(sinks)
    flow = nx.DiGraph()
    for a, b, capacity in graph.edges(data="bandwidth_Bps"):
        flow.add_edge(a, b, capacity=capacity)
        flow.add_edge(b, a, capacity=capacity)
    for index in src:
        flow.add_edge("_source", gpu_id(index))  # no capacity attribute = unbounded
    for index in dst:
        flow.add_edge(gpu_id(index), "_sink")
    return float(nx.maximum_flow_value(flow, "_source", "_sink")) / len(src)
