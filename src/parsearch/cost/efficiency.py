"""Efficiency profiles: how much of the datasheet peaks real kernels reach.

One profile per GPU generation lives in ``cost_models/efficiency/<name>.yaml``
and lists the GPU profiles it covers.  Every number is a *physical* quantity
(a fraction of a datasheet peak, a time per kernel, a per-call latency) with
a prior and a range taken from cited microbenchmarks (the ``priors`` section
of the file, sources in ``cost_models/references/``).  Calibration
(:mod:`parsearch.validation.calibration`) fits a few of them to published
runs, regularised toward the priors and never outside the ranges; a value
that lands on a bound fails calibration.  The ``uncertainty`` section holds
the out-of-sample error band of each kind of prediction (dense or MoE),
written by the calibration.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from parsearch.cost.coverage import ArchitectureCoverage, parse_coverage
from parsearch.errors import SpecError
from parsearch.files import is_file
from parsearch.resources import data_dir

# Fields that are fractions of a peak (validated to lie in (0, 1]).
FRACTION_FIELDS: frozenset[str] = frozenset({
    "grouped_gemm_efficiency", "attention_forward_efficiency",
    "attention_backward_efficiency", "hbm_efficiency", "alltoall_efficiency",
    "comm_sm_share",
})


@dataclass(frozen=True)
class Prior:
    """A parameter's literature value and cited physical range."""

    value: float
    low: float
    high: float
    source: str

    def contains(self, x: float, tolerance: float = 1e-9) -> bool:
        return self.low - tolerance <= x <= self.high + tolerance


@dataclass(frozen=True)
class ErrorBand:
    """Out-of-sample ``log(predicted / measured)`` quantiles of one kind of prediction."""

    low: float
    high: float
    n: int
    method: str = ""
    #: Precisions of the runs behind the band (empty: not recorded).
    precisions: tuple[str, ...] = ()

    def interval(self, predicted: float) -> tuple[float, float]:
        """Range of the measurement implied by the band: ``pred / e^high .. pred / e^low``."""
        return predicted / math.exp(self.high), predicted / math.exp(self.low)

    def covers(self, precision: str) -> bool:
        """Whether runs of ``precision`` were behind the band (or it does not say)."""
        return not self.precisions or precision in self.precisions

    @property
    def relative_halfwidth(self) -> float:
        """Half the band's width as a fraction (``0.1`` = about ±10 %)."""
        return (math.exp(self.high - self.low) - 1.0) / 2.0


def band_for(bands: dict[str, ErrorBand], moe: bool,
             precision: str) -> tuple[ErrorBand | None, bool]:
    """The error band of a prediction of this kind, and whether it is an extrapolation.

    The band of its kind (``dense`` / ``moe``) when runs of its precision were behind
    it; otherwise no run like it was in the calibration set, and the band is the
    union of every kind's band (the widest error seen on this generation), flagged.

    >>> dense = ErrorBand(-0.2, -0.1, 5, precisions=("fp8",))
    >>> moe = ErrorBand(-0.2, 0.2, 38, precisions=("bf16", "fp8"))
    >>> band_for({"dense": dense, "moe": moe}, False, "fp8") == (dense, False)
    True
    >>> pooled, extrapolated = band_for({"dense": dense, "moe": moe}, False, "bf16")
    >>> (pooled.low, pooled.high, extrapolated)
    (-0.2, 0.2, True)
    """
    band = bands.get("moe" if moe else "dense")
    if band is None or band.covers(precision):
        return band, False
    return ErrorBand(min(b.low for b in bands.values()), max(b.high for b in bands.values()),
                     sum(b.n for b in bands.values()),
                     f"no {'MoE' if moe else 'dense'} {precision} run in the calibration "
                     "set: the union of this generation's bands"), True


@dataclass(frozen=True)
class EfficiencyProfile:
    """Achieved fractions of peak, per-kernel and per-call costs for one GPU generation.

    * ``gemm_efficiency[precision]``: a large GEMM's fraction of that
      precision's dense datasheet peak (cuBLAS large-matmul measurements);
    * ``gemm_half_flops``: per-call FLOPs at which a BF16 GEMM reaches half of it,
      ``eta(F) = eta_max * F / (F + F_half)``, and ``gemm_half_flops_ceiling`` (optional):
      the BF16 large-GEMM share of the peak the sweep that measured it reached; with it,
      a GEMM's fixed time per call is the measured ``F_half / (ceiling * peak)`` in every
      precision, never a fitted quantity (:func:`parsearch.cost.compute.gemm_half_flops`);
    * ``grouped_gemm_efficiency``: an MoE grouped GEMM relative to one dense
      GEMM of the same per-expert shape (tile padding is counted separately);
    * ``attention_forward_efficiency``, ``attention_backward_efficiency``:
      fused attention forward / backward, fraction of the BF16 peak for long
      blocks (FlashAttention-2/3, cuDNN), and ``attention_half_block``: the
      block length (tokens, ``s / cp``) at which it is half of that;
    * ``hbm_efficiency``: achieved fraction of HBM bandwidth (STREAM-like);
    * ``memory_bound_factor``: counted HBM bytes of non-GEMM kernels times
      this factor (fusion and extra copies the count does not see);
    * ``kernel_overhead_s``: fixed GPU time per kernel (launch and tail);
    * ``host_time_per_layer_s``: CPU time to issue one layer's forward and
      backward kernels in eager mode; a layer whose GPU work is shorter waits
      for the host (CUDA graphs remove most of it);
    * ``step_overhead_s``: fixed time per optimizer step;
    * ``alltoall_efficiency``: NCCL all-to-all busbw across the network
      relative to the ring-collective bandwidth the cluster file states
      (inside an NVLink domain all-to-all runs at the ring rate);
    * ``collective_latency_s``: base latency of one collective call;
    * ``comm_sm_share``: share of SMs communication kernels occupy while they
      overlap compute (the overlapped compute runs that much slower);
    * ``moe_imbalance``: max/mean tokens per expert rank;
    * ``cluster_speed`` (optional, default 1): a user's cluster's delivered speed over
      what the other factors model (power cap, clocks, software overhead), fitted by
      ``parsearch calibrate`` only when its runs fall outside what the cited ranges
      allow (:mod:`parsearch.validation.cluster_speed`); every step time is divided by it.
    """

    name: str
    gpus: tuple[str, ...]
    gemm_efficiency: dict[str, float]
    gemm_half_flops: float
    grouped_gemm_efficiency: float
    attention_forward_efficiency: float
    attention_backward_efficiency: float
    attention_half_block: float
    hbm_efficiency: float
    memory_bound_factor: float
    kernel_overhead_s: float
    host_time_per_layer_s: float
    step_overhead_s: float
    alltoall_efficiency: float
    collective_latency_s: float
    comm_sm_share: float
    moe_imbalance: float
    source: str
    priors: dict[str, Prior] = field(default_factory=dict)
    uncertainty: dict[str, ErrorBand] = field(default_factory=dict)
    gemm_half_flops_ceiling: float | None = None
    coverage: ArchitectureCoverage | None = None  # what the calibration runs had
    cluster_speed: float = 1.0

    def get(self, name: str) -> float:
        """A parameter by its dotted name (``gemm_efficiency.fp8``)."""
        if "." in name:
            outer, key = name.split(".", 1)
            return float(getattr(self, outer)[key])
        return float(getattr(self, name))

    def with_values(self, values: dict[str, float]) -> EfficiencyProfile:
        """A copy with some parameters (dotted names) replaced."""
        changes: dict[str, Any] = {}
        gemm = dict(self.gemm_efficiency)
        for name, value in values.items():
            if name.startswith("gemm_efficiency."):
                gemm[name.split(".", 1)[1]] = float(value)
            else:
                changes[name] = float(value)
        return replace(self, gemm_efficiency=gemm, **changes)

    def out_of_range(self) -> list[str]:
        """Parameters outside their cited range (``name=value not in [low, high]``)."""
        bad = []
        for name, prior in self.priors.items():
            with contextlib.suppress(KeyError, AttributeError):
                value = self.get(name)
                if not prior.contains(value):
                    bad.append(f"{name}={value:.4g} not in [{prior.low:.4g}, {prior.high:.4g}]")
        return bad


#: Scalar fields a profile file may leave out.
_OPTIONAL_SCALARS = ("gemm_half_flops_ceiling",)
_SCALAR_FIELDS = tuple(
    f.name for f in fields(EfficiencyProfile)
    if f.name not in ("name", "gpus", "gemm_efficiency", "source", "priors", "uncertainty",
                      "coverage", "cluster_speed", *_OPTIONAL_SCALARS)
)


def efficiency_dir() -> Path:
    """Folder of the built-in efficiency profiles."""
    return data_dir("cost_models") / "efficiency"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as error:  # one line
        raise SpecError(f"efficiency profile {path}: cannot read it: "
                        f"{' '.join(str(error).split())[:300]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"efficiency profile {path}: expected a mapping at the top level")
    return data


def parse_efficiency_profile(data: dict[str, Any], where: str) -> EfficiencyProfile:
    """Validate a profile mapping; errors name the file and the field."""
    required = ["name", "gpus", "gemm_efficiency", "source", *_SCALAR_FIELDS]
    missing = [n for n in required if n not in data]
    if missing:
        raise SpecError(f"efficiency profile {where}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - {*required, "priors", "uncertainty", "calibrated_on",
                                  "cluster_speed", *_OPTIONAL_SCALARS})
    if unknown:
        raise SpecError(f"efficiency profile {where}: unknown field(s) {', '.join(unknown)}")
    gemm = data["gemm_efficiency"]
    if not isinstance(gemm, dict) or not gemm:
        raise SpecError(f"efficiency profile {where}: gemm_efficiency must map precision "
                        "to a fraction, e.g. {bf16: 0.75, fp8: 0.65}")
    if not isinstance(data["gpus"] or [], list):
        raise SpecError(f"efficiency profile {where}: gpus must be a list of GPU names, "
                        f"got {str(data['gpus'])[:40]}")
    values: dict[str, Any] = {
        "name": str(data["name"]),
        "source": str(data["source"]),
        "gpus": tuple(str(v) for v in (data["gpus"] or ())),
        "gemm_efficiency": {str(k): _fraction(where, f"gemm_efficiency.{k}", v)
                            for k, v in gemm.items()},
    }
    for name in _SCALAR_FIELDS:
        if name in FRACTION_FIELDS:
            values[name] = _fraction(where, name, data[name])
        else:
            values[name] = _non_negative(where, name, data[name])
    if values["moe_imbalance"] < 1.0:
        raise SpecError(f"efficiency profile {where}: moe_imbalance must be >= 1 (max/mean)")
    for name in _OPTIONAL_SCALARS:
        if data.get(name) is not None:
            values[name] = _fraction(where, name, data[name])
    if data.get("cluster_speed") is not None:
        values["cluster_speed"] = _non_negative(where, "cluster_speed", data["cluster_speed"])
        if values["cluster_speed"] == 0.0:
            raise SpecError(f"efficiency profile {where}: cluster_speed must be > 0")
    values["priors"] = _priors(where, data.get("priors") or {})
    values["uncertainty"] = parse_bands(where, data.get("uncertainty") or {})
    if data.get("calibrated_on") is not None:
        values["coverage"] = parse_coverage(data["calibrated_on"], where)
    return EfficiencyProfile(**values)


def _priors(where: str, raw: Any) -> dict[str, Prior]:
    if not isinstance(raw, dict):
        raise SpecError(f"efficiency profile {where}: priors must be a mapping")
    out = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or not {"value", "low", "high"} <= set(spec):
            raise SpecError(f"efficiency profile {where}: priors.{name} needs value, low, high "
                            "and source")
        value, low, high = (_non_negative(where, f"priors.{name}.{k}", spec[k])
                            for k in ("value", "low", "high"))
        if not low <= value <= high:
            raise SpecError(f"efficiency profile {where}: priors.{name}: value {value} is not "
                            f"inside [low, high] = [{low}, {high}]")
        out[str(name)] = Prior(value, low, high, str(spec.get("source", "")))
    return out


def parse_bands(where: str, raw: Any) -> dict[str, ErrorBand]:
    if not isinstance(raw, dict):
        raise SpecError(f"efficiency profile {where}: uncertainty must be a mapping")
    out = {}
    for kind, spec in raw.items():
        try:
            band = ErrorBand(float(spec["low"]), float(spec["high"]), int(spec["n"]),
                             str(spec.get("method", "")))
        except (TypeError, KeyError, ValueError, OverflowError):  # OverflowError: n = .inf
            raise SpecError(f"efficiency profile {where}: uncertainty.{kind} needs numbers "
                            "low, high and n") from None
        precisions = spec.get("precisions") or []
        if not (isinstance(precisions, list)
                and all(p in ("bf16", "fp8", "fp4") for p in precisions)):
            raise SpecError(f"efficiency profile {where}: uncertainty.{kind}.precisions must "
                            f"be a list of bf16, fp8, fp4; got {precisions!r}")
        band = replace(band, precisions=tuple(precisions))
        if not (math.isfinite(band.low) and math.isfinite(band.high) and band.low <= band.high):
            raise SpecError(f"efficiency profile {where}: uncertainty.{kind}: need finite "
                            f"low <= high, got {band.low}, {band.high}")
        out[str(kind)] = band
    return out


def _non_negative(where: str, name: str, value: Any) -> float:
    if isinstance(value, str):  # YAML 1.1 reads "2.0e9" (no exponent sign) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    # At most _MAX_VALUE keeps every product of profile values finite; NaN fails both tests.
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 <= value <= _MAX_VALUE):
        raise SpecError(f"efficiency profile {where}: {name} must be a finite number >= 0 "
                        f"(at most {_MAX_VALUE:g}), got {str(value)[:40]}")
    return float(value)


_MAX_VALUE = 1e15


def _fraction(where: str, name: str, value: Any) -> float:
    number = _non_negative(where, name, value)
    if number > 1.0 or number == 0.0:
        raise SpecError(f"efficiency profile {where}: {name} must be in (0, 1], got {value!r}")
    return number


def load_efficiency_profile(name_or_path: str) -> EfficiencyProfile:
    """A built-in profile by name (``hopper``) or a YAML file by path."""
    path = Path(name_or_path)
    if not is_file(path):
        path = efficiency_dir() / f"{name_or_path}.yaml"
    if not is_file(path):
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


def profile_to_yaml(profile: EfficiencyProfile, header: str = "") -> str:
    """The profile as YAML text (what :func:`load_efficiency_profile` reads back)."""
    doc: dict[str, Any] = {"name": profile.name, "gpus": list(profile.gpus),
                           "gemm_efficiency": {k: round(v, 4) for k, v in
                                               profile.gemm_efficiency.items()}}
    for name in _SCALAR_FIELDS:
        doc[name] = float(f"{profile.get(name):.4g}")
        if name == "gemm_half_flops" and profile.gemm_half_flops_ceiling is not None:
            doc["gemm_half_flops_ceiling"] = profile.gemm_half_flops_ceiling
    if profile.cluster_speed != 1.0:
        doc["cluster_speed"] = float(f"{profile.cluster_speed:.4g}")
    doc["source"] = profile.source
    doc["priors"] = {name: {"value": p.value, "low": p.low, "high": p.high, "source": p.source}
                     for name, p in profile.priors.items()}
    doc["uncertainty"] = {kind: {"low": round(b.low, 4), "high": round(b.high, 4), "n": b.n,
                                 "method": b.method,
                                 **({"precisions": list(b.precisions)} if b.precisions else {})}
                          for kind, b in profile.uncertainty.items()}
    if profile.coverage is not None:
        doc["calibrated_on"] = profile.coverage.to_dict()
    text = yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)
    return (header.rstrip() + "\n" if header else "") + text
