"""Cluster files: what a GPU cluster is made of, loaded from YAML.

A cluster file (``topologies/<name>.yaml``) describes one kind of node and
the network that joins the nodes.  The file uses the units datasheets use
(GB/s for NVLink per GPU per direction, Gb/s line rate per NIC, µs);
:class:`ClusterSpec` holds SI values (bytes/s, s).  Every preset gives a
source for each number in ``sources`` (field -> text) and in comments.

Fields of a cluster file (required unless a default is given):

====================== ==========================================================
``name``               preset name
``gpu``                hardware profile name (``cost_models/hardware/<gpu>.yaml``)
``gpus_per_node``      GPUs per server (compute tray for NVL72 racks: 4)
``nvlink_domain_size`` GPUs joined by one NVLink/NVSwitch fabric (8 HGX, 72 NVL72)
``usable_domain_size`` GPUs of a domain one job gets (default: all; NVL72: 64 = 16 of 18
                       trays, leaving spares and keeping power-of-two groups in one rack)
``nvlink_bandwidth_GBps`` NVLink bandwidth per GPU per direction, GB/s
``nics_per_node``      scale-out NICs per node (0: no network)
``nic_bandwidth_Gbps`` line rate per NIC per direction, Gb/s
``fabric``             ``infiniband`` or ``ethernet`` (RoCE)
``rail_optimized``     NIC j of every node of a scalable unit goes to leaf j
``gpus_per_leaf``      GPUs whose NICs one leaf switch serves
``leaf_oversubscription``  leaf downlink : uplink capacity (1 = non-blocking)
``spine_oversubscription`` spine downlink : core uplink (default 1; used with pods)
``gpus_per_pod``       GPUs under one spine group (default: one pod, no core tier)
``nvlink_latency_us``  per-step latency of an NVLink collective
``network_latency_us`` per-step latency between two GPUs under the same leaf
``switch_latency_us``  added per further switch crossed (default 0.5)
``nvlink_efficiency``  achievable fraction of NVLink bandwidth (default 0.8)
``network_efficiency`` achievable fraction of NIC bandwidth (default 0.92 IB, 0.85 RoCE)
``max_gpus``           largest supported job (default: unlimited)
``gpu_power_limit_W``  GPU variant (:mod:`parsearch.topology.variants`): board power limit
``gpu_sm_clock_MHz``   ... SM clock lock
``gpu_memory_GiB``     ... memory per GPU
``gpu_hbm_bandwidth_TBps`` ... HBM bandwidth
``description``, ``sources``  free text
====================== ==========================================================
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsearch.errors import SpecError, TopologyError, parse_yaml_text
from parsearch.files import is_file
from parsearch.model.specs import short_repr
from parsearch.resources import data_dir
from parsearch.topology.hardware import list_gpu_profiles

FABRICS: tuple[str, ...] = ("infiniband", "ethernet")

_GB = 1e9  # GB/s -> B/s
_GBIT = 1e9 / 8  # Gb/s -> B/s
_US = 1e-6

_REQUIRED: tuple[str, ...] = (
    "name",
    "gpu",
    "gpus_per_node",
    "nvlink_domain_size",
    "nvlink_bandwidth_GBps",
    "nics_per_node",
    "nic_bandwidth_Gbps",
    "fabric",
    "rail_optimized",
    "gpus_per_leaf",
    "leaf_oversubscription",
    "nvlink_latency_us",
    "network_latency_us",
)
#: Cluster-file fields that vary the GPU, and the variant field each sets
#: (:data:`parsearch.topology.variants.VARIANT_FIELDS`).
GPU_VARIANT_FIELDS: dict[str, str] = {
    "gpu_power_limit_W": "power_limit_W",
    "gpu_sm_clock_MHz": "sm_clock_MHz",
    "gpu_memory_GiB": "hbm_capacity_GiB",
    "gpu_hbm_bandwidth_TBps": "hbm_bandwidth_TBps",
}
_OPTIONAL: tuple[str, ...] = (
    "description",
    "sources",
    "usable_domain_size",
    "max_gpus",
    "spine_oversubscription",
    "gpus_per_pod",
    "switch_latency_us",
    "nvlink_efficiency",
    "network_efficiency",
    *GPU_VARIANT_FIELDS,
)

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
#: Largest cluster file read.
MAX_FILE_BYTES = 1 * 2**20

# Defaults when a file omits an efficiency: formulas.md §9 (H100 ring busbw ~370 of 450 GB/s;
# NDR 46-48 of 50 GB/s per NIC); RoCE lower (no measured source; an assumption).
_DEFAULT_NVLINK_EFFICIENCY = 0.8
_DEFAULT_NETWORK_EFFICIENCY = {"infiniband": 0.92, "ethernet": 0.85}
_DEFAULT_SWITCH_LATENCY_US = 0.5


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
    switch_latency_s: float = _DEFAULT_SWITCH_LATENCY_US * _US
    nvlink_efficiency: float = _DEFAULT_NVLINK_EFFICIENCY
    network_efficiency: float = 0.92
    max_gpus: int | None = None
    usable_domain_size: int | None = None
    description: str = ""
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        owner = f"cluster '{self.name}'"
        for name in ("gpus_per_node", "nvlink_domain_size", "gpus_per_leaf"):
            _require_int(owner, name, getattr(self, name), minimum=1)
        _require_int(owner, "nics_per_node", self.nics_per_node, minimum=0)
        for name in ("nvlink_bandwidth_Bps", "nic_bandwidth_Bps"):
            _require_number(owner, name, getattr(self, name), positive=True)
        for name in ("nvlink_latency_s", "network_latency_s", "switch_latency_s"):
            _require_number(owner, name, getattr(self, name), positive=False)
        for name in ("leaf_oversubscription", "spine_oversubscription"):
            value = _require_number(owner, name, getattr(self, name), positive=True)
            if value < 1:
                raise TopologyError(f"{owner}: {name} must be >= 1 (1 = non-blocking), got {value}")
        for name in ("nvlink_efficiency", "network_efficiency"):
            value = _require_number(owner, name, getattr(self, name), positive=True)
            if value > 1:
                raise TopologyError(f"{owner}: {name} must be in (0, 1], got {value}")
        if self.fabric not in FABRICS:
            raise TopologyError(
                f"{owner}: fabric must be one of {', '.join(FABRICS)}, got {self.fabric!r}"
            )
        self._check_shapes(owner)

    def _check_shapes(self, owner: str) -> None:
        if self.usable_domain_size is not None:
            used = _require_int(owner, "usable_domain_size", self.usable_domain_size, minimum=1)
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
            _require_int(owner, "gpus_per_pod", self.gpus_per_pod, minimum=1)
            if self.gpus_per_pod % self.gpus_per_leaf_group:
                raise TopologyError(
                    f"{owner}: gpus_per_pod={self.gpus_per_pod} must be a multiple of the "
                    f"GPUs under one leaf group ({self.gpus_per_leaf_group})"
                )
        if self.max_gpus is not None:
            _require_int(owner, "max_gpus", self.max_gpus, minimum=1)

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


def _require_int(owner: str, name: str, value: Any, *, minimum: int) -> int:
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


def _require_number(owner: str, name: str, value: Any, *, positive: bool) -> float:
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


def _require_bool(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TopologyError(f"{owner}: field '{name}' must be true or false, got {value!r}")
    return value


def cluster_from_dict(data: Any, where: str) -> ClusterSpec:
    """Build a :class:`ClusterSpec` from a parsed cluster file.

    Errors name ``where`` (the file) and the field as written in the file.
    """
    if not isinstance(data, dict):
        raise TopologyError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise TopologyError(
            f"{where}: missing field '{missing[0]}' (required: {', '.join(missing)})"
        )
    unknown = sorted(str(key) for key in set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        close = difflib.get_close_matches(unknown[0], _REQUIRED + _OPTIONAL, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise TopologyError(f"{where}: unknown field '{unknown[0]}'{hint}")
    for key in ("name", "gpu"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise TopologyError(f"{where}: field '{key}' must be a non-empty text, "
                                f"got {short_repr(data[key])}")
    gpu = str(data["gpu"])
    known = list_gpu_profiles()
    if gpu not in known:
        raise TopologyError(
            f"{where}: field 'gpu': unknown GPU model '{gpu}'; known models: {', '.join(known)}"
        )
    gpu = _gpu_variant(data, gpu, where)
    fabric = str(data["fabric"]).lower()
    if fabric not in FABRICS:
        raise TopologyError(
            f"{where}: field 'fabric' must be one of {', '.join(FABRICS)}, got {data['fabric']!r}"
        )
    sources = data.get("sources") or {}
    if not isinstance(sources, dict):
        raise TopologyError(f"{where}: field 'sources' must map field names to source text")

    def num(key: str, default: float | None = None, *, positive: bool = True) -> float:
        value = data.get(key, default)
        return _require_number(where, key, value, positive=positive)

    def integer(key: str, minimum: int = 1) -> int:
        return _require_int(where, key, data[key], minimum=minimum)

    def optional_int(key: str) -> int | None:
        value = data.get(key)
        return None if value is None else _require_int(where, key, value, minimum=1)

    return ClusterSpec(
        name=str(data["name"]),
        gpu=gpu,
        gpus_per_node=integer("gpus_per_node"),
        nvlink_domain_size=integer("nvlink_domain_size"),
        nvlink_bandwidth_Bps=num("nvlink_bandwidth_GBps") * _GB,
        nics_per_node=integer("nics_per_node", minimum=0),
        nic_bandwidth_Bps=num("nic_bandwidth_Gbps") * _GBIT,
        fabric=fabric,
        rail_optimized=_require_bool(where, "rail_optimized", data["rail_optimized"]),
        gpus_per_leaf=integer("gpus_per_leaf"),
        leaf_oversubscription=num("leaf_oversubscription"),
        spine_oversubscription=num("spine_oversubscription", 1.0),
        gpus_per_pod=optional_int("gpus_per_pod"),
        nvlink_latency_s=num("nvlink_latency_us", positive=False) * _US,
        network_latency_s=num("network_latency_us", positive=False) * _US,
        switch_latency_s=num("switch_latency_us", _DEFAULT_SWITCH_LATENCY_US, positive=False)
        * _US,
        nvlink_efficiency=num("nvlink_efficiency", _DEFAULT_NVLINK_EFFICIENCY),
        network_efficiency=num("network_efficiency", _DEFAULT_NETWORK_EFFICIENCY[fabric]),
        max_gpus=optional_int("max_gpus"),
        usable_domain_size=optional_int("usable_domain_size"),
        description=str(data.get("description", "")).strip(),
        sources=tuple((str(k), str(v).strip()) for k, v in sources.items()),
    )


def _gpu_variant(data: dict[str, Any], gpu: str, where: str) -> str:
    """The ``gpu`` name with the file's ``gpu_*`` variant fields applied and checked."""
    fields = {}
    for key, field_name in GPU_VARIANT_FIELDS.items():
        if data.get(key) is not None:
            fields[field_name] = _require_number(where, key, data[key], positive=True)
    if not fields:
        return gpu
    from parsearch.topology.variants import load_variant_profile, variant_name

    name = variant_name(gpu, fields)
    try:
        load_variant_profile(name, {v: k for k, v in GPU_VARIANT_FIELDS.items()})
    except SpecError as error:
        raise TopologyError(f"{where}: {error}") from None
    return name


def topologies_dir() -> Path:
    """Folder of the built-in cluster files."""
    return data_dir("topologies")


def preset_names() -> list[str]:
    """Names of the built-in cluster presets, sorted."""
    return sorted(path.stem for path in topologies_dir().glob("*.yaml"))


def load_cluster_file(path: Path) -> ClusterSpec:
    """Read one cluster file; malformed files raise :class:`TopologyError` naming the field."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise TopologyError(f"cluster file {path} is over {MAX_FILE_BYTES:,} bytes; "
                                "a cluster file is a short YAML mapping")
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as error:
        raise TopologyError(f"cannot read cluster file {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise TopologyError(f"cluster file {path} is not UTF-8 text (byte {error.start}: "
                            f"{error.reason})") from None
    data = parse_yaml_text(text, str(path), TopologyError)
    return cluster_from_dict(data, str(path))


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """A preset by name (``"dgx-h100"``) or a cluster file by path."""
    path = Path(name_or_path)
    exists = is_file(path)
    if path.suffix in (".yaml", ".yml") or exists:
        if not exists:
            raise TopologyError(f"cluster file {path} does not exist")
        return load_cluster_file(path)
    preset = topologies_dir() / f"{name_or_path}.yaml"
    if not is_file(preset):
        names = preset_names()
        close = difflib.get_close_matches(str(name_or_path), names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise TopologyError(
            f"unknown cluster '{name_or_path}'; {hint}presets: {', '.join(names)} "
            "(or give a path to a cluster file)"
        )
    return load_cluster_file(preset)


def list_clusters() -> list[ClusterSpec]:
    """Every built-in preset, sorted by name."""
    return [load_cluster(name) for name in preset_names()]
