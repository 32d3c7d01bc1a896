"""Answer one cell of a sweep: the best layouts of a model on N GPUs of a cluster.

The answer is a JSON-safe mapping (it is stored in the sweep's storage and
read back by any machine): ``status`` is ``ok`` (a layout fits), ``no-fit``
(valid layouts exist but none fits in memory) or ``invalid`` (the question
itself is refused, e.g. no valid layout, or a size the cluster cannot
hold), with the reason in one line.  Numbers are finite floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from parsearch.errors import ParsearchError
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.query import Query
from parsearch.sweep.grid import Cell, SweepGrid

GIB = float(1 << 30)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass
class CellSolver:
    """Answers cells of one grid; resolves each model and cluster once per worker."""

    grid: SweepGrid
    _models: dict[str, ModelSpec] = field(default_factory=dict)
    _clusters: dict[str, Any] = field(default_factory=dict)

    def model(self, name: str) -> ModelSpec:
        if name not in self._models:
            from parsearch.model.files import resolve_model

            self._models[name] = resolve_model(name)
        return self._models[name]

    def cluster(self, name: str) -> Any:
        if name not in self._clusters:
            from parsearch.topology.cluster import load_cluster

            self._clusters[name] = load_cluster(name)
        return self._clusters[name]

    def training(self, cell: Cell) -> TrainingSpec:
        return TrainingSpec(seq_len=cell.seq_len, global_batch=cell.global_batch,
                            micro_batch_sizes=self.grid.micro_batch_sizes,
                            recompute_modes=self.grid.recompute,
                            precision=self.grid.precision)

    def query(self, cell: Cell) -> Query:
        """The question of ``cell``, as ``parsearch search`` asks it by default (MoE
        features chosen with each layout)."""
        from parsearch.cost.options import DEFAULT_SEARCHED_FEATURES, CostOptions

        return Query(self.model(cell.model), self.training(cell), self.cluster(cell.cluster),
                     options=CostOptions(search_features=DEFAULT_SEARCHED_FEATURES))

    def check(self) -> None:
        """Resolve every model and cluster now: a bad name fails before any work starts."""
        for name in self.grid.models:
            self.model(name)
        for name in self.grid.clusters:
            self.cluster(name)

    def solve(self, cell: Cell) -> dict[str, Any]:
        """The answer to ``cell`` (never raises for a question the model refuses)."""
        from parsearch.launch.plan import priced_features
        from parsearch.search.api import search_layouts

        try:
            result = search_layouts(self.query(cell), num_gpus=cell.gpus, top=self.grid.top)
        except ParsearchError as error:
            return {"status": "invalid", "reason": str(error).splitlines()[0]}
        base: dict[str, Any] = {"valid": result.valid, "feasible": result.feasible,
                                "considered": result.considered}
        best = result.best
        if best is None:
            need = result.smallest_memory_gib
            reason = (f"none of the {result.valid:,} valid layouts fits in memory"
                      + (f"; the leanest needs {need:.1f} GiB per GPU"
                         if need is not None and math.isfinite(need) else ""))
            return {"status": "no-fit", "reason": reason, **base}
        est = best.estimate
        return {
            "status": "ok", **base,
            "layout": best.layout.key(),
            "tokens_per_s": _finite(est.tokens_per_s),
            "tokens_per_s_per_gpu": _finite(est.tokens_per_s_per_gpu),
            "step_time_s": _finite(est.step_time_s),
            "mfu": _finite(est.mfu),
            "memory_gib": _finite(est.memory_bytes["total"] / GIB),
            "bottleneck": str(est.bottleneck),
            "features": list(priced_features(best.launch.plan)),
            "top": [e.layout.key() for e in result.entries],
        }


__all__ = ["CellSolver"]
