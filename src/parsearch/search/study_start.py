"""Known-good layouts a study starts from, so its first trials are feasible.

Per GPU count: tensor and context parallel inside the NVLink domain,
pipeline parallel across nodes as far as memory needs, experts spread over
as many ranks as divide them, data parallel to fill
(:func:`starting_layouts`); spread round-robin over GPU counts and
clusters (:func:`starting_params`).  Nothing here imports optuna.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from parsearch.cost.analytic import CostOptions, usable_memory_bytes
from parsearch.cost.memory import memory_arrays
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.search.study_space import AXES, CLUSTER_AXIS, StudySpace, rule_violations
from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.hardware import load_gpu_profile


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


def starting_params(model: ModelSpec, training: TrainingSpec, space: StudySpace,
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


def enqueue_limit(n_trials: int, space: StudySpace) -> int:
    """A quarter of the budget per cluster, at most half of it in all."""
    per_cluster = max(1, n_trials // 4)
    return per_cluster if not space.multi else max(1, min(n_trials // 2,
                                                          per_cluster * len(space.clusters)))
