"""Public search API: the best layouts on N GPUs, and throughput against GPU count.

Everything the ``search`` and ``pareto`` commands do starts here, as two
keyword-only functions returning frozen dataclasses
(:mod:`~parsearch.search.results`) whose ``to_dict()`` is the CLI's JSON
(``shared/spec/cli.md``).  Their arguments are checked in
:mod:`~parsearch.search.arguments`; a front's best layout per GPU count is
found by :mod:`~parsearch.search.front_methods`:

Both take the question as a :class:`~parsearch.query.Query` (model, training setup,
cluster(s), cost options, efficiency profile) and their own knobs as keywords:

>>> from parsearch.model.specs import ModelSpec, TrainingSpec
>>> from parsearch.query import Query
>>> toy = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
>>> setup = TrainingSpec(seq_len=2048, global_batch=64, micro_batch_sizes=(1, 2))
>>> result = search_layouts(Query(toy, setup, "dgx-h100"), num_gpus=8, top=3)
>>> len(result.entries), result.entries[0].rank
(3, 1)
>>> front = pareto_front(Query(toy, setup, "dgx-h100"), max_gpus=32)
>>> [p.num_gpus for p in front.front][:1]
[8]

Several clusters: a front per cluster and one over all of them (which
cluster, and how many GPUs):

>>> both = pareto_front(Query(toy, setup, ["dgx-h100", "dgx-a100"]), max_gpus=16)
>>> both.clusters, sorted({p.cluster for p in both.points})
(('dgx-h100', 'dgx-a100'), ['dgx-a100', 'dgx-h100'])
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from parsearch.cost.analytic import (
    GIB,
    CostOptions,
    Estimate,
    build_cost_model,
    wide_columns,
)
from parsearch.cost.coverage import uncovered_features
from parsearch.cost.efficiency import band_for
from parsearch.cost.ep_overlap import pinned_feature_flags
from parsearch.errors import SpecError
from parsearch.launch import launch_for_cluster
from parsearch.layout.soft_rules import soft_rule_flags
from parsearch.layout.space import require_layouts
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.query import Query
from parsearch.search.arguments import (
    as_cluster,
    as_clusters,
    as_model,
    check_precision,
    check_size,
    default_profile,
    gpu_counts_by_cluster,
    gpu_counts_for,
    positive,
    progress_bar,
    search_query,
)
from parsearch.search.exhaustive import (
    considered_count,
    estimates_for_rows,
    rank_feasible,
    scan_bounded,
    shape_codes,
)
from parsearch.search.front_methods import (
    Found,
    StudyArgs,
    auto_method,
    exhaustive_found,
    optuna_found,
)
from parsearch.search.pareto import hypervolume, pareto_mask
from parsearch.search.results import ParetoPoint, ParetoResult, SearchEntry, SearchResult
from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.hardware import load_gpu_profile
from parsearch.topology.summary import fabric_from_spec

Method = Literal["exhaustive", "optuna", "auto"]
METHODS: tuple[str, ...] = ("exhaustive", "optuna", "auto")
#: ``method="auto"`` scans exhaustively (exact, with bounds) unless given a limit on the valid
#: layouts over all GPU counts; above a given limit it runs optuna and says so in the result.
DEFAULT_EXHAUSTIVE_LIMIT: int | None = None


# --- search -------------------------------------------------------------------------------------


def search_layouts(query: Query | None = None, /, *, num_gpus: int, top: int = 10,
                   diverse: bool = False, progress: bool = False,
                   **legacy: Any) -> SearchResult:
    """The ``top`` feasible layouts on exactly ``num_gpus`` GPUs, best predicted tokens/s first.

    ``query`` names the model, training setup, one cluster, cost options and profile.
    Exhaustive and exact: every valid layout is scored.  ``diverse`` keeps
    one layout (the best) per (tp, pp, cp, ep, etp) shape.  When nothing
    fits, ``entries`` is empty and ``smallest_memory_gib`` says how much the
    leanest valid layout needs per GPU.  The keywords ``model=, training=, cluster=,
    profile=, options=`` of earlier versions still build the query
    (:meth:`Query.of <parsearch.query.Query.of>`).
    """
    start = time.perf_counter()
    query = Query.of(query, legacy, "search_layouts")
    training, profile, options = (query.require_training("search_layouts"), query.profile,
                                  query.options)
    model, cluster = as_model(query.model), as_cluster(query.cluster)
    positive("num_gpus", num_gpus)
    positive("top", top)
    check_size(cluster, num_gpus, "--gpus")
    table = require_layouts(model, training, num_gpus)
    cm = build_cost_model(model, training, fabric_from_spec(cluster, num_gpus), profile=profile,
                          options=options)
    band = tie_band(cm)
    with progress_bar(progress, len(table), "layouts", f"search {num_gpus} GPUs") as advance:
        scan = scan_bounded(cm, table, top=top, diverse=diverse, tie_band=band,
                            considered=considered_count(model, training, num_gpus),
                            on_rows=advance)
    floor = (float(scan.tokens_per_s.max()) * (1.0 - band)
             if band is not None and scan.feasible else None)
    picks = (rank_feasible(scan, top=top, diverse=diverse) if scan.feasible
             else np.zeros(0, int))
    # ties (within the error band of the best) are marked and keep the throughput order:
    # the same question names the same first layouts whatever ``top`` is
    estimates = estimates_for_rows(cm, table, scan.feasible_rows[picks])
    in_band = ([False] * len(picks) if floor is None
               else (scan.tokens_per_s[picks] >= floor).tolist())
    ties = 0 if floor is None else int(np.count_nonzero(scan.tokens_per_s >= floor))
    tied_total = ties if ties > 1 else 0
    if diverse and tied_total:  # the list holds one layout per shape: count tied shapes
        inside = scan.feasible_rows[scan.tokens_per_s >= floor]
        tied_total = len(np.unique(shape_codes(table.columns, inside)))
    entries = tuple(
        SearchEntry(rank=i + 1, estimate=e,
                    launch=launch_for_cluster(model, training, e.layout, cluster,
                                              options=e.options or cm.options,
                                              gpu=cm.fabric.gpu),
                    flags=tuple(soft_rule_flags(e.layout, cm.fabric, training.global_batch,
                                                training)
                                + pinned_feature_flags(model, cm.options, e.layout)),
                    tied=ties > 1 and in_band[i])
        for i, e in enumerate(estimates))
    smallest = None
    if not scan.feasible:
        smallest = _smallest_memory_gib(cm, table)
    return SearchResult(
        query=search_query(model, training, cluster, num_gpus=num_gpus, top=top, diverse=diverse),
        considered=scan.considered, valid=scan.valid, feasible=scan.feasible, entries=entries,
        elapsed_s=time.perf_counter() - start, smallest_memory_gib=smallest,
        examined=scan.checked, tie_note=tie_note(cm) if ties > 1 else "", tied_total=tied_total,
        outside_calibration=uncovered_features(cm.model, cm.profile.coverage))


def tie_band(cm: Any) -> float | None:
    """Relative width below the best within which layouts tie (``None``: no band).

    The band is the out-of-sample spread of this kind of prediction (the
    profile's ``uncertainty``: half the 10th-90th percentile width of
    measured/predicted); the tool cannot tell layouts inside it apart.
    """
    band, _ = band_for(cm.profile.uncertainty, cm.model.is_moe, cm.training.precision)
    return None if band is None else float(band.relative_halfwidth)


def tie_note(cm: Any) -> str:
    """The note under a table of ties: the band, what it rests on ("" without a band)."""
    band, extrapolated = band_for(cm.profile.uncertainty, cm.model.is_moe,
                                  cm.training.precision)
    if band is None:
        return ""
    kind = f"{cm.profile.name} {'MoE' if cm.model.is_moe else 'dense'} {cm.training.precision}"
    basis = ("; no such run was calibrated, so the generation's widest band"
             if extrapolated else "")
    return (f"~ tie: within {band.relative_halfwidth:.0%} of the best, closer than the tool "
            f"can tell (out of sample, {kind} runs measured {math.exp(-band.high):.2f}-"
            f"{math.exp(-band.low):.2f}x of prediction, 10th-90th percentile{basis}).\n"
            "  Ties keep the order of the point estimate; profile them to choose.")


def _smallest_memory_gib(cm: Any, table: Any) -> float:
    from parsearch.cost.memory import memory_arrays

    c = wide_columns(table.columns)
    mem = memory_arrays(cm.model, cm.training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"],
                        c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"],
                        cm.options.memory)
    return float(np.min(mem.total)) / GIB


# --- pareto -------------------------------------------------------------------------------------


def pareto_front(query: Query | None = None, /, *, max_gpus: int,
                 min_gpus: int | None = None, gpu_step: int | None = None,
                 method: Method | str = "auto", n_trials: int | None = None,
                 seed: int | None = None, storage: str | None = None,
                 study_name: str | None = None, sampler: str = "nsga2",
                 exhaustive_limit: int | None = DEFAULT_EXHAUSTIVE_LIMIT,
                 progress: bool = False, stop_after: int | None = None,
                 **legacy: Any) -> ParetoResult:
    """Best throughput at each GPU count and the front of tokens/s against GPUs.

    ``query`` names the model, training setup, cluster(s), cost options and profile
    (the keywords ``model=, training=, cluster=, profile=, options=`` of earlier
    versions still build it: :meth:`Query.of <parsearch.query.Query.of>`).

    ``method``: ``exhaustive`` finds the best layout of every GPU count
    exactly (shapes whose throughput bound is below the best found are
    skipped: :func:`~parsearch.search.exhaustive.scan_bounded`); ``optuna``
    runs a multi-objective study (``n_trials``, ``seed``,
    ``storage``/``study_name`` to persist and resume, ``sampler``), adds
    the exact best at a few GPU counts, improves every other count's best by
    exact scans of its neighbouring shapes, and reports the share of the
    valid layouts it scored (``coverage``; ``exact`` is false); ``auto`` is
    ``exhaustive``, unless ``exhaustive_limit`` is given and all GPU counts
    together have more valid layouts than that: then optuna, with a ``note``
    saying so.

    ``query.clusters``: one cluster, or several.  Several clusters
    each get their own GPU counts (:func:`gpu_counts_by_cluster`); the
    result holds the front of each (``per_cluster``) and the overall front
    over all of them, every point naming its cluster.  ``exhaustive`` scans
    cluster after cluster; ``optuna`` runs one study with the cluster as an
    axis; ``auto`` counts the valid layouts of every (cluster, GPU count)
    pair.  ``profile`` (default: the one covering each cluster's GPU)
    applies to every cluster.
    """
    start = time.perf_counter()
    query = Query.of(query, legacy, "pareto_front")
    training, profile, options = (query.require_training("pareto_front"), query.profile,
                                  query.options)
    model, clusters = as_model(query.model), as_clusters(list(query.clusters))
    if method not in METHODS:
        raise SpecError(f"--method must be one of {', '.join(METHODS)}; got {method!r}")
    if len(clusters) == 1:
        counts_by = {clusters[0].name: gpu_counts_for(
            cluster=clusters[0], max_gpus=max_gpus, min_gpus=min_gpus, gpu_step=gpu_step)}
    else:
        counts_by = gpu_counts_by_cluster(clusters=clusters, max_gpus=max_gpus,
                                          min_gpus=min_gpus, gpu_step=gpu_step)
    if exhaustive_limit is not None:
        positive("exhaustive_limit", exhaustive_limit)
    for c in clusters:
        check_precision(training, c)
    # resolve once per cluster, not once per GPU count
    profiles = {c.name: profile if profile is not None else default_profile(c)
                for c in clusters}
    note = None
    if method == "auto":
        method, note = auto_method(model, training, counts_by, exhaustive_limit)
    if method == "exhaustive":
        found = exhaustive_found(model, training, clusters, counts_by, profiles, options,
                                 progress)
    else:
        found = optuna_found(model, training, clusters, counts_by, profiles, options,
                             progress, StudyArgs(n_trials, seed, storage, study_name,
                                                   sampler, stop_after))
    if note is not None:
        found = found._replace(note=note)
    # the options each cluster's estimates were priced with: its launch settings use them
    priced = {c.name: (options or CostOptions()).resolved(profiles[c.name]) for c in clusters}
    if len(clusters) == 1:
        return _cluster_result(model, training, clusters[0], counts_by[clusters[0].name],
                               found, method=method, max_gpus=max_gpus, gpu_step=gpu_step,
                               start=start, label=False, priced=priced)
    return _multi_result(model, training, clusters, counts_by, found, method=method,
                         max_gpus=max_gpus, gpu_step=gpu_step, start=start, priced=priced)


def _reference_gpus(counts: tuple[int, ...]) -> float:
    """One step past the largest count: the GPU side of the hypervolume reference."""
    step = counts[1] - counts[0] if len(counts) > 1 else counts[0]
    return float(counts[-1] + step)


def _cluster_result(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                    counts: tuple[int, ...], found: Found, *, method: str, max_gpus: int,
                    gpu_step: int | None, start: float, label: bool,
                    priced: dict[str, CostOptions]) -> ParetoResult:
    """The front of one cluster (the whole result when there is one cluster)."""
    best = found.best[cluster.name]
    stats = found.stats[cluster.name]
    items = [(cluster, n, best[n]) for n in sorted(best)]
    points, hv, ref = _points(model, training, items, _reference_gpus(counts), label=label,
                              priced=priced)
    top = max_gpus if cluster.max_gpus is None or not label else min(max_gpus, cluster.max_gpus)
    query = search_query(model, training, cluster, min_gpus=counts[0], max_gpus=top,
                         gpu_step=counts[1] - counts[0] if len(counts) > 1 else (gpu_step or 0))
    return ParetoResult(query=query, method=method, gpu_counts=counts, points=points,
                        considered=stats.considered, valid=stats.valid,
                        feasible=stats.feasible,
                        evaluations=found.evaluations if not label else stats.evaluations,
                        hypervolume=hv, hypervolume_reference=ref,
                        elapsed_s=time.perf_counter() - start,
                        study=None if label else found.study, clusters=(cluster.name,),
                        exact=found.exact, examined=stats.examined,
                        coverage=found.coverage, note=found.note)


def _multi_result(model: ModelSpec, training: TrainingSpec, clusters: tuple[ClusterSpec, ...],
                  counts_by: dict[str, tuple[int, ...]], found: Found, *, method: str,
                  max_gpus: int, gpu_step: int | None, start: float,
                  priced: dict[str, CostOptions]) -> ParetoResult:
    """Per-cluster fronts and the overall front (which cluster, and how many GPUs)."""
    per_cluster = tuple(
        _cluster_result(model, training, c, counts_by[c.name], found, method=method,
                        max_gpus=max_gpus, gpu_step=gpu_step, start=start, label=True,
                        priced=priced)
        for c in clusters)
    items = [(c, n, e) for c in clusters for n, e in sorted(found.best[c.name].items())]
    reference = max(_reference_gpus(counts) for counts in counts_by.values())
    points, hv, ref = _points(model, training, items, reference, label=True, priced=priced)
    names = tuple(c.name for c in clusters)
    query = search_query(model, training, ",".join(names), clusters=list(names),
                         min_gpus=min(counts[0] for counts in counts_by.values()),
                         max_gpus=max_gpus, gpu_step=gpu_step)
    union = tuple(sorted({n for counts in counts_by.values() for n in counts}))
    return ParetoResult(
        query=query, method=method, gpu_counts=union, points=points,
        considered=sum(s.considered for s in found.stats.values()),
        valid=sum(s.valid for s in found.stats.values()),
        feasible=sum(s.feasible for s in found.stats.values()),
        evaluations=found.evaluations, hypervolume=hv, hypervolume_reference=ref,
        elapsed_s=time.perf_counter() - start, study=found.study, clusters=names,
        per_cluster=per_cluster, exact=found.exact,
        examined=None if found.exact is False else sum(
            s.examined or 0 for s in found.stats.values()),
        coverage=found.coverage, note=found.note)


def _points(model: ModelSpec, training: TrainingSpec,
            items: Sequence[tuple[ClusterSpec, int, Estimate]], reference_gpus: float, *,
            label: bool, priced: dict[str, CostOptions]
            ) -> tuple[tuple[ParetoPoint, ...], float, tuple[float, float]]:
    """Points sorted by GPU count (ties in the given cluster order), front and hypervolume."""
    ref = (reference_gpus, 0.0)
    items = sorted(items, key=lambda item: item[1])
    if not items:
        return (), 0.0, ref
    values = np.array([[n, e.tokens_per_s] for _, n, e in items], dtype=np.float64)
    on_front = pareto_mask(values, minimize=(True, False))
    hv = hypervolume(values, reference=ref, minimize=(True, False))
    first = int(np.nonzero(on_front)[0][0])
    base_n, base = items[first][1], items[first][2].tokens_per_s
    gpus = {c.name: load_gpu_profile(c.gpu) for c, _, _ in items}  # once per cluster
    points = []
    for (c, n, e), front in zip(items, on_front, strict=True):
        speedup = e.tokens_per_s / base
        points.append(ParetoPoint(
            num_gpus=n, estimate=e, on_front=bool(front), speedup=speedup,
            scaling_efficiency=speedup * base_n / n if n else math.nan,
            launch=launch_for_cluster(model, training, e.layout, c,
                                      options=e.options or priced[c.name], gpu=gpus[c.name]),
            cluster=c.name if label else None,
            flags=tuple(pinned_feature_flags(model, priced[c.name], e.layout))))
    return tuple(points), hv, ref


__all__ = [
    "DEFAULT_EXHAUSTIVE_LIMIT",
    "METHODS",
    "pareto_front",
    "search_layouts",
]
