"""Efficiency profiles: how much of the datasheet peak real kernels reach.

One profile per GPU generation lives in ``cost_models/efficiency/<name>.yaml``
and lists the GPU profiles it covers.  The numbers are *calibrated* (one set
per generation, never per run) against the published runs in
``src/parsearch/data/published_runs.csv``; each file says which starting
points it took from the literature.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from parsearch.errors import SpecError
from parsearch.resources import data_dir


@dataclass(frozen=True)
class EfficiencyProfile:
    """Achieved fractions of peak and fixed overheads for one GPU generation.

    * ``gemm_max_efficiency[precision]``: fraction of that precision's dense
      peak a large GEMM reaches;
    * ``gemm_half_flops``: the per-call GEMM size (FLOPs) at which the
      efficiency is half its maximum, ``eta(F) = eta_max * F / (F + F_half)``
      (a smooth form of Calculon's size-stepped matrix efficiency);
    * ``grouped_gemm_factor``: MoE grouped GEMMs relative to a dense GEMM of
      the same size;
    * ``attention_efficiency``: fused (flash) attention, fraction of the BF16 peak,
      for long blocks;
    * ``attention_half_block``: the query/key block length (tokens) at which the
      attention kernel reaches half of that: a rank's block is ``s / cp``
      (context parallelism runs the ring over blocks of the local chunk);
    * ``elementwise_bytes_per_hidden``: HBM bytes per token per layer per
      hidden unit moved by non-GEMM kernels (norms, residuals, activations,
      RoPE, casts), forward + backward;
    * ``moe_bytes_per_hidden``: the same for MoE permute/unpermute and router
      per routed token copy;
    * ``quantize_bytes_per_hidden``: the same for FP8/FP4 casts, scaling and
      transposes of GEMM inputs, only when training in FP8 or FP4
      (formulas.md §7.7: "quantize/transpose/amax kernels add memory-bound time");
    * ``hbm_efficiency``: achieved fraction of HBM bandwidth;
    * ``layer_overhead_s``: launch/host time per layer per micro-batch
      (forward + backward);
    * ``step_overhead_s``: fixed time per optimizer step;
    * ``tp_overlap``, ``ep_overlap``, ``pp_overlap``: fraction of that
      communication hidden behind compute (0 = fully exposed);
    * ``moe_imbalance``: max/mean tokens per expert rank.
    """

    name: str
    gpus: tuple[str, ...]
    gemm_max_efficiency: dict[str, float]
    gemm_half_flops: float
    grouped_gemm_factor: float
    attention_efficiency: float
    attention_half_block: float
    elementwise_bytes_per_hidden: float
    moe_bytes_per_hidden: float
    quantize_bytes_per_hidden: float
    hbm_efficiency: float
    layer_overhead_s: float
    step_overhead_s: float
    tp_overlap: float
    ep_overlap: float
    pp_overlap: float
    moe_imbalance: float
    source: str


def efficiency_dir() -> Path:
    """Folder of the built-in efficiency profiles."""
    return data_dir("cost_models") / "efficiency"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(f"efficiency profile {path}: cannot read it: {error}") from None
    if not isinstance(data, dict):
        raise SpecError(f"efficiency profile {path}: expected a mapping at the top level")
    return data


def parse_efficiency_profile(data: dict[str, Any], where: str) -> EfficiencyProfile:
    """Validate a profile mapping; errors name the file and the field."""
    names = [f.name for f in fields(EfficiencyProfile)]
    missing = [n for n in names if n not in data]
    if missing:
        raise SpecError(f"efficiency profile {where}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise SpecError(f"efficiency profile {where}: unknown field(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for name in names:
        value = data[name]
        if name in ("name", "source"):
            values[name] = str(value)
        elif name == "gpus":
            values[name] = tuple(str(v) for v in value)
        elif name == "gemm_max_efficiency":
            values[name] = {str(k): _fraction(where, f"{name}.{k}", v) for k, v in value.items()}
        elif name in ("tp_overlap", "ep_overlap", "pp_overlap", "attention_efficiency",
                      "hbm_efficiency", "grouped_gemm_factor"):
            values[name] = _fraction(where, name, value)
        else:
            values[name] = _non_negative(where, name, value)
    if values["moe_imbalance"] < 1.0:
        raise SpecError(f"efficiency profile {where}: moe_imbalance must be >= 1 (max/mean)")
    return EfficiencyProfile(**values)


def _non_negative(where: str, name: str, value: Any) -> float:
    if isinstance(value, str):  # YAML 1.1 reads "2.0e9" (no exponent sign) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise SpecError(f"efficiency profile {where}: {name} must be a number >= 0, got {value!r}")
    return float(value)


def _fraction(where: str, name: str, value: Any) -> float:
    number = _non_negative(where, name, value)
    if number > 1.0:
        raise SpecError(f"efficiency profile {where}: {name} must be in [0, 1], got {value!r}")
    return number


def load_efficiency_profile(name_or_path: str) -> EfficiencyProfile:
    """A built-in profile by name (``hopper``) or a YAML file by path."""
    path = Path(name_or_path)
    if not path.is_file():
        path = efficiency_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in efficiency_dir().glob("*.yaml")))
        raise SpecError(f"unknown efficiency profile {name_or_path!r}; built-in: {known}")
    return parse_efficiency_profile(_read(path), str(path))


def efficiency_for_gpu(gpu_name: str) -> EfficiencyProfile:
    """The built-in profile whose ``gpus`` list names ``gpu_name``."""
    for path in sorted(efficiency_dir().glob("*.yaml")):
        profile = parse_efficiency_profile(_read(path), str(path))
        if gpu_name in profile.gpus:
            return profile
    raise SpecError(
        f"no efficiency profile covers GPU {gpu_name!r}; add it to the `gpus` list of a "
        f"file in {efficiency_dir()} or pass --efficiency FILE"
    )
