"""GPU variants: a datasheet part with a power limit, a clock lock or other memory.

A variant is a base hardware profile plus a few fields, applied once:

====================== ===================================================================
``power_limit_W``      board power limit (``nvidia-smi -pl``): the tensor-core,
                       special-function and in-register 4-bit weight conversion rates
                       scale with the sustained SM clock (:mod:`parsearch.topology.power`);
                       HBM bandwidth does not
``sm_clock_MHz``       SM clock lock (``nvidia-smi -lgc``): the same rates scale with
                       ``min(lock, power-limited clock) / sustained clock at rated power``
``hbm_capacity_GiB``   memory per GPU (the 94/95 GB parts); what fits changes
``hbm_bandwidth_TBps`` HBM bandwidth (HBM2e parts: 2.4 TB/s); memory-bound work changes
``max_power_W``        the board's highest power limit (a lower-power board, e.g. 400 W)
``max_clock_MHz``      the board's highest SM clock
====================== ===================================================================

Variants are named three ways, all resolved by :func:`load_variant_profile`:

* a hardware file with ``variant_of: <base>`` and the fields (``h100-sxm-500w``);
* a name with the fields after ``@``: ``"h100-sxm@power_limit_W=500,hbm_capacity_GiB=94"``
  (what a cluster's ``gpu`` becomes when a cluster file or the command line sets them,
  so every ``load_gpu_profile(cluster.gpu)`` sees the same part);
* both: ``"h100-nvl@power_limit_W=350"`` (fields after ``@`` win).

The derived profile keeps the base part's ``name`` (the efficiency profiles are chosen
by it) and says what changed in ``variant``.

>>> gpu = load_variant_profile("h100-sxm@power_limit_W=500")
>>> round(gpu.peak_flops["bf16"] / 1e12), gpu.name
(894, 'h100-sxm')
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from parsearch.errors import SpecError
from parsearch.topology.cluster_spec import ClusterSpec
from parsearch.topology.gpu_profile import (
    GpuProfile,
    gpu_profile_from_dict,
    read_profile_file,
)
from parsearch.topology.power import compute_speed, sustained_clock_MHz

_GIB = 2**30
_TERA = 1e12

#: Fields of a variant and the widest range accepted for each (units as named); a
#: GPU's own limits (its minimum and rated power, its highest clock) narrow the first two.
VARIANT_FIELDS: dict[str, tuple[float, float]] = {
    "power_limit_W": (50.0, 5_000.0),
    "sm_clock_MHz": (100.0, 5_000.0),
    "hbm_capacity_GiB": (1.0, 4_096.0),
    "hbm_bandwidth_TBps": (0.1, 100.0),
    "max_power_W": (50.0, 5_000.0),
    "max_clock_MHz": (100.0, 5_000.0),
}
_UNITS = {"power_limit_W": "W", "sm_clock_MHz": "MHz", "hbm_capacity_GiB": "GiB",
          "hbm_bandwidth_TBps": "TB/s", "max_power_W": "W", "max_clock_MHz": "MHz"}
#: Fields a variant hardware file may carry besides the variant fields.
_FILE_FIELDS = ("name", "description", "variant_of", "source", "sources")
#: Lowest power limit accepted when a profile states none: a quarter of the rated power
#: (NVIDIA H100 SXM boards accept 200 of 700 W; Ujeniya et al., arXiv 2604.11391, cap
#: H100s from 200 W).
_DEFAULT_MIN_POWER_SHARE = 0.25
_MAX_DEPTH = 4


def parse_variant_spec(text: str, where: str = "GPU variant") -> dict[str, float]:
    """``"power_limit_W=500,hbm_capacity_GiB=94"`` -> the fields (checked by name and
    number; ranges are checked when applied)."""
    fields: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in VARIANT_FIELDS:
            raise SpecError(f"{where}: {part!r} is not FIELD=NUMBER with FIELD one of "
                            f"{', '.join(VARIANT_FIELDS)}")
        try:
            fields[key] = float(value)
        except ValueError:
            raise SpecError(f"{where}: field '{key}' must be a number, got "
                            f"{value.strip()!r}") from None
    return fields


def variant_name(base: str, fields: dict[str, float]) -> str:
    """The name that carries ``fields`` on top of ``base`` (fields already in ``base``'s
    ``@`` part are replaced).

    >>> variant_name("h100-sxm", {"power_limit_W": 500.0})
    'h100-sxm@power_limit_W=500'
    >>> variant_name("h100-sxm@power_limit_W=500", {"hbm_capacity_GiB": 94.0})
    'h100-sxm@power_limit_W=500,hbm_capacity_GiB=94'
    """
    root, _, spec = base.partition("@")
    merged = {**parse_variant_spec(spec), **fields}
    if not merged:
        return root
    ordered = [k for k in VARIANT_FIELDS if k in merged]
    return root + "@" + ",".join(f"{k}={merged[k]:g}" for k in ordered)


def _resolve(name: str, depth: int = 0) -> tuple[GpuProfile, dict[str, float], list[str]]:
    """``(datasheet part, merged variant fields, labels)`` of a name or variant file."""
    if depth > _MAX_DEPTH:
        raise SpecError(f"GPU variant '{name}': variant_of chain longer than {_MAX_DEPTH}")
    base, _, spec = name.partition("@")
    data, where = read_profile_file(base)
    if isinstance(data, dict) and "variant_of" in data:
        root, fields, labels = _resolve(str(data["variant_of"]), depth + 1)
        fields = {**fields, **_file_fields(data, where)}
        labels = [*labels, str(data.get("name", base))]
    else:
        root, fields, labels = gpu_profile_from_dict(data, where), {}, []
    if spec:
        fields = {**fields, **parse_variant_spec(spec, f"GPU variant '{name}'")}
    return root, fields, labels


def _file_fields(data: dict[str, Any], where: str) -> dict[str, float]:
    unknown = sorted(str(k) for k in set(data) - set(VARIANT_FIELDS) - set(_FILE_FIELDS))
    if unknown:
        raise SpecError(f"{where}: unknown field '{unknown[0]}' in a variant file; known: "
                        f"{', '.join((*_FILE_FIELDS, *VARIANT_FIELDS))}")
    fields: dict[str, float] = {}
    for key in VARIANT_FIELDS:
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SpecError(f"{where}: field '{key}' must be a number, got {value!r}")
            fields[key] = float(value)
    return fields


def check_variant(gpu: GpuProfile, fields: dict[str, float],
                  names: dict[str, str] | None = None) -> None:
    """Raise :class:`SpecError` naming the field, its value and the allowed range when a
    field is out of range for ``gpu``.  ``names``: how the caller spells each field
    (``--gpu-power-limit``)."""
    names = names or {}
    for key, value in fields.items():
        low, high = VARIANT_FIELDS[key]
        _in_range(gpu, names.get(key, key), value, low, high, " " + _UNITS[key])
    max_power = fields.get("max_power_W", gpu.tdp_W)
    if "power_limit_W" in fields:
        if gpu.tdp_W is None or max_power is None:
            raise SpecError(f"{names.get('power_limit_W', 'power_limit_W')}: GPU "
                            f"'{gpu.name}' states no rated power (tdp_W) in its hardware "
                            "profile, so a power limit cannot be priced")
        low = gpu.min_power_W or _DEFAULT_MIN_POWER_SHARE * gpu.tdp_W
        _in_range(gpu, names.get("power_limit_W", "power_limit_W"), fields["power_limit_W"],
                  low, min(max_power, gpu.tdp_W), " W (the board's minimum and maximum "
                  "power limit)")
    if "sm_clock_MHz" in fields:
        high = fields.get("max_clock_MHz", gpu.max_clock_MHz)
        if high is None or gpu.sustained_clock_MHz is None:
            raise SpecError(f"{names.get('sm_clock_MHz', 'sm_clock_MHz')}: GPU '{gpu.name}' "
                            "states no sustained or maximum SM clock in its hardware "
                            "profile, so a clock lock cannot be priced")
        _in_range(gpu, names.get("sm_clock_MHz", "sm_clock_MHz"), fields["sm_clock_MHz"],
                  VARIANT_FIELDS["sm_clock_MHz"][0], high, " MHz (up to the board's "
                  "highest SM clock)")


def _in_range(gpu: GpuProfile, name: str, value: float, low: float, high: float,
              unit: str) -> None:
    if not math.isfinite(value) or not low <= value <= high:
        raise SpecError(f"{name} = {value:g} is outside the allowed range {low:g} .. "
                        f"{high:g}{unit} for GPU '{gpu.name}'")


def apply_variant(gpu: GpuProfile, fields: dict[str, float], label: str = "",
                  names: dict[str, str] | None = None) -> GpuProfile:
    """``gpu`` with ``fields`` applied (checked first, :func:`check_variant`)."""
    if not fields:
        return gpu
    check_variant(gpu, fields, names)
    power = fields.get("power_limit_W")
    lock = fields.get("sm_clock_MHz")
    speed = compute_speed(gpu, power, lock)
    notes = [label] if label else []
    if power is not None or lock is not None:
        clock = sustained_clock_MHz(gpu, power, lock)
        what = " and ".join(x for x in (f"{power:g} W" if power is not None else "",
                                        f"clock lock {lock:g} MHz" if lock is not None else "")
                            if x)
        notes.append(f"{what}: sustained SM clock {clock:,.0f} of {gpu.sustained_clock_MHz:,.0f}"
                     f" MHz, tensor, SFU and 4-bit conversion rates x{speed:.3f}")
    changes: dict[str, Any] = {
        "peak_flops": {k: v * speed for k, v in gpu.peak_flops.items()},
        "exp_per_s": None if gpu.exp_per_s is None else gpu.exp_per_s * speed,
        # the rate of 4-bit weights converted in registers is the SMs' instruction rate
        # (GpuProfile.weight_only_4bit_Bps), so it follows the clock as the tensor rates do
        "weight_only_4bit_Bps": (None if gpu.weight_only_4bit_Bps is None
                                 else gpu.weight_only_4bit_Bps * speed),
    }
    if "hbm_capacity_GiB" in fields:
        changes["hbm_bytes"] = fields["hbm_capacity_GiB"] * _GIB
        notes.append(f"{fields['hbm_capacity_GiB']:g} GiB HBM")
    if "hbm_bandwidth_TBps" in fields:
        changes["hbm_bandwidth_Bps"] = fields["hbm_bandwidth_TBps"] * _TERA
        notes.append(f"{fields['hbm_bandwidth_TBps']:g} TB/s HBM")
    if power is not None or lock is not None:
        # the derived part delivers its (scaled) peaks at this clock and power, so the
        # power law applied to it again composes (it is scale-free)
        changes["sustained_clock_MHz"] = sustained_clock_MHz(gpu, power, lock)
    if power is not None:
        changes["tdp_W"] = power
    if "max_clock_MHz" in fields:
        changes["max_clock_MHz"] = fields["max_clock_MHz"]
    variant = "; ".join(notes)
    return dataclasses.replace(gpu, **changes, variant=variant,
                               description=f"{gpu.description} ({variant})")


def load_variant_profile(name: str, names: dict[str, str] | None = None) -> GpuProfile:
    """The profile of a variant name or variant file (see the module docstring)."""
    root, fields, labels = _resolve(name)
    if "max_power_W" in fields and "power_limit_W" not in fields:
        # a lower-power board runs at its own maximum unless told otherwise
        fields = {**fields, "power_limit_W": min(fields["max_power_W"], root.tdp_W or math.inf)}
    return apply_variant(root, fields, " / ".join(labels), names)


#: Accepted NVLink bandwidth per GPU and direction (GB/s) for an override.
NVLINK_RANGE_GBPS = (1.0, 10_000.0)
_SHORT = {"power_limit_W": "{:g}W", "sm_clock_MHz": "{:g}MHz", "hbm_capacity_GiB": "{:g}GiB",
          "hbm_bandwidth_TBps": "{:g}TBps"}


def cluster_variant(cluster: ClusterSpec, fields: dict[str, float] | None = None,
                    nvlink_GBps: float | None = None,
                    names: dict[str, str] | None = None) -> ClusterSpec:
    """``cluster`` with its GPU varied by ``fields`` and its NVLink bandwidth per GPU and
    direction set to ``nvlink_GBps`` (the H800's 200 GB/s); checked here, so errors name
    the field as ``names`` spells it.  The name gains a suffix (``dgx-h100+500W``), so
    results and caches keyed by cluster name keep the variant apart."""
    fields = {k: v for k, v in (fields or {}).items() if v is not None}
    names = names or {}
    if not fields and nvlink_GBps is None:
        return cluster
    changes: dict[str, Any] = {}
    suffix = [_SHORT[k].format(v) for k, v in fields.items() if k in _SHORT]
    if fields:
        gpu = variant_name(cluster.gpu, fields)
        load_variant_profile(gpu, names)  # checks the fields against this GPU
        changes["gpu"] = gpu
    if nvlink_GBps is not None:
        low, high = NVLINK_RANGE_GBPS
        if not (math.isfinite(nvlink_GBps) and low <= nvlink_GBps <= high):
            raise SpecError(f"{names.get('nvlink_GBps', 'nvlink_GBps')} = {nvlink_GBps:g} is "
                            f"outside the allowed range {low:g} .. {high:g} GB/s per GPU and "
                            "direction")
        changes["nvlink_bandwidth_Bps"] = nvlink_GBps * 1e9
        suffix.append(f"nvlink{nvlink_GBps:g}GBps")
    note = "GPU variant: " + ", ".join(suffix)
    return dataclasses.replace(
        cluster, **changes, name=f"{cluster.name}+{'+'.join(suffix)}",
        description=f"{cluster.description} ({note})".strip(),
        sources=(*cluster.sources, ("gpu_variant", note + " (parsearch.topology.variants)")))


__all__ = ["NVLINK_RANGE_GBPS", "VARIANT_FIELDS", "apply_variant", "check_variant",
           "cluster_variant", "load_variant_profile", "parse_variant_spec", "variant_name"]
