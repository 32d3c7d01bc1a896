"""Profile and cluster factors fitted together to measured runs.

The cost model's procedure (:func:`~parsearch.validation.fit.calibration.calibrate`:
soft-L1 loss on ``log(predicted / measured)`` with scale
:data:`~parsearch.validation.fit.calibration.LOSS_SCALE`, each factor pulled toward
its prior by ``prior_weight * LOSS_SCALE`` per unit of its cited range, bounded
by the range), extended to the cluster's delivered bandwidth
(:mod:`parsearch.validation.fit.network_calibration`), whose prior is 1.0: the
cluster file taken at its word.  A slow network and a slow GEMM move different
layouts differently (the network only those whose groups cross nodes), so the
two are fitted in one least-squares problem, not one after the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from parsearch.cost.efficiency import EfficiencyProfile, Prior
from parsearch.errors import ParsearchError
from parsearch.validation.fit.calibration import (
    BOUND_TOLERANCE,
    LOSS_SCALE,
    PRIOR_WEIGHT,
    PreparedRow,
    factor_prior,
    predict,
)
from parsearch.validation.fit.factor_ties import gemm_ties, with_ties
from parsearch.validation.fit.network_calibration import CLUSTER_FACTORS, rows_with_cluster_factors

#: Evaluations allowed to one fit (a few runs converge in far fewer).
MAX_EVALUATIONS = 100
#: How far past a bound (share of the range) a factor on it is tried, to see whether the
#: runs push it there.
OUTWARD_STEP = 0.02


@dataclass(frozen=True)
class FactorFit:
    """A fitted profile and cluster factors (only those fitted; the rest stay 1.0)."""

    profile: EfficiencyProfile
    cluster: dict[str, float]
    cluster_priors: dict[str, Prior]
    fitted: tuple[str, ...]
    on_bound: tuple[str, ...]
    sensitivity: dict[str, float]
    why: str

    def predict(self, rows: Sequence[PreparedRow]) -> np.ndarray:
        """Predicted tokens/s/GPU of ``rows`` under the fitted profile and cluster factors."""
        return predict(rows_with_cluster_factors(rows, self.cluster), self.profile)


def _unit(prior: Prior, value: float) -> float:
    """Position in the range, 0..1; log scale for ranges of a decade or more (as
    :mod:`parsearch.validation.fit.calibration` maps its factors)."""
    if prior.high / max(prior.low, 1e-30) >= 10.0:
        return math.log(value / prior.low) / math.log(prior.high / prior.low)
    return (value - prior.low) / (prior.high - prior.low)


def _from_unit(prior: Prior, u: float) -> float:
    if prior.high / max(prior.low, 1e-30) >= 10.0:
        return prior.low * (prior.high / prior.low) ** float(u)
    return prior.low + float(u) * (prior.high - prior.low)


def fit_factors(rows: Sequence[PreparedRow], start: EfficiencyProfile, names: Sequence[str],
                cluster_priors: Mapping[str, Prior], *, prior_weight: float = PRIOR_WEIGHT,
                ) -> tuple[EfficiencyProfile, dict[str, float], tuple[str, ...]]:
    """(profile, cluster factors, on_bound): the factors ``names`` fitted to ``rows``.

    Every factor starts at its prior's value (``start``'s priors: the shipped values
    once anchored); ``on_bound``: fitted factors that ended on a bound of their range
    with the runs pushing them past it (:func:`_pushed`).
    """
    # FP8's GEMM efficiency moves with BF16's (parsearch.validation.fit.factor_ties), as in
    # the published-run calibration, unless it is named itself.
    ties = {n: tie for n, tie in gemm_ties(start).items() if n not in names}
    start = start.with_values({n: p.value for n, p in start.priors.items()})
    if not names:
        return start, {}, ()
    priors = [cluster_priors[n] if n in CLUSTER_FACTORS else factor_prior(start, n, ties)
              for n in names]
    u_prior = np.array([_unit(p, p.value) for p in priors])
    measured = np.array([r.measured for r in rows])

    def split(u: np.ndarray) -> tuple[EfficiencyProfile, dict[str, float]]:
        values = {n: _from_unit(p, x) for n, p, x in zip(names, priors, u, strict=True)}
        cluster = {n: v for n, v in values.items() if n in CLUSTER_FACTORS}
        profile = start.with_values(with_ties({n: v for n, v in values.items()
                                               if n not in cluster}, ties))
        return profile, cluster

    def residuals(u: np.ndarray) -> np.ndarray:
        profile, cluster = split(u)
        pred = predict(rows_with_cluster_factors(rows, cluster), profile)
        logs = np.log(np.maximum(pred, 1e-9) / measured)
        return np.concatenate([logs, prior_weight * LOSS_SCALE * (u - u_prior)])

    fit = least_squares(residuals, np.clip(u_prior, 0.02, 0.98), bounds=(0.0, 1.0),
                        loss="soft_l1", f_scale=LOSS_SCALE, max_nfev=MAX_EVALUATIONS,
                        diff_step=1e-3)
    profile, cluster = split(fit.x)
    on_bound = tuple(n for j, n in enumerate(names) if _pushed(residuals, fit.x, j))
    return profile, cluster, on_bound


def _objective(residuals: Callable[[np.ndarray], np.ndarray], u: np.ndarray) -> float:
    """The soft-L1 cost ``least_squares`` minimises (``f_scale = LOSS_SCALE``)."""
    z = (residuals(u) / LOSS_SCALE) ** 2
    return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _pushed(residuals: Callable[[np.ndarray], np.ndarray], u: np.ndarray, j: int) -> bool:
    """Factor ``j`` ended on a bound of its range and the runs would take it beyond.

    A factor that sits on a bound because its shipped value is there and the runs
    agree is not a failure; one the runs push past the cited range is (the structure
    misses something).  Judged by the fit's own objective a step past the bound.
    """
    x = float(u[j])
    if BOUND_TOLERANCE < x < 1.0 - BOUND_TOLERANCE:
        return False
    beyond = u.copy()
    beyond[j] = -OUTWARD_STEP if x <= BOUND_TOLERANCE else 1.0 + OUTWARD_STEP
    try:
        return _objective(residuals, beyond) < _objective(residuals, u)
    except (ParsearchError, ValueError, ZeroDivisionError):
        return True  # the model cannot be priced past the bound: report it as on the bound
