"""How a front finds the best layout at each GPU count: exhaustive scans or an optuna study.

:func:`exhaustive_found` scans every GPU count exactly (bounded scans);
:func:`optuna_found` runs one study over every cluster, adds exact answers
at a few GPU counts and improves the others by exact scans of their
neighbouring shapes; :func:`auto_method` picks between them.  Each returns a
:class:`Found`: the best estimate per cluster and GPU count, with counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from parsearch.cost.analytic import CostOptions, Estimate, build_cost_model, estimate
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.layout import Layout
from parsearch.layout.space import enumerate_layouts
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.search.arguments import positive, progress_bar
from parsearch.search.exhaustive import (
    SHAPE_AXES,
    considered_count,
    estimates_for_rows,
    rank_feasible,
    scan_bounded,
)
from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.hardware import load_gpu_profile
from parsearch.topology.summary import fabric_from_spec

#: GPU counts per cluster where an optuna front is seeded with the exact best layout.
SEED_COUNTS = 3


class StudyArgs(NamedTuple):
    n_trials: int | None
    seed: int | None
    storage: str | None
    study_name: str | None
    sampler: str
    stop_after: int | None


class MethodStats(NamedTuple):
    considered: int
    valid: int
    feasible: int
    evaluations: int
    examined: int | None = None  # valid layouts checked (exhaustive); None: unknown


class Found(NamedTuple):
    """What a method found: the best estimate per cluster and GPU count, and the counts."""

    best: dict[str, dict[int, Estimate]]
    stats: dict[str, MethodStats]
    evaluations: int
    study: dict[str, Any] | None
    exact: bool = True
    coverage: float | None = None
    note: str | None = None


def auto_method(model: ModelSpec, training: TrainingSpec,
                counts_by: dict[str, tuple[int, ...]], limit: int | None,
                ) -> tuple[str, str | None]:
    """``(method, note)``: ``exhaustive`` (exact) unless more than ``limit`` valid layouts.

    The note says why the answer is not exact when ``auto`` picks optuna.
    """
    if limit is None:
        return "exhaustive", None
    sizes: dict[int, int] = {}  # the valid layouts of a count do not depend on the cluster
    total = 0
    for counts in counts_by.values():
        for n in counts:
            if n not in sizes:
                sizes[n] = len(enumerate_layouts(model, training, n, explain=False))
            total += sizes[n]
            if total > limit:
                return "optuna", (
                    f"auto: more than {limit:,} valid layouts (--exhaustive-limit), so optuna "
                    "searched instead of the exact scan; points are the best layouts it "
                    "tried, not proven best (see coverage); use --method exhaustive for the "
                    "exact answer")
    return "exhaustive", None


def exhaustive_found(model: ModelSpec, training: TrainingSpec,
                     clusters: tuple[ClusterSpec, ...], counts_by: dict[str, tuple[int, ...]],
                     profiles: dict[str, EfficiencyProfile], options: CostOptions | None,
                     progress: bool) -> Found:
    best: dict[str, dict[int, Estimate]] = {}
    stats: dict[str, MethodStats] = {}
    for c in clusters:
        desc = "pareto (exhaustive)" if len(clusters) == 1 else f"pareto (exhaustive, {c.name})"
        best[c.name], stats[c.name] = _exhaustive_bests(
            model, training, c, counts_by[c.name], profiles[c.name], options, progress, desc)
    return Found(best, stats, sum(s.evaluations for s in stats.values()), None)


def _exhaustive_bests(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                      counts: Sequence[int], profile: EfficiencyProfile | None,
                      options: CostOptions | None, progress: bool,
                      desc: str = "pareto (exhaustive)",
                      ) -> tuple[dict[int, Estimate], MethodStats]:
    """The exact best layout at each GPU count (bounded scans: :func:`scan_bounded`)."""
    best: dict[int, Estimate] = {}
    considered = valid = feasible = examined = 0
    gpu = load_gpu_profile(cluster.gpu)
    with progress_bar(progress, len(counts), "counts", desc) as advance:
        for n in counts:
            table = enumerate_layouts(model, training, n, explain=False)
            considered += considered_count(model, training, n)
            valid += len(table)
            if len(table):
                cm = build_cost_model(model, training, fabric_from_spec(cluster, n, gpu=gpu),
                                      profile=profile, options=options)
                scan = scan_bounded(cm, table, top=1)
                feasible += scan.feasible
                examined += scan.checked
                if scan.feasible:
                    pick = rank_feasible(scan, top=1)
                    best[n] = estimates_for_rows(cm, table, scan.feasible_rows[pick])[0]
            advance(1)
    return best, MethodStats(considered, valid, feasible, examined, examined)


def optuna_found(model: ModelSpec, training: TrainingSpec, clusters: tuple[ClusterSpec, ...],
                 counts_by: dict[str, tuple[int, ...]],
                 profiles: dict[str, EfficiencyProfile], options: CostOptions | None,
                 progress: bool, study_args: StudyArgs) -> Found:
    """One study over every cluster (a ``cluster`` axis when there are several)."""
    from parsearch.search.optuna_search import run_study

    a = study_args
    budget = 2000 if a.n_trials is None else positive("n_trials", a.n_trials)
    single = len(clusters) == 1
    with progress_bar(progress, budget, "trials", "pareto (optuna)") as advance:
        outcome = run_study(
            model=model, training=training, cluster=clusters[0] if single else clusters,
            gpu_counts=counts_by[clusters[0].name] if single else counts_by, n_trials=budget,
            seed=a.seed, storage=a.storage, study_name=a.study_name, sampler=a.sampler,
            profile=profiles[clusters[0].name] if single else profiles, options=options,
            on_trials=advance, stop_after=a.stop_after)
    best: dict[str, dict[int, Estimate]] = {}
    stats: dict[str, MethodStats] = {}
    sizes: dict[int, int] = {}  # valid layouts per GPU count (the same on every cluster)
    scored = total = 0
    seeded: dict[str, list[int]] = {}
    for c in clusters:
        records = [r for r in outcome.records if r.cluster == c.name]
        best[c.name] = _best_of_records(model, training, c, records, profiles[c.name], options)
        # exact answers at a few GPU counts: the front is anchored where they are known
        seeds, seed_stats = _exhaustive_bests(model, training, c, _seed_counts(counts_by[c.name]),
                                              profiles[c.name], options, False)
        for n, e in seeds.items():
            if n not in best[c.name] or e.tokens_per_s > best[c.name][n].tokens_per_s:
                best[c.name][n] = e
        seeded[c.name] = sorted(seeds)
        polished = _polish(model, training, c, best[c.name], set(seeds), profiles[c.name],
                           options)
        evaluations = (outcome.evaluations_by_cluster.get(c.name, 0) + seed_stats.evaluations
                       + polished)
        stats[c.name] = MethodStats(len(records), sum(r.valid for r in records),
                               sum(r.valid and r.fits for r in records), evaluations)
        for n in counts_by[c.name]:
            if n not in sizes:
                sizes[n] = len(enumerate_layouts(model, training, n, explain=False))
            total += sizes[n]
        scored += evaluations
    coverage = min(1.0, scored / total) if total else 1.0
    study = outcome.to_dict() | {"seeded_exact": seeded if not single
                                 else seeded[clusters[0].name]}
    return Found(best, stats, sum(s.evaluations for s in stats.values()), study, exact=False,
                  coverage=coverage)


def _polish(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
            best: dict[int, Estimate], exact: set[int], profile: EfficiencyProfile,
            options: CostOptions | None, rounds: int = 3) -> int:
    """Improve each GPU count's best by exact scans of its neighbourhood (in place).

    The neighbourhood of a layout: every valid layout of its GPU count whose
    (tp, pp, cp, ep, etp) differs from it in at most one axis.  Repeated while
    it improves (at most ``rounds`` times).  Returns the layouts scored.
    """
    scored = 0
    for n in sorted(set(best) - exact):
        table = enumerate_layouts(model, training, n, explain=False)
        cm = build_cost_model(model, training, fabric_from_spec(cluster, n), profile=profile,
                              options=options)
        for _ in range(rounds):
            lay, c = best[n].layout, table.columns
            differ = sum((c[a] != getattr(lay, a)).astype(np.int64) for a in SHAPE_AXES)
            near = table.select(differ <= 1)
            scan = scan_bounded(cm, near, top=1)
            scored += scan.checked
            if not scan.feasible:
                break
            found = estimates_for_rows(cm, near, scan.feasible_rows[rank_feasible(scan, top=1)])
            if found[0].tokens_per_s <= best[n].tokens_per_s:
                break
            best[n] = found[0]
    return scored


def _seed_counts(counts: Sequence[int]) -> tuple[int, ...]:
    """The smallest, the largest and a middle GPU count (geometrically), at most SEED_COUNTS."""
    if len(counts) <= SEED_COUNTS:
        return tuple(counts)
    middle = math.sqrt(counts[0] * counts[-1])
    mid = min(counts, key=lambda n: abs(n - middle))
    return tuple(sorted({counts[0], mid, counts[-1]}))[:SEED_COUNTS]


def _best_of_records(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                     records: Sequence[Any], profile: EfficiencyProfile,
                     options: CostOptions | None) -> dict[int, Estimate]:
    """The full estimate of the fastest fitting layout tried at each GPU count."""
    chosen: dict[int, Layout] = {}
    tokens: dict[int, float] = {}
    for rec in records:
        if rec.valid and rec.fits and rec.tokens_per_s > tokens.get(rec.layout.num_gpus, 0.0):
            chosen[rec.layout.num_gpus] = rec.layout
            tokens[rec.layout.num_gpus] = rec.tokens_per_s
    best: dict[int, Estimate] = {}
    for n, lay in chosen.items():
        cm = build_cost_model(model, training, fabric_from_spec(cluster, n), profile=profile,
                              options=options)
        best[n] = estimate(cm, lay)
    return best
