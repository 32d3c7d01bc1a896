"""Which layouts to measure next: the ones whose measurement settles the ranking most.

The prediction error of a layout is modelled, in log throughput, as

    error = g . du + e

* ``du``: how far each residual factor of the profile really is from its
  current value, in units of its cited range (``g``: the change in log
  throughput from the low to the high end of the range, computed by the
  cost model for that layout); before any measurement each ``du`` is taken
  uniform over the range (standard deviation ``1/sqrt(12)``);
* ``e``: what no factor explains for that layout (:data:`STRUCTURE_SD`),
  independent between layouts.

A measured layout is known up to the run-to-run spread (:data:`NOISE_SD`),
which also informs ``du`` and through it every layout that shares the
factor.  Among the candidates near the top of the predicted ranking, layouts
are picked greedily to minimise

    sum over pairs among the TOP_PAIRS best of Phi(-|mu_i - mu_j| / sd_ij)
    + mean over all candidates of var_i / STRUCTURE_SD^2

the expected number of misordered pairs in the top of the ranking (a layout
the profile cannot tell from its neighbours is picked because measuring it
removes its own error) plus how uncertain the predictions are on average, in
units of the error no factor explains (a layout that exercises a factor the
data leave loose is picked because it removes the shared error of many; a
shift common to all layouts does not change their order, but does change how
far each prediction is off).  Measurements already taken (``--measurements``)
condition the model first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.stats import norm

from parsearch.cost.analytic import CostModel, score_columns
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.errors import SpecError
from parsearch.launch import LaunchSettings, launch_for_cluster
from parsearch.layout import Layout
from parsearch.search.exhaustive import rank_feasible, scan_table
from parsearch.space import require_layouts
from parsearch.validation.calibration import FIT_ORDER, PreparedRow, predict
from parsearch.validation.megatron_logs import MIN_STEADY_LINES, WARMUP_ITERATIONS

#: Prior spread of a factor's true value: uniform over its cited range, in range units.
FACTOR_SD = 1.0 / math.sqrt(12.0)
#: Per-layout error no factor explains (log throughput); an assumption of the plan.
STRUCTURE_SD = 0.05
#: Run-to-run spread of a measured steady-state step time (log); an assumption of the plan.
NOISE_SD = 0.02
#: Pairs among this many best-predicted candidates count toward the ranking uncertainty.
TOP_PAIRS = 10
#: Candidates considered: the best layout of each of this many best shapes.
CANDIDATES = 30
#: Iterations measured after warm-up: the median of 20 per-iteration times is within about
#: 1 % of the mean for the 2-3 % iteration-to-iteration spread of steady training.
MEASURED_ITERATIONS = max(20, MIN_STEADY_LINES)


@dataclass(frozen=True)
class PlannedRun:
    """One layout to measure."""

    order: int
    layout: Layout
    predicted_rank: int
    tokens_per_s_per_gpu: float
    step_time_s: float
    reasons: tuple[str, ...]
    launch: LaunchSettings

    @property
    def iterations(self) -> int:
        return WARMUP_ITERATIONS + MEASURED_ITERATIONS

    @property
    def minutes(self) -> float:
        """Training time of the planned iterations (start-up not counted)."""
        return self.iterations * self.step_time_s / 60.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": self.order, "layout": self.layout.to_dict(), "key": self.layout.key(),
            "num_gpus": self.layout.num_gpus, "predicted_rank": self.predicted_rank,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "step_time_s": self.step_time_s,
            "iterations": self.iterations, "warmup_iterations": WARMUP_ITERATIONS,
            "minutes": self.minutes, "reasons": list(self.reasons),
            "launch": self.launch.to_dict(),
        }


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "expected_misordered_pairs_before": self.misordered_before,
            "expected_misordered_pairs_after": self.misordered_after,
            "top_pairs_of": TOP_PAIRS,
            "factor_sd_before": self.factor_sd_before,
            "factor_sd_after": self.factor_sd_after,
            "picks": [p.to_dict() for p in self.picks],
        }


def _with_profile(cm: CostModel, profile: EfficiencyProfile) -> CostModel:
    return replace(cm, profile=profile)


def gradients(cm: CostModel, cols: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """(layouts x factors): log-throughput change from each factor's low to high bound."""
    out = np.zeros((len(cols["tp"]), len(names)))
    for j, name in enumerate(names):
        prior = cm.profile.priors[name]
        ends = [score_columns(_with_profile(cm, cm.profile.with_values({name: x})), cols,
                              with_memory=False)["tokens_per_s_per_gpu"]
                for x in (prior.low, prior.high)]
        out[:, j] = np.log(ends[1] / ends[0])
    return out


def row_gradients(rows: Sequence[PreparedRow], profile: EfficiencyProfile,
                  names: Sequence[str]) -> np.ndarray:
    """:func:`gradients` of measured rows (each priced with its own cost model)."""
    out = np.zeros((len(rows), len(names)))
    for j, name in enumerate(names):
        prior = profile.priors[name]
        low = predict(rows, profile.with_values({name: prior.low}))
        high = predict(rows, profile.with_values({name: prior.high}))
        out[:, j] = np.log(high / low)
    return out


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


def expected_misordered(mu: np.ndarray, cov: np.ndarray, top: int) -> float:
    """``sum Phi(-|mu_i - mu_j| / sd_ij)`` over pairs among the ``top`` highest ``mu``."""
    order = np.argsort(-mu)[:top]
    total = 0.0
    for a in range(len(order)):
        for b in range(a + 1, len(order)):
            i, j = order[a], order[b]
            var = cov[i, i] + cov[j, j] - 2.0 * cov[i, j]
            sd = math.sqrt(max(var, 1e-12))
            total += float(norm.cdf(-abs(mu[i] - mu[j]) / sd))
    return total


def plan_objective(mu: np.ndarray, cov: np.ndarray) -> float:
    """Expected misordered top pairs plus the mean error variance in structural units."""
    return (expected_misordered(mu, cov, TOP_PAIRS)
            + float(np.mean(np.diag(cov))) / STRUCTURE_SD**2)


def _candidate_rows(scan: Any, count: int) -> np.ndarray:
    """The best layout of each of the ``count`` best shapes (tp, pp, cp, ep, etp).

    Variants of one shape (micro-batch, interleaving, recompute) share their errors
    almost entirely; measuring one of them tells about the others, so one stands for all.
    """
    return rank_feasible(scan, top=count, diverse=True)


def plan_profiling(cm: CostModel, *, k: int, measured: Sequence[PreparedRow] = (),
                   candidates: int = CANDIDATES) -> ProfilingPlan:
    """The ``k`` layouts (on ``cm``'s fabric) worth measuring next, in the order to run them."""
    if k < 1:
        raise SpecError(f"k must be >= 1 layouts to measure, got {k}")
    model, training = cm.model, cm.training
    table = require_layouts(model, training, cm.fabric.num_gpus)
    scan = scan_table(cm, table)
    if not scan.feasible:
        raise SpecError(f"no layout fits in memory on {cm.fabric.num_gpus} GPUs; nothing to "
                        "measure (`parsearch search` says how much the leanest one needs)")
    positions = _candidate_rows(scan, candidates)
    rows = scan.feasible_rows[positions]
    cols = {name: v[rows] for name, v in table.columns.items()}
    scores = score_columns(cm, cols, with_memory=False)
    tokens = np.asarray(scores["tokens_per_s_per_gpu"])
    mu = np.log(tokens)
    names = tuple(n for n in FIT_ORDER if n in cm.profile.priors)
    g = gradients(cm, cols, names)
    keep = np.abs(g).max(axis=0) > 1e-6 if len(g) else np.zeros(len(names), bool)
    if measured:
        keep |= np.abs(row_gradients(measured, cm.profile, names)).max(axis=0) > 1e-6
    names = tuple(n for n, kept in zip(names, keep, strict=True) if kept)
    g = g[:, keep]
    belief = _Belief(FACTOR_SD**2 * np.eye(len(names)), g)
    cov = belief.error_cov()
    if measured:
        for row_g in row_gradients(measured, cm.profile, names):
            cov = belief.observe(row_g, None, cov)
    sd_before = {n: float(math.sqrt(belief.factor_cov[i, i])) for i, n in enumerate(names)}
    before = expected_misordered(mu, cov, TOP_PAIRS)
    rank = np.empty(len(mu), dtype=int)
    rank[np.argsort(-mu)] = np.arange(1, len(mu) + 1)
    picks: list[PlannedRun] = []
    chosen: set[int] = set()
    current = before
    for order in range(1, min(k, len(mu)) + 1):
        best_i, best_value, best_state = -1, math.inf, None
        for i in range(len(mu)):
            if i in chosen:
                continue
            trial = _Belief(belief.factor_cov.copy(), g)
            new_cov = trial.observe(g[i], i, cov)
            value = plan_objective(mu, new_cov)
            if value < best_value - 1e-12:
                best_i, best_value, best_state = i, value, (trial, new_cov)
        assert best_state is not None
        after = expected_misordered(mu, best_state[1], TOP_PAIRS)
        reasons = _reasons(best_i, mu, cov, rank, names, belief.factor_cov,
                           best_state[0].factor_cov, current, after)
        belief, cov = best_state
        current = after
        chosen.add(best_i)
        layout = table.layout(int(rows[best_i]))
        picks.append(PlannedRun(
            order=order, layout=layout, predicted_rank=int(rank[best_i]),
            tokens_per_s_per_gpu=float(tokens[best_i]),
            step_time_s=float(scores["step_time_s"][best_i]), reasons=tuple(reasons),
            launch=_launch(cm, layout)))
    sd_after = {n: float(math.sqrt(belief.factor_cov[i, i])) for i, n in enumerate(names)}
    return ProfilingPlan(tuple(picks), len(mu), names, sd_before, sd_after, before, current)


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
        p, r = max(partners)
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


def _launch(cm: CostModel, layout: Layout) -> LaunchSettings:
    """Launch settings of ``layout`` with the features it was priced with, for a short run.

    Megatron-LM ``--train-iters/--log-interval/--log-throughput`` and the Megatron-Bridge
    fields they mirror (``train.train_iters``, ``logger.log_interval``,
    ``logger.log_throughput``: ``megatron/training/config/training_config.py``), so every
    iteration is logged with its throughput.
    """
    settings = launch_for_cluster(cm.model, cm.training, layout, cm.fabric.cluster,
                                  options=cm.options)
    iterations = WARMUP_ITERATIONS + MEASURED_ITERATIONS
    return replace(
        settings,
        megatron_lm_args=(*settings.megatron_lm_args, "--train-iters", str(iterations),
                          "--log-interval", "1", "--log-throughput"),
        bridge_overrides=(*settings.bridge_overrides, f"train.train_iters={iterations}",
                          "logger.log_interval=1", "logger.log_throughput=true"))


def launch_script(run: PlannedRun, model_name: str) -> str:
    """A shell script that runs one planned measurement with Megatron-LM (Bridge: commented)."""
    return (
        "#!/usr/bin/env bash\n"
        f"# parsearch plan-profiling, measurement {run.order}: {model_name}, layout "
        f"{run.layout.key()} on {run.launch.num_gpus} GPUs ({run.launch.nodes} node(s)).\n"
        f"# {run.iterations} iterations ({WARMUP_ITERATIONS} warm-up); predicted "
        f"{run.step_time_s:.2f} s per step, about {run.minutes:.1f} min after start-up.\n"
        "# Pass the data and tokenizer arguments of your setup to this script; set\n"
        "# MASTER_ADDR/MASTER_PORT (torchrun rendezvous) and run it on every node;\n"
        "# then feed the log to "
        "`parsearch calibrate --measurements LOG --model ... --cluster ...`.\n"
        "set -euo pipefail\n"
        + "\n".join(_megatron_lm_only(run.launch.shell_snippet().splitlines())) + "\n"
    )


def _megatron_lm_only(lines: list[str]) -> list[str]:
    """The launch snippet with its Megatron-Bridge alternative commented out (one run),
    and the script's own arguments (data, tokenizer) passed on to Megatron-LM."""
    out: list[str] = []
    bridge = False
    for line in lines:
        if line.startswith("# Megatron-Bridge") and not bridge:
            bridge = True
            out[-1] += ' "$@"'
        out.append(line if not bridge or line.startswith("#") else "# " + line)
    return out
