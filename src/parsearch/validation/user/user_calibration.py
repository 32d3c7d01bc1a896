"""Calibrate a generation's efficiency profile to measurements of the user's own cluster.

Each measurement (:mod:`parsearch.validation.user.measurements`) becomes a
:class:`~parsearch.validation.fit.calibration.PreparedRow`: its model, cluster,
layout, batch, precision and the features it ran with.  The fit is the cost
model's own bounded, regularised procedure
(:func:`~parsearch.validation.fit.calibration.calibrate`, here
:func:`~parsearch.validation.fit.joint_fit.fit_factors`) with three choices made
for a handful of runs of one cluster:

* the shipped profile is the starting point: every factor starts at (and is
  pulled toward) its shipped value, which was fitted to the published runs,
  inside the cited range, which stays the bound;
* the cluster's delivered bandwidth and its GPUs' sustained clock are factors too
  (:mod:`parsearch.validation.fit.network_calibration`: inter-node and NVLink
  bandwidth over what the cluster file says, and the SM clock over the rated one,
  pulled toward 1.0), fitted only for runs of one cluster file;
* only factors the measurements can inform are fitted: those whose whole cited
  range moves the runs' predicted throughput by at least
  :data:`MIN_SENSITIVITY` (in log; the cluster's bandwidth
  :data:`~parsearch.validation.fit.network_calibration.MIN_NETWORK_SENSITIVITY`),
  most sensitive first, at most one per
  :data:`~parsearch.validation.fit.calibration.ROWS_PER_FACTOR` runs, rounded up,
  and only those that at least :data:`MIN_RUNS_MOVED` runs each move by
  :data:`MIN_UNIQUE_EFFECT` (never the only factor spent on one run; a single
  run fits nothing).  The report says which were fitted, and why the others
  were not.

When the runs push a factor past the bound of its cited range, they are slower
or faster than the ranges allow: the cluster-level speed factor
(:mod:`parsearch.validation.fit.cluster_speed`) is fitted with the others, and the
report says so and keeps the bound as a warning.  Every factor that ends on a
bound is flagged, cluster factors included
(:func:`~parsearch.validation.fit.cluster_speed.on_bounds`).

Accuracy is reported as leave-one-run-out: each run predicted by the shipped
profile (which has never seen it) and by a profile calibrated on the other
runs (factor choice included), as MAPE and as ranking quality
(:mod:`parsearch.validation.user.user_report`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from parsearch.cost.analytic import CostOptions, build_cost_model, estimate, layout_columns
from parsearch.cost.coverage import widened
from parsearch.cost.efficiency import EfficiencyProfile, Prior
from parsearch.errors import ParsearchError
from parsearch.layout.rules import check_layout
from parsearch.model.files import resolve_model
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.fit.calibration import (
    BOUND_TOLERANCE,
    FIT_ORDER,
    PRIOR_WEIGHT,
    ROWS_PER_FACTOR,
    PreparedRow,
    added_effects,
    predict,
    range_effect,
)
from parsearch.validation.fit.cluster_speed import (
    CLUSTER_SPEED,
    UserFit,
    better_with_speed,
    on_bounds,
    with_speed_prior,
)
from parsearch.validation.fit.factor_ties import gemm_ties
from parsearch.validation.fit.joint_fit import fit_factors
from parsearch.validation.fit.network_calibration import (
    CLUSTER_FACTORS,
    COMPUTE_FACTOR,
    MIN_NETWORK_SENSITIVITY,
    NETWORK_FACTOR,
    NVLINK_FACTOR,
    SPINE_FACTOR,
    network_priors,
    rows_with_cluster_factors,
)
from parsearch.validation.fit.spine_tier import (
    leaf_before_spine,
    spine_apart,
    spine_earns_its_place,
    spine_tied_reason,
    tier_sentence,
)
from parsearch.validation.published.published_runs import PublishedRun
from parsearch.validation.user.measurements import Measurement, one_line
from parsearch.validation.user.user_report import (
    RowReport,
    UserCalibration,
    error_bands,
)

#: A factor whose whole cited range moves the measured runs' log throughput by less than this
#: (mean over the runs) cannot be informed by them and is not fitted.
MIN_SENSITIVITY = 0.01
#: What only a factor explains (its range effect less the least-squares combination of the
#: other informed factors' effects) must move some run by this much for the runs to tell
#: it apart: 2.5 times the 2 % run-to-run spread of a measured step time, the bar the
#: cluster factors use (network_calibration.MIN_NETWORK_SENSITIVITY).
MIN_UNIQUE_EFFECT = 0.05
#: A factor is fitted only when at least this many runs each move by MIN_UNIQUE_EFFECT across
#: its cited range: the only factor spent on one run absorbs that run's error and nothing
#: the others can check (issue 33: with two runs the one factor fitted often moved one).
MIN_RUNS_MOVED = 2


def prepare_measurements(measurements: Sequence[Measurement],
                         profile: EfficiencyProfile | None = None,
                         ) -> tuple[list[PreparedRow], list[str]]:
    """Rows ready for calibration, and one line per measurement that cannot be priced."""
    rows: list[PreparedRow] = []
    problems: list[str] = []
    models: dict[str, ModelSpec] = {}
    fabrics: dict[tuple[str, int], Any] = {}
    for m in measurements:
        try:
            rows.append(_prepare(m, profile, models, fabrics))
        except ParsearchError as error:
            text = str(error) if m.source in str(error) else f"{m.source}: {error}"
            problems.append(one_line(text))
    return rows, problems


def _prepare(m: Measurement, profile: EfficiencyProfile | None, models: dict[str, ModelSpec],
             fabrics: dict[tuple[str, int], Any]) -> PreparedRow:
    if m.model is None:
        raise ParsearchError("the measurement does not name the model; pass --model")
    if m.cluster is None:
        raise ParsearchError("the measurement does not name the cluster; pass --cluster")
    if m.model not in models:
        models[m.model] = resolve_model(m.model)
    model = models[m.model]
    for name, value in m.model_facts.items():
        if getattr(model, name) != value:
            raise ParsearchError(f"the log states {name}={value} but model {model.name} has "
                                 f"{getattr(model, name)}; pass the --model that ran")
    key = (m.cluster, m.layout.num_gpus)
    if key not in fabrics:
        fabrics[key] = build_fabric(load_cluster(m.cluster), m.layout.num_gpus)
    fabric = fabrics[key]
    lay = m.layout
    training = TrainingSpec(
        seq_len=m.seq_len, global_batch=m.global_batch, micro_batch_sizes=(lay.mbs,),
        precision=m.precision, recompute_modes=(lay.recompute,),  # type: ignore[arg-type]
        sequence_parallel="on" if lay.sp or lay.tp == 1 else "off", **m.training)
    violations = check_layout(model, training, lay)
    if violations:
        v = violations[0]
        raise ParsearchError(f"layout {lay.key()} on {lay.num_gpus} GPUs breaks {v.rule}: "
                             f"{v.message}")
    # A measured run did run: its memory is not judged against a safety margin.
    options = CostOptions(memory_margin=0.0, **m.options)
    cm = build_cost_model(model, training, fabric, profile=profile, options=options)
    notes = list(m.notes)
    if not estimate(cm, lay).fits:
        notes.append("the memory model says this layout does not fit (it ran: the memory "
                     "model is pessimistic here)")
    run = PublishedRun(
        id=m.source, source="user measurements", source_tag="USER", source_locator=m.source,
        model=model.name, gpu=fabric.gpu.name, cluster=m.cluster, num_gpus=lay.num_gpus,
        layout=lay, global_batch=m.global_batch, seq_len=m.seq_len,
        precision=m.precision,  # type: ignore[arg-type]
        precision_raw=m.precision, fp8_recipe=None,
        measured_tokens_per_s_per_gpu=m.tokens_per_s_per_gpu, measured_tflops_per_gpu=None,
        measured_mfu=None, conversion="reported", verified="yes", notes="; ".join(notes),
        model_spec=model, model_source=None, release=None, assumptions=(), skip_reason=None)
    return PreparedRow(run, cm, layout_columns([lay]), m.tokens_per_s_per_gpu,
                       cm.profile.name, "; ".join(notes))


def anchored(profile: EfficiencyProfile) -> EfficiencyProfile:
    """``profile`` with each prior's value moved to the profile's (fitted) value.

    :func:`calibrate` starts every factor at its prior value and pulls it
    there; anchoring makes that the shipped, already-fitted value, so a few
    runs move the profile away from what the published runs established only
    as far as they show.
    """
    priors = {}
    for name, prior in profile.priors.items():
        try:
            value = min(max(profile.get(name), prior.low), prior.high)
        except (AttributeError, KeyError):
            value = prior.value
        priors[name] = Prior(value, prior.low, prior.high, prior.source)
    return replace(profile, priors=priors)


def range_effects(rows: Sequence[PreparedRow], profile: EfficiencyProfile,
                  names: Sequence[str] | None = None,
                  cluster_priors: Mapping[str, Prior] | None = None) -> dict[str, np.ndarray]:
    """Each row's log throughput change when a factor goes from its low to high bound.

    Profile factors (``names``, default :data:`FIT_ORDER`) and the cluster factors
    of ``cluster_priors`` (:mod:`parsearch.validation.fit.network_calibration`).
    """
    out = {}
    # FP8's GEMM efficiency is fitted through BF16's: the anchor's effect includes it
    # (calibration.range_effect; attention stays untied here, factor_ties.gemm_ties).
    tied = gemm_ties(profile)
    for name in names if names is not None else [n for n in FIT_ORDER if n not in tied]:
        prior = profile.priors.get(name)
        if prior is None or prior.high <= prior.low:
            continue
        out[name] = range_effect(rows, profile, name, tied)
    for name, prior in (cluster_priors or {}).items():
        low = predict(rows_with_cluster_factors(rows, {name: prior.low}), profile)
        high = predict(rows_with_cluster_factors(rows, {name: prior.high}), profile)
        out[name] = np.log(high / low)
    return out


#: Profile factors that scale with the GPUs' SM clock (tensor-core and SFU rates:
#: parsearch.topology.power), which the clock moves together.
CLOCK_RATE_FACTORS = ("gemm_efficiency.bf16", "gemm_efficiency.fp8", "gemm_efficiency.fp4",
                      "grouped_gemm_efficiency", "attention_forward_efficiency")


def ranking_rms(rms: Mapping[str, float]) -> dict[str, float]:
    """The root-mean-square effects factors are ordered by, the clock's raised to the
    largest of the kernel efficiencies it moves (:data:`CLOCK_RATE_FACTORS`).

    A few runs barely tell the clock from one kernel's efficiency (GEMMs dominate the
    step), and the clock moves GEMMs, grouped GEMMs and attention together, as a power
    cap, clock lock or throttling does (the common reasons a user's cluster is slower,
    issue 33): it takes the compute direction's place in the order, ahead of them (ties
    go to the clock), and an efficiency is fitted beside it only where the runs show it
    apart (:func:`added_effects`).  Against the other factors it competes as the compute
    direction does.

    >>> ranking_rms({"gemm_efficiency.bf16": 0.3, COMPUTE_FACTOR: 0.2, "x": 0.25})[COMPUTE_FACTOR]
    0.3
    """
    out = dict(rms)
    if COMPUTE_FACTOR in out:
        out[COMPUTE_FACTOR] = max([out[COMPUTE_FACTOR],
                                   *(out[n] for n in CLOCK_RATE_FACTORS if n in out)])
    return out


def factor_limit(n_rows: int, rows_per_factor: int = ROWS_PER_FACTOR) -> int:
    """Factors ``n_rows`` runs may fit: one per ``ROWS_PER_FACTOR``, rounded up, at least one.

    >>> [factor_limit(n) for n in (1, 3, 4, 5, 10)]
    [1, 1, 1, 2, 3]
    """
    return max(1, math.ceil(n_rows / rows_per_factor))


def threshold(name: str) -> float:
    """Least sensitivity at which a factor is fitted (cluster factors ask for more)."""
    return MIN_NETWORK_SENSITIVITY if name in CLUSTER_FACTORS else MIN_SENSITIVITY


def cluster_priors_for(rows: Sequence[PreparedRow]) -> tuple[dict[str, Prior], str]:
    """The cluster factors ``rows`` may fit, and why the others may not (``""``: none left out).

    Only runs of one cluster file: the delivered bandwidth is a property of one cluster.
    """
    clusters = sorted({r.cost_model.fabric.cluster.name for r in rows})
    if len(clusters) > 1:
        return {}, (f"network factors not fitted: the runs span clusters {', '.join(clusters)} "
                    "(calibrate one cluster at a time with --cluster to fit its network)")
    priors = network_priors(rows[0].cost_model.fabric.cluster)
    missing = [n for n in CLUSTER_FACTORS if n not in priors]
    why = (f"{', '.join(missing)} not fitted: cluster {clusters[0]} has no such tier"
           if missing else "")
    return priors, why


def choose_factors(rows: Sequence[PreparedRow], profile: EfficiencyProfile,
                   rows_per_factor: int = ROWS_PER_FACTOR,
                   cluster_priors: Mapping[str, Prior] | None = None,
                   ) -> tuple[list[str], dict[str, float], str]:
    """The factors to fit, every factor's sensitivity, and a sentence saying why.

    A factor is informed when its whole range moves the runs by :func:`threshold`
    (mean |d log throughput|).  Profile and cluster factors compete on one list,
    ordered by how much the runs say about them: the root-mean-square change, the
    square root of the diagonal of the linearised fit's normal matrix ``J'J / n``
    (a factor that moves two of five runs a lot is better determined than one that
    moves all five a little).  The GPUs' clock (:data:`COMPUTE_FACTOR`) goes ahead of
    the kernel efficiencies it moves together (:func:`ranking_rms`); the spine goes
    right after the leaf tier it refines, and is kept only where the runs tell it
    apart from it (:mod:`parsearch.validation.fit.spine_tier`).
    """
    chosen, sens, why, reasons = _choose(rows, profile, rows_per_factor, cluster_priors)
    return chosen, sens, why + _tiers(chosen, reasons, cluster_priors)


def _choose(rows: Sequence[PreparedRow], profile: EfficiencyProfile, rows_per_factor: int,
            cluster_priors: Mapping[str, Prior] | None,
            ) -> tuple[list[str], dict[str, float], str, dict[str, str]]:
    """:func:`choose_factors`, and why each scale-out tier's factor was not fitted."""
    effects = range_effects(rows, profile, cluster_priors=cluster_priors)
    sens = {n: float(np.mean(np.abs(g))) for n, g in effects.items()}
    rms = {n: float(np.sqrt(np.mean(g * g))) for n, g in effects.items()}
    moved = {n: int(np.sum(np.abs(g) >= MIN_UNIQUE_EFFECT)) for n, g in effects.items()}
    lonely = [n for n, s in sens.items() if s >= threshold(n) and moved[n] < MIN_RUNS_MOVED]
    rank = ranking_rms(rms)
    informative = leaf_before_spine(sorted(
        (n for n, s in sens.items() if s >= threshold(n) and moved[n] >= MIN_RUNS_MOVED),
        key=lambda n: (-rank[n], n != COMPUTE_FACTOR)))
    # Of factors whose effects the others can mimic, the runs fix only their sum: keep the
    # better determined one, the first listed, and a later one only where it moves some run
    # beyond what those before it can (calibration.added_effects: forward, so two near-copies
    # cannot together mimic a third; the shipped fit keeps the first in FIT_ORDER instead:
    # its runs span many models, a user's few).  The spine must also stand apart from the
    # leaf tier, kept or not (spine_tier.spine_apart).
    apart = spine_apart(added_effects({n: effects[n] for n in informative}, MIN_UNIQUE_EFFECT),
                        effects, MIN_UNIQUE_EFFECT)
    mimicked = [n for n in informative if n not in apart]
    limit = factor_limit(len(rows), rows_per_factor)
    chosen = apart[:limit]
    why = (f"fitted {len(chosen)} of the {len(informative)} factors these runs inform "
           f"(|d log throughput| >= {MIN_SENSITIVITY} over the cited range, "
           f">= {MIN_NETWORK_SENSITIVITY} for the cluster's bandwidth)")
    if chosen:
        why += f": {', '.join(chosen)}"
    if lonely:
        why += (f"; not fitted, fewer than {MIN_RUNS_MOVED} runs move it by {MIN_UNIQUE_EFFECT} "
                "over its cited range (fitted to one run it would only absorb that run's "
                "error): " + ", ".join(f"{n} ({moved[n]} run(s))" for n in lonely))
    if mimicked:
        why += (f"; left at the shipped values, the runs cannot tell them apart from the "
                f"others (what only it explains moves no run by {MIN_UNIQUE_EFFECT}): "
                f"{', '.join(mimicked)}")
    if len(apart) > limit:
        why += (f"; {len(rows)} run(s) allow at most {limit} (one per {rows_per_factor} runs): "
                f"left at the shipped values: {', '.join(apart[limit:])}")
    reasons: dict[str, str] = {}
    for name in cluster_priors or {}:
        if name in chosen:
            continue
        if name == SPINE_FACTOR:
            reasons[name] = spine_tied_reason(rows, effects, chosen, informative, apart,
                                              MIN_UNIQUE_EFFECT, MIN_RUNS_MOVED,
                                              MIN_NETWORK_SENSITIVITY)
            continue
        if sens[name] < MIN_NETWORK_SENSITIVITY:
            what = _USES.get(name, "depend on it")
            reasons[name] = (f"the runs barely {what} (its range {cluster_priors[name].low:.2f}-"
                             f"{cluster_priors[name].high:.2f} moves them {sens[name]:.3f} < "
                             f"{MIN_NETWORK_SENSITIVITY})")
            why += f"; {name} not fitted: {reasons[name]}, the cluster file is kept"
        elif name in lonely:
            reasons[name] = f"{moved[name]} run(s) move by {MIN_UNIQUE_EFFECT} over its range"
        elif name in mimicked:
            reasons[name] = "the runs cannot tell it apart from the factors fitted"
        else:
            reasons[name] = f"the factor limit (one per {rows_per_factor} runs) left no room"
    return chosen, sens, why, reasons


def _tiers(fitted: Sequence[str], reasons: Mapping[str, str],
           cluster_priors: Mapping[str, Prior] | None) -> str:
    """``"; scale-out tiers: ..."`` for clusters with a spine tier (``""`` otherwise)."""
    present = [n for n in (cluster_priors or {}) if n != COMPUTE_FACTOR]
    return f"; {tier_sentence(fitted, reasons, present)}" if SPINE_FACTOR in present else ""


#: What a run must do for a cluster factor to move it (the report's words).
_USES = {NETWORK_FACTOR: "cross nodes", NVLINK_FACTOR: "use NVLink",
         SPINE_FACTOR: "cross leaf groups", COMPUTE_FACTOR: "depend on the GPUs' clock"}


def fit_user_profile(rows: Sequence[PreparedRow], base: EfficiencyProfile | None = None, *,
                     prior_weight: float = PRIOR_WEIGHT, rows_per_factor: int = ROWS_PER_FACTOR,
                     network: bool = True, speed: bool = True) -> UserFit:
    """Profile and cluster factors fitted to ``rows`` of one generation.

    ``network=False``: profile factors only (the cluster file taken at its word).
    When the runs push a factor past the bound of its cited range (they are slower or
    faster than the ranges allow), or the fit leaves them off by more than the speed
    factor removes (:data:`~parsearch.validation.fit.cluster_speed.SPEED_GAIN`), the
    cluster-level speed factor is fitted with the others
    (:mod:`parsearch.validation.fit.cluster_speed`; ``speed=False``: never).
    """
    if not rows:
        raise ParsearchError("no usable measurements to calibrate on")
    generations = sorted({r.generation for r in rows})
    if len(generations) > 1:
        raise ParsearchError(f"the measurements span GPU generations {', '.join(generations)}; "
                             "calibrate one cluster (or generation) at a time with --cluster")
    base = base or rows[0].cost_model.profile
    start = anchored(base)
    cluster_priors, left_out = cluster_priors_for(rows) if network else ({}, "")
    names, sens, why, reasons = _choose(rows, start, rows_per_factor, cluster_priors)
    if left_out:
        why += f"; {left_out}"
    profile, cluster, pushed = fit_factors(rows, start, names, cluster_priors,
                                           prior_weight=prior_weight)
    if _faster_than_the_clock(cluster, cluster_priors):
        # The clock cannot explain runs faster than the profile: the GEMM efficiencies,
        # whose ranges reach the best measured matmul, can (network_calibration.compute_prior).
        cluster_priors = {n: p for n, p in cluster_priors.items() if n != COMPUTE_FACTOR}
        names, sens, why, reasons = _choose(rows, start, rows_per_factor, cluster_priors)
        why += (f"; {COMPUTE_FACTOR} left at 1.0: the runs are not slower than the GPUs' "
                "sustained clock allows, and no clock runs faster than it")
        if left_out:
            why += f"; {left_out}"
        profile, cluster, pushed = fit_factors(rows, start, names, cluster_priors,
                                               prior_weight=prior_weight)
    fit = UserFit(profile, cluster, dict(cluster_priors), tuple(names), pushed, sens, why)
    # The spine must explain more than the runs' scatter (spine_tier.SPINE_GAIN).
    fit, spread = spine_earns_its_place(rows, start, fit, prior_weight)
    if spread:
        reasons[SPINE_FACTOR] = spread
        pushed = fit.on_bound
    fit = replace(fit, on_bound=on_bounds(fit, start))
    if not speed or len(rows) < MIN_RUNS_MOVED:
        return replace(fit, why=fit.why + _tiers(fit.fitted, reasons, cluster_priors))
    # The speed factor counts against the factor limit: it takes the place of the last
    # physical factor chosen (three noisy runs fitting a physical factor and the speed factor
    # together misordered near-tied MoE layouts: benchmarks/calibration_user_cases.py).
    keep = factor_limit(len(rows), rows_per_factor) - 1
    final = better_with_speed(rows, start, fit, prior_weight, keep, pushed)
    dropped = [n for n in fit.fitted if n not in final.fitted]
    if dropped:
        final = replace(final, why=f"{final.why}; {', '.join(dropped)} then left out: "
                        f"{CLUSTER_SPEED} took its place (the factor limit)")
        reasons.update({n: f"{CLUSTER_SPEED} took its place" for n in dropped})
    return replace(final, why=final.why + _tiers(final.fitted, reasons, cluster_priors))


def _faster_than_the_clock(cluster: Mapping[str, float], priors: Mapping[str, Prior]) -> bool:
    """Whether the fitted :data:`COMPUTE_FACTOR` ended on its upper bound (the GPUs' clock at
    rated power: the runs are not slower than it allows, and may be faster)."""
    if COMPUTE_FACTOR not in cluster:
        return False
    prior = priors[COMPUTE_FACTOR]
    return cluster[COMPUTE_FACTOR] >= prior.high - BOUND_TOLERANCE * (prior.high - prior.low)


def calibrate_user(rows: Sequence[PreparedRow], base: EfficiencyProfile | None = None, *,
                   leave_one_out: bool = True, network: bool = True) -> UserCalibration:
    """Fit on all runs; with ``leave_one_out``, predict each run from a fit to the others."""
    fit = fit_user_profile(rows, base, network=network)
    base = base or rows[0].cost_model.profile
    shipped = predict(rows, base)
    calibrated = fit.predict(rows)
    loo = np.full(len(rows), np.nan)
    if leave_one_out and len(rows) > 1:
        for i in range(len(rows)):
            others = [r for j, r in enumerate(rows) if j != i]
            fold = fit_user_profile(others, base, network=network)
            loo[i] = fold.predict([rows[i]])[0]
    reports = tuple(RowReport(r.id, r.run.layout.key(), r.run.num_gpus, r.measured,
                              float(a), float(b), float(c), _job(r))
                    for r, a, b, c in zip(rows, shipped, loo, calibrated, strict=True))
    bands = error_bands(rows, loo, base)
    names = ", ".join(f"{n}={fit.profile.get(n):.4g}" for n in fit.fitted
                      if n not in CLUSTER_FACTORS) or "nothing"
    source = (base.source.split("; calibration")[0]
              + f"; calibrated by parsearch calibrate to {len(rows)} measured run(s): {names}")
    if fit.cluster:
        source += ("; fitted together with the cluster's delivered bandwidth ("
                   + ", ".join(f"{n}={v:.3g}" for n, v in fit.cluster.items())
                   + "): use it with the corrected cluster file")
    # The user's runs join what the profile was fitted to (parsearch.cost.coverage).
    coverage = widened(base.coverage, (r.run.model_spec for r in rows
                                       if r.run.model_spec is not None))
    if fit.speed is not None:
        source += f"; {CLUSTER_SPEED}={fit.speed.value:.4g} fitted: {fit.speed.reason}"
    # The speed factor's cited range travels with the profile that uses it.
    priors = with_speed_prior(base).priors if fit.speed is not None else base.priors
    written = replace(fit.profile, priors=priors, uncertainty=bands, source=source,
                      coverage=coverage)
    return UserCalibration(written, base, fit.fitted, fit.on_bound, fit.sensitivity, fit.why,
                           reports, dict(fit.cluster), fit.cluster_priors,
                           rows[0].run.cluster if fit.cluster else None, fit.speed)


def _job(row: PreparedRow) -> str:
    """The job a run belongs to: layouts of one job compete for it (ranking quality)."""
    run = row.run
    return f"{run.model} on {run.num_gpus} GPUs, batch {run.global_batch}, seq {run.seq_len}"
