"""Fit an efficiency profile's residual factors to measured runs, honestly.

The cost model's structure carries the physics; calibration only moves a few
residual factors, each a physical quantity with a cited prior and range
(``priors`` in the profile YAML):

* robust loss on the log ratio ``log(predicted / measured)`` (soft-L1: rows a
  structure cannot explain do not drag the rest), plus a penalty pulling every
  factor toward its prior, in units of its cited range;
* every factor bounded by its cited range; a fitted factor that ends on a
  bound means the structure is wrong, and the fit is reported as failed
  (:attr:`CalibrationResult.on_bound`) instead of widening the range;
* a factor is fitted only where some run resolves it (its cited range moves the
  run's prediction by more than the loss scale, :func:`resolved`) and where the runs
  tell it apart from the other factors (what the others cannot mimic of its effect
  still moves some run by more than the loss scale, :func:`separable`); the others
  stay at their priors;
* with few runs, fewer factors are fitted (at most one per
  :data:`ROWS_PER_FACTOR` runs), in the order of :data:`FIT_ORDER`;
* a factor whose ratio to another is measured follows it (FP8's GEMM efficiency BF16's,
  attention backward forward; :mod:`parsearch.validation.fit.factor_ties`): one factor,
  resolved by the runs of both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from parsearch.cost.analytic import CostModel, CostOptions, layout_columns, score_columns
from parsearch.cost.efficiency import EfficiencyProfile, Prior, efficiency_for_gpu
from parsearch.errors import ParsearchError
from parsearch.validation.fit.factor_ties import (
    GEMM_ANCHOR,
    anchor_prior,
    anchors,
    factor_ties,
    with_ties,
)
from parsearch.validation.published.published_runs import (
    PublishedRun,
    current_releases,
    dedupe,
    dev_rows,
)
from parsearch.validation.published.runs import best_reading, fabric_for, run_cost_model

#: Factors in the order they are fitted when the data allow only some of them.
FIT_ORDER: tuple[str, ...] = (
    "gemm_efficiency.bf16", "gemm_efficiency.fp8", "gemm_efficiency.fp4",
    "attention_forward_efficiency", "memory_bound_factor", "grouped_gemm_efficiency",
    "alltoall_efficiency", "host_time_per_layer_s",
)
ROWS_PER_FACTOR = 4
#: Robust-loss scale: log ratios beyond ~10 % count linearly, not quadratically.
LOSS_SCALE = 0.1
#: Weight of the pull toward the prior, per factor, in units of its cited range.
PRIOR_WEIGHT = 0.3
#: A factor within this share of its range from a bound is "on the bound".
BOUND_TOLERANCE = 0.01

#: Model families for leave-one-family-out (base model name -> family).  Kimi-K2 uses
#: DeepSeek-V3's architecture, so it is held out together with it.
FAMILIES: dict[str, str] = {
    "DeepSeekV3": "deepseek", "Kimi_K2": "deepseek",
    "LLAMA3_8B": "llama3", "LLAMA3-8B": "llama3", "LLAMA3_70B": "llama3",
    "Qwen3_30B_a3B": "qwen3", "Qwen2-57B-A14B": "qwen2", "Mixtral-8x22B": "mixtral",
}


def model_family(run: PublishedRun) -> str:
    """The family a run's model belongs to (GPT-style paper models are ``gpt``)."""
    base = run.base_model
    if base.startswith("GPT"):
        return "gpt"
    return FAMILIES.get(base, base.lower())


@dataclass(frozen=True)
class PreparedRow:
    """One measured run ready to be priced under any profile of its generation."""

    run: PublishedRun
    cost_model: CostModel
    columns: dict[str, np.ndarray]
    measured: float
    generation: str
    note: str

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def family(self) -> str:
        return model_family(self.run)

    @property
    def kind(self) -> str:
        """``dense`` or ``moe``: the error band a prediction of this row belongs to."""
        return "moe" if self.run.is_moe else "dense"


def prepare_rows(runs: Iterable[PublishedRun], *, options: CostOptions | None = None,
                 include_partial: bool = False, current_only: bool = True) -> list[PreparedRow]:
    """Usable runs (the latest release of each layout), read from their recorded setup;
    with ``current_only``, only the release lines no newer one superseded
    (:func:`current_releases`), the runs a calibration fits."""
    options = replace(options or CostOptions(), memory_margin=0.0)  # these runs did run
    usable = [r for r in runs if r.skip_reason is None and r.measured_tokens_per_s_per_gpu
              and r.model_spec is not None and r.cluster is not None
              and (r.verified == "yes" or (include_partial and r.verified == "partial"))]
    if not include_partial:
        usable = dev_rows(usable)
    fabrics: dict = {}
    out = []
    usable = dedupe(usable)
    for run in current_releases(usable) if current_only else usable:
        assert run.cluster is not None
        try:
            fabric = fabric_for(fabrics, run.cluster, run.num_gpus)
            reading = best_reading(run, fabric, options)
            cm = run_cost_model(run, fabric, options, reading.training)
        except ParsearchError:
            continue
        if not reading.estimate.fits:
            continue
        out.append(PreparedRow(run, cm, layout_columns([reading.layout]),
                               float(run.measured_tokens_per_s_per_gpu or 0.0),
                               cm.profile.name, reading.note))
    return out


def predict(rows: Sequence[PreparedRow], profile: EfficiencyProfile | None = None) -> np.ndarray:
    """Predicted tokens/s/GPU of each row (under ``profile``, else its own profile).

    Rows priced by the same cost model (a user's runs of one model on one cluster and GPU
    count) are scored in one call, each layout a row of it: a fit prices every row many
    times, and one call per row made calibration's time grow with the rows' count twice
    over."""
    out = np.empty(len(rows))
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, row in enumerate(rows):
        cm = row.cost_model
        own_profile = id(cm.profile) if profile is None else None  # else replaced below
        key = (id(cm.fabric), own_profile, cm.model, cm.training, cm.options, cm.variants)
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        cm = rows[members[0]].cost_model
        if profile is not None:
            cm = replace(cm, profile=profile,
                         options=replace(cm.options, moe_imbalance=None).resolved(profile))
        columns = {name: np.concatenate([rows[i].columns[name] for i in members])
                   for name in rows[members[0]].columns}
        out[members] = np.asarray(score_columns(cm, columns, with_memory=False)
                                  ["tokens_per_s_per_gpu"], dtype=np.float64)
    return out


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted profile and how the fit went."""

    profile: EfficiencyProfile
    fitted: tuple[str, ...]
    on_bound: tuple[str, ...]
    loss_before: float
    loss_after: float
    n_rows: int
    #: Factors these rows price but none resolves apart from the others: held at their
    #: cited priors.
    unresolved: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """False when a fitted factor ended on its cited bound (the structure is wrong)."""
        return not self.on_bound


def factor_prior(profile: EfficiencyProfile, name: str,
                 ties: dict[str, tuple[str, float]] | None = None) -> Prior:
    """``name``'s cited range as calibration searches it (an anchor's narrowed so the
    factors tied to it stay inside theirs; ``ties`` default: :func:`factor_ties`)."""
    ties = factor_ties(profile) if ties is None else ties
    if name in anchors(ties):
        return anchor_prior(profile, name, ties)
    return profile.priors[name]


def range_effect(rows: Sequence[PreparedRow], profile: EfficiencyProfile,
                 name: str, ties: dict[str, tuple[str, float]] | None = None) -> np.ndarray:
    """Each row's log throughput change when ``name`` goes from its low to its high bound
    (the factors tied to it moving with it; ``ties`` default: :func:`factor_ties`)."""
    ties = factor_ties(profile) if ties is None else ties
    prior = factor_prior(profile, name, ties)
    low = predict(rows, profile.with_values(with_ties({name: prior.low}, ties)))
    high = predict(rows, profile.with_values(with_ties({name: prior.high}, ties)))
    return np.log(high / low)


def resolved(rows: Sequence[PreparedRow], profile: EfficiencyProfile, name: str) -> bool:
    """Whether some row tells ``name``'s cited range apart from the runs' scatter.

    A row resolves a factor when moving the factor across its whole cited range (the
    others where ``profile`` has them) moves the row's predicted throughput by more than
    :data:`LOSS_SCALE` (10 % in log, the scale of the robust loss).  A factor no row
    resolves is not identified: the fit would move it on scatter and structure error
    alone, typically onto a bound, so it stays at its cited prior.
    """
    return _resolves(range_effect(rows, profile, name))


def _resolves(effect: np.ndarray) -> bool:
    return bool(np.any(np.abs(effect) > LOSS_SCALE))


def separable(names: Sequence[str], rows: Sequence[PreparedRow],
              profile: EfficiencyProfile) -> list[str]:
    """The factors of ``names`` the rows can tell apart from one another.

    A factor's effect on the rows (:func:`range_effect`, one log change per row) can be
    mimicked by a combination of the other factors' effects; what is left (the least-squares
    residual) is what only it explains.  Where that moves no row by more than
    :data:`LOSS_SCALE`, the fit could set the factor anywhere and let the others make up
    the difference, so it keeps its prior.  Factors are dropped one at a time, the latest
    in :data:`FIT_ORDER` first, so that of factors that only move together the earliest
    is kept and fits their common direction (:func:`separable_effects`).
    """
    if len(names) < 2:
        return list(names)
    return separable_effects({n: range_effect(rows, profile, n) for n in names}, LOSS_SCALE)


def separable_effects(effects: dict[str, np.ndarray], threshold: float) -> list[str]:
    """The names (in ``effects`` order) left after dropping, one at a time, the last of
    those whose effect the others' least-squares combination leaves at most ``threshold``
    of on every row.

    ``effects`` come in order of priority (:data:`FIT_ORDER`: the GEMM rate, whose range
    the large-matmul measurements bound, before the terms with wider, less direct
    ranges), so of factors the runs cannot tell apart the first is kept and fits their
    common direction; the others keep their priors.  Which one the data would pin best
    is not the question: a wide-ranged factor always moves the runs more, and fitted in
    place of the GEMM rate it absorbs the GEMM's share onto its own bound.

    >>> e = {"a": np.array([0.2, 0.0, 0.1]), "b": np.array([0.0, 0.3, 0.0]),
    ...      "c": np.array([0.2, 0.3, 0.1])}            # c = a + b
    >>> separable_effects(e, 0.1)
    ['a', 'b']
    >>> separable_effects({"gemm": np.array([0.1, 0.1]), "mem": np.array([0.4, 0.4])}, 0.1)
    ['gemm']
    """
    kept = list(effects)
    while len(kept) > 1:
        weak = [name for name in kept if _unique_effect(effects, kept, name) <= threshold]
        if not weak:
            break
        kept.remove(weak[-1])
    return kept


def added_effects(effects: dict[str, np.ndarray], threshold: float) -> list[str]:
    """The names (in ``effects`` order, best determined first) each of which moves some
    row by more than ``threshold`` beyond what the least-squares combination of those kept
    before it can: forward selection.

    User calibration's few runs cannot carry many factors, and of a group of nearly
    parallel effects (a GPU's clock, its GEMM efficiency, its grouped-GEMM efficiency: all
    scale the GEMMs) the small differences between two members can mimic a third factor's
    effect; dropping factors from the whole list (:func:`separable_effects`) then drops
    that third one, a slow network say, and keeps the near-copies.  Asked one at a time,
    in order, whether a factor adds a direction to those before it, near-copies add
    nothing and are left out, and what they would have mimicked is kept (issue 33: a
    cluster at 0.85x compute and half the inter-node bandwidth).

    >>> e = {"clock": np.array([0.32, 0.26, 0.32]), "gemm": np.array([0.21, 0.14, 0.22]),
    ...      "net": np.array([0.09, 0.09, 0.20])}
    >>> added_effects(e, 0.05)
    ['clock', 'net']
    """
    kept: list[str] = []
    for name in effects:
        if not kept or _unique_effect(effects, [*kept, name], name) > threshold:
            kept.append(name)
    return kept


def _unique_effect(effects: dict[str, np.ndarray], kept: Sequence[str], name: str) -> float:
    """The largest change in any row that ``name`` makes and no combination of the other
    ``kept`` factors can: the residual of its effect on theirs, by least squares."""
    others = np.column_stack([effects[o] for o in kept if o != name])
    coef, *_ = np.linalg.lstsq(others, effects[name], rcond=None)
    return float(np.max(np.abs(effects[name] - others @ coef)))


def candidate_factors(rows: Sequence[PreparedRow], profile: EfficiencyProfile) -> list[str]:
    """The factors of :data:`FIT_ORDER` that price work these rows do (their precisions,
    MoE layers), in that order; a tied factor is fitted through its anchor."""
    precisions = {r.cost_model.training.precision for r in rows}
    ties = factor_ties(profile)
    tied_precisions = {name.split(".")[1] for name, (anchor, _) in ties.items()
                       if anchor == GEMM_ANCHOR}
    any_moe = any(r.run.is_moe for r in rows)
    out = []
    for name in FIT_ORDER:
        if name not in profile.priors or name in ties:
            continue
        if name.startswith("gemm_efficiency."):
            priced = {name.split(".")[1]} | (tied_precisions if name == GEMM_ANCHOR else set())
            if not priced & precisions:
                continue
        if name in ("grouped_gemm_efficiency", "alltoall_efficiency") and not any_moe:
            continue
        out.append(name)
    return out


def _within_limit(names: Sequence[str], n_rows: int) -> list[str]:
    """The first ``names``, at most one per :data:`ROWS_PER_FACTOR` rows."""
    return list(names[:max(0, n_rows // ROWS_PER_FACTOR)])


def _robust_mean(log_ratios: np.ndarray) -> float:
    z = log_ratios / LOSS_SCALE
    return float(np.mean(2.0 * (np.sqrt(1.0 + z * z) - 1.0)) * LOSS_SCALE**2)


def _log_scaled(prior: Prior) -> bool:
    """Ranges spanning a decade or more are searched on a log scale."""
    return prior.high / max(prior.low, 1e-30) >= 10.0


def _to_unit(prior: Prior, value: float) -> float:
    """Position of ``value`` in the prior's range, 0 (low) .. 1 (high)."""
    if _log_scaled(prior):
        return math.log(value / prior.low) / math.log(prior.high / prior.low)
    return (value - prior.low) / (prior.high - prior.low)


def _values(names: Sequence[str], priors: Sequence[Prior], u: np.ndarray) -> dict[str, float]:
    """Parameter values at unit positions ``u`` (the inverse of :func:`_to_unit`)."""
    out = {}
    for name, prior, x in zip(names, priors, u, strict=True):
        if _log_scaled(prior):
            out[name] = prior.low * (prior.high / prior.low) ** float(x)
        else:
            out[name] = prior.low + float(x) * (prior.high - prior.low)
    return out


def calibrate(rows: Sequence[PreparedRow], profile: EfficiencyProfile | None = None, *,
              factors: Sequence[str] | None = None, max_evaluations: int = 200,
              prior_weight: float = PRIOR_WEIGHT) -> CalibrationResult:
    """Fit ``profile`` (default: the rows' generation profile) to ``rows``."""
    if not rows:
        raise ParsearchError("calibration needs at least one measured run")
    generations = {r.generation for r in rows}
    if len(generations) > 1:
        raise ParsearchError(f"calibrate one GPU generation at a time, got {sorted(generations)}")
    start = profile or efficiency_for_gpu(rows[0].cost_model.fabric.gpu.name)
    ties = factor_ties(start)
    if factors is not None:
        ties = {name: tie for name, tie in ties.items() if name not in factors}
    # Every factor starts at its prior: a factor this fit does not move must not carry a
    # value an earlier fit (for instance on held-out runs) left in the profile.  A tied
    # precision starts where its anchor's prior puts it.
    start = start.with_values(with_ties(
        {name: prior.value for name, prior in start.priors.items() if name not in ties},
        ties))
    unresolved: tuple[str, ...] = ()
    if factors is not None:
        names = list(factors)
    else:
        candidates = candidate_factors(rows, start)
        # Each candidate's effect once: it decides both resolution and separability.
        effects = {n: range_effect(rows, start, n, ties) for n in candidates}
        informed = separable_effects({n: e for n, e in effects.items() if _resolves(e)},
                                     LOSS_SCALE)
        unresolved = tuple(n for n in candidates if n not in informed)
        names = _within_limit(informed, len(rows))
    measured = np.array([r.measured for r in rows])
    before = _robust_mean(np.log(predict(rows, start) / measured))
    if not names:
        return CalibrationResult(start, (), (), before, before, len(rows), unresolved)
    priors = [factor_prior(start, n, ties) for n in names]
    u_prior = np.array([_to_unit(p, p.value) for p in priors])

    def residuals(u: np.ndarray) -> np.ndarray:
        trial = start.with_values(with_ties(_values(names, priors, u), ties))
        logs = np.log(np.maximum(predict(rows, trial), 1e-9) / measured)
        return np.concatenate([logs, prior_weight * LOSS_SCALE * (u - u_prior)])

    u0 = np.clip(u_prior, 0.02, 0.98)
    fit = least_squares(residuals, u0, bounds=(0.0, 1.0), loss="soft_l1", f_scale=LOSS_SCALE,
                        max_nfev=max_evaluations, diff_step=1e-3)
    best = start.with_values(with_ties(_values(names, priors, fit.x), ties))
    after = _robust_mean(np.log(predict(rows, best) / measured))
    on_bound = tuple(n for n, x in zip(names, fit.x, strict=True)
                     if x <= BOUND_TOLERANCE or x >= 1.0 - BOUND_TOLERANCE)
    return CalibrationResult(best, tuple(names), on_bound, before, after, len(rows),
                             unresolved)
