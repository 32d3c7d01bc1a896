"""What a search returns: ranked layouts on one GPU count, and fronts over GPU counts.

Frozen dataclasses whose ``to_dict()`` is the CLI's JSON
(``shared/spec/cli.md``): :class:`SearchResult` of :class:`SearchEntry`
(``parsearch search``) and :class:`ParetoResult` of :class:`ParetoPoint`
(``parsearch pareto``, one cluster or several).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parsearch.cost.analytic import GIB, Estimate
from parsearch.launch import LaunchSettings
from parsearch.launch.plan import priced_features
from parsearch.layout import Layout


@dataclass(frozen=True)
class SearchEntry:
    """One ranked layout: its estimate and how to launch it."""

    rank: int
    estimate: Estimate
    launch: LaunchSettings
    flags: tuple[str, ...] = ()  # soft rules of the layout spec it breaks
    #: within the prediction's error band of the best: the tool cannot order them
    tied: bool = False

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
                   launch=self.launch.to_dict(), flags=list(self.flags),
                   tied_with_best=self.tied,
                   priced_features=list(priced_features(self.launch.plan)))
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
    tie_note: str = ""  # what the ``tied`` entries share ("" when fewer than two tie)
    #: entries of this list's kind (layouts, or shapes with ``diverse``) inside the tie band
    #: of the best, listed or not: more than the tied entries shown means the list was cut
    #: inside the band (0: no band, or fewer than two tie)
    tied_total: int = 0
    # what the model has that no calibration run of this GPU generation had
    # (parsearch.cost.coverage): the ranges and the tie band do not cover it
    outside_calibration: tuple[str, ...] = ()

    @property
    def best(self) -> SearchEntry | None:
        return self.entries[0] if self.entries else None

    @property
    def tied_unlisted(self) -> int:
        """Entries inside the tie band of the best that the list does not show."""
        return max(0, self.tied_total - sum(1 for e in self.entries if e.tied))

    @property
    def pruned(self) -> int:
        """Valid layouts never scored: their shape's bound proves they cannot enter."""
        return 0 if self.examined is None else self.valid - self.examined

    def to_dict(self) -> dict[str, Any]:
        return {"query": dict(self.query), "considered": self.considered, "valid": self.valid,
                "feasible": self.feasible,
                "examined": self.valid if self.examined is None else self.examined,
                "pruned": self.pruned, "exact": True,
                "results": [e.to_dict() for e in self.entries], "elapsed_s": self.elapsed_s,
                "tie_note": self.tie_note or None,
                "tied_total": self.tied_total,
                "outside_calibration": list(self.outside_calibration)}


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
    flags: tuple[str, ...] = ()  # pinned features it runs without, and why

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
                   speedup=self.speedup, nodes=self.launch.nodes, launch=self.launch.to_dict(),
                   flags=list(self.flags))
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
