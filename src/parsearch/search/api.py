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
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from parsearch.cost.analytic import (
    GIB,
    CostOptions,
    Estimate,
    build_cost_model,
    estimate,
    usable_memory_bytes,
)
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.errors import SpecError
from parsearch.hardware import load_gpu_profile
from parsearch.layout import Layout
from parsearch.search.exhaustive import (
    considered_count,
    estimates_for_rows,
    fitting_rows,
    rank_feasible,
    scan_table,
)
from parsearch.search.launch import LaunchSettings, launch_settings
from parsearch.search.pareto import hypervolume, pareto_mask
from parsearch.space import enumerate_layouts, require_layouts
from parsearch.topology.cluster import ClusterSpec, load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.workload import ModelSpec, TrainingSpec

Method = Literal["exhaustive", "optuna", "auto"]
METHODS: tuple[str, ...] = ("exhaustive", "optuna", "auto")
#: ``method="auto"`` scans exhaustively up to this many valid layouts over all GPU counts.
DEFAULT_EXHAUSTIVE_LIMIT = 5_000_000


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchEntry:
    """One ranked layout: its estimate and how to launch it."""

    rank: int
    estimate: Estimate
    launch: LaunchSettings

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
                   launch=self.launch.to_dict())
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

    @property
    def best(self) -> SearchEntry | None:
        return self.entries[0] if self.entries else None

    def to_dict(self) -> dict[str, Any]:
        return {"query": dict(self.query), "considered": self.considered, "valid": self.valid,
                "feasible": self.feasible, "results": [e.to_dict() for e in self.entries],
                "elapsed_s": self.elapsed_s}


@dataclass(frozen=True)
class ParetoPoint:
    """The best layout found on one GPU count."""

    num_gpus: int
    estimate: Estimate
    launch: LaunchSettings
    on_front: bool
    scaling_efficiency: float
    speedup: float

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
        return out


@dataclass(frozen=True)
class ParetoResult:
    """Throughput against GPU count: the non-dominated front and the best per count.

    ``front`` holds the GPU counts whose best layout beats every smaller
    count (sorted by GPU count); ``points`` the best layout found at every
    GPU count where one fits.  Scaling efficiency and speedup are against
    the smallest point of the front.
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
    front: tuple[ParetoPoint, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "front", tuple(p for p in self.points if p.on_front))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "query": dict(self.query), "method": self.method, "considered": self.considered,
            "valid": self.valid, "feasible": self.feasible, "evaluations": self.evaluations,
            "front": [p.to_dict() for p in self.front],
            "points": [{"num_gpus": p.num_gpus, "tokens_per_s": p.tokens_per_s,
                        "on_front": p.on_front, "key": p.layout.key()} for p in self.points],
            "hypervolume": self.hypervolume,
            "hypervolume_reference": {"num_gpus": self.hypervolume_reference[0],
                                      "tokens_per_s": self.hypervolume_reference[1]},
            "elapsed_s": self.elapsed_s,
        }
        if self.study is not None:
            out["study"] = dict(self.study)
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


def _query(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
           **extra: Any) -> dict[str, Any]:
    return {
        "model": model.name, "cluster": cluster.name, **extra,
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
    cm = build_cost_model(model, training, build_fabric(cluster, num_gpus), profile=profile,
                          options=options)
    with _progress_bar(progress, len(table), "layouts", f"search {num_gpus} GPUs") as advance:
        scan = scan_table(cm, table, considered=considered_count(model, training, num_gpus),
                          on_rows=advance)
    picks = rank_feasible(scan, top=top, diverse=diverse) if scan.feasible else np.zeros(0, int)
    estimates = estimates_for_rows(cm, table, scan.feasible_rows[picks])
    entries = tuple(
        SearchEntry(rank=i + 1, estimate=e,
                    launch=launch_settings(model, training, e.layout,
                                           gpus_per_node=cluster.gpus_per_node))
        for i, e in enumerate(estimates))
    smallest = None
    if not scan.feasible:
        smallest = _smallest_memory_gib(cm, table)
    return SearchResult(
        query=_query(model, training, cluster, num_gpus=num_gpus, top=top, diverse=diverse),
        considered=scan.considered, valid=scan.valid, feasible=scan.feasible, entries=entries,
        elapsed_s=time.perf_counter() - start, smallest_memory_gib=smallest)


def _smallest_memory_gib(cm: Any, table: Any) -> float:
    from parsearch.cost.memory import memory_arrays

    c = table.columns
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


def pareto_front(*, model: ModelSpec | str, training: TrainingSpec, cluster: ClusterSpec | str,
                 max_gpus: int, min_gpus: int | None = None, gpu_step: int | None = None,
                 method: Method | str = "auto", n_trials: int | None = None,
                 seed: int | None = None, storage: str | None = None,
                 study_name: str | None = None, sampler: str = "nsga2",
                 profile: EfficiencyProfile | None = None, options: CostOptions | None = None,
                 exhaustive_limit: int = DEFAULT_EXHAUSTIVE_LIMIT,
                 progress: bool = False, stop_after: int | None = None) -> ParetoResult:
    """Best throughput at each GPU count and the front of tokens/s against GPUs.

    ``method``: ``exhaustive`` scores every valid layout of every GPU count
    (exact); ``optuna`` runs a multi-objective study (``n_trials``, ``seed``,
    ``storage``/``study_name`` to persist and resume, ``sampler``);
    ``auto`` scans exhaustively when all GPU counts together have at most
    ``exhaustive_limit`` valid layouts, else uses optuna.
    """
    start = time.perf_counter()
    model, cluster = _model(model), _cluster(cluster)
    if method not in METHODS:
        raise SpecError(f"--method must be one of {', '.join(METHODS)}; got {method!r}")
    counts = gpu_counts_for(cluster=cluster, max_gpus=max_gpus, min_gpus=min_gpus,
                            gpu_step=gpu_step)
    _positive("exhaustive_limit", exhaustive_limit)
    if profile is None:  # resolve once, not once per GPU count
        from parsearch.cost.efficiency import efficiency_for_gpu

        profile = efficiency_for_gpu(load_gpu_profile(cluster.gpu).name)
    if method == "auto":
        method = "exhaustive" if _total_valid(model, training, counts,
                                              exhaustive_limit) <= exhaustive_limit else "optuna"
    study: dict[str, Any] | None = None
    if method == "exhaustive":
        best, considered, valid, feasible = _exhaustive_bests(
            model, training, cluster, counts, profile, options, progress)
        evaluations = valid
    else:
        best, considered, valid, feasible, evaluations, study = _optuna_bests(
            model, training, cluster, counts, profile, options, progress,
            n_trials=n_trials, seed=seed, storage=storage, study_name=study_name,
            sampler=sampler, stop_after=stop_after)
    points, hv, ref = _points(model, training, cluster, counts, best)
    query = _query(model, training, cluster, min_gpus=counts[0], max_gpus=max_gpus,
                   gpu_step=counts[1] - counts[0] if len(counts) > 1 else (gpu_step or 0))
    return ParetoResult(query=query, method=method, gpu_counts=counts, points=points,
                        considered=considered, valid=valid, feasible=feasible,
                        evaluations=evaluations, hypervolume=hv, hypervolume_reference=ref,
                        elapsed_s=time.perf_counter() - start, study=study)


def _total_valid(model: ModelSpec, training: TrainingSpec, counts: tuple[int, ...],
                 limit: int) -> int:
    total = 0
    for n in counts:
        total += len(enumerate_layouts(model, training, n))
        if total > limit:
            break
    return total


def _exhaustive_bests(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                      counts: tuple[int, ...], profile: EfficiencyProfile | None,
                      options: CostOptions | None, progress: bool,
                      ) -> tuple[dict[int, Estimate], int, int, int]:
    hbm = usable_memory_bytes(load_gpu_profile(cluster.gpu), options)
    memory = (options or CostOptions()).memory
    best: dict[int, Estimate] = {}
    considered = valid = feasible = 0
    with _progress_bar(progress, len(counts), "counts", "pareto (exhaustive)") as advance:
        for n in counts:
            table = enumerate_layouts(model, training, n)
            considered += considered_count(model, training, n)
            valid += len(table)
            rows = fitting_rows(model, training, memory, hbm, table) if len(table) else []
            if len(rows):
                cm = build_cost_model(model, training, build_fabric(cluster, n),
                                      profile=profile, options=options)
                scan = scan_table(cm, table, rows=np.asarray(rows))
                feasible += scan.feasible
                if scan.feasible:
                    pick = rank_feasible(scan, top=1)
                    best[n] = estimates_for_rows(cm, table, scan.feasible_rows[pick])[0]
            advance(1)
    return best, considered, valid, feasible


def _optuna_bests(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                  counts: tuple[int, ...], profile: EfficiencyProfile | None,
                  options: CostOptions | None, progress: bool, *, n_trials: int | None,
                  seed: int | None, storage: str | None, study_name: str | None, sampler: str,
                  stop_after: int | None,
                  ) -> tuple[dict[int, Estimate], int, int, int, int, dict[str, Any]]:
    from parsearch.search.optuna_search import run_study

    budget = 2000 if n_trials is None else _positive("n_trials", n_trials)
    with _progress_bar(progress, budget, "trials", "pareto (optuna)") as advance:
        outcome = run_study(model=model, training=training, cluster=cluster, gpu_counts=counts,
                            n_trials=budget, seed=seed, storage=storage, study_name=study_name,
                            sampler=sampler, profile=profile, options=options,
                            on_trials=advance, stop_after=stop_after)
    chosen: dict[int, Layout] = {}
    tokens: dict[int, float] = {}
    for rec in outcome.records:
        if rec.valid and rec.fits and rec.tokens_per_s > tokens.get(rec.layout.num_gpus, 0.0):
            chosen[rec.layout.num_gpus] = rec.layout
            tokens[rec.layout.num_gpus] = rec.tokens_per_s
    best: dict[int, Estimate] = {}
    for n, lay in chosen.items():
        cm = build_cost_model(model, training, build_fabric(cluster, n), profile=profile,
                              options=options)
        best[n] = estimate(cm, lay)
    records = outcome.records
    valid = sum(r.valid for r in records)
    feasible = sum(r.valid and r.fits for r in records)
    return best, len(records), valid, feasible, outcome.evaluations, outcome.to_dict()


def _points(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
            counts: tuple[int, ...], best: dict[int, Estimate],
            ) -> tuple[tuple[ParetoPoint, ...], float, tuple[float, float]]:
    step = counts[1] - counts[0] if len(counts) > 1 else counts[0]
    ref = (float(counts[-1] + step), 0.0)
    ns = sorted(best)
    if not ns:
        return (), 0.0, ref
    values = np.array([[n, best[n].tokens_per_s] for n in ns], dtype=np.float64)
    on_front = pareto_mask(values, minimize=(True, False))
    hv = hypervolume(values, reference=ref, minimize=(True, False))
    base_n = next(n for n, f in zip(ns, on_front, strict=True) if f)
    base = best[base_n].tokens_per_s
    points = []
    for n, front in zip(ns, on_front, strict=True):
        e = best[n]
        speedup = e.tokens_per_s / base
        points.append(ParetoPoint(
            num_gpus=n, estimate=e, on_front=bool(front), speedup=speedup,
            scaling_efficiency=speedup * base_n / n if n else math.nan,
            launch=launch_settings(model, training, e.layout,
                                   gpus_per_node=cluster.gpus_per_node)))
    return tuple(points), hv, ref


__all__ = [
    "DEFAULT_EXHAUSTIVE_LIMIT",
    "METHODS",
    "ParetoPoint",
    "ParetoResult",
    "SearchEntry",
    "SearchResult",
    "gpu_counts_for",
    "pareto_front",
    "search_layouts",
]
