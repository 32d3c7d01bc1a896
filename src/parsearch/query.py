"""The question every planning entry point answers: what to run, on what, priced how.

:func:`~parsearch.search.api.search_layouts`, :func:`~parsearch.search.api.pareto_front`,
:func:`~parsearch.serve.api.serve_layouts` and each cell of a sweep
(:meth:`~parsearch.sweep.cells.CellSolver.query`) take one :class:`Query`; what is
particular to the question (the GPU count, how many layouts, a serving workload) stays
a keyword of the entry point.  The command line builds the query once per command.

>>> from parsearch.model.specs import TrainingSpec
>>> q = Query("llama3-8b", TrainingSpec(seq_len=4096, global_batch=256), "dgx-h100")
>>> q.clusters, q.cluster
(('dgx-h100',), 'dgx-h100')
>>> Query("llama3-8b", None, ["dgx-h100", "dgx-a100"]).clusters
('dgx-h100', 'dgx-a100')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parsearch.cost.efficiency import EfficiencyProfile, load_efficiency_profile
from parsearch.cost.options import CostOptions
from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import ClusterSpec

#: The keywords the entry points took before the query object, and the field each fills.
LEGACY_KEYWORDS: Mapping[str, str] = {
    "model": "model", "training": "training", "cluster": "clusters", "options": "options",
    "profile": "profile", "efficiency": "profile",
}


@dataclass(frozen=True)
class Query:
    """A model (preset name or spec), its training setup, one or more clusters, and the
    cost options and efficiency profile to price with (``None``: the defaults, the
    profile of each cluster's GPU).

    ``clusters`` takes one cluster (name or spec) or a sequence of them and is kept as
    a tuple.  ``training`` is ``None`` for serving, which takes a workload instead.
    """

    model: ModelSpec | str
    training: TrainingSpec | None = None
    clusters: tuple[ClusterSpec | str, ...] = ()
    options: CostOptions | None = None
    profile: EfficiencyProfile | None = None

    def __post_init__(self) -> None:
        # one cluster becomes a tuple of one; the entry points load and check the rest
        clusters: Any = self.clusters
        if isinstance(clusters, (str, ClusterSpec)):
            object.__setattr__(self, "clusters", (clusters,))
        elif isinstance(clusters, Sequence):
            object.__setattr__(self, "clusters", tuple(clusters))
        else:
            raise SpecError(f"cluster must be a ClusterSpec, a preset name/path or a sequence "
                            f"of them, got {type(clusters).__name__}")

    @property
    def cluster(self) -> ClusterSpec | str:
        """The one cluster of a single-cluster question."""
        if len(self.clusters) != 1:
            raise SpecError(f"this question takes one cluster; the query names "
                            f"{len(self.clusters)}")
        return self.clusters[0]

    def require_training(self, what: str) -> TrainingSpec:
        """The training setup, which ``what`` needs."""
        if self.training is None:
            raise SpecError(f"{what} needs a training setup (Query.training)")
        return self.training

    @classmethod
    def of(cls, query: Query | None, keywords: Mapping[str, Any], entry: str) -> Query:
        """``query``, or one built from the keywords ``entry`` took before the query object
        (``model=, training=, cluster=, options=, profile=``; ``efficiency=``, a profile
        or its name, for serving).  Not both, and no other keyword (``query=`` is the
        query given by name)."""
        if "query" in keywords and query is None:
            keywords = dict(keywords)
            query = keywords.pop("query")
        unknown = sorted(set(keywords) - set(LEGACY_KEYWORDS))
        if unknown:
            raise TypeError(f"{entry}() got an unexpected keyword argument {unknown[0]!r}")
        if query is not None:
            if keywords:
                raise TypeError(f"{entry}(): give a Query or the keywords "
                                f"{', '.join(sorted(keywords))}, not both")
            if not isinstance(query, Query):
                raise TypeError(f"{entry}(): the first argument must be a Query; got "
                                f"{type(query).__name__}")
            return query
        if "model" not in keywords:
            raise TypeError(f"{entry}() needs a Query (or the keyword model=)")
        fields = {LEGACY_KEYWORDS[key]: value for key, value in keywords.items()}
        if isinstance(fields.get("profile"), str):
            fields["profile"] = load_efficiency_profile(fields["profile"])
        return cls(**fields)


__all__ = ["LEGACY_KEYWORDS", "Query"]
