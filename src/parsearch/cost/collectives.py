"""Alpha-beta time of NCCL collectives on a placed process group.

All functions are elementwise over numpy arrays (or plain floats), so one
call prices a collective for a whole column of layouts.  A group is described
by the arrays of :meth:`parsearch.topology.fabric.Fabric.group_links`:

* ``size`` ranks, ``members_per_domain`` of them in each NVLink domain it
  spans (``domains = size / members_per_domain``);
* ``nvlink_bandwidth_Bps`` and ``network_bandwidth_Bps``: achievable bytes
  per second per member per direction on each tier;
* ``latency_s``: the per-step latency of the slowest tier it crosses.

Sizes are in bytes and follow nccl-tests' convention (``doc/PERFORMANCE.md``):
for all-reduce ``S`` is the buffer each rank holds; for all-gather and
reduce-scatter ``S`` is the full (gathered) buffer; for all-to-all ``S`` is
what each rank sends in total (including the share it keeps).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

Num = float | np.ndarray


@dataclass(frozen=True)
class LinkArrays:
    """The fields of a placed group that the collective formulas read."""

    size: Num
    members_per_domain: Num
    nvlink_bandwidth_Bps: Num
    network_bandwidth_Bps: Num
    nvlink_latency_s: Num
    network_latency_s: Num

    @classmethod
    def from_group_links(
        cls, links: Mapping[str, np.ndarray], nvlink_latency_s: float, network_latency_s: float
    ) -> LinkArrays:
        """Build from ``Fabric.group_links`` output and the cluster's per-tier latencies."""
        return cls(
            size=np.asarray(links["size"], dtype=np.float64),
            members_per_domain=np.asarray(links["members_per_domain"], dtype=np.float64),
            nvlink_bandwidth_Bps=np.asarray(links["nvlink_bandwidth_Bps"], dtype=np.float64),
            network_bandwidth_Bps=np.asarray(links["network_bandwidth_Bps"], dtype=np.float64),
            nvlink_latency_s=nvlink_latency_s,
            network_latency_s=network_latency_s,
        )


def split_group(link: LinkArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(members in one domain k, domains spanned M, group size n), as float arrays."""
    n = np.maximum(np.asarray(link.size, dtype=np.float64), 1.0)
    k = np.clip(np.asarray(link.members_per_domain, dtype=np.float64), 1.0, n)
    return k, n / k, n


def safe_div(num: Num, den: Num) -> np.ndarray:
    den = np.asarray(den, dtype=np.float64)
    return np.where(den > 0, np.asarray(num, dtype=np.float64) / np.where(den > 0, den, 1.0), 0.0)


def _log2_steps(count: np.ndarray) -> np.ndarray:
    return np.ceil(np.log2(np.maximum(count, 1.0)))


def reduce_scatter_time(link: LinkArrays, size_bytes: Num) -> np.ndarray:
    """Reduce-scatter (or, by symmetry, all-gather) of a ``size_bytes`` buffer.

    Bandwidth term: (n-1)/n * S / B (nccl-tests PERFORMANCE.md, busbw factor).
    Across domains it is hierarchical (formulas.md §7.1): an intra-domain pass
    over k members moves (k-1)/k * S on NVLink, then each member reduces its
    1/k slice over the M domains on the network, (M-1)/M * S/k per member.
    Latency: NCCL runs reduce-scatter and all-gather as a ring (no tree; its PAT
    algorithm only with one GPU per node), whose n-1 steps cross the network M-1
    times: (n-M) NVLink steps plus (M-1) network steps (NCCL's own latency model,
    NVIDIA/nccl@5067397c src/graph/tuning.cc, ring: nsteps = nRanks-1,
    nInterSteps = nNodes-1), so the latency grows linearly with the domains.
    """
    return np.where(split_group(link)[2] > 1, _bandwidth_s(link, size_bytes) + ring_latency(link),
                    0.0)


def _bandwidth_s(link: LinkArrays, size_bytes: Num) -> np.ndarray:
    """The hierarchical bandwidth term of one reduce-scatter (or all-gather) pass."""
    k, m, _ = split_group(link)
    s = np.asarray(size_bytes, dtype=np.float64)
    return (safe_div((k - 1.0) / k * s, link.nvlink_bandwidth_Bps)
            + safe_div((m - 1.0) / m * s / k, link.network_bandwidth_Bps))


def ring_latency(link: LinkArrays) -> np.ndarray:
    """Seconds of latency of one ring reduce-scatter / all-gather call over ``link``:
    ``(n - M)`` NVLink steps and ``(M - 1)`` network steps (NCCL tuning.cc ring model).

    >>> link = LinkArrays(16, 8, 1.0, 1.0, 1e-6, 1e-5)   # 16 ranks, 8 per domain
    >>> round(float(ring_latency(link)) * 1e6, 6)         # 14 x 1 us + 1 x 10 us
    24.0
    """
    _, m, n = split_group(link)
    return (n - m) * np.asarray(link.nvlink_latency_s) + (m - 1.0) * np.asarray(
        link.network_latency_s)


def tree_latency(link: LinkArrays) -> np.ndarray:
    """Seconds of latency of one all-reduce call over ``link`` as NCCL's tree runs it at
    scale: twice ``(k - 1)`` NVLink steps and ``log2 M`` network steps (NCCL tuning.cc,
    tree all-reduce: 2 x ((nRanks/nNodes - 1) x intraLat + log2(nNodes) x interLat))."""
    k, m, _ = split_group(link)
    return 2.0 * ((k - 1.0) * np.asarray(link.nvlink_latency_s)
                  + _log2_steps(m) * np.asarray(link.network_latency_s))


def all_gather_time(link: LinkArrays, size_bytes: Num) -> np.ndarray:
    """All-gather of a ``size_bytes`` gathered buffer: the mirror of reduce-scatter."""
    return reduce_scatter_time(link, size_bytes)


def all_reduce_time(link: LinkArrays, size_bytes: Num) -> np.ndarray:
    """All-reduce: the bandwidth of a reduce-scatter plus an all-gather, 2(n-1)/n * S / B
    (nccl-tests busbw), at the latency of NCCL's tree (:func:`tree_latency`)."""
    return np.where(split_group(link)[2] > 1,
                    2.0 * _bandwidth_s(link, size_bytes) + tree_latency(link), 0.0)


def all_to_all_time(link: LinkArrays, size_bytes: Num) -> np.ndarray:
    """All-to-all where each rank sends ``size_bytes`` spread evenly over the group.

    (k-1)/n of it stays in the domain (NVLink), (n-k)/n crosses the network;
    both proceed at once, so the slower sets the time (formulas.md §7.1
    hierarchical all-to-all).  Latency: one step per peer domain plus one on NVLink.
    """
    k, m, n = split_group(link)
    s = np.asarray(size_bytes, dtype=np.float64)
    intra = safe_div((k - 1.0) / n * s, link.nvlink_bandwidth_Bps)
    inter = safe_div((n - k) / n * s, link.network_bandwidth_Bps)
    latency = np.where(k > 1, link.nvlink_latency_s, 0.0) + (m - 1.0) * link.network_latency_s
    return np.where(n > 1, np.maximum(intra, inter) + latency, 0.0)


def p2p_time(link: LinkArrays, size_bytes: Num) -> np.ndarray:
    """One point-to-point send between pipeline neighbours: S / B + latency.

    Neighbours in one domain use NVLink; otherwise the network.
    """
    k, _m, n = split_group(link)
    s = np.asarray(size_bytes, dtype=np.float64)
    inside = k >= n
    bandwidth = np.where(inside, link.nvlink_bandwidth_Bps, link.network_bandwidth_Bps)
    latency = np.where(inside, link.nvlink_latency_s, link.network_latency_s)
    return np.where(n > 1, safe_div(s, bandwidth) + latency, 0.0)
