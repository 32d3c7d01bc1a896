"""Scoring the trials of an optuna study: vectorized, cached per run, one scorer per cluster.

Invalid and out-of-memory layouts get throughput 0 and positive constraint
values: ``rules`` is :data:`RULE_PENALTY` per broken layout rule,
``memory`` the relative excess over the GPU's memory (capped below
:data:`RULE_PENALTY`, so a valid layout always beats an invalid one).  A
GPU count the chosen cluster does not offer adds a ``gpus`` violation.
Scores are cached by cluster, GPU count and layout key (:func:`cache_key`).
Nothing here imports optuna at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from parsearch.cost.analytic import (
    CostModel,
    CostOptions,
    build_cost_model,
    score_columns,
    usable_memory_bytes,
)
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.cost.memory import memory_arrays
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.search.study_space import (
    CLUSTER_AXIS,
    OUTCOME_KEYS,
    StudySpace,
    layout_from_params,
    rule_violations,
)
from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.fabric import build_fabric
from parsearch.topology.hardware import load_gpu_profile

if TYPE_CHECKING:  # pragma: no cover
    import optuna

#: Constraint value per broken layout rule (and for a GPU count the cluster does not offer).
RULE_PENALTY = 10.0
_MAX_MEMORY_PENALTY = 9.0


@dataclass
class Scorer:
    """Scores layouts of one cluster, caching each outcome by GPU count and layout key."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    profile: EfficiencyProfile | None
    options: CostOptions | None
    hbm_bytes: float
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    cost_models: dict[int, CostModel] = field(default_factory=dict)
    evaluations: int = 0
    cache_hits: int = 0

    def cost_model(self, num_gpus: int) -> CostModel:
        if num_gpus not in self.cost_models:
            fabric = build_fabric(self.cluster, num_gpus)
            self.cost_models[num_gpus] = build_cost_model(
                self.model, self.training, fabric, profile=self.profile, options=self.options)
        return self.cost_models[num_gpus]

    def score(self, layouts: Sequence[Layout]) -> list[dict[str, Any]]:
        """Outcome per layout: valid, fits, tokens_per_s, rule and memory violations."""
        keys = [cache_key(x) for x in layouts]
        todo: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            if key in self.cache:
                self.cache_hits += 1
            else:
                todo.setdefault(layouts[i].num_gpus, []).append(i)
        for num_gpus, idx in todo.items():
            self._score_group(num_gpus, [layouts[i] for i in idx], [keys[i] for i in idx])
        return [self.cache[k] for k in keys]

    def _score_group(self, num_gpus: int, layouts: list[Layout], keys: list[str]) -> None:
        # de-duplicate within the batch
        unique: dict[str, Layout] = {}
        for key, lay in zip(keys, layouts, strict=True):
            unique.setdefault(key, lay)
        keys, layouts = list(unique), list(unique.values())
        self.evaluations += len(layouts)
        broken, cols = rule_violations(self.model, self.training, num_gpus, layouts)
        outcome = [{"valid": False, "fits": False, "tokens_per_s": 0.0,
                    "rules": RULE_PENALTY * float(b), "memory": 0.0} for b in broken]
        valid = np.nonzero(broken == 0)[0]
        if len(valid):
            sub = {k: v[valid] for k, v in cols.items()}
            mem = memory_arrays(self.model, self.training, sub["tp"], sub["cp"], sub["pp"],
                                sub["ep"], sub["etp"], sub["vpp"], sub["mbs"], sub["dp"],
                                sub["edp"], sub["recompute"], sub["sp"],
                                (self.options or CostOptions()).memory)
            excess = (np.asarray(mem.total) - self.hbm_bytes) / self.hbm_bytes
            fits = excess <= 0
            for j, i in enumerate(valid):
                outcome[i].update(valid=True, memory=float(min(excess[j], _MAX_MEMORY_PENALTY)))
            if fits.any():
                cm = self.cost_model(num_gpus)
                rows = valid[fits]
                scores = score_columns(cm, {k: v[rows] for k, v in cols.items()})
                for j, i in enumerate(rows):
                    outcome[i].update(fits=bool(scores["fits"][j]),
                                      tokens_per_s=float(scores["tokens_per_s"][j]))
        for key, out in zip(keys, outcome, strict=True):
            self.cache[key] = out


def cache_key(layout: Layout, cluster: str | None = None) -> str:
    """``"<num_gpus>:<layout key>"``: what the score cache and the trial attributes use.

    With ``cluster`` (studies over several clusters): ``"<cluster>/<num_gpus>:<key>"``.
    """
    key = f"{layout.num_gpus}:{layout.key()}"
    return key if cluster is None else f"{cluster}/{key}"


def _count_violations(model: ModelSpec, training: TrainingSpec, num_gpus: int,
                      layouts: Sequence[Layout]) -> list[dict[str, Any]]:
    """Outcomes of layouts on a GPU count their cluster does not offer (not scored).

    The ``gpus`` violation comes on top of the layout-rule violations, so
    such a layout never ranks above the same layout on an allowed count
    (a flat penalty alone would beat layouts that break two rules and pull
    the sampler towards counts the cluster does not have).
    """
    broken, _ = rule_violations(model, training, num_gpus, layouts)
    return [{"valid": False, "fits": False, "tokens_per_s": 0.0,
             "rules": RULE_PENALTY * float(b), "memory": 0.0, "gpus": RULE_PENALTY}
            for b in broken]


@dataclass
class Router:
    """One scorer (and cache) per cluster; GPU counts a cluster does not offer are violations."""

    scorers: dict[str, Scorer]
    allowed: dict[str, frozenset[int]]

    @property
    def evaluations(self) -> int:
        return sum(s.evaluations for s in self.scorers.values())

    @property
    def cache_hits(self) -> int:
        return sum(s.cache_hits for s in self.scorers.values())

    def score(self, pairs: Sequence[tuple[str, Layout]]) -> list[dict[str, Any]]:
        """Outcome per (cluster name, layout), with a ``gpus`` violation (0 when allowed)."""
        out: list[dict[str, Any]] = [{} for _ in pairs]
        scored: dict[str, list[int]] = {}
        refused: dict[int, list[int]] = {}
        for i, (name, lay) in enumerate(pairs):
            if lay.num_gpus in self.allowed[name]:
                scored.setdefault(name, []).append(i)
            else:
                refused.setdefault(lay.num_gpus, []).append(i)
        for name, idx in scored.items():
            results = self.scorers[name].score([pairs[i][1] for i in idx])
            for i, result in zip(idx, results, strict=True):
                out[i] = {**result, "gpus": 0.0}
        any_scorer = next(iter(self.scorers.values()))
        for num_gpus, idx in refused.items():
            results = _count_violations(any_scorer.model, any_scorer.training, num_gpus,
                                        [pairs[i][1] for i in idx])
            for i, result in zip(idx, results, strict=True):
                out[i] = result
        return out

    def warm(self, trials: Sequence[optuna.trial.FrozenTrial], default: str) -> None:
        """Fill the caches from completed trials: a resumed run repeats no evaluation."""
        for trial in trials:
            attrs = trial.user_attrs
            if "cache_key" not in attrs or attrs.get("gpus", 0.0) > 0:
                continue
            name = str(trial.params.get(CLUSTER_AXIS, default))
            if name in self.scorers:
                key = cache_key(layout_from_params(trial.params))
                self.scorers[name].cache[key] = {k: attrs[k] for k in OUTCOME_KEYS}


def _profile_of(profile: EfficiencyProfile | Mapping[str, EfficiencyProfile | None] | None,
                name: str) -> EfficiencyProfile | None:
    return profile.get(name) if isinstance(profile, Mapping) else profile


def make_router(model: ModelSpec, training: TrainingSpec, space: StudySpace,
                profile: EfficiencyProfile | Mapping[str, EfficiencyProfile | None] | None,
                options: CostOptions | None) -> Router:
    """One scorer per cluster of the space, each with its profile and usable memory."""
    scorers = {
        c.name: Scorer(model, training, c, _profile_of(profile, c.name), options,
                       usable_memory_bytes(load_gpu_profile(c.gpu), options))
        for c in space.clusters}
    return Router(scorers, {n: frozenset(v) for n, v in space.counts.items()})
