"""The cluster type: :class:`ClusterSpec`, one cluster description in SI units, checked
on construction.

What a cluster file may say and how it is read (its units, GPU names and GPU variants)
is :mod:`parsearch.topology.cluster`, which builds on this module and on
:mod:`parsearch.topology.variants` (a variant of a cluster is a :class:`ClusterSpec`
too); this module needs neither, so both can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from parsearch.errors import TopologyError
from parsearch.model.specs import short_repr

FABRICS: tuple[str, ...] = ("infiniband", "ethernet")

_US = 1e-6

#: Largest job parsearch models (GPUs): above the largest public clusters (~100k GPUs),
#: and the topology graph of this many GPUs still builds in seconds.
MAX_GPUS = 131_072
#: Accepted range of each number of a cluster file, in the file's units; far outside any
#: real hardware, so that no product of them overflows or rounds to zero.
FIELD_RANGES: dict[str, tuple[float, float]] = {
    "nvlink_bandwidth_GBps": (1e-3, 1e6),
    "nic_bandwidth_Gbps": (1e-3, 1e7),
    "leaf_oversubscription": (0.0, 1024.0),  # >= 1 checked by ClusterSpec
    "spine_oversubscription": (0.0, 1024.0),
    "nvlink_latency_us": (0.0, 1e6),
    "network_latency_us": (0.0, 1e6),
    "switch_latency_us": (0.0, 1e6),
    "host_memory_GB": (1e-3, 1e7),
}
#: Largest value of each integer field of a cluster file.
INT_MAXIMA: dict[str, int] = {
    "gpus_per_node": 4_096,
    "nics_per_node": 4_096,
    "nvlink_domain_size": MAX_GPUS,
    "usable_domain_size": MAX_GPUS,
    "gpus_per_leaf": MAX_GPUS,
    "gpus_per_pod": MAX_GPUS,
    "max_gpus": 2**31 - 1,
}
# Defaults when a file omits an efficiency: formulas.md §9 (H100 ring busbw ~370 of 450 GB/s;
# NDR 46-48 of 50 GB/s per NIC); RoCE lower (no measured source; an assumption).
DEFAULT_NVLINK_EFFICIENCY = 0.8
DEFAULT_NETWORK_EFFICIENCY = {"infiniband": 0.92, "ethernet": 0.85}
DEFAULT_SWITCH_LATENCY_US = 0.5


@dataclass(frozen=True)
class ClusterSpec:
    """One cluster description, SI units.  Validated on construction."""

    name: str
    gpu: str
    gpus_per_node: int
    nvlink_domain_size: int
    nvlink_bandwidth_Bps: float
    nics_per_node: int
    nic_bandwidth_Bps: float
    fabric: str
    rail_optimized: bool
    gpus_per_leaf: int
    leaf_oversubscription: float
    nvlink_latency_s: float
    network_latency_s: float
    spine_oversubscription: float = 1.0
    gpus_per_pod: int | None = None
    switch_latency_s: float = DEFAULT_SWITCH_LATENCY_US * _US
    nvlink_efficiency: float = DEFAULT_NVLINK_EFFICIENCY
    network_efficiency: float = 0.92
    #: achieved share of line rate of NCCL's ring/tree collectives across nodes
    #: (nccl-tests all_reduce_perf busbw / NIC total), where it falls below what sends
    #: reach (``network_efficiency``); ``None``: the same as sends
    network_collective_efficiency: float | None = None
    max_gpus: int | None = None
    usable_domain_size: int | None = None
    #: host (CPU) memory of one node, bytes (``None``: not stated, not checked)
    host_memory_bytes: float | None = None
    description: str = ""
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def host_memory_per_gpu_bytes(self) -> float | None:
        """Host memory one GPU's process can use: the node's, shared by its GPUs."""
        if self.host_memory_bytes is None:
            return None
        return self.host_memory_bytes / self.gpus_per_node

    @property
    def collective_efficiency(self) -> float:
        """Share of line rate data-parallel collectives reach across nodes."""
        if self.network_collective_efficiency is None:
            return self.network_efficiency
        return self.network_collective_efficiency

    def __post_init__(self) -> None:
        owner = f"cluster '{self.name}'"
        for name in ("gpus_per_node", "nvlink_domain_size", "gpus_per_leaf"):
            require_int(owner, name, getattr(self, name), minimum=1)
        require_int(owner, "nics_per_node", self.nics_per_node, minimum=0)
        for name in ("nvlink_bandwidth_Bps", "nic_bandwidth_Bps"):
            require_number(owner, name, getattr(self, name), positive=True)
        for name in ("nvlink_latency_s", "network_latency_s", "switch_latency_s"):
            require_number(owner, name, getattr(self, name), positive=False)
        for name in ("leaf_oversubscription", "spine_oversubscription"):
            value = require_number(owner, name, getattr(self, name), positive=True)
            if value < 1:
                raise TopologyError(f"{owner}: {name} must be >= 1 (1 = non-blocking), got {value}")
        if self.host_memory_bytes is not None:
            require_number(owner, "host_memory_bytes", self.host_memory_bytes, positive=True)
        for name in ("nvlink_efficiency", "network_efficiency", "network_collective_efficiency"):
            if getattr(self, name) is None:
                continue
            value = require_number(owner, name, getattr(self, name), positive=True)
            if value > 1:
                raise TopologyError(f"{owner}: {name} must be in (0, 1], got {value}")
        if self.fabric not in FABRICS:
            raise TopologyError(
                f"{owner}: fabric must be one of {', '.join(FABRICS)}, got {self.fabric!r}"
            )
        self._check_shapes(owner)

    def _check_shapes(self, owner: str) -> None:
        if self.usable_domain_size is not None:
            used = require_int(owner, "usable_domain_size", self.usable_domain_size, minimum=1)
            if used > self.nvlink_domain_size or used % self.gpus_per_node:
                raise TopologyError(
                    f"{owner}: usable_domain_size={used} must be a multiple of gpus_per_node="
                    f"{self.gpus_per_node} and at most nvlink_domain_size={self.nvlink_domain_size}"
                )
        if self.nvlink_domain_size % self.gpus_per_node:
            raise TopologyError(
                f"{owner}: nvlink_domain_size={self.nvlink_domain_size} must be a multiple of "
                f"gpus_per_node={self.gpus_per_node} (a domain is made of whole nodes)"
            )
        if self.nics_per_node and self.gpus_per_node % self.nics_per_node:
            raise TopologyError(
                f"{owner}: gpus_per_node={self.gpus_per_node} must be a multiple of "
                f"nics_per_node={self.nics_per_node} (each NIC serves the same number of GPUs)"
            )
        unit = self.gpus_per_nic if self.rail_optimized else self.gpus_per_node
        if self.gpus_per_leaf % unit:
            what = "GPUs per NIC" if self.rail_optimized else "gpus_per_node"
            raise TopologyError(
                f"{owner}: gpus_per_leaf={self.gpus_per_leaf} must be a multiple of {what}={unit}"
            )
        if self.gpus_per_pod is not None:
            require_int(owner, "gpus_per_pod", self.gpus_per_pod, minimum=1)
            if self.gpus_per_pod % self.gpus_per_leaf_group:
                raise TopologyError(
                    f"{owner}: gpus_per_pod={self.gpus_per_pod} must be a multiple of the "
                    f"GPUs under one leaf group ({self.gpus_per_leaf_group})"
                )
        if self.max_gpus is not None:
            require_int(owner, "max_gpus", self.max_gpus, minimum=1)

    @property
    def job_domain_size(self) -> int:
        """GPUs of one NVLink domain that consecutive ranks fill (``usable_domain_size``)."""
        return self.usable_domain_size or self.nvlink_domain_size

    @property
    def gpus_per_nic(self) -> int:
        """GPUs that share one NIC (``gpus_per_node / nics_per_node``; all GPUs if no NIC)."""
        if not self.nics_per_node:
            return self.gpus_per_node
        return self.gpus_per_node // self.nics_per_node

    @property
    def nodes_per_leaf_group(self) -> int:
        """Nodes under one leaf group: a rail-optimized scalable unit, or one leaf."""
        if self.rail_optimized:
            return self.gpus_per_leaf // self.gpus_per_nic
        return self.gpus_per_leaf // self.gpus_per_node

    @property
    def gpus_per_leaf_group(self) -> int:
        """GPUs whose traffic stays below the spine (one scalable unit / one leaf)."""
        return self.nodes_per_leaf_group * self.gpus_per_node

    @property
    def nic_bandwidth_per_gpu_Bps(self) -> float:
        """Line-rate NIC bandwidth per GPU per direction (all GPUs sending at once)."""
        return self.nics_per_node * self.nic_bandwidth_Bps / self.gpus_per_node

    def source_of(self, field_name: str) -> str:
        """The source text given for a file field, or ``""``."""
        return dict(self.sources).get(field_name, "")


def require_int(owner: str, name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyError(f"{owner}: field '{name}' must be an integer, "
                            f"got {short_repr(value)}")
    if value < minimum:
        raise TopologyError(f"{owner}: field '{name}' must be >= {minimum}, "
                            f"got {short_repr(value)}")
    maximum = INT_MAXIMA.get(name)
    if maximum is not None and value > maximum:
        raise TopologyError(f"{owner}: field '{name}' = {short_repr(value)} exceeds the largest "
                            f"supported value, {maximum:,}")
    return value


def require_number(owner: str, name: str, value: Any, *, positive: bool) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not -1e300 < value < 1e300):  # NaN and Infinity fail too; huge ints never float
        raise TopologyError(f"{owner}: field '{name}' must be a finite number, "
                            f"got {short_repr(value)}")
    if positive and value <= 0:
        raise TopologyError(f"{owner}: field '{name}' must be positive, got {value}")
    if not positive and value < 0:
        raise TopologyError(f"{owner}: field '{name}' must not be negative, got {value}")
    low, high = FIELD_RANGES.get(name, (-math.inf, math.inf))
    if not low <= value <= high:
        raise TopologyError(f"{owner}: field '{name}' = {value:g} is outside the supported "
                            f"range {low:g} .. {high:g}")
    return float(value)


def require_bool(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TopologyError(f"{owner}: field '{name}' must be true or false, got {value!r}")
    return value
