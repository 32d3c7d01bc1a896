"""A compact summary of a topology graph, for scoring many layouts quickly.

:func:`build_fabric` walks the graph once and keeps, per GPU, the ids of its
node, NVLink domain, leaf group and pod, and the bandwidth each tier leaves
for that GPU when every GPU communicates at once (process groups of one kind
partition the ranks, so all GPUs run that kind's collective together):

* NVLink: the GPU's edge to its domain's NVSwitch;
* NIC share: a NIC's uplink capacity divided by the GPUs attached to it;
* leaf uplink share: a leaf's uplink capacity divided by the GPUs below it
  (what crossing the spine costs; oversubscription shows up here);
* pod uplink share: a pod's core uplink divided by the GPUs in it.

:meth:`Fabric.group_link` then answers "where does this process group sit
and what bandwidth does each member get" from these arrays only; results
are cached per ``(stride, size)`` inside the instance.

Rail-optimized fabrics: traffic between GPUs of one scalable unit stays on
its rail leaves (NCCL rings keep rail alignment, PXN forwards over NVLink),
so only groups spanning several scalable units pay the leaf uplinks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import networkx as nx
import numpy as np

from parsearch.errors import TopologyError
from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.graph import build_graph, validate_graph
from parsearch.topology.hardware import GpuProfile, load_gpu_profile

TIERS: tuple[str, ...] = ("nvlink", "network")


@dataclass(frozen=True)
class GroupLink:
    """Where one kind of process group sits, for the worst group of that shape.

    The groups are ``{r0 + stride*i, i < size}`` under block placement.  Spans
    are maxima and bandwidths minima over all groups of that shape (the
    slowest group sets the pace of a synchronous step).  Bandwidths are per
    member per direction and achievable (line rate × the cluster's efficiency).
    """

    size: int
    stride: int
    nvlink_domains_spanned: int
    nodes_spanned: int
    leaf_groups_spanned: int
    members_per_domain: int
    tier: str
    nvlink_bandwidth_Bps: float
    network_bandwidth_Bps: float
    bandwidth_Bps: float
    latency_s: float


_INT_FIELDS = ("size", "stride", "nvlink_domains_spanned", "nodes_spanned",
               "leaf_groups_spanned", "members_per_domain")


class Fabric:
    """The per-GPU summary of one (cluster, num_gpus) topology graph."""

    def __init__(self, cluster: ClusterSpec, num_gpus: int, gpu: GpuProfile, graph: nx.Graph):
        self.cluster = cluster
        self.num_gpus = num_gpus
        self.gpu = gpu
        self._summarize(graph)
        self._cache: dict[tuple[int, int], GroupLink] = {}

    @classmethod
    def from_summary(cls, cluster: ClusterSpec, num_gpus: int, gpu: GpuProfile,
                     summary: dict[str, object]) -> Fabric:
        """A fabric from per-GPU arrays computed elsewhere (:mod:`parsearch.topology.summary`)."""
        fabric = cls.__new__(cls)
        fabric.cluster, fabric.num_gpus, fabric.gpu = cluster, num_gpus, gpu
        for name, value in summary.items():
            setattr(fabric, name, value)
        fabric._cache = {}
        return fabric

    # -- summary (one walk over the graph) ---------------------------------------------
    def _summarize(self, graph: nx.Graph) -> None:
        n = self.num_gpus
        self.node_of = np.zeros(n, dtype=np.int64)
        self.domain_of = np.zeros(n, dtype=np.int64)
        self.leaf_group_of = np.zeros(n, dtype=np.int64)
        self.pod_of = np.zeros(n, dtype=np.int64)
        self.nvlink_Bps = np.full(n, self.cluster.nvlink_bandwidth_Bps)
        self.nic_share_Bps = np.zeros(n)
        self.leaf_uplink_share_Bps = np.full(n, np.inf)
        self.pod_uplink_share_Bps = np.full(n, np.inf)
        nvlink_up = network_up = spine_up = core_up = 0.0
        leaf_members: dict[str, list[int]] = {}
        for name, attrs in graph.nodes(data=True):
            if attrs["kind"] != "gpu":
                continue
            i = attrs["index"]
            self.node_of[i] = attrs["node"]
            self.domain_of[i] = attrs["domain"]
            for neighbour, edge in graph[name].items():
                kind = graph.nodes[neighbour]["kind"]
                if kind == "nvswitch":
                    self.nvlink_Bps[i] = edge["bandwidth_Bps"]
                    nvlink_up = max(nvlink_up, edge["latency_s"])
                elif kind == "nic":
                    share, leaf, latency = self._nic_share(graph, neighbour, edge)
                    self.nic_share_Bps[i] += share
                    network_up = max(network_up, latency)
                    leaf_members.setdefault(leaf, []).append(i)
        pod_gpus: dict[int, int] = {}
        for leaf, members in leaf_members.items():
            attrs = graph.nodes[leaf]
            self.leaf_group_of[members] = attrs["leaf_group"]
            self.pod_of[members] = attrs["pod"]
            pod_gpus[attrs["pod"]] = pod_gpus.get(attrs["pod"], 0) + len(members)
        for leaf, members in leaf_members.items():
            spine = self._up(graph, leaf, "spine")
            if spine is None:
                continue
            uplink = graph.edges[leaf, spine]
            spine_up = max(spine_up, uplink["latency_s"])
            self.leaf_uplink_share_Bps[members] = uplink["bandwidth_Bps"] / len(members)
            core = self._up(graph, spine, "core")
            if core is not None:
                core_edge = graph.edges[spine, core]
                core_up = max(core_up, core_edge["latency_s"])
                pod = graph.nodes[spine]["pod"]
                self.pod_uplink_share_Bps[members] = core_edge["bandwidth_Bps"] / pod_gpus[pod]
        # Latency of one step at each tier: up and down the path (formulas.md §7.1 α terms).
        self.tier_latency_s = {
            "nvlink": 2 * nvlink_up,
            "leaf": 2 * network_up,
            "spine": 2 * (network_up + spine_up),
            "core": 2 * (network_up + spine_up + core_up),
        }

    @staticmethod
    def _up(graph: nx.Graph, node: str, kind: str) -> str | None:
        for neighbour in graph[node]:
            if graph.nodes[neighbour]["kind"] == kind:
                return neighbour
        return None

    @staticmethod
    def _nic_share(graph: nx.Graph, nic: str, gpu_edge: dict) -> tuple[float, str, float]:
        # Path bottleneck GPU -> NIC -> leaf, with the NIC's uplink shared by its GPUs.
        users = sum(1 for nb in graph[nic] if graph.nodes[nb]["kind"] == "gpu")
        leaf = Fabric._up(graph, nic, "leaf")
        if leaf is None:
            raise TopologyError(f"NIC {nic} has no leaf switch")
        uplink = graph.edges[nic, leaf]
        share = min(gpu_edge["bandwidth_Bps"], uplink["bandwidth_Bps"] / users)
        return share, leaf, gpu_edge["latency_s"] + uplink["latency_s"]

    # -- queries -----------------------------------------------------------------------
    def strided_groups(self, stride: int, size: int) -> np.ndarray:
        """All groups ``{r0 + stride*i}`` as a ``(count, size)`` array of ranks."""
        stride, size = int(stride), int(size)
        if stride < 1 or size < 1 or self.num_gpus % (stride * size):
            raise TopologyError(
                f"no process groups of size {size} and stride {stride} on {self.num_gpus} GPUs: "
                f"stride*size={stride * size} must divide the GPU count"
            )
        ranks = np.arange(self.num_gpus, dtype=np.int64)
        blocks = ranks.reshape(-1, size, stride)  # [block, member, offset]
        return blocks.transpose(0, 2, 1).reshape(-1, size)

    def group_link(self, stride: int, size: int) -> GroupLink:
        """Placement of the strided process groups ``(stride, size)`` (cached).

        >>> from parsearch.topology.cluster import load_cluster
        >>> fabric = build_fabric(load_cluster("dgx-h100"), 64)
        >>> link = fabric.group_link(1, 8)          # TP=8
        >>> link.tier, link.nvlink_domains_spanned, round(link.bandwidth_Bps / 1e9)
        ('nvlink', 1, 369)
        >>> link = fabric.group_link(8, 8)          # DP=8 over 8 nodes
        >>> link.tier, link.nodes_spanned, round(link.bandwidth_Bps / 1e9)
        ('network', 8, 46)
        """
        key = (int(stride), int(size))
        if key not in self._cache:
            groups = self.strided_groups(*key)
            self._cache[key] = self.link_for_groups(groups, stride=key[0])
        return self._cache[key]

    def link_for_groups(self, groups: np.ndarray, *, stride: int = 0) -> GroupLink:
        """Placement of explicit groups (a ``(count, size)`` rank array); not cached.

        Works for any partition, strided or not (``stride`` is only recorded).
        """
        groups = np.sort(np.asarray(groups, dtype=np.int64), axis=1)
        size = groups.shape[1]
        domains = _spans(self.domain_of[groups])
        leaf_groups = _spans(self.leaf_group_of[groups])
        pods = _spans(self.pod_of[groups])
        c = self.cluster
        nvlink_Bps = float(self.nvlink_Bps[groups].min()) * c.nvlink_efficiency
        crosses = domains > 1
        tier, network_Bps = "nvlink", 0.0
        latency = self.tier_latency_s["nvlink"]
        if crosses.any():
            member = self.nic_share_Bps[groups]
            member = np.where(
                (leaf_groups > 1)[:, None], np.minimum(member, self.leaf_uplink_share_Bps[groups]),
                member,
            )
            member = np.where(
                (pods > 1)[:, None], np.minimum(member, self.pod_uplink_share_Bps[groups]), member
            )
            network_Bps = float(member[crosses].min()) * c.network_efficiency
            tier = "network"
            level = "core" if pods.max() > 1 else "spine" if leaf_groups.max() > 1 else "leaf"
            latency = self.tier_latency_s[level]
        bandwidth = min(nvlink_Bps, network_Bps) if tier == "network" else nvlink_Bps
        return GroupLink(
            size=int(size),
            stride=int(stride),
            nvlink_domains_spanned=int(domains.max()),
            nodes_spanned=int(_spans(self.node_of[groups]).max()),
            leaf_groups_spanned=int(leaf_groups.max()),
            members_per_domain=_max_run(self.domain_of[groups]),
            tier=tier,
            nvlink_bandwidth_Bps=nvlink_Bps,
            network_bandwidth_Bps=network_Bps,
            bandwidth_Bps=bandwidth,
            latency_s=float(latency),
        )

    def group_links(
        self, strides: np.ndarray, sizes: np.ndarray, *, invalid: str = "raise"
    ) -> dict[str, np.ndarray]:
        """Vectorized :meth:`group_link`: one entry per ``(strides[k], sizes[k])``.

        Returns arrays named like the :class:`GroupLink` fields (``tier`` as
        strings) plus ``crosses_network`` (bool).  Only the distinct pairs are
        computed.  ``invalid="nan"`` gives NaN bandwidths (and -1 counts)
        for pairs whose groups do not tile the GPUs instead of raising.
        """
        strides = np.asarray(strides, dtype=np.int64).ravel()
        sizes = np.asarray(sizes, dtype=np.int64).ravel()
        if strides.shape != sizes.shape:
            raise ValueError("strides and sizes must have the same length")
        # One int64 key per pair (sizes <= num_gpus), far faster than np.unique(axis=0).
        base = np.int64(max(self.num_gpus, int(sizes.max(initial=0))) + 1)
        keys, inverse = np.unique(strides * base + sizes, return_inverse=True)
        inverse = inverse.ravel()
        out: dict[str, list] = {f.name: [] for f in fields(GroupLink)}
        for stride, size in zip(keys // base, keys % base, strict=True):
            ok = stride >= 1 and size >= 1 and self.num_gpus % (stride * size) == 0
            if not ok and invalid == "nan":
                for f in fields(GroupLink):
                    out[f.name].append(-1 if f.name in _INT_FIELDS else "" if f.name == "tier"
                                       else np.nan)
                continue
            link = self.group_link(int(stride), int(size))
            for f in fields(GroupLink):
                out[f.name].append(getattr(link, f.name))
        result = {name: np.asarray(values)[inverse] for name, values in out.items()}
        result["crosses_network"] = result["tier"] == "network"
        return result


def _spans(ids: np.ndarray) -> np.ndarray:
    """Distinct ids per row of a ``(count, size)`` array."""
    ordered = np.sort(ids, axis=1)
    return 1 + np.count_nonzero(np.diff(ordered, axis=1), axis=1)


def _max_run(ids: np.ndarray) -> int:
    """Most members of one group that share an id (e.g. a domain)."""
    count = ids.shape[0]
    keys = np.arange(count, dtype=np.int64)[:, None] * (int(ids.max()) + 1) + ids
    return int(np.unique(keys, return_counts=True)[1].max())


def build_fabric(cluster: ClusterSpec, num_gpus: int, *, graph: nx.Graph | None = None) -> Fabric:
    """Build (unless given), validate and summarize the graph of ``num_gpus`` GPUs."""
    if graph is None:
        graph = build_graph(cluster, num_gpus)
    validate_graph(graph)
    return Fabric(cluster, num_gpus, load_gpu_profile(cluster.gpu), graph)
