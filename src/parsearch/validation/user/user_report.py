"""What ``parsearch calibrate`` reports: per-run errors, MAPE and ranking quality, before
and after.

Ranking quality answers the question a user calibrates for: does the profile
put the layouts in the order they measured?  It is judged within each job (same
model, GPU count, global batch and sequence length: layouts of one job compete,
runs of different jobs do not), before (the shipped profile) and after (each run
predicted by a profile fitted without it, as the MAPE after):

* **best first**: in how many jobs of two or more runs the measured fastest is
  predicted fastest;
* **Spearman's rho** between measured and predicted throughput, over the runs of
  jobs of three or more runs (ranks taken within each job, pooled).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parsearch.cost.efficiency import EfficiencyProfile, ErrorBand, Prior
from parsearch.validation.fit.calibration import PreparedRow
from parsearch.validation.fit.cluster_speed import SpeedFit
from parsearch.validation.fit.crossval import BAND_QUANTILES
from parsearch.validation.fit.network_calibration import CLUSTER_FACTORS, SPINE_FACTOR
from parsearch.validation.fit.spine_tier import TIERS

#: Runs needed before the leave-one-run-out errors replace the shipped error band.
MIN_RUNS_FOR_BAND = 5


@dataclass(frozen=True)
class RowReport:
    """One measured run: shipped prediction, leave-one-out and in-sample calibrated."""

    source: str
    layout: str
    num_gpus: int
    measured: float
    shipped: float
    leave_one_out: float
    calibrated: float
    #: The job the run belongs to (model, GPUs, batch, sequence): runs of one job compete.
    job: str = ""

    @property
    def error_before(self) -> float:
        return self.shipped / self.measured - 1.0

    @property
    def error_after(self) -> float:
        return self.leave_one_out / self.measured - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "layout": self.layout, "num_gpus": self.num_gpus,
            "job": self.job, "measured_tokens_per_s_per_gpu": self.measured,
            "shipped_prediction": self.shipped,
            "leave_one_out_prediction": _finite(self.leave_one_out),
            "calibrated_prediction": self.calibrated,
            "error_before": self.error_before, "error_after": _finite(self.error_after),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank.

    >>> _ranks([3.0, 1.0, 3.0]).tolist()
    [2.5, 1.0, 2.5]
    """
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1, dtype=float)
    for value in np.unique(x):
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _jobs(rows: Sequence[RowReport]) -> list[list[RowReport]]:
    groups: dict[str, list[RowReport]] = defaultdict(list)
    for row in rows:
        groups[row.job].append(row)
    return list(groups.values())


@dataclass(frozen=True)
class Ranking:
    """Ranking quality of one set of predictions (see the module docstring)."""

    best_first: int
    jobs: int
    spearman: float  # NaN: no job of three or more runs

    def text(self) -> str:
        rho = "n/a" if math.isnan(self.spearman) else f"{self.spearman:+.2f}"
        return f"fastest first in {self.best_first}/{self.jobs} job(s), Spearman {rho}"

    def to_dict(self) -> dict[str, Any]:
        return {"best_first": self.best_first, "jobs": self.jobs,
                "spearman": _finite(self.spearman)}


def ranking(rows: Sequence[RowReport], predicted: Sequence[float]) -> Ranking:
    """Ranking quality of ``predicted`` (one per row, NaN where none) against the measured.

    >>> rows = [RowReport(str(i), "l", 8, m, 0, 0, 0, "job") for i, m in enumerate([3, 2, 1])]
    >>> ranking(rows, [9.0, 7.0, 8.0]).text()
    'fastest first in 1/1 job(s), Spearman +0.50'
    """
    by_row = {id(r): p for r, p in zip(rows, predicted, strict=True)}
    best = jobs = 0
    pooled_measured: list[float] = []
    pooled_predicted: list[float] = []
    for group in _jobs(rows):
        group = [r for r in group if math.isfinite(by_row[id(r)])]
        if len(group) < 2:
            continue
        jobs += 1
        measured = [r.measured for r in group]
        guess = [by_row[id(r)] for r in group]
        best += int(np.argmax(measured) == np.argmax(guess))
        if len(group) >= 3:
            pooled_measured += _ranks(measured).tolist()
            pooled_predicted += _ranks(guess).tolist()
    rho = math.nan
    if len(pooled_measured) >= 3 and np.std(pooled_measured) > 0 and np.std(pooled_predicted) > 0:
        rho = float(np.corrcoef(pooled_measured, pooled_predicted)[0, 1])
    return Ranking(best, jobs, rho)


@dataclass(frozen=True)
class UserCalibration:
    """The fitted profile (and cluster factors) and how well they predict unseen runs."""

    profile: EfficiencyProfile
    base: EfficiencyProfile
    fitted: tuple[str, ...]
    on_bound: tuple[str, ...]
    sensitivity: dict[str, float]
    why: str
    rows: tuple[RowReport, ...]
    cluster: dict[str, float] = field(default_factory=dict)
    cluster_priors: dict[str, Prior] = field(default_factory=dict)
    cluster_file: str | None = None
    #: Set when the cluster-level speed factor was fitted (parsearch.validation.fit.cluster_speed).
    speed: SpeedFit | None = None

    @property
    def mape_before(self) -> float:
        return float(np.mean([abs(r.error_before) for r in self.rows]))

    @property
    def mape_after(self) -> float:
        """Leave-one-run-out MAPE of the calibrated profile (NaN with a single run)."""
        errors = [abs(r.error_after) for r in self.rows if math.isfinite(r.error_after)]
        return float(np.mean(errors)) if errors else math.nan

    @property
    def mape_in_sample(self) -> float:
        return float(np.mean([abs(r.calibrated / r.measured - 1.0) for r in self.rows]))

    @property
    def ranking_before(self) -> Ranking:
        return ranking(self.rows, [r.shipped for r in self.rows])

    @property
    def ranking_after(self) -> Ranking:
        """Leave-one-run-out predictions' ranking quality."""
        return ranking(self.rows, [r.leave_one_out for r in self.rows])

    def value(self, name: str) -> float:
        """A fitted factor's value (profile or cluster factor)."""
        return self.cluster[name] if name in CLUSTER_FACTORS else self.profile.get(name)

    def shipped(self, name: str) -> float:
        return 1.0 if name in CLUSTER_FACTORS else self.base.get(name)

    def prior(self, name: str) -> Prior:
        if name in CLUSTER_FACTORS:
            return self.cluster_priors[name]
        return self.profile.priors.get(name) or self.base.priors[name]

    @property
    def tiers(self) -> dict[str, str]:
        """Each scale-out tier the cluster has: ``fitted``, ``tied`` (the spine, following
        the leaf tier) or ``kept`` (the cluster file's word); why is in :attr:`why`."""
        return {tier: "fitted" if name in self.fitted else
                "tied" if name == SPINE_FACTOR else "kept"
                for tier, name in TIERS if name in self.cluster_priors}

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "runs": len(self.rows),
            "fitted": {n: {"value": self.value(n), "shipped": self.shipped(n),
                           "low": self.prior(n).low, "high": self.prior(n).high}
                       for n in self.fitted},
            "cluster_factors": dict(self.cluster),
            "scale_out_tiers": self.tiers,
            "cluster_file": self.cluster_file,
            "cluster_speed": self.speed.to_dict() if self.speed else None,
            "on_bound": list(self.on_bound),
            "why": self.why,
            "sensitivity": self.sensitivity,
            "mape_before": self.mape_before,
            "mape_leave_one_out_after": _finite(self.mape_after),
            "mape_in_sample_after": self.mape_in_sample,
            "ranking_before": self.ranking_before.to_dict(),
            "ranking_leave_one_out_after": self.ranking_after.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
        }


def error_bands(rows: Sequence[PreparedRow], loo: np.ndarray,
                base: EfficiencyProfile) -> dict[str, ErrorBand]:
    """Error bands of the calibrated profile, per kind of prediction (dense / MoE).

    With :data:`MIN_RUNS_FOR_BAND` leave-one-out predictions of a kind: their
    10th-90th percentile log ratios.  With fewer: the shipped band's width, centred
    on the mean leave-one-out log ratio (0 without any): the shipped band's offset is
    the shipped profile's bias on the published runs, which the calibration removes.
    """
    bands = {}
    logs: dict[str, list[float]] = {}
    for r, pred in zip(rows, loo, strict=True):
        if math.isfinite(pred):
            logs.setdefault(r.kind, []).append(math.log(pred / r.measured))
    for kind, band in base.uncertainty.items():
        values = logs.get(kind, [])
        if len(values) >= MIN_RUNS_FOR_BAND:
            lo, hi = np.quantile(values, BAND_QUANTILES)
            bands[kind] = ErrorBand(float(lo), float(hi), len(values),
                                    "leave-one-run-out on the user's measurements")
            continue
        centre = float(np.mean(values)) if values else 0.0
        half = (band.high - band.low) / 2.0
        bands[kind] = ErrorBand(centre - half, centre + half, band.n,
                                f"{band.method} width, centred on the calibration")
    return bands
