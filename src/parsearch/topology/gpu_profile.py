"""GPU datasheet profiles: the :class:`GpuProfile` type and reading one profile file.

Profiles live in ``cost_models/hardware/<name>.yaml`` (see
:func:`parsearch.resources.data_dir`); every number in them carries its
source in a comment and the file's ``source`` field.  Units in the files are
the ones datasheets use (TFLOP/s, GiB, TB/s); :class:`GpuProfile` holds SI
values (FLOP/s, bytes, bytes/s).

This module reads a file as it is written: a variant file (``variant_of``) or a name
with ``@`` fields is resolved by :mod:`parsearch.topology.variants`, which builds on
this module, and :func:`parsearch.topology.hardware.load_gpu_profile` (above both) is
the loader that takes either.

>>> data, where = read_profile_file("h100-sxm")
>>> round(gpu_profile_from_dict(data, where).peak_flops["bf16"] / 1e12, 1)
989.4
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from parsearch.errors import SpecError
from parsearch.files import is_file
from parsearch.resources import data_dir

#: Precision keys of :attr:`GpuProfile.peak_flops` ("fp8" covers MXFP8, "fp4" is NVFP4).
PEAK_PRECISIONS: tuple[str, ...] = ("bf16", "fp8", "fp4")

_TERA = 1e12
_GIB = 2**30
_POWER_FIELDS = ("tdp_W", "min_power_W", "sustained_clock_MHz", "max_clock_MHz",
                 "power_clock_exponent")
_REQUIRED = ("name", "peak_tflops", "hbm_capacity_GiB", "hbm_bandwidth_TBps", "source")
_OPTIONAL = ("description", "compute_capability", "host_link_GBps", "sm_count",
             "large_matmul_fraction", "exp_Tps", "tdp_W", "min_power_W",
             "sustained_clock_MHz", "max_clock_MHz", "power_clock_exponent",
             "weight_only_4bit_TBps")


@dataclass(frozen=True)
class GpuProfile:
    """One GPU model.  ``peak_flops`` is dense (no 2:4 sparsity), FLOP/s; a missing key
    means the chip has no tensor-core support for that precision."""

    name: str
    peak_flops: dict[str, float]
    hbm_bytes: float
    hbm_bandwidth_Bps: float
    source: str
    description: str = ""
    #: CUDA compute capability (8.0 Ampere, 9.0 Hopper, 10.x Blackwell); ``None``: unknown.
    #: Launch settings depend on it (``CUDA_DEVICE_MAX_CONNECTIONS``, the FP8 recipe).
    compute_capability: float | None = None
    #: Host memory <-> GPU copy bandwidth per GPU and direction with every GPU of the
    #: node copying (PCIe, or NVLink-C2C on Grace superchips); ``None``: not stated.
    host_link_Bps: float | None = None
    #: Streaming multiprocessors: what a communication kernel's SM budget is a share of;
    #: ``None``: not stated.
    sm_count: int | None = None
    #: Best measured large-matmul throughput over the dense peak, by precision (a
    #: maximum-achievable-matmul sweep); a precision not listed was not measured.
    large_matmul_fraction: dict[str, float] = field(default_factory=dict)
    #: Exponentials per second of the special function units (the softmax of fused
    #: attention, :mod:`parsearch.cost.softmax`); ``None``: not stated.
    exp_per_s: float | None = None
    #: Rated board power (W) the peaks are delivered at, and the lowest power limit the
    #: board accepts; ``None``: not stated (no power-limit variants of this GPU).
    tdp_W: float | None = None
    min_power_W: float | None = None
    #: SM clock (MHz) sustained under dense tensor-core load at ``tdp_W`` (what the
    #: profile's GEMM efficiency was measured at), and the highest clock the board runs.
    sustained_clock_MHz: float | None = None
    max_clock_MHz: float | None = None
    #: gamma of sustained clock ~ power ** gamma (``None``: the default of
    #: :mod:`parsearch.topology.power`).
    power_clock_exponent: float | None = None
    #: Bytes/s of 4-bit weights a weight-only GEMM kernel can stream on a GPU without 4-bit
    #: tensor cores: each element is converted to BF16 in registers before the MMA, and on
    #: Hopper that conversion, not HBM, sets the rate; ``None``: not measured (no cap).
    weight_only_4bit_Bps: float | None = None
    #: What a variant (:mod:`parsearch.topology.variants`) changed; ``""``: the datasheet
    #: part.  A variant keeps the base part's ``name`` (the efficiency profiles name it).
    variant: str = ""


def hardware_dir() -> Path:
    """Folder of the built-in GPU profiles."""
    return data_dir("cost_models") / "hardware"


def list_gpu_profiles() -> list[str]:
    """Names of the built-in GPU profiles, sorted."""
    return sorted(path.stem for path in hardware_dir().glob("*.yaml"))


def _positive(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{where}: field '{key}' must be a positive number, got {value!r}")
    if value <= 0:
        raise SpecError(f"{where}: field '{key}' must be a positive number, got {value}")
    return float(value)


def gpu_profile_from_dict(data: Any, where: str) -> GpuProfile:
    """Build a :class:`GpuProfile` from parsed YAML; errors name ``where`` and the field."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    for key in _REQUIRED:
        if key not in data:
            raise SpecError(f"{where}: missing field '{key}'")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise SpecError(f"{where}: unknown field '{unknown[0]}'; known: "
                        f"{', '.join(_REQUIRED + _OPTIONAL)}")
    peaks = data["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise SpecError(f"{where}: field 'peak_tflops' must map precisions to TFLOP/s")
    flops: dict[str, float] = {}
    for precision, value in peaks.items():
        if precision not in PEAK_PRECISIONS:
            raise SpecError(
                f"{where}: peak_tflops has unknown precision '{precision}'; "
                f"use {', '.join(PEAK_PRECISIONS)}"
            )
        flops[precision] = _positive(where, f"peak_tflops.{precision}", value) * _TERA
    if "bf16" not in flops:
        raise SpecError(f"{where}: missing field 'peak_tflops.bf16'")
    return GpuProfile(
        name=str(data["name"]),
        peak_flops=flops,
        hbm_bytes=_positive(where, "hbm_capacity_GiB", data["hbm_capacity_GiB"]) * _GIB,
        hbm_bandwidth_Bps=_positive(where, "hbm_bandwidth_TBps", data["hbm_bandwidth_TBps"])
        * _TERA,
        source=str(data["source"]).strip(),
        description=str(data.get("description", "")),
        compute_capability=(None if data.get("compute_capability") is None else
                            _positive(where, "compute_capability", data["compute_capability"])),
        host_link_Bps=(None if data.get("host_link_GBps") is None else
                       _positive(where, "host_link_GBps", data["host_link_GBps"]) * 1e9),
        sm_count=(None if data.get("sm_count") is None else
                  int(_positive(where, "sm_count", data["sm_count"]))),
        large_matmul_fraction=_fractions(where, data.get("large_matmul_fraction")),
        exp_per_s=(None if data.get("exp_Tps") is None else
                   _positive(where, "exp_Tps", data["exp_Tps"]) * _TERA),
        weight_only_4bit_Bps=(None if data.get("weight_only_4bit_TBps") is None else
                              _positive(where, "weight_only_4bit_TBps",
                                        data["weight_only_4bit_TBps"]) * _TERA),
        **{key: (None if data.get(key) is None else _positive(where, key, data[key]))
           for key in _POWER_FIELDS},
    )


def _fractions(where: str, data: object) -> dict[str, float]:
    """``large_matmul_fraction``: precision -> a share of the dense peak in (0, 1]."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{where}: large_matmul_fraction must map precisions to shares of "
                        f"the peak, got {str(data)[:40]}")
    out: dict[str, float] = {}
    for key, value in data.items():
        share = _positive(where, f"large_matmul_fraction.{key}", value)
        if share > 1.0:
            raise SpecError(f"{where}: large_matmul_fraction.{key} must be at most 1 (a share "
                            f"of the dense peak), got {value!r}")
        out[str(key)] = share
    return out


def read_profile_file(name: str) -> tuple[Any, str]:
    """The parsed YAML of a built-in profile (by name) or a profile file (by path), and
    where it came from."""
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and is_file(path)):
        path = hardware_dir() / f"{name}.yaml"
    if not is_file(path):
        known = ", ".join(list_gpu_profiles())
        raise SpecError(f"unknown GPU model '{name}'; known models: {known}")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")), str(path)
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML ({error})") from None
