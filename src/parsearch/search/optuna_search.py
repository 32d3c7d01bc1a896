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

This module runs the study; its space is :mod:`~parsearch.search.study_space`,
its scoring :mod:`~parsearch.search.study_scoring` and its starting layouts
:mod:`~parsearch.search.study_start` (none of them imports optuna).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from parsearch.cost.analytic import CostOptions
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.search import storage as storage_mod
from parsearch.search.study_scoring import Router, cache_key, make_router
from parsearch.search.study_space import (
    CLUSTER_AXIS,
    StudySpace,
    layout_from_params,
    study_sets,
    study_space,
)
from parsearch.search.study_start import enqueue_limit, starting_params
from parsearch.topology.cluster import ClusterSpec

SAMPLERS: tuple[str, ...] = ("nsga2", "tpe")
_QUERY_ATTR = "parsearch_query"
_ENQUEUED_ATTR = "parsearch_enqueued"


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


# --- storage and study ---------------------------------------------------------------------


def make_storage(url: str | None) -> Any:
    """An optuna storage for ``url``: ``None`` in memory, a journal file, or an RDB URL.

    RDB storages keep a heartbeat per running trial, so a dead worker's
    trials are failed and queued again (:mod:`parsearch.search.storage`).
    """
    return storage_mod.make_storage(url)


def _sampler(name: str, seed: int | None, population_size: int) -> optuna.samplers.BaseSampler:
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=population_size, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=population_size)
    raise SpecError(f"optuna search: sampler must be one of {', '.join(SAMPLERS)}; got {name!r}")


def _completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _record(trial: optuna.trial.FrozenTrial, default_cluster: str) -> TrialRecord:
    attrs = trial.user_attrs
    return TrialRecord(number=trial.number, layout=layout_from_params(trial.params),
                       valid=bool(attrs.get("valid")), fits=bool(attrs.get("fits")),
                       tokens_per_s=float(attrs.get("tokens_per_s", 0.0)),
                       cluster=str(trial.params.get(CLUSTER_AXIS, default_cluster)))


def _open_study(model: ModelSpec, training: TrainingSpec, space: StudySpace,
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


def _tell_batch(study: optuna.Study, batch: list[optuna.trial.Trial], router: Router,
                space: StudySpace) -> None:
    """Score a batch of asked trials together and tell the study every result."""
    told = 0
    try:
        pairs = [(space.cluster_of(t.params), layout_from_params(t.params)) for t in batch]
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
    space = study_space(cluster, gpu_counts)
    pop = population_size or int(min(100, max(16, n_trials // 25)))
    if pop < 2:
        raise SpecError(f"optuna search: population_size must be >= 2, got {pop}")
    sets = study_sets(model, training, space)
    backend = storage_mod.make_storage(storage, heartbeat_s=heartbeat_s)
    study = _open_study(model, training, space, sets, storage=storage, study_name=study_name,
                        sampler=_sampler(sampler, seed, pop), backend=backend)
    # each worker on the study samples its own stream (worker 0: the seed itself)
    worker = storage_mod.claim_worker_number(study, backend, storage) if storage else 0
    if worker:
        study.sampler = _sampler(sampler, storage_mod.worker_seed(seed, worker), pop)
    router = make_router(model, training, space, profile, options)
    completed = _completed(study)
    router.warm(completed, space.names[0])
    enqueued = 0
    if enqueue:
        enqueued = _enqueue_once(study, backend, storage, starting_params(
            model, training, space, sets, limit=enqueue_limit(n_trials, space),
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
    "SAMPLERS",
    "StudyOutcome",
    "TrialRecord",
    "make_storage",
    "run_study",
    "trial_budget_for",
]
