"""Cluster files: what a GPU cluster is made of, loaded from YAML.

The type a file becomes, :class:`ClusterSpec`, is :mod:`parsearch.topology.cluster_spec`
(re-exported here); this module reads files, and resolves a file's GPU variant fields
through :mod:`parsearch.topology.variants`, which sits between the two.

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
``network_collective_efficiency`` ... of NCCL ring/tree collectives across nodes
                       (nccl-tests all_reduce_perf busbw / the node's NIC total), used for
                       the data-parallel collectives; default: ``network_efficiency``
``max_gpus``           largest supported job (default: unlimited)
``host_memory_GB``     host (CPU) memory per node, GB: holds CPU-offloaded activations
                       (default: not stated, not checked)
``gpu_power_limit_W``  GPU variant (:mod:`parsearch.topology.variants`): board power limit
``gpu_sm_clock_MHz``   ... SM clock lock
``gpu_memory_GiB``     ... memory per GPU
``gpu_hbm_bandwidth_TBps`` ... HBM bandwidth
``description``, ``sources``  free text
====================== ==========================================================
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from parsearch.errors import SpecError, TopologyError, parse_yaml_text
from parsearch.files import is_file
from parsearch.model.specs import short_repr
from parsearch.resources import data_dir
from parsearch.topology.cluster_spec import (
    DEFAULT_NETWORK_EFFICIENCY,
    DEFAULT_NVLINK_EFFICIENCY,
    DEFAULT_SWITCH_LATENCY_US,
    FABRICS,
    FIELD_RANGES,
    INT_MAXIMA,
    MAX_GPUS,
    ClusterSpec,
    require_bool,
    require_int,
    require_number,
)
from parsearch.topology.gpu_profile import list_gpu_profiles
from parsearch.topology.variants import load_variant_profile, variant_name

__all__ = [
    "FABRICS",
    "FIELD_RANGES",
    "GPU_VARIANT_FIELDS",
    "INT_MAXIMA",
    "MAX_FILE_BYTES",
    "MAX_GPUS",
    "ClusterSpec",
    "cluster_from_dict",
    "list_clusters",
    "load_cluster",
    "load_cluster_file",
    "preset_names",
    "topologies_dir",
]

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
    "network_collective_efficiency",
    "host_memory_GB",
    *GPU_VARIANT_FIELDS,
)

#: Largest cluster file read.
MAX_FILE_BYTES = 1 * 2**20


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
        return require_number(where, key, value, positive=positive)

    def integer(key: str, minimum: int = 1) -> int:
        return require_int(where, key, data[key], minimum=minimum)

    def optional_int(key: str) -> int | None:
        value = data.get(key)
        return None if value is None else require_int(where, key, value, minimum=1)

    return ClusterSpec(
        name=str(data["name"]),
        gpu=gpu,
        gpus_per_node=integer("gpus_per_node"),
        nvlink_domain_size=integer("nvlink_domain_size"),
        nvlink_bandwidth_Bps=num("nvlink_bandwidth_GBps") * _GB,
        nics_per_node=integer("nics_per_node", minimum=0),
        nic_bandwidth_Bps=num("nic_bandwidth_Gbps") * _GBIT,
        fabric=fabric,
        rail_optimized=require_bool(where, "rail_optimized", data["rail_optimized"]),
        gpus_per_leaf=integer("gpus_per_leaf"),
        leaf_oversubscription=num("leaf_oversubscription"),
        spine_oversubscription=num("spine_oversubscription", 1.0),
        gpus_per_pod=optional_int("gpus_per_pod"),
        nvlink_latency_s=num("nvlink_latency_us", positive=False) * _US,
        network_latency_s=num("network_latency_us", positive=False) * _US,
        switch_latency_s=num("switch_latency_us", DEFAULT_SWITCH_LATENCY_US, positive=False)
        * _US,
        nvlink_efficiency=num("nvlink_efficiency", DEFAULT_NVLINK_EFFICIENCY),
        network_efficiency=num("network_efficiency", DEFAULT_NETWORK_EFFICIENCY[fabric]),
        network_collective_efficiency=(num("network_collective_efficiency")
                                       if "network_collective_efficiency" in data else None),
        max_gpus=optional_int("max_gpus"),
        usable_domain_size=optional_int("usable_domain_size"),
        host_memory_bytes=(num("host_memory_GB") * 1e9 if "host_memory_GB" in data else None),
        description=str(data.get("description", "")).strip(),
        sources=tuple((str(k), str(v).strip()) for k, v in sources.items()),
    )


def _gpu_variant(data: dict[str, Any], gpu: str, where: str) -> str:
    """The ``gpu`` name with the file's ``gpu_*`` variant fields applied and checked."""
    fields = {}
    for key, field_name in GPU_VARIANT_FIELDS.items():
        if data.get(key) is not None:
            fields[field_name] = require_number(where, key, data[key], positive=True)
    if not fields:
        return gpu
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
