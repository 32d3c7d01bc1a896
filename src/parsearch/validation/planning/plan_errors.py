"""The errors a calibration leaves after a set of measurements, linearised (the plan's
objective; see :mod:`parsearch.validation.planning.plan_profiling` for the model), and the expected
number of misordered pairs among the best candidates.

:func:`fit_error_parts` gives what the plan's objective reads (the diagonal and the block
of the best candidates) in time linear in the candidates; :func:`fit_error_cov` the whole
matrix, for tests and analysis.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr

from parsearch.validation.fit.calibration import LOSS_SCALE, PRIOR_WEIGHT, added_effects
from parsearch.validation.planning.plan_spine import SpineRule
from parsearch.validation.user.user_calibration import MIN_SENSITIVITY, MIN_UNIQUE_EFFECT

#: Prior spread of a factor's true value: uniform over its cited range, in range units.
FACTOR_SD = 1.0 / math.sqrt(12.0)
#: Per-layout error no factor explains (log throughput); an assumption of the plan.
STRUCTURE_SD = 0.05
#: Run-to-run spread of a measured steady-state step time (log); an assumption of the plan.
NOISE_SD = 0.02


def fit_error_cov(g_measured: np.ndarray, own: Sequence[int | None], g_target: np.ndarray,
                  n_factors: int, thresholds: np.ndarray | None = None,
                  lead: int | None = None, clock_group: Sequence[int] = (),
                  spine: SpineRule | None = None) -> np.ndarray:
    """Covariance of the targets' log prediction errors after the calibration, linearised.

    ``g_*``: factor gradients (:func:`gradients`) of the measured layouts and of the
    targets; ``own``: the target each measured layout is (None: not a target);
    ``thresholds``: the least sensitivity at which the fit takes each factor (``inf``:
    never; default :data:`MIN_SENSITIVITY`).  The fit takes the ``n_factors`` factors
    above their thresholds (mean |g|) with the largest root-mean-square gradient that the
    measured layouts tell apart (as
    :func:`~parsearch.validation.user.user_calibration.choose_factors` does), and solves
    ``min |J d - y|^2 + lam^2 |d|^2`` (``lam = PRIOR_WEIGHT * LOSS_SCALE``), so a
    target's error is ``b . y - g_F . d_F - g_U . d_U - e_t`` with
    ``b = g_F (J'J + lam^2)^-1 J'`` and ``y = J_F d_F + J_U d_U + e_m``: every offset
    ``d`` has standard deviation :data:`FACTOR_SD` in range units, a layout's own
    error ``e`` :data:`STRUCTURE_SD` (plus :data:`NOISE_SD` when measured).  ``spine``:
    the spine factor's column, taken by the fit's rules for it (:class:`SpineRule`).
    """
    b, shared, (u_cols, q) = _fit_terms(g_measured, own, g_target, n_factors, thresholds, lead,
                                        clock_group, spine)
    # Own errors: b e_m - e_t, where a measured target's e_t is inside its e_m.
    own_part = -np.eye(len(b))
    own_part[:, u_cols] += q
    free = np.array([t is None for t in own], dtype=bool)
    return (FACTOR_SD**2 * shared @ shared.T + STRUCTURE_SD**2 * own_part @ own_part.T
            + NOISE_SD**2 * b @ b.T + STRUCTURE_SD**2 * b[:, free] @ b[:, free].T)


def fitted_columns(g_measured: np.ndarray, n_factors: int, thresholds: np.ndarray | None,
                   lead: int | None = None, clock_group: Sequence[int] = (),
                   spine: SpineRule | None = None) -> list[int]:
    """The factors (columns) the calibration fits from runs with gradients ``g_measured``,
    in the order it takes them (:func:`fit_error_cov` says how)."""
    if not len(g_measured):
        return []
    if thresholds is None:
        thresholds = np.full(g_measured.shape[1], MIN_SENSITIVITY)
    sens = np.abs(g_measured).mean(axis=0)
    rms = np.sqrt((g_measured**2).mean(axis=0))
    # By rms, the GPUs' clock (``lead``) at the largest of the kernel efficiencies it moves
    # (``clock_group``) and ahead of them, as choose_factors orders them (ranking_rms).
    key = rms.copy()
    if lead is not None:
        key[lead] = max(key[lead], *(key[j] for j in clock_group))
    order = sorted(range(len(rms)), key=lambda j: (-key[j], j != lead))
    informed = [j for j in order if sens[j] >= thresholds[j]]
    if spine is not None:
        # The spine right after the leaf tier, and only where two runs cross it (SpineRule).
        informed = [j for j in spine.order(informed)
                    if j != spine.spine or spine.informed(g_measured)]
    # Of factors the measured layouts move together only one is fitted, as in
    # choose_factors (calibration.added_effects); the spine must also stand apart from the
    # leaf tier, kept or not (spine_tier.spine_apart).
    ordered = added_effects({j: g_measured[:, j] for j in informed}, MIN_UNIQUE_EFFECT)
    if spine is not None:
        ordered = spine.apart(ordered, g_measured)
    return ordered[:n_factors]


def _fit_terms(g_measured: np.ndarray, own: Sequence[int | None], g_target: np.ndarray,
               n_factors: int, thresholds: np.ndarray | None, lead: int | None = None,
               clock_group: Sequence[int] = (), spine: SpineRule | None = None,
               chosen: Sequence[int] | None = None
               ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """``b``, the factor part of the errors, and the measured targets' own-error columns
    (target indices, and ``b`` summed over the measurements of each) of
    :func:`fit_error_cov` (``chosen``: the factors fitted, when already known)."""
    ordered = list(chosen) if chosen is not None else fitted_columns(
        g_measured, n_factors, thresholds, lead, clock_group, spine)
    rest = [j for j in range(g_measured.shape[1]) if j not in ordered]
    jf = g_measured[:, ordered]
    lam = PRIOR_WEIGHT * LOSS_SCALE
    b = g_target[:, ordered] @ np.linalg.solve(jf.T @ jf + lam**2 * np.eye(len(ordered)), jf.T)
    shared = np.hstack([b @ jf - g_target[:, ordered], b @ g_measured[:, rest] - g_target[:, rest]])
    u_cols = np.array(sorted({t for t in own if t is not None}), dtype=int)
    q = np.zeros((len(b), len(u_cols)))
    for m, t in enumerate(own):
        if t is not None:
            q[:, int(np.searchsorted(u_cols, t))] += b[:, m]
    return b, shared, (u_cols, q)


def fit_error_parts(g_measured: np.ndarray, own: Sequence[int | None], g_target: np.ndarray,
                    n_factors: int, thresholds: np.ndarray | None,
                    block: np.ndarray, lead: int | None = None,
                    clock_group: Sequence[int] = (), spine: SpineRule | None = None,
                    chosen: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The diagonal of :func:`fit_error_cov` and its ``block`` x ``block`` submatrix, without
    forming the whole (targets x targets) matrix: what the plan's objective reads, in time
    linear in the targets (the whole matrix is quadratic; 1,000 candidates made each
    evaluation cost milliseconds, and the exchange step makes many)."""
    b, shared, (u_cols, q) = _fit_terms(g_measured, own, g_target, n_factors, thresholds, lead,
                                        clock_group, spine, chosen)
    free = np.array([t is None for t in own], dtype=bool)
    bf = b[:, free]
    n = len(b)
    # own_part = -I + Q scattered to the columns u_cols: |row i|^2 = 1 - 2 Q[i, i] + |Q_i|^2
    self_q = np.zeros(n)
    if len(u_cols):
        self_q[u_cols] = q[u_cols, np.arange(len(u_cols))]
    own_diag = 1.0 - 2.0 * self_q + np.einsum("ij,ij->i", q, q)
    diag = (FACTOR_SD**2 * np.einsum("ij,ij->i", shared, shared) + STRUCTURE_SD**2 * own_diag
            + NOISE_SD**2 * np.einsum("ij,ij->i", b, b)
            + STRUCTURE_SD**2 * np.einsum("ij,ij->i", bf, bf))
    own_rows = np.zeros((len(block), n))
    own_rows[np.arange(len(block)), block] = -1.0
    own_rows[:, u_cols] += q[block]
    s, br, fr = shared[block], b[block], bf[block]
    sub = (FACTOR_SD**2 * s @ s.T + STRUCTURE_SD**2 * own_rows @ own_rows.T
           + NOISE_SD**2 * br @ br.T + STRUCTURE_SD**2 * fr @ fr.T)
    return diag, sub


def fit_error(g_measured: np.ndarray, g_target: np.ndarray, n_factors: int,
              own: Sequence[int | None] | None = None,
              thresholds: np.ndarray | None = None) -> float:
    """Mean squared log error the calibration leaves on the targets (:func:`fit_error_cov`)."""
    own = own if own is not None else [None] * len(g_measured)
    return float(np.mean(np.diag(fit_error_cov(g_measured, own, g_target, n_factors,
                                                thresholds))))


def expected_misordered(mu: np.ndarray, cov: np.ndarray, top: int) -> float:
    """``sum Phi(-|mu_i - mu_j| / sd_ij)`` over pairs among the ``top`` highest ``mu``."""
    order = np.argsort(-mu)[:top]
    return misordered_pairs(mu[order], cov[np.ix_(order, order)])


def misordered_pairs(mu: np.ndarray, cov: np.ndarray) -> float:
    """``sum Phi(-|mu_i - mu_j| / sd_ij)`` over every pair of ``mu`` (one vector call)."""
    a, b = _pairs(len(mu))
    if not len(a):
        return 0.0
    var = cov[a, a] + cov[b, b] - 2.0 * cov[a, b]
    sd = np.sqrt(np.maximum(var, 1e-12))
    return float(np.sum(ndtr(-np.abs(mu[a] - mu[b]) / sd)))


@functools.lru_cache(maxsize=8)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.triu_indices(n, k=1)
    return a, b


__all__ = ["FACTOR_SD", "NOISE_SD", "STRUCTURE_SD", "expected_misordered", "fit_error",
           "fit_error_cov", "fit_error_parts", "fitted_columns", "misordered_pairs"]
