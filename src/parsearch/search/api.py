"""Public search API: the best layouts on N GPUs, and throughput against GPU count.

Everything the ``search`` and ``pareto`` commands do is here, as two
keyword-only functions returning frozen dataclasses whose ``to_dict()`` is
the CLI's JSON (``shared/spec/cli.md``):

>>> from parsearch.workload import ModelSpec, TrainingSpec
>>> toy = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
>>> setup = TrainingSpec(seq_len=2048, global_batch=64, micro_batch_sizes=(1, 2))
>>> result = search_layouts(model=toy, training=setup, cluster="dgx-h100", num_gpus=8, top=3)
>>> len(result.entries), result.entries[0].rank
(3, 1)
>>> front = pareto_front(model=toy, training=setup, cluster="dgx-h100", max_gpus=32)
>>> [p.num_gpus for p in front.front][:1]
[8]

Several clusters: a front per cluster and one over all of them (which
cluster, and how many GPUs):

>>> both = pareto_front(model=toy, training=setup, cluster=["dgx-h100", "dgx-a100"],
...                     max_gpus=16)
>>> both.clusters, sorted({p.cluster for p in both.points})
(('dgx-h100', 'dgx-a100'), ['dgx-a100', 'dgx-h100'])
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from parsearch.cost.analytic import (
    GIB,
    CostOptions,
    Estimate,
    build_cost_model,
    estimate,
    wide_columns,
)
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.errors import SpecError
from parsearch.hardware import load_gpu_profile
from parsearch.launch import LaunchSettings, launch_for_cluster
from parsearch.layout import Layout
from parsearch.search.exhaustive import (
    SHAPE_AXES,
    considered_count,
    estimates_for_rows,
    rank_feasible,
    scan_bounded,
)
from parsearch.search.pareto import hypervolume, pareto_mask
from parsearch.soft_rules import soft_rule_flags
from parsearch.space import enumerate_layouts, require_layouts
from parsearch.topology.cluster import ClusterSpec, load_cluster
from parsearch.topology.summary import fabric_from_spec
from parsearch.workload import ModelSpec, TrainingSpec

Method = Literal["exhaustive", "optuna", "auto"]
#: A cluster: a preset name, a cluster file path, or a :class:`ClusterSpec`.
ClusterLike = ClusterSpec | str
METHODS: tuple[str, ...] = ("exhaustive", "optuna", "auto")
#: ``method="auto"`` scans exhaustively (exact, with bounds) unless given a limit on the valid
#: layouts over all GPU counts; above a given limit it runs optuna and says so in the result.
DEFAULT_EXHAUSTIVE_LIMIT: int | None = None
#: GPU counts per cluster where an optuna front is seeded with the exact best layout.
SEED_COUNTS = 3


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchEntry:
    """One ranked layout: its estimate and how to launch it."""

    rank: int
    estimate: Estimate
    launch: LaunchSettings
    flags: tuple[str, ...] = ()  # soft rules of the layout spec it breaks

    @property
    def layout(self) -> Layout:
        return self.estimate.layout

    @property
    def headroom_bytes(self) -> float:
        """GPU memory left free on the most loaded GPU."""
        return self.estimate.capacity_bytes - self.estimate.memory_bytes["total"]

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, **self.estimate.to_dict()}
        out.update(key=self.layout.key(), bottleneck=self.estimate.bottleneck,
                   headroom_gib_per_gpu=self.headroom_bytes / GIB, nodes=self.launch.nodes,
                   launch=self.launch.to_dict(), flags=list(self.flags))
        return out


@dataclass(frozen=True)
class SearchResult:
    """The best layouts on one GPU count, with how much of the space was covered."""

    query: dict[str, Any]
    considered: int
    valid: int
    feasible: int
    entries: tuple[SearchEntry, ...]
    elapsed_s: float
    smallest_memory_gib: float | None = None
    examined: int | None = None  # valid layouts checked (None: all of them)

    @property
    def best(self) -> SearchEntry | None:
        return self.entries[0] if self.entries else None

    @property
    def pruned(self) -> int:
        """Valid layouts never scored: their shape's bound proves they cannot enter."""
        return 0 if self.examined is None else self.valid - self.examined

    def to_dict(self) -> dict[str, Any]:
        return {"query": dict(self.query), "considered": self.considered, "valid": self.valid,
                "feasible": self.feasible,
                "examined": self.valid if self.examined is None else self.examined,
                "pruned": self.pruned, "exact": True,
                "results": [e.to_dict() for e in self.entries], "elapsed_s": self.elapsed_s}


@dataclass(frozen=True)
class ParetoPoint:
    """The best layout found on one GPU count (of one cluster, when several are compared).

    ``cluster`` names the cluster in a result over several clusters; it is
    ``None`` (and absent from ``to_dict()``) in a single-cluster result.
    """

    num_gpus: int
    estimate: Estimate
    launch: LaunchSettings
    on_front: bool
    scaling_efficiency: float
    speedup: float
    cluster: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s

    @property
    def layout(self) -> Layout:
        return self.estimate.layout

    def to_dict(self) -> dict[str, Any]:
        out = self.estimate.to_dict()
        out.update(key=self.layout.key(), bottleneck=self.estimate.bottleneck,
                   on_front=self.on_front, scaling_efficiency=self.scaling_efficiency,
                   speedup=self.speedup, nodes=self.launch.nodes, launch=self.launch.to_dict())
        if self.cluster is not None:
            out["cluster"] = self.cluster
        return out

    def summary(self) -> dict[str, Any]:
        """The short form listed under ``"points"``."""
        out: dict[str, Any] = {"num_gpus": self.num_gpus, "tokens_per_s": self.tokens_per_s,
                               "on_front": self.on_front, "key": self.layout.key()}
        if self.cluster is not None:
            out["cluster"] = self.cluster
        return out


@dataclass(frozen=True)
class ParetoResult:
    """Throughput against GPU count: the non-dominated front and the best per count.

    ``front`` holds the GPU counts whose best layout beats every smaller
    count (sorted by GPU count); ``points`` the best layout found at every
    GPU count where one fits.  Scaling efficiency and speedup are against
    the smallest point of the front.

    Over several clusters, ``points`` holds the best layout of every
    (cluster, GPU count) pair, ``front`` the overall front (each point names
    its cluster), ``clusters`` the cluster names and ``per_cluster`` one
    single-cluster result per cluster, in the same order.
    """

    query: dict[str, Any]
    method: str
    gpu_counts: tuple[int, ...]
    points: tuple[ParetoPoint, ...]
    considered: int
    valid: int
    feasible: int
    evaluations: int
    hypervolume: float
    hypervolume_reference: tuple[float, float]
    elapsed_s: float
    study: dict[str, Any] | None = None
    clusters: tuple[str, ...] = ()
    per_cluster: tuple[ParetoResult, ...] = ()
    exact: bool = True  # every point is the proven best of its GPU count
    examined: int | None = None  # valid layouts scored (exhaustive; None: not counted)
    coverage: float | None = None  # share of the valid layouts scored (optuna)
    note: str | None = None  # why the answer is not exact, when it is not
    front: tuple[ParetoPoint, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "front", tuple(p for p in self.points if p.on_front))

    @property
    def multi_cluster(self) -> bool:
        """True for a result over several clusters."""
        return len(self.per_cluster) > 1

    @property
    def by_cluster(self) -> dict[str, ParetoResult]:
        """The single-cluster result of each cluster, by name (empty for one cluster)."""
        return {r.clusters[0]: r for r in self.per_cluster}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "query": dict(self.query), "method": self.method, "considered": self.considered,
            "valid": self.valid, "feasible": self.feasible, "evaluations": self.evaluations,
            "front": [p.to_dict() for p in self.front],
            "points": [p.summary() for p in self.points],
            "hypervolume": self.hypervolume,
            "hypervolume_reference": {"num_gpus": self.hypervolume_reference[0],
                                      "tokens_per_s": self.hypervolume_reference[1]},
            "elapsed_s": self.elapsed_s,
            "exact": self.exact,
        }
        if self.examined is not None:
            out.update(examined=self.examined, pruned=self.valid - self.examined)
        if self.coverage is not None:
            out["coverage"] = self.coverage
        if self.note is not None:
            out["note"] = self.note
        if self.multi_cluster:
            out["by_cluster"] = {name: _cluster_dict(r) for name, r in self.by_cluster.items()}
        if self.study is not None:
            out["study"] = dict(self.study)
        return out


def _cluster_dict(result: ParetoResult) -> dict[str, Any]:
    """One cluster's part of a multi-cluster document (its run time is the whole run's)."""
    out = result.to_dict()
    out.pop("elapsed_s", None)
    out.pop("study", None)
    out["gpu_counts"] = list(result.gpu_counts)
    return out


# --- helpers ------------------------------------------------------------------------------------


def _model(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        from parsearch.model_files import resolve_model

        return resolve_model(model)
    raise SpecError(f"model must be a ModelSpec or a preset name/path, got {type(model).__name__}")


def _cluster(cluster: ClusterSpec | str) -> ClusterSpec:
    if isinstance(cluster, ClusterSpec):
        return cluster
    if isinstance(cluster, str):
        return load_cluster(cluster)
    raise SpecError(f"cluster must be a ClusterSpec or a preset name/path, "
                    f"got {type(cluster).__name__}")


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name} must be a positive integer, got {value!r}")
    return value


def _check_size(cluster: ClusterSpec, num_gpus: int, option: str) -> None:
    if cluster.max_gpus is not None and num_gpus > cluster.max_gpus:
        raise SpecError(f"{option} {num_gpus} exceeds the {cluster.max_gpus} GPUs cluster "
                        f"{cluster.name} supports (max_gpus); use at most {cluster.max_gpus}")


def _query(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec | str,
           **extra: Any) -> dict[str, Any]:
    name = cluster.name if isinstance(cluster, ClusterSpec) else cluster
    return {
        "model": model.name, "cluster": name, **extra,
        "global_batch": training.global_batch, "seq_len": training.seq_len,
        "precision": training.precision,
        "micro_batch_sizes": list(training.micro_batch_sizes),
        "recompute": list(training.recompute_modes),
        "pipeline_split": training.pipeline_split,
        "sequence_parallel": training.sequence_parallel, "max_vpp": training.max_vpp,
        "distributed_optimizer": training.distributed_optimizer,
    }


@contextmanager
def _progress_bar(enabled: bool, total: int, unit: str,
                  desc: str) -> Iterator[Callable[[int], None]]:
    """A tqdm bar on stderr when ``enabled``; yields ``advance(k)``."""
    if not enabled:
        yield lambda _k: None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True,
               leave=False, unit_scale=True)
    try:
        yield bar.update
    finally:
        bar.close()


# --- search -------------------------------------------------------------------------------------


def search_layouts(*, model: ModelSpec | str, training: TrainingSpec,
                   cluster: ClusterSpec | str, num_gpus: int, top: int = 10,
                   diverse: bool = False, profile: EfficiencyProfile | None = None,
                   options: CostOptions | None = None, progress: bool = False) -> SearchResult:
    """The ``top`` feasible layouts on exactly ``num_gpus`` GPUs, best predicted tokens/s first.

    Exhaustive and exact: every valid layout is scored.  ``diverse`` keeps
    one layout (the best) per (tp, pp, cp, ep, etp) shape.  When nothing
    fits, ``entries`` is empty and ``smallest_memory_gib`` says how much the
    leanest valid layout needs per GPU.
    """
    start = time.perf_counter()
    model, cluster = _model(model), _cluster(cluster)
    _positive("num_gpus", num_gpus)
    _positive("top", top)
    _check_size(cluster, num_gpus, "--gpus")
    table = require_layouts(model, training, num_gpus)
    cm = build_cost_model(model, training, fabric_from_spec(cluster, num_gpus), profile=profile,
                          options=options)
    with _progress_bar(progress, len(table), "layouts", f"search {num_gpus} GPUs") as advance:
        scan = scan_bounded(cm, table, top=top, diverse=diverse,
                            considered=considered_count(model, training, num_gpus),
                            on_rows=advance)
    picks = rank_feasible(scan, top=top, diverse=diverse) if scan.feasible else np.zeros(0, int)
    estimates = order_ties(cm, estimates_for_rows(cm, table, scan.feasible_rows[picks]))
    entries = tuple(
        SearchEntry(rank=i + 1, estimate=e,
                    launch=launch_for_cluster(model, training, e.layout, cluster,
                                              options=cm.options, gpu=cm.fabric.gpu),
                    flags=tuple(soft_rule_flags(e.layout, cm.fabric, training.global_batch)))
        for i, e in enumerate(estimates))
    smallest = None
    if not scan.feasible:
        smallest = _smallest_memory_gib(cm, table)
    return SearchResult(
        query=_query(model, training, cluster, num_gpus=num_gpus, top=top, diverse=diverse),
        considered=scan.considered, valid=scan.valid, feasible=scan.feasible, entries=entries,
        elapsed_s=time.perf_counter() - start, smallest_memory_gib=smallest,
        examined=scan.checked)


def order_ties(cm: Any, estimates: Sequence[Estimate]) -> list[Estimate]:
    """Layouts within the prediction's error band of the best, most memory headroom first.

    The band is the out-of-sample spread of this kind of prediction (the
    profile's ``uncertainty``: half the 10th-90th percentile width of
    measured/predicted); the tool cannot tell such layouts apart, so the one
    least likely to run out of memory leads.  Without a band the order is unchanged.
    """
    band = cm.profile.uncertainty.get("moe" if cm.model.is_moe else "dense")
    if band is None or not estimates:
        return list(estimates)
    best = max(e.tokens_per_s_per_gpu for e in estimates)
    floor = best * (1.0 - band.relative_halfwidth)
    tied = [e for e in estimates if e.tokens_per_s_per_gpu >= floor]
    rest = [e for e in estimates if e.tokens_per_s_per_gpu < floor]
    tied.sort(key=lambda e: e.capacity_bytes - e.memory_bytes["total"], reverse=True)
    return tied + rest


def _smallest_memory_gib(cm: Any, table: Any) -> float:
    from parsearch.cost.memory import memory_arrays

    c = wide_columns(table.columns)
    mem = memory_arrays(cm.model, cm.training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"],
                        c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"],
                        cm.options.memory)
    return float(np.min(mem.total)) / GIB


# --- pareto -------------------------------------------------------------------------------------


def gpu_counts_for(*, cluster: ClusterSpec | str, max_gpus: int, min_gpus: int | None = None,
                   gpu_step: int | None = None) -> tuple[int, ...]:
    """The GPU counts a front is computed on: ``min_gpus..max_gpus`` by ``gpu_step``.

    Defaults: whole nodes (``gpu_step`` = GPUs per node, ``min_gpus`` = one step).

    >>> gpu_counts_for(cluster="dgx-h100", max_gpus=32)
    (8, 16, 24, 32)
    """
    cluster = _cluster(cluster)
    step = cluster.gpus_per_node if gpu_step is None else _positive("gpu_step", gpu_step)
    low = step if min_gpus is None else _positive("min_gpus", min_gpus)
    _positive("max_gpus", max_gpus)
    if max_gpus < low:
        raise SpecError(f"--max-gpus {max_gpus} is below --min-gpus {low}; "
                        f"give --max-gpus >= {low}")
    _check_size(cluster, max_gpus, "--max-gpus")
    return tuple(range(low, max_gpus + 1, step))


def gpu_counts_by_cluster(*, clusters: Sequence[ClusterLike], max_gpus: int,
                          min_gpus: int | None = None,
                          gpu_step: int | None = None) -> dict[str, tuple[int, ...]]:
    """The GPU counts of each cluster of a multi-cluster front, by cluster name.

    Each cluster steps by ``gpu_step`` (default: its own GPUs per node) from
    ``min_gpus`` (default: one step) and stops at ``max_gpus`` or at its own
    ``max_gpus``, whichever is smaller.

    >>> gpu_counts_by_cluster(clusters=["dgx-h100", "gb200-nvl72"], max_gpus=16)
    {'dgx-h100': (8, 16), 'gb200-nvl72': (4, 8, 12, 16)}
    """
    specs = _clusters(clusters)
    _positive("max_gpus", max_gpus)
    out: dict[str, tuple[int, ...]] = {}
    for c in specs:
        step = c.gpus_per_node if gpu_step is None else _positive("gpu_step", gpu_step)
        low = step if min_gpus is None else _positive("min_gpus", min_gpus)
        top = max_gpus if c.max_gpus is None else min(max_gpus, c.max_gpus)
        if max_gpus < low:
            raise SpecError(f"--max-gpus {max_gpus} is below --min-gpus {low}; "
                            f"give --max-gpus >= {low}")
        if top < low:
            raise SpecError(f"cluster {c.name} supports at most {c.max_gpus} GPUs (max_gpus), "
                            f"below --min-gpus {low}; lower --min-gpus or drop {c.name} "
                            "from --cluster")
        out[c.name] = tuple(range(low, top + 1, step))
    return out


def _clusters(cluster: ClusterLike | Sequence[ClusterLike]) -> tuple[ClusterSpec, ...]:
    """One cluster or a non-empty sequence of distinct clusters, loaded."""
    if isinstance(cluster, ClusterSpec | str):
        return (_cluster(cluster),)
    if not isinstance(cluster, Sequence):
        raise SpecError(f"cluster must be a ClusterSpec, a preset name/path or a sequence of "
                        f"them, got {type(cluster).__name__}")
    if not cluster:
        raise SpecError("cluster: give at least one cluster")
    specs = tuple(_cluster(c) for c in cluster)
    names = [c.name for c in specs]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise SpecError(f"--cluster names {twice} twice; give each cluster once")
    return specs


class _StudyArgs(NamedTuple):
    n_trials: int | None
    seed: int | None
    storage: str | None
    study_name: str | None
    sampler: str
    stop_after: int | None


class _Stats(NamedTuple):
    considered: int
    valid: int
    feasible: int
    evaluations: int
    examined: int | None = None  # valid layouts checked (exhaustive); None: unknown


class _Found(NamedTuple):
    """What a method found: the best estimate per cluster and GPU count, and the counts."""

    best: dict[str, dict[int, Estimate]]
    stats: dict[str, _Stats]
    evaluations: int
    study: dict[str, Any] | None
    exact: bool = True
    coverage: float | None = None
    note: str | None = None


def pareto_front(*, model: ModelSpec | str, training: TrainingSpec,
                 cluster: ClusterLike | Sequence[ClusterLike], max_gpus: int,
                 min_gpus: int | None = None, gpu_step: int | None = None,
                 method: Method | str = "auto", n_trials: int | None = None,
                 seed: int | None = None, storage: str | None = None,
                 study_name: str | None = None, sampler: str = "nsga2",
                 profile: EfficiencyProfile | None = None, options: CostOptions | None = None,
                 exhaustive_limit: int | None = DEFAULT_EXHAUSTIVE_LIMIT,
                 progress: bool = False, stop_after: int | None = None) -> ParetoResult:
    """Best throughput at each GPU count and the front of tokens/s against GPUs.

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

    ``cluster``: one cluster, or a sequence of clusters.  Several clusters
    each get their own GPU counts (:func:`gpu_counts_by_cluster`); the
    result holds the front of each (``per_cluster``) and the overall front
    over all of them, every point naming its cluster.  ``exhaustive`` scans
    cluster after cluster; ``optuna`` runs one study with the cluster as an
    axis; ``auto`` counts the valid layouts of every (cluster, GPU count)
    pair.  ``profile`` (default: the one covering each cluster's GPU)
    applies to every cluster.
    """
    start = time.perf_counter()
    model, clusters = _model(model), _clusters(cluster)
    if method not in METHODS:
        raise SpecError(f"--method must be one of {', '.join(METHODS)}; got {method!r}")
    if len(clusters) == 1:
        counts_by = {clusters[0].name: gpu_counts_for(
            cluster=clusters[0], max_gpus=max_gpus, min_gpus=min_gpus, gpu_step=gpu_step)}
    else:
        counts_by = gpu_counts_by_cluster(clusters=clusters, max_gpus=max_gpus,
                                          min_gpus=min_gpus, gpu_step=gpu_step)
    if exhaustive_limit is not None:
        _positive("exhaustive_limit", exhaustive_limit)
    for c in clusters:
        _check_precision(training, c)
    # resolve once per cluster, not once per GPU count
    profiles = {c.name: profile if profile is not None else _default_profile(c)
                for c in clusters}
    note = None
    if method == "auto":
        method, note = _auto_method(model, training, counts_by, exhaustive_limit)
    if method == "exhaustive":
        found = _exhaustive_found(model, training, clusters, counts_by, profiles, options,
                                  progress)
    else:
        found = _optuna_found(model, training, clusters, counts_by, profiles, options,
                              progress, _StudyArgs(n_trials, seed, storage, study_name,
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


def _default_profile(cluster: ClusterSpec) -> EfficiencyProfile:
    from parsearch.cost.efficiency import efficiency_for_gpu

    return efficiency_for_gpu(load_gpu_profile(cluster.gpu).name)


def _check_precision(training: TrainingSpec, cluster: ClusterSpec) -> None:
    gpu = load_gpu_profile(cluster.gpu)
    if training.precision not in gpu.peak_flops:
        have = ", ".join(sorted(gpu.peak_flops))
        raise SpecError(f"precision {training.precision} is not supported by {gpu.name} "
                        f"(cluster {cluster.name}); it supports {have}")


def _auto_method(model: ModelSpec, training: TrainingSpec,
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


def _exhaustive_found(model: ModelSpec, training: TrainingSpec,
                      clusters: tuple[ClusterSpec, ...], counts_by: dict[str, tuple[int, ...]],
                      profiles: dict[str, EfficiencyProfile], options: CostOptions | None,
                      progress: bool) -> _Found:
    best: dict[str, dict[int, Estimate]] = {}
    stats: dict[str, _Stats] = {}
    for c in clusters:
        desc = "pareto (exhaustive)" if len(clusters) == 1 else f"pareto (exhaustive, {c.name})"
        best[c.name], stats[c.name] = _exhaustive_bests(
            model, training, c, counts_by[c.name], profiles[c.name], options, progress, desc)
    return _Found(best, stats, sum(s.evaluations for s in stats.values()), None)


def _exhaustive_bests(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                      counts: Sequence[int], profile: EfficiencyProfile | None,
                      options: CostOptions | None, progress: bool,
                      desc: str = "pareto (exhaustive)",
                      ) -> tuple[dict[int, Estimate], _Stats]:
    """The exact best layout at each GPU count (bounded scans: :func:`scan_bounded`)."""
    best: dict[int, Estimate] = {}
    considered = valid = feasible = examined = 0
    gpu = load_gpu_profile(cluster.gpu)
    with _progress_bar(progress, len(counts), "counts", desc) as advance:
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
    return best, _Stats(considered, valid, feasible, examined, examined)


def _optuna_found(model: ModelSpec, training: TrainingSpec, clusters: tuple[ClusterSpec, ...],
                  counts_by: dict[str, tuple[int, ...]],
                  profiles: dict[str, EfficiencyProfile], options: CostOptions | None,
                  progress: bool, study_args: _StudyArgs) -> _Found:
    """One study over every cluster (a ``cluster`` axis when there are several)."""
    from parsearch.search.optuna_search import run_study

    a = study_args
    budget = 2000 if a.n_trials is None else _positive("n_trials", a.n_trials)
    single = len(clusters) == 1
    with _progress_bar(progress, budget, "trials", "pareto (optuna)") as advance:
        outcome = run_study(
            model=model, training=training, cluster=clusters[0] if single else clusters,
            gpu_counts=counts_by[clusters[0].name] if single else counts_by, n_trials=budget,
            seed=a.seed, storage=a.storage, study_name=a.study_name, sampler=a.sampler,
            profile=profiles[clusters[0].name] if single else profiles, options=options,
            on_trials=advance, stop_after=a.stop_after)
    best: dict[str, dict[int, Estimate]] = {}
    stats: dict[str, _Stats] = {}
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
        stats[c.name] = _Stats(len(records), sum(r.valid for r in records),
                               sum(r.valid and r.fits for r in records), evaluations)
        for n in counts_by[c.name]:
            if n not in sizes:
                sizes[n] = len(enumerate_layouts(model, training, n, explain=False))
            total += sizes[n]
        scored += evaluations
    coverage = min(1.0, scored / total) if total else 1.0
    study = outcome.to_dict() | {"seeded_exact": seeded if not single
                                 else seeded[clusters[0].name]}
    return _Found(best, stats, sum(s.evaluations for s in stats.values()), study, exact=False,
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


def _reference_gpus(counts: tuple[int, ...]) -> float:
    """One step past the largest count: the GPU side of the hypervolume reference."""
    step = counts[1] - counts[0] if len(counts) > 1 else counts[0]
    return float(counts[-1] + step)


def _cluster_result(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                    counts: tuple[int, ...], found: _Found, *, method: str, max_gpus: int,
                    gpu_step: int | None, start: float, label: bool,
                    priced: dict[str, CostOptions]) -> ParetoResult:
    """The front of one cluster (the whole result when there is one cluster)."""
    best = found.best[cluster.name]
    stats = found.stats[cluster.name]
    items = [(cluster, n, best[n]) for n in sorted(best)]
    points, hv, ref = _points(model, training, items, _reference_gpus(counts), label=label,
                              priced=priced)
    top = max_gpus if cluster.max_gpus is None or not label else min(max_gpus, cluster.max_gpus)
    query = _query(model, training, cluster, min_gpus=counts[0], max_gpus=top,
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
                  counts_by: dict[str, tuple[int, ...]], found: _Found, *, method: str,
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
    query = _query(model, training, ",".join(names), clusters=list(names),
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
            launch=launch_for_cluster(model, training, e.layout, c, options=priced[c.name],
                                      gpu=gpus[c.name]),
            cluster=c.name if label else None))
    return tuple(points), hv, ref


__all__ = [
    "DEFAULT_EXHAUSTIVE_LIMIT",
    "METHODS",
    "ClusterLike",
    "ParetoPoint",
    "ParetoResult",
    "SearchEntry",
    "SearchResult",
    "gpu_counts_by_cluster",
    "gpu_counts_for",
    "pareto_front",
    "search_layouts",
]
