"""The search space of an optuna study: its axes, candidate values, clusters and fingerprint.

Every trial suggests every axis from a fixed candidate set
(:func:`candidate_sets`), so samplers that need the same space in every
trial work and a resumed study sees the same space.  A study over several
clusters has one more categorical axis, :data:`CLUSTER_AXIS`
(:class:`StudySpace`).  :func:`query_fingerprint` names what a study
optimizes, so a stored study is not resumed for another query.  Nothing
here imports optuna.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parsearch.cost.analytic import layout_columns
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.layout.rules import RECOMPUTE_CODES, RULES, derive_columns, rule_context
from parsearch.layout.space import divisors
from parsearch.model.specs import RECOMPUTE_MODES, ModelSpec, TrainingSpec
from parsearch.topology.cluster import ClusterSpec

AXES: tuple[str, ...] = ("num_gpus", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp",
                         "recompute")
#: The extra categorical axis of a study over several clusters.
CLUSTER_AXIS = "cluster"
#: What a trial records of its outcome (user attributes; ``gpus`` too over several clusters).
OUTCOME_KEYS: tuple[str, ...] = ("valid", "fits", "tokens_per_s", "rules", "memory")

#: Largest grid of candidate values one rule is tried on, and grid points times GPU counts.
_MAX_RULE_GRID = 1 << 20
_MAX_RULE_WORK = 1 << 25


def candidate_sets(model: ModelSpec, training: TrainingSpec,
                   gpu_counts: Sequence[int]) -> dict[str, tuple[Any, ...]]:
    """The fixed candidate values of every axis, for every trial.

    Degrees: the union of the divisors of the GPU counts, less the values
    that no combination passes (rules of at most three axes, tried on the
    grid of candidates at every GPU count).  ``vpp`` runs to the layer count
    (or ``max_vpp``); ``mbs``, ``sp`` and ``recompute`` come from the
    training setup.
    """
    counts = sorted(set(gpu_counts))
    union: set[int] = set()
    for n in counts:
        union.update(divisors(n))
    degrees = np.asarray(sorted(union), dtype=np.int64)
    max_vpp = model.num_layers if training.max_vpp is None else min(model.num_layers,
                                                                   training.max_vpp)
    sets: dict[str, np.ndarray] = {
        "tp": degrees, "pp": degrees[degrees <= model.num_layers],
        "cp": degrees if training.max_cp is None else degrees[degrees <= training.max_cp],
        "ep": degrees, "etp": degrees, "vpp": np.arange(1, max_vpp + 1, dtype=np.int64),
        "mbs": np.asarray(sorted(set(training.micro_batch_sizes)), dtype=np.int64),
        "sp": np.asarray([0] if training.sequence_parallel == "off" else [0, 1]),
        "recompute": np.asarray(sorted(RECOMPUTE_CODES[m] for m in training.recompute_modes)),
    }
    # rules of fewer axes first (they shrink the grids of the wider ones); a grid too large
    # to build at every GPU count is skipped: the sets stay wider, never wrong
    for rule in sorted(RULES, key=lambda r: len(r.axes)):
        axes = sorted(rule.axes)
        if len(axes) > 3 or not set(axes) <= sets.keys():
            continue
        size = int(np.prod([len(sets[a]) for a in axes], dtype=np.float64))
        if size > _MAX_RULE_GRID or size * len(counts) > _MAX_RULE_WORK:
            continue
        grids = np.meshgrid(*(sets[a] for a in axes), indexing="ij")
        cols = {a: g.ravel() for a, g in zip(axes, grids, strict=True)}
        ok = np.zeros(grids[0].size, dtype=bool)
        for n in counts:
            ok |= np.broadcast_to(rule.holds(rule_context(model, training, n), cols), ok.shape)
        for axis in axes:
            sets[axis] = np.unique(cols[axis][ok])
    out: dict[str, tuple[Any, ...]] = {"num_gpus": tuple(counts)}
    for axis in AXES[1:]:
        values = [int(v) for v in sets[axis]]
        if axis == "recompute":
            out[axis] = tuple(RECOMPUTE_MODES[v] for v in values)
        elif axis == "sp":
            out[axis] = tuple(bool(v) for v in values)
        else:
            out[axis] = tuple(values)
        if not out[axis]:
            raise SpecError(f"optuna search: no candidate value for {axis} passes the layout "
                            f"rules for model {model.name}")
    return out


def rule_violations(model: ModelSpec, training: TrainingSpec, num_gpus: int,
                    layouts: Sequence[Layout]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Broken-rule counts of layouts of one GPU count (vectorized), and their columns."""
    ctx = rule_context(model, training, num_gpus)
    cols = layout_columns(list(layouts))
    cols.update(derive_columns(ctx, cols))
    broken = np.zeros(len(layouts), dtype=np.int64)
    for rule in RULES:
        broken += ~np.broadcast_to(np.asarray(rule.holds(ctx, cols), dtype=bool), broken.shape)
    return broken, cols


def layout_from_params(params: dict[str, Any]) -> Layout:
    """The layout a trial's parameters describe (the ``cluster`` parameter aside)."""
    return Layout(num_gpus=int(params["num_gpus"]), tp=int(params["tp"]), pp=int(params["pp"]),
                  cp=int(params["cp"]), ep=int(params["ep"]), etp=int(params["etp"]),
                  vpp=int(params["vpp"]), mbs=int(params["mbs"]), sp=bool(params["sp"]),
                  recompute=str(params["recompute"]))  # type: ignore[arg-type]


def query_fingerprint(model: ModelSpec, training: TrainingSpec,
                      cluster: ClusterSpec | Sequence[ClusterSpec],
                      sets: dict[str, tuple[Any, ...]],
                      cluster_counts: Mapping[str, Sequence[int]] | None = None) -> str:
    """A stable text naming what a study optimizes (model, setup, cluster(s), space).

    Several clusters: their list (in order) and each one's GPU counts are
    part of it, so a study cannot be resumed with another cluster list.
    """
    clusters: Any = (repr(cluster) if isinstance(cluster, ClusterSpec)
                     else [repr(c) for c in cluster])
    document: dict[str, Any] = {"model": repr(model), "training": repr(training),
                                "cluster": clusters,
                                "space": {k: list(v) for k, v in sets.items()}}
    if cluster_counts is not None:
        document["cluster_gpu_counts"] = {k: list(v) for k, v in cluster_counts.items()}
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
    return digest[:16]


# --- one cluster or several ------------------------------------------------------------------


@dataclass(frozen=True)
class StudySpace:
    """The clusters a study covers and the GPU counts each one offers (sorted)."""

    clusters: tuple[ClusterSpec, ...]
    counts: dict[str, tuple[int, ...]]

    @property
    def multi(self) -> bool:
        return len(self.clusters) > 1

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.clusters)

    @property
    def union(self) -> tuple[int, ...]:
        return tuple(sorted({n for counts in self.counts.values() for n in counts}))

    @property
    def axes(self) -> tuple[str, ...]:
        return ((CLUSTER_AXIS,) if self.multi else ()) + AXES

    @property
    def outcome_keys(self) -> tuple[str, ...]:
        return OUTCOME_KEYS + (("gpus",) if self.multi else ())

    def cluster_of(self, params: dict[str, Any]) -> str:
        return str(params.get(CLUSTER_AXIS, self.names[0]))

    def fingerprint(self, model: ModelSpec, training: TrainingSpec,
                    sets: dict[str, tuple[Any, ...]]) -> str:
        if not self.multi:  # exactly the single-cluster fingerprint of earlier releases
            return query_fingerprint(model, training, self.clusters[0], sets)
        return query_fingerprint(model, training, self.clusters, sets, self.counts)


def study_space(cluster: ClusterSpec | Sequence[ClusterSpec],
                gpu_counts: Sequence[int] | Mapping[str, Sequence[int]]) -> StudySpace:
    """The clusters and each one's GPU counts, checked (distinct names, counts for each)."""
    if isinstance(cluster, ClusterSpec):
        clusters: tuple[ClusterSpec, ...] = (cluster,)
    elif (isinstance(cluster, Sequence) and not isinstance(cluster, str) and cluster
          and all(isinstance(c, ClusterSpec) for c in cluster)):
        clusters = tuple(cluster)
    else:
        raise SpecError("optuna search: cluster must be a ClusterSpec or a non-empty sequence "
                        f"of them, got {cluster!r}")
    names = [c.name for c in clusters]
    if len(set(names)) != len(names):
        raise SpecError(f"optuna search: cluster names must be distinct, got {', '.join(names)}")
    if isinstance(gpu_counts, Mapping):
        missing = [n for n in names if n not in gpu_counts]
        if missing:
            raise SpecError(f"optuna search: no GPU counts given for cluster {missing[0]!r}")
        counts = {n: tuple(sorted(set(gpu_counts[n]))) for n in names}
    else:
        counts = {n: tuple(sorted(set(gpu_counts))) for n in names}
    for name, values in counts.items():
        if not values:
            where = f" for cluster {name!r}" if len(names) > 1 else ""
            raise SpecError(f"optuna search: give at least one GPU count{where}")
    return StudySpace(clusters, counts)


def study_sets(model: ModelSpec, training: TrainingSpec,
               space: StudySpace) -> dict[str, tuple[Any, ...]]:
    """The candidate values of every axis of the study (the cluster axis too, when several)."""
    sets = candidate_sets(model, training, space.union)
    if space.multi:
        sets[CLUSTER_AXIS] = space.names
    return sets
