"""Multi-objective optuna search over GPU count and layout (the only module importing optuna).

For spaces too large to scan: many GPU counts, many micro-batch and
recompute options, several clusters.  The study maximizes tokens/s and
minimizes GPUs.

* Static search space: every trial suggests every axis (GPU count, tp, pp,
  cp, ep, etp, vpp, mbs, sp, recompute) from a fixed candidate set
  (:func:`candidate_sets`), so samplers that need the same space in every
  trial (NSGA-II's intersection space) work, and a resumed study sees the
  same space.
* Invalid and out-of-memory layouts are completed trials with throughput 0
  and positive constraint values (``trial.set_constraint``): ``rules`` is 10
  per broken layout rule, ``memory`` the relative excess over the GPU's
  memory (capped below 10, so a valid layout always beats an invalid one).
* Several clusters: one study, with the cluster as one more categorical
  axis (``cluster``, the fixed list, suggested in every trial) and the GPU
  count candidates the union of every cluster's counts.  A count that is
  not one of the chosen cluster's counts (above its ``max_gpus``, or off its
  node step) is a completed trial with throughput 0 and a third constraint,
  ``gpus`` (10).  With one cluster there is no ``cluster`` axis and no
  ``gpus`` constraint, so single-cluster studies are unchanged.
* Trials are asked in batches and scored together with the vectorized
  scorer; scores are cached by cluster, GPU count and layout key for the
  run (the cache is warmed from the completed trials of a resumed study).
* Known-good layouts are enqueued when a study starts, for every cluster:
  tensor parallel inside the NVLink domain, pipeline parallel across nodes
  as far as memory needs, data parallel to fill.
* Storage: in memory by default, or any optuna storage URL
  (``sqlite:///file.db``, ``postgresql://...``) or a journal file
  (``journal:PATH`` or a path ending in ``.log``/``.journal``).  The study
  is created with ``load_if_exists``; the run counts the completed trials
  already in the storage and runs only the remainder of ``n_trials``, so an
  interrupted run, resumed, neither loses nor repeats a completed trial,
  and several processes can share one study (the budget is checked before
  every batch, so together they overshoot it by at most one batch each).
* Several workers (:mod:`parsearch.search.storage`): the starting layouts
  are enqueued once per study; each worker takes a number from the study
  and samples its own seed stream (worker 0 uses ``seed`` itself); on an
  RDB storage every running trial has a heartbeat, and the trials of a
  dead worker are failed and queued again by the next batch of any worker.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from parsearch.constraints import RECOMPUTE_CODES, RULES, derive_columns, rule_context
from parsearch.cost.analytic import (
    CostModel,
    CostOptions,
    build_cost_model,
    layout_columns,
    score_columns,
    usable_memory_bytes,
)
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.cost.memory import memory_arrays
from parsearch.errors import SpecError
from parsearch.hardware import load_gpu_profile
from parsearch.layout import Layout
from parsearch.search import storage as storage_mod
from parsearch.space import divisors
from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.fabric import build_fabric
from parsearch.workload import RECOMPUTE_MODES, ModelSpec, TrainingSpec

SAMPLERS: tuple[str, ...] = ("nsga2", "tpe")
AXES: tuple[str, ...] = ("num_gpus", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp",
                         "recompute")
#: The extra categorical axis of a study over several clusters.
CLUSTER_AXIS = "cluster"
RULE_PENALTY = 10.0
_MAX_MEMORY_PENALTY = 9.0
_QUERY_ATTR = "parsearch_query"
_ENQUEUED_ATTR = "parsearch_enqueued"
_OUTCOME_KEYS: tuple[str, ...] = ("valid", "fits", "tokens_per_s", "rules", "memory")


@dataclass(frozen=True)
class TrialRecord:
    """One completed trial: the layout, whether it is valid and fits, its throughput."""

    number: int
    layout: Layout
    valid: bool
    fits: bool
    tokens_per_s: float
    cluster: str | None = None


@dataclass(frozen=True)
class StudyOutcome:
    """What a run of :func:`run_study` left in the study."""

    study_name: str
    storage: str
    n_trials: int
    records: tuple[TrialRecord, ...]
    trials_before: int
    trials_run: int
    evaluations: int
    cache_hits: int
    enqueued: int
    candidate_sets: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    clusters: tuple[str, ...] = ()
    evaluations_by_cluster: dict[str, int] = field(default_factory=dict)

    @property
    def multi_cluster(self) -> bool:
        return len(self.clusters) > 1

    @property
    def trials_completed(self) -> int:
        return len(self.records)

    def to_dict(self) -> dict[str, Any]:
        return {
            "study_name": self.study_name,
            "storage": self.storage,
            "n_trials": self.n_trials,
            "trials_completed": self.trials_completed,
            "trials_before": self.trials_before,
            "trials_run": self.trials_run,
            "evaluations": self.evaluations,
            "cache_hits": self.cache_hits,
            "enqueued": self.enqueued,
        } | ({"clusters": list(self.clusters)} if self.multi_cluster else {})


# --- the search space ---------------------------------------------------------------------


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
        "tp": degrees, "pp": degrees[degrees <= model.num_layers], "cp": degrees,
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


# --- scoring with a per-run cache -----------------------------------------------------------


@dataclass
class _Scorer:
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
class _Router:
    """One scorer (and cache) per cluster; GPU counts a cluster does not offer are violations."""

    scorers: dict[str, _Scorer]
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
                key = cache_key(_layout_from_params(trial.params))
                self.scorers[name].cache[key] = {k: attrs[k] for k in _OUTCOME_KEYS}


# --- known-good starting layouts --------------------------------------------------------------


def starting_layouts(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                     sets: dict[str, tuple[Any, ...]], *, limit: int,
                     options: CostOptions | None = None) -> list[Layout]:
    """Up to ``limit`` valid layouts that fit, spread over the GPU counts.

    Per GPU count and per tensor- and context-parallel pair inside the
    NVLink domain (largest first): the smallest pipeline depth (across nodes) and the
    least recompute that make the layout fit, experts spread over as many
    ranks as divide them, data parallel filling the rest.
    """
    counts = list(sets["num_gpus"])
    if limit < 1 or not counts:
        return []
    domain = cluster.job_domain_size
    hbm = usable_memory_bytes(load_gpu_profile(cluster.gpu), options)
    memory_options = (options or CostOptions()).memory
    mbs = min(sets["mbs"])
    modes = [m for m in ("none", "selective", "full") if m in sets["recompute"]]
    per_count: list[list[Layout]] = []
    for n in counts:
        found: list[Layout] = []
        inside = [(t, c) for t in sets["tp"] for c in sets["cp"]
                  if t * c <= min(domain, n) and n % (t * c) == 0]
        for tp, cp in sorted(inside, key=lambda tc: (-tc[0] * tc[1], -tc[0])):
            sp = tp > 1 and True in sets["sp"]
            candidates = []
            for mode in modes:
                for pp in sorted(p for p in sets["pp"] if n % (tp * cp * p) == 0):
                    ep = 1
                    if model.moe is not None:
                        ep = max((e for e in sets["ep"] if (n // pp) % e == 0
                                  and model.moe.num_experts % e == 0), default=1)
                    candidates.append(Layout(num_gpus=n, tp=tp, cp=cp, pp=pp, ep=ep, mbs=mbs,
                                             sp=sp, recompute=mode))  # type: ignore[arg-type]
            if not candidates:
                continue
            broken, cols = rule_violations(model, training, n, candidates)
            valid = np.nonzero(broken == 0)[0]
            if not len(valid):
                continue
            sub = {k: v[valid] for k, v in cols.items()}
            mem = memory_arrays(model, training, sub["tp"], sub["cp"], sub["pp"], sub["ep"],
                                sub["etp"], sub["vpp"], sub["mbs"], sub["dp"], sub["edp"],
                                sub["recompute"], sub["sp"], memory_options)
            fits = np.nonzero(np.asarray(mem.total) <= hbm)[0]
            if len(fits):
                # fewest pipeline stages first, then the least recompute
                best = min(fits, key=lambda j: (candidates[int(valid[j])].pp, int(j)))
                found.append(candidates[int(valid[best])])
        per_count.append(found)
    # round-robin over GPU counts (largest tp first), so a small limit still spans the range
    return _round_robin(per_count, limit)


def _round_robin(lists: Sequence[Sequence[Any]], limit: int) -> list[Any]:
    """The first of every list, then the second of every list, ... up to ``limit`` items."""
    out: list[Any] = []
    depth = 0
    while len(out) < limit and any(depth < len(items) for items in lists):
        for items in lists:
            if depth < len(items) and len(out) < limit:
                out.append(items[depth])
        depth += 1
    return out


# --- storage and study ---------------------------------------------------------------------


def make_storage(url: str | None) -> Any:
    """An optuna storage for ``url``: ``None`` in memory, a journal file, or an RDB URL.

    RDB storages keep a heartbeat per running trial, so a dead worker's
    trials are failed and queued again (:mod:`parsearch.search.storage`).
    """
    return storage_mod.make_storage(url)


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


def _sampler(name: str, seed: int | None, population_size: int) -> optuna.samplers.BaseSampler:
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=population_size, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=population_size)
    raise SpecError(f"optuna search: sampler must be one of {', '.join(SAMPLERS)}; got {name!r}")


def _layout_from_params(params: dict[str, Any]) -> Layout:
    return Layout(num_gpus=int(params["num_gpus"]), tp=int(params["tp"]), pp=int(params["pp"]),
                  cp=int(params["cp"]), ep=int(params["ep"]), etp=int(params["etp"]),
                  vpp=int(params["vpp"]), mbs=int(params["mbs"]), sp=bool(params["sp"]),
                  recompute=str(params["recompute"]))  # type: ignore[arg-type]


def _completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _record(trial: optuna.trial.FrozenTrial, default_cluster: str) -> TrialRecord:
    attrs = trial.user_attrs
    return TrialRecord(number=trial.number, layout=_layout_from_params(trial.params),
                       valid=bool(attrs.get("valid")), fits=bool(attrs.get("fits")),
                       tokens_per_s=float(attrs.get("tokens_per_s", 0.0)),
                       cluster=str(trial.params.get(CLUSTER_AXIS, default_cluster)))


# --- one cluster or several ------------------------------------------------------------------


@dataclass(frozen=True)
class _Space:
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
        return _OUTCOME_KEYS + (("gpus",) if self.multi else ())

    def cluster_of(self, params: dict[str, Any]) -> str:
        return str(params.get(CLUSTER_AXIS, self.names[0]))

    def fingerprint(self, model: ModelSpec, training: TrainingSpec,
                    sets: dict[str, tuple[Any, ...]]) -> str:
        if not self.multi:  # exactly the single-cluster fingerprint of earlier releases
            return query_fingerprint(model, training, self.clusters[0], sets)
        return query_fingerprint(model, training, self.clusters, sets, self.counts)


def _space(cluster: ClusterSpec | Sequence[ClusterSpec],
           gpu_counts: Sequence[int] | Mapping[str, Sequence[int]]) -> _Space:
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
    return _Space(clusters, counts)


def _study_sets(model: ModelSpec, training: TrainingSpec,
                space: _Space) -> dict[str, tuple[Any, ...]]:
    sets = candidate_sets(model, training, space.union)
    if space.multi:
        sets[CLUSTER_AXIS] = space.names
    return sets


def _profile_of(profile: EfficiencyProfile | Mapping[str, EfficiencyProfile | None] | None,
                name: str) -> EfficiencyProfile | None:
    return profile.get(name) if isinstance(profile, Mapping) else profile


def _router(model: ModelSpec, training: TrainingSpec, space: _Space,
            profile: EfficiencyProfile | Mapping[str, EfficiencyProfile | None] | None,
            options: CostOptions | None) -> _Router:
    scorers = {
        c.name: _Scorer(model, training, c, _profile_of(profile, c.name), options,
                        usable_memory_bytes(load_gpu_profile(c.gpu), options))
        for c in space.clusters}
    return _Router(scorers, {n: frozenset(v) for n, v in space.counts.items()})


def _starting_params(model: ModelSpec, training: TrainingSpec, space: _Space,
                     sets: dict[str, tuple[Any, ...]], *, limit: int,
                     options: CostOptions | None) -> list[dict[str, Any]]:
    """Known-good layouts of every cluster (each on its own GPU counts), as trial params."""
    share = limit
    per_cluster: list[list[dict[str, Any]]] = []
    for c in space.clusters:
        own = {**sets, "num_gpus": space.counts[c.name]}
        found = []
        for lay in starting_layouts(model, training, c, own, limit=share, options=options):
            params = {a: getattr(lay, a) for a in AXES}
            if space.multi:
                params[CLUSTER_AXIS] = c.name
            found.append(params)
        per_cluster.append(found)
    return _round_robin(per_cluster, limit)


def _enqueue_limit(n_trials: int, space: _Space) -> int:
    """A quarter of the budget per cluster, at most half of it in all."""
    per_cluster = max(1, n_trials // 4)
    return per_cluster if not space.multi else max(1, min(n_trials // 2,
                                                          per_cluster * len(space.clusters)))


def _open_study(model: ModelSpec, training: TrainingSpec, space: _Space,
                sets: dict[str, tuple[Any, ...]], *, storage: str | None,
                study_name: str | None, sampler: optuna.samplers.BaseSampler,
                backend: Any = None) -> optuna.Study:
    """Create or load the study; refuse one made for another query (or cluster list).

    Several workers may open it at once: the query is recorded under the
    storage lock, and the first to record it wins.
    """
    fingerprint = space.fingerprint(model, training, sets)
    name = study_name or f"parsearch-{model.name}-{fingerprint}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = make_storage(storage) if backend is None else backend
    study = optuna.create_study(storage=backend, study_name=name,
                                directions=["maximize", "minimize"], sampler=sampler,
                                load_if_exists=True)
    with storage_mod.storage_lock(backend, storage, f"{name}:query"):
        stored = study.user_attrs.get(_QUERY_ATTR)
        if stored is None and not study.get_trials(deepcopy=False):
            study.set_user_attr(_QUERY_ATTR, fingerprint)
    if stored is not None and stored != fingerprint:
        raise SpecError(f"study {name!r} in {_redact(storage)} was created for another query "
                        "(model, training setup, cluster list or GPU range differ); use another "
                        "--study-name or the original options")
    return study


def _tell_batch(study: optuna.Study, batch: list[optuna.trial.Trial], router: _Router,
                space: _Space) -> None:
    """Score a batch of asked trials together and tell the study every result."""
    told = 0
    try:
        pairs = [(space.cluster_of(t.params), _layout_from_params(t.params)) for t in batch]
        outcomes = router.score(pairs)
        for trial, (name, lay), out in zip(batch, pairs, outcomes, strict=True):
            trial.set_constraint("rules", out["rules"])
            trial.set_constraint("memory", out["memory"])
            if space.multi:
                trial.set_constraint("gpus", out["gpus"])
            trial.set_user_attr("cache_key", cache_key(lay, name if space.multi else None))
            for key in space.outcome_keys:
                trial.set_user_attr(key, out[key])
            study.tell(trial, [out["tokens_per_s"], float(lay.num_gpus)])
            told += 1
    except BaseException:
        # leave no trial RUNNING behind in a shared storage: fail the rest and queue them again
        storage_mod.give_back(study, batch[told:])
        raise


def _check_run_args(n_trials: object, sampler: str) -> None:
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise SpecError(f"optuna search: n_trials must be a positive integer, got {n_trials!r}")
    if sampler not in SAMPLERS:
        raise SpecError(f"optuna search: sampler must be one of {', '.join(SAMPLERS)}; "
                        f"got {sampler!r}")


def run_study(*, model: ModelSpec, training: TrainingSpec,
              cluster: ClusterSpec | Sequence[ClusterSpec],
              gpu_counts: Sequence[int] | Mapping[str, Sequence[int]], n_trials: int,
              seed: int | None = None, storage: str | None = None,
              study_name: str | None = None, sampler: str = "nsga2",
              population_size: int | None = None, enqueue: bool = True,
              profile: EfficiencyProfile | Mapping[str, EfficiencyProfile | None] | None = None,
              options: CostOptions | None = None,
              on_trials: Callable[[int], None] | None = None,
              stop_after: int | None = None,
              heartbeat_s: int | None = storage_mod.DEFAULT_HEARTBEAT_S) -> StudyOutcome:
    """Run (or resume) the study until it holds ``n_trials`` completed trials.

    ``cluster``: one cluster, or several (one study with a ``cluster`` axis);
    ``gpu_counts``: the GPU counts, or a mapping from cluster name to that
    cluster's counts; ``profile``: one profile for all clusters, or one per
    cluster name (``None``: the one covering each cluster's GPU).
    ``on_trials(k)`` is called after each batch of ``k`` completed trials
    (progress).  ``stop_after`` ends this run after that many new trials
    (a controlled interruption, for tests and time-boxed workers).
    ``heartbeat_s``: seconds between the heartbeats of running trials on an
    RDB storage (``None``: none; a dead worker's trials then stay RUNNING).
    """
    _check_run_args(n_trials, sampler)
    space = _space(cluster, gpu_counts)
    pop = population_size or int(min(100, max(16, n_trials // 25)))
    if pop < 2:
        raise SpecError(f"optuna search: population_size must be >= 2, got {pop}")
    sets = _study_sets(model, training, space)
    backend = storage_mod.make_storage(storage, heartbeat_s=heartbeat_s)
    study = _open_study(model, training, space, sets, storage=storage, study_name=study_name,
                        sampler=_sampler(sampler, seed, pop), backend=backend)
    # each worker on the study samples its own stream (worker 0: the seed itself)
    worker = storage_mod.claim_worker_number(study, backend, storage) if storage else 0
    if worker:
        study.sampler = _sampler(sampler, storage_mod.worker_seed(seed, worker), pop)
    router = _router(model, training, space, profile, options)
    completed = _completed(study)
    router.warm(completed, space.names[0])
    enqueued = 0
    if enqueue:
        enqueued = _enqueue_once(study, backend, storage, _starting_params(
            model, training, space, sets, limit=_enqueue_limit(n_trials, space),
            options=options))
    before, run = len(completed), 0
    distributions = {a: optuna.distributions.CategoricalDistribution(sets[a])
                     for a in space.axes}
    while True:
        left = n_trials - len(_completed(study))
        if stop_after is not None:
            left = min(left, stop_after - run)
        if left <= 0:
            break
        storage_mod.reap_stale_trials(study, backend, storage)  # a dead worker's trials
        with storage_mod.Heartbeat(backend) as beat:
            batch: list[optuna.trial.Trial] = []
            try:
                for _ in range(min(pop, left)):
                    batch.append(storage_mod.ask(study, distributions))
                    beat.add(batch[-1]._trial_id)  # from its first moment: a kill is seen
            except BaseException:
                storage_mod.give_back(study, batch)
                raise
            _tell_batch(study, batch, router, space)
        run += len(batch)
        if on_trials is not None:
            on_trials(len(batch))
    records = tuple(_record(t, space.names[0]) for t in _completed(study))
    return StudyOutcome(
        study_name=study.study_name, storage=_redact(storage), n_trials=n_trials,
        records=records, trials_before=before, trials_run=run, evaluations=router.evaluations,
        cache_hits=router.cache_hits, enqueued=enqueued, candidate_sets=sets,
        clusters=space.names,
        evaluations_by_cluster={n: s.evaluations for n, s in router.scorers.items()})


def _enqueue_once(study: optuna.Study, backend: Any, storage: str | None,
                  params: Sequence[dict[str, Any]]) -> int:
    """Enqueue the starting layouts once per study, however many workers start together.

    A study made by an earlier release without the mark but with trials counts as enqueued.
    """
    with storage_mod.storage_lock(backend, storage, f"{study.study_name}:enqueue"):
        if _ENQUEUED_ATTR in study.user_attrs or study.get_trials(deepcopy=False):
            return 0
        for p in params:
            study.enqueue_trial(p)
        study.set_user_attr(_ENQUEUED_ATTR, len(params))
    return len(params)


def _redact(url: str | None) -> str:
    """The storage URL without a password (it is printed and stored in reports)."""
    return storage_mod.redact(url)


def trial_budget_for(total_layouts: int, fraction: float = 0.1) -> int:
    """A default trial budget: ``fraction`` of the exhaustive count, 200..5000."""
    return int(min(5000, max(200, math.ceil(total_layouts * fraction))))


__all__ = [
    "AXES",
    "SAMPLERS",
    "StudyOutcome",
    "TrialRecord",
    "cache_key",
    "candidate_sets",
    "make_storage",
    "query_fingerprint",
    "rule_violations",
    "run_study",
    "starting_layouts",
    "trial_budget_for",
]
