"""Which layouts to measure next: the ones whose measurement settles the ranking most.

The plan models what ``parsearch calibrate`` will do with the measurements,
linearised.  A layout's log-throughput error is

    error = g . du + e

* ``du``: how far each factor really is from its current value, in units of
  its cited range (``g``: the change in log throughput from the low to the high
  end of the range, computed by the cost model for that layout), each taken
  uniform over the range (standard deviation :data:`FACTOR_SD`).  The factors
  are the profile's residual factors and the cluster's delivered bandwidth
  (:mod:`parsearch.validation.fit.network_calibration`: inter-node and NVLink
  bandwidth over what the cluster file says, range down to a quarter of it), so
  a network that delivers less than the cluster file is one more loose factor,
  and a set that makes it identifiable lowers the expected error of the
  network-bound targets;
* ``e``: what no factor explains for that layout (:data:`STRUCTURE_SD`),
  independent between layouts; a measurement adds :data:`NOISE_SD`.

The calibration fits only the ``factor_limit(n)`` factors the measured layouts
say most about (largest root-mean-square ``g``, each with mean ``|g|`` above its
threshold: :func:`~parsearch.validation.user.user_calibration.threshold`), by penalised least
squares (penalty ``PRIOR_WEIGHT * LOSS_SCALE`` per range unit,
:mod:`parsearch.validation.fit.calibration`), and leaves the others at the shipped
values.  Linearised, that is a ridge estimate, and the covariance of the
calibrated predictions' errors (:func:`fit_error_cov`) has three parts: the
variance of the fitted factors, the bias of the factors left out (the cluster
factors always, with ``network=False``), and each layout's own error.  Among the
candidates near the top, the set of K layouts is chosen to minimise

    sum over pairs among the TOP_PAIRS best of Phi(-|mu_i - mu_j| / sd_ij)
    + FIT_WEIGHT * mean error variance over the targets / STRUCTURE_SD^2
    + CLUSTER_WEIGHT * mean remaining variance of the cluster factors / FACTOR_SD^2

the expected number of misordered pairs in the top of the ranking after the
calibration, plus the calibrated predictions' mean squared error over the
best layout of each of the :data:`TARGET_SHAPES` best shapes (the layouts the
user may end up choosing from, wider than the candidates).  The second term is
the Bayesian I-optimal (V-optimal) criterion of the procedure actually run
(Chaloner and Verdinelli, "Bayesian Experimental Design: A Review", Statist.
Sci. 10(3), 1995, sec. 2.2): it favours sets that span the directions the
target layouts depend on and make the fit take the factors that matter for
them.  The third is the same criterion (A-optimal, ibid.) for the cluster's clock and
bandwidths, which the corrected cluster file carries to later jobs: it favours sets
whose runs differ in compute and inter-node share, which tell the two apart (issue 33).
The spine (cross-leaf) factor is modelled as the fit takes it where a slow spine would
change which candidate ranks first (:mod:`parsearch.validation.planning.plan_spine`):
after the leaf factor, only from two runs that cross it by 5 % and tell it from the NICs,
and never for a job inside one leaf group; there each top pair a slow spine reorders
counts (:data:`SPINE_WEIGHT`) while the fit would leave it tied.
The set is built greedily, then improved by exchanging members
(:func:`_exchange`), because which factors the fit takes depends on the whole
set.  Measurements already taken (``--measurements``) count toward the fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.stats import norm

from parsearch.cost.analytic import CostModel, score_columns
from parsearch.cost.efficiency import EfficiencyProfile, Prior
from parsearch.errors import SpecError
from parsearch.layout.space import require_layouts
from parsearch.search.exhaustive import rank_feasible, scan_table
from parsearch.validation.fit.calibration import FIT_ORDER, PreparedRow, factor_prior
from parsearch.validation.fit.factor_ties import gemm_ties, with_ties
from parsearch.validation.fit.network_calibration import (
    CLUSTER_FACTORS,
    COMPUTE_FACTOR,
    SPINE_FACTOR,
    network_priors,
    with_cluster_factors,
)
from parsearch.validation.planning.plan_errors import (  # re-exported: the plan's error model
    FACTOR_SD,
    NOISE_SD,
    STRUCTURE_SD,
    expected_misordered,
    fit_error,
    fit_error_cov,
    fit_error_parts,
    fitted_columns,
    misordered_pairs,
)
from parsearch.validation.planning.plan_launch import PlannedRun, short_run_launch
from parsearch.validation.planning.plan_spine import (
    spans_leaf_groups,
    spine_rule,
    spine_summary,
)
from parsearch.validation.planning.runnable import RunnableLayouts, runnable_rows
from parsearch.validation.user.user_calibration import (
    CLOCK_RATE_FACTORS,
    factor_limit,
    range_effects,
    threshold,
)

#: Pairs among this many best-predicted candidates count toward the ranking uncertainty.
TOP_PAIRS = 10
#: Candidates considered: the best layout of each of this many best shapes.
CANDIDATES = 30
#: Fit quality is judged on the best layout of each of this many best shapes.
TARGET_SHAPES = 90
#: Weight of the mean squared error term, in units of STRUCTURE_SD^2, against the expected
#: misordered pairs: one pair is worth the error no factor explains on every target.
FIT_WEIGHT = 1.0
#: Weight of the cluster factors' remaining variance (mean over them, in units of their
#: prior variance) against the expected misordered pairs: the corrected cluster file
#: serves every later job on the cluster, not only the targets of this one, so a set
#: that pins the cluster's clock and network is worth one misordered pair.
CLUSTER_WEIGHT = 1.0
#: Weight, in misordered pairs, of each pair among the TOP_PAIRS best that the spine at its
#: low bound reorders, counted while the plan's runs leave the spine tied to the leaf tier
#: (the fit's rules: :mod:`parsearch.validation.planning.plan_spine`) and only when the
#: slow spine would change which candidate ranks first: those pairs are misordered whenever
#: the spine is slow and the calibration cannot see it.
SPINE_WEIGHT = 1.0
#: Passes of the exchange step over the chosen set (it stops early once nothing improves).
EXCHANGE_PASSES = 5
#: Evaluations of the plan's objective, all steps together (about 0.6 ms each with 1,000
#: candidates on one core): a plan whose greedy choice alone needs more is refused before
#: it starts, and the exchange step stops when the rest is spent (``exchange_complete``).
MAX_EVALUATIONS = 40_000


@dataclass(frozen=True)
class ProfilingPlan:
    """The layouts to measure and how much they settle."""

    picks: tuple[PlannedRun, ...]
    candidates: int
    factors: tuple[str, ...]
    factor_sd_before: dict[str, float]
    factor_sd_after: dict[str, float]
    misordered_before: float
    misordered_after: float
    exchange_complete: bool = True  # False: stopped at MAX_EVALUATIONS
    runnable_source: str | None = None  # the runnable-layouts file the plan was bound to
    not_valid: tuple[str, ...] = ()  # its layouts that are no valid layout of the job
    spine: dict[str, Any] | None = None  # the spine tier (plan_spine.spine_summary)

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "runnable_layouts_file": self.runnable_source,
            "runnable_layouts_not_valid": list(self.not_valid),
            "expected_misordered_pairs_before": self.misordered_before,
            "expected_misordered_pairs_after": self.misordered_after,
            "top_pairs_of": TOP_PAIRS,
            "exchange_complete": self.exchange_complete,
            "factor_sd_before": self.factor_sd_before,
            "factor_sd_after": self.factor_sd_after,
            "picks": [p.to_dict() for p in self.picks],
            **({"spine_tier": self.spine} if self.spine is not None else {}),
        }


def _with_profile(cm: CostModel, profile: EfficiencyProfile) -> CostModel:
    return replace(cm, profile=profile)


def _priced(cm: CostModel, name: str, value: float) -> CostModel:
    """``cm`` with one factor (profile or cluster) at ``value`` (FP8 GEMMs following BF16's
    as user calibration moves them, :func:`parsearch.validation.fit.factor_ties.gemm_ties`)."""
    if name in CLUSTER_FACTORS:
        return with_cluster_factors(cm, {name: value})
    ties = gemm_ties(cm.profile)
    return _with_profile(cm, cm.profile.with_values(with_ties({name: value}, ties)))


def factor_priors(cm: CostModel, names: Sequence[str]) -> dict[str, Prior]:
    """The range each factor is searched over: the cluster's (``network_priors``), or the
    profile's as calibration searches it (BF16's GEMM range narrowed so that FP8, moving
    with it, stays inside its own: :func:`~parsearch.validation.fit.calibration.factor_prior`)."""
    cluster = network_priors(cm.fabric.cluster)
    ties = gemm_ties(cm.profile)
    return {n: cluster[n] if n in CLUSTER_FACTORS else factor_prior(cm.profile, n, ties)
            for n in names}


def gradients(cm: CostModel, cols: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """(layouts x factors): log-throughput change from each factor's low to high bound."""
    out = np.zeros((len(cols["tp"]), len(names)))
    for j, (name, prior) in enumerate(factor_priors(cm, names).items()):
        ends = [score_columns(_priced(cm, name, x), cols, with_memory=False)
                ["tokens_per_s_per_gpu"] for x in (prior.low, prior.high)]
        out[:, j] = np.log(ends[1] / ends[0])
    return out


def _row_effects(rows: Sequence[PreparedRow], profile: EfficiencyProfile,
                 names: Sequence[str], cluster_priors: dict[str, Prior]) -> np.ndarray:
    """(rows x factors): :func:`gradients` of measured rows, each priced with its own cost
    model (:func:`~parsearch.validation.user.user_calibration.range_effects`)."""
    if not rows:
        return np.zeros((0, len(names)))
    effects = range_effects(rows, profile, [n for n in names if n not in CLUSTER_FACTORS],
                            {n: cluster_priors[n] for n in names if n in CLUSTER_FACTORS})
    # A factor whose range is a single value moves nothing (range_effects leaves it out).
    none = np.zeros(len(rows))
    return np.column_stack([effects.get(n, none) for n in names])


@dataclass
class _Belief:
    """Joint Gaussian of the factor offsets and the candidates' prediction errors."""

    factor_cov: np.ndarray
    g: np.ndarray

    def error_cov(self) -> np.ndarray:
        return self.g @ self.factor_cov @ self.g.T + STRUCTURE_SD**2 * np.eye(len(self.g))

    def observe(self, g_new: np.ndarray, own: int | None, cov: np.ndarray) -> np.ndarray:
        """Condition on one measurement (its gradient ``g_new``; ``own``: its candidate index).

        Returns the updated error covariance of the candidates; ``factor_cov`` is updated.
        """
        # Cross-covariance of the measurement with the candidates' errors and the factors.
        cross = self.g @ self.factor_cov @ g_new
        if own is not None:
            cross = cross.copy()
            cross[own] += STRUCTURE_SD**2
        var = float(g_new @ self.factor_cov @ g_new) + STRUCTURE_SD**2 + NOISE_SD**2
        f_cross = self.factor_cov @ g_new
        self.factor_cov = self.factor_cov - np.outer(f_cross, f_cross) / var
        return cov - np.outer(cross, cross) / var


def _candidate_rows(scan: Any, count: int) -> np.ndarray:
    """The best layout of each of the ``count`` best shapes (tp, pp, cp, ep, etp).

    Variants of one shape (micro-batch, interleaving, recompute) share their errors
    almost entirely; measuring one of them tells about the others, so one stands for all.
    """
    return rank_feasible(scan, top=count, diverse=True)


def plan_profiling(cm: CostModel, *, k: int, measured: Sequence[PreparedRow] = (),
                   candidates: int = CANDIDATES, fit_weight: float = FIT_WEIGHT,
                   network: bool = True,
                   runnable: RunnableLayouts | None = None) -> ProfilingPlan:
    """The ``k`` layouts (on ``cm``'s fabric) worth measuring next, in the order to run them.

    ``network=False``: the calibration will not fit the cluster's bandwidth (its
    uncertainty still counts, as error no measurement removes).  ``runnable``: only these
    layouts can be launched on the user's setup; the plan chooses among them (and counts
    its ranking over them), and names those that are no valid layout of the job.
    """
    if k < 1:
        raise SpecError(f"k must be >= 1 layouts to measure, got {k}")
    model, training = cm.model, cm.training
    table = require_layouts(model, training, cm.fabric.num_gpus)
    not_valid: tuple[str, ...] = ()
    if runnable is not None:
        rows_ok, missing = runnable_rows(table, runnable.layouts)
        not_valid = tuple(layout.key() for layout in missing)
        if not len(rows_ok):
            raise SpecError(f"--candidates {runnable.source}: none of its "
                            f"{len(runnable.layouts)} layouts is a valid layout of this job "
                            f"({model.name}, {cm.fabric.num_gpus} GPUs, global batch "
                            f"{training.global_batch}); `parsearch check --layout ...` says "
                            "which rule each breaks")
        table = table.select(rows_ok)
    scan = scan_table(cm, table)
    if not scan.feasible:
        where = (f"among the {len(table)} valid layouts of {runnable.source}"
                 if runnable is not None else f"on {cm.fabric.num_gpus} GPUs")
        raise SpecError(f"no layout fits in memory {where}; nothing to "
                        "measure (`parsearch search` says how much the leanest one needs)")
    positions = _candidate_rows(scan, max(candidates, TARGET_SHAPES))
    targets = scan.feasible_rows[positions]
    rows = targets[:candidates]
    cols = {name: v[rows] for name, v in table.columns.items()}
    target_cols = {name: v[targets] for name, v in table.columns.items()}
    scores = score_columns(cm, cols, with_memory=False)
    tokens = np.asarray(scores["tokens_per_s_per_gpu"])
    mu = np.log(tokens)
    needed = _fixed_evaluations(k, len(mu))
    if needed > MAX_EVALUATIONS:
        raise SpecError(f"--k {k} of {len(mu):,} candidate shapes needs {needed:,} evaluations "
                        f"of the plan to choose and order them; the limit is "
                        f"{MAX_EVALUATIONS:,} (about a minute): lower --k or --candidates")
    cluster_priors = network_priors(cm.fabric.cluster)
    if not spans_leaf_groups(cm):  # no group of the job can cross the spine
        cluster_priors.pop(SPINE_FACTOR, None)
    tied = gemm_ties(cm.profile)  # FP8 moves with BF16 (user calibration)
    names = (*(n for n in FIT_ORDER if n in cm.profile.priors and n not in tied),
             *cluster_priors)
    g_target = gradients(cm, target_cols, names)
    keep = np.abs(g_target).max(axis=0) > 1e-6 if len(g_target) else np.zeros(len(names), bool)
    # The measured rows' effects over the same ranges (user calibration's own count).
    g_done = _row_effects(measured, cm.profile, names, cluster_priors)
    if measured:
        keep |= np.abs(g_done).max(axis=0) > 1e-6
    names = tuple(n for n, kept in zip(names, keep, strict=True) if kept)
    g_target = g_target[:, keep]
    g = g_target[:len(rows)]
    thresholds = np.array([threshold(n) if network or n not in CLUSTER_FACTORS else math.inf
                           for n in names])
    g_done = g_done[:, keep]
    # The clock ranks with the kernel efficiencies it moves (user_calibration.ranking_rms).
    lead = names.index(COMPUTE_FACTOR) if COMPUTE_FACTOR in names else None
    clock_group = [j for j, n in enumerate(names) if n in CLOCK_RATE_FACTORS]
    # Where a slow spine would change which candidate ranks first, the spine as the fit
    # takes it (after the leaf tier, from two runs that cross it), and the top pairs it
    # reorders count while the runs leave it tied; elsewhere as before (plan_spine).
    spine, spine_pairs = spine_rule(cm, cols, mu, names, cluster_priors, TOP_PAIRS, network)
    n_factors = factor_limit(len(measured) + min(k, len(rows)))
    belief = _Belief(FACTOR_SD**2 * np.eye(len(names)), g)
    cov = belief.error_cov()
    for row_g in g_done:
        cov = belief.observe(row_g, None, cov)
    sd_before = {n: float(math.sqrt(belief.factor_cov[i, i])) for i, n in enumerate(names)}
    before = expected_misordered(mu, cov, TOP_PAIRS)
    rank = np.empty(len(mu), dtype=int)
    rank[np.argsort(-mu)] = np.arange(1, len(mu) + 1)

    top = np.argsort(-mu)[:TOP_PAIRS]

    spent = [0]

    # The cluster factors' own errors, as targets whose gradient is the factor alone (a unit
    # row: its "prediction error" is the fitted factor's error, in range units).
    pinned = [j for j, n in enumerate(names) if n in CLUSTER_FACTORS and thresholds[j] < math.inf]
    g_all = np.vstack([g_target, np.eye(len(names))[pinned]])
    n_targets = len(g_target)

    def objective(picked: Sequence[int]) -> float:
        spent[0] += 1
        g_runs = np.vstack([g_done, g[list(picked)]])
        chosen = fitted_columns(g_runs, n_factors, thresholds, lead, clock_group, spine)
        diag, block = fit_error_parts(g_runs, [*[None] * len(g_done), *picked], g_all,
                                      n_factors, thresholds, top, lead, clock_group, spine,
                                      chosen)
        # A unit row's own term (STRUCTURE_SD^2) is the same for every set: taken out.
        factors = (float(np.mean(diag[n_targets:] - STRUCTURE_SD**2)) / FACTOR_SD**2
                   if pinned else 0.0)
        tied = (SPINE_WEIGHT * spine_pairs
                if spine is not None and spine.spine not in chosen else 0.0)
        return (misordered_pairs(mu[top], block)
                + fit_weight * float(np.mean(diag[:n_targets])) / STRUCTURE_SD**2
                + CLUSTER_WEIGHT * factors + tied)

    greedy = _greedy(objective, range(len(mu)), k)
    final, complete = _exchange(objective, greedy, len(mu),
                                MAX_EVALUATIONS - spent[0] - _ordering_evaluations(len(greedy)))
    picks: list[PlannedRun] = []
    chosen: list[int] = []
    current = before
    # The chosen set in the order that settles the most first (the order to run them).
    for order in range(1, len(final) + 1):
        best_i = min((i for i in final if i not in chosen),
                     key=lambda i: objective([*chosen, i]))
        trial = _Belief(belief.factor_cov.copy(), g)
        new_cov = trial.observe(g[best_i], best_i, cov)
        after = expected_misordered(mu, new_cov, TOP_PAIRS)
        reasons = _reasons(best_i, mu, cov, rank, names, belief.factor_cov,
                           trial.factor_cov, current, after)
        belief, cov = trial, new_cov
        current = after
        chosen.append(best_i)
        layout = table.layout(int(rows[best_i]))
        picks.append(PlannedRun(
            order=order, layout=layout, predicted_rank=int(rank[best_i]),
            tokens_per_s_per_gpu=float(tokens[best_i]),
            step_time_s=float(scores["step_time_s"][best_i]), reasons=tuple(reasons),
            launch=short_run_launch(cm, layout)))
    sd_after = {n: float(math.sqrt(belief.factor_cov[i, i])) for i, n in enumerate(names)}
    spine_tier = None
    if SPINE_FACTOR in names:
        g_runs = np.vstack([g_done, g[chosen]])
        spine_tier = spine_summary(
            spine, spine_pairs, g_runs,
            fitted_columns(g_runs, n_factors, thresholds, lead, clock_group, spine), n_factors,
            fitted_columns(g_runs, len(names), thresholds, lead, clock_group, spine))
    return ProfilingPlan(tuple(picks), len(mu), names, sd_before, sd_after, before, current,
                         complete, runnable_source=runnable.source if runnable else None,
                         not_valid=not_valid, spine=spine_tier)


def _ordering_evaluations(k: int) -> int:
    return k * (k + 1) // 2


def _fixed_evaluations(k: int, n: int) -> int:
    """Objective evaluations of the greedy choice of ``k`` of ``n`` and of their ordering."""
    picked = min(k, n)
    return sum(n - i for i in range(picked)) + _ordering_evaluations(picked)


def _greedy(objective: Callable[[Sequence[int]], float], pool: Iterable[int],
            k: int) -> list[int]:
    """Add, one at a time, the member of ``pool`` that lowers ``objective`` most."""
    pool = list(pool)
    chosen: list[int] = []
    for _ in range(min(k, len(pool))):
        chosen.append(min((i for i in pool if i not in chosen),
                          key=lambda i: objective([*chosen, i])))
    return chosen


def _exchange(objective: Callable[[Sequence[int]], float], chosen: list[int],
              n: int, budget: int) -> tuple[list[int], bool]:
    """Swap members of ``chosen`` for other candidates while that lowers ``objective``.

    The exchange step of Fedorov's algorithm (Fedorov, "Theory of Optimal
    Experiments", 1972, ch. 3; Cook and Nachtsheim, Technometrics 22(3), 1980):
    greedy choice alone stops where one more layout cannot help although a
    different set would (which factors the fit takes depends on the whole set).
    Makes at most ``budget`` evaluations; the flag says whether it ran to its end.
    """
    if budget < 1:
        return chosen, False
    best = objective(chosen)
    budget -= 1
    for _ in range(EXCHANGE_PASSES):
        improved = False
        for position in range(len(chosen)):
            for j in range(n):
                if j in chosen:
                    continue
                if budget < 1:
                    return chosen, False
                budget -= 1
                trial = [*chosen[:position], j, *chosen[position + 1:]]
                value = objective(trial)
                if value < best - 1e-12:
                    chosen, best, improved = trial, value, True
        if not improved:
            break
    return chosen, True


def _reasons(i: int, mu: np.ndarray, cov: np.ndarray, rank: np.ndarray, names: Sequence[str],
             factor_before: np.ndarray, factor_after: np.ndarray, u_before: float,
             u_after: float) -> list[str]:
    out = []
    top = np.argsort(-mu)[:TOP_PAIRS]
    if i in top:
        partners = []
        for j in top:
            if j == i:
                continue
            sd = math.sqrt(max(cov[i, i] + cov[j, j] - 2.0 * cov[i, j], 1e-12))
            partners.append((float(norm.cdf(-abs(mu[i] - mu[j]) / sd)), int(rank[j])))
        p, r = max(partners) if partners else (0.0, 0)  # the only candidate: no partner
        if p > 0.1:
            out.append(f"predicted #{rank[i]}: the profile cannot tell it from #{r} "
                       f"(P(misordered) {p:.0%})")
        else:
            out.append(f"predicted #{rank[i]}")
    else:
        out.append(f"predicted #{rank[i]}, outside the top {TOP_PAIRS}")
    drops = [(math.sqrt(factor_before[j, j]) - math.sqrt(factor_after[j, j]), j)
             for j in range(len(names))]
    if drops:
        drop, j = max(drops)
        if drop > 0.01:
            out.append(f"pins {names[j]} (sd {math.sqrt(factor_before[j, j]):.2f} -> "
                       f"{math.sqrt(factor_after[j, j]):.2f} of its range)")
    out.append(f"expected misordered pairs in the top {TOP_PAIRS}: {u_before:.2f} -> "
               f"{u_after:.2f}")
    return out


__all__ = ["CANDIDATES", "FACTOR_SD", "MAX_EVALUATIONS", "NOISE_SD", "STRUCTURE_SD",
           "TARGET_SHAPES", "TOP_PAIRS", "PlannedRun", "ProfilingPlan", "expected_misordered",
           "factor_priors", "fit_error", "fit_error_cov", "gradients", "plan_profiling"]
