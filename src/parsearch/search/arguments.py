"""The arguments of a search, checked and resolved: model, cluster(s), GPU counts, query.

Models and clusters may be given as specs or as preset names / file paths;
bad values are :class:`~parsearch.errors.SpecError` naming the option.
:func:`gpu_counts_for` and :func:`gpu_counts_by_cluster` give the GPU
counts a front is computed on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import ClusterSpec, load_cluster
from parsearch.topology.hardware import load_gpu_profile

#: A cluster: a preset name, a cluster file path, or a :class:`ClusterSpec`.
ClusterLike = ClusterSpec | str


def as_model(model: ModelSpec | str) -> ModelSpec:
    """A model spec, or a preset name / model file path resolved to one."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        from parsearch.model.files import resolve_model

        return resolve_model(model)
    raise SpecError(f"model must be a ModelSpec or a preset name/path, got {type(model).__name__}")


def as_cluster(cluster: ClusterSpec | str) -> ClusterSpec:
    """A cluster spec, or a preset name / cluster file path loaded."""
    if isinstance(cluster, ClusterSpec):
        return cluster
    if isinstance(cluster, str):
        return load_cluster(cluster)
    raise SpecError(f"cluster must be a ClusterSpec or a preset name/path, "
                    f"got {type(cluster).__name__}")


def as_clusters(cluster: ClusterLike | Sequence[ClusterLike]) -> tuple[ClusterSpec, ...]:
    """One cluster or a non-empty sequence of distinct clusters, loaded."""
    if isinstance(cluster, ClusterSpec | str):
        return (as_cluster(cluster),)
    if not isinstance(cluster, Sequence):
        raise SpecError(f"cluster must be a ClusterSpec, a preset name/path or a sequence of "
                        f"them, got {type(cluster).__name__}")
    if not cluster:
        raise SpecError("cluster: give at least one cluster")
    specs = tuple(as_cluster(c) for c in cluster)
    names = [c.name for c in specs]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise SpecError(f"--cluster names {twice} twice; give each cluster once")
    return specs


def positive(name: str, value: object) -> int:
    """``value`` when it is a positive integer (not a bool); else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_size(cluster: ClusterSpec, num_gpus: int, option: str) -> None:
    """Refuse more GPUs than the cluster has (its ``max_gpus``), naming the ``option``."""
    if cluster.max_gpus is not None and num_gpus > cluster.max_gpus:
        raise SpecError(f"{option} {num_gpus} exceeds the {cluster.max_gpus} GPUs cluster "
                        f"{cluster.name} supports (max_gpus); use at most {cluster.max_gpus}")


def search_query(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec | str,
                 **extra: Any) -> dict[str, Any]:
    """The ``query`` part of a result: what was asked (``extra`` after model and cluster)."""
    name = cluster.name if isinstance(cluster, ClusterSpec) else cluster
    return {
        "model": model.name, "cluster": name, **extra,
        "global_batch": training.global_batch, "seq_len": training.seq_len,
        "precision": training.precision,
        "micro_batch_sizes": list(training.micro_batch_sizes),
        "recompute": list(training.recompute_modes),
        "pipeline_split": training.pipeline_split,
        "sequence_parallel": training.sequence_parallel, "max_vpp": training.max_vpp,
        **({"max_cp": training.max_cp} if training.max_cp is not None else {}),
        "distributed_optimizer": training.distributed_optimizer,
    }


@contextmanager
def progress_bar(enabled: bool, total: int, unit: str,
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


def gpu_counts_for(*, cluster: ClusterSpec | str, max_gpus: int, min_gpus: int | None = None,
                   gpu_step: int | None = None) -> tuple[int, ...]:
    """The GPU counts a front is computed on: ``min_gpus..max_gpus`` by ``gpu_step``.

    Defaults: whole nodes (``gpu_step`` = GPUs per node, ``min_gpus`` = one step).

    >>> gpu_counts_for(cluster="dgx-h100", max_gpus=32)
    (8, 16, 24, 32)
    """
    cluster = as_cluster(cluster)
    step = cluster.gpus_per_node if gpu_step is None else positive("gpu_step", gpu_step)
    low = step if min_gpus is None else positive("min_gpus", min_gpus)
    positive("max_gpus", max_gpus)
    if max_gpus < low:
        raise SpecError(f"--max-gpus {max_gpus} is below --min-gpus {low}; "
                        f"give --max-gpus >= {low}")
    check_size(cluster, max_gpus, "--max-gpus")
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
    specs = as_clusters(clusters)
    positive("max_gpus", max_gpus)
    out: dict[str, tuple[int, ...]] = {}
    for c in specs:
        step = c.gpus_per_node if gpu_step is None else positive("gpu_step", gpu_step)
        low = step if min_gpus is None else positive("min_gpus", min_gpus)
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


def default_profile(cluster: ClusterSpec) -> EfficiencyProfile:
    """The shipped efficiency profile covering the cluster's GPU."""
    from parsearch.cost.efficiency import efficiency_for_gpu

    return efficiency_for_gpu(load_gpu_profile(cluster.gpu).name)


def check_precision(training: TrainingSpec, cluster: ClusterSpec) -> None:
    """Refuse a precision the cluster's GPU has no peak for."""
    gpu = load_gpu_profile(cluster.gpu)
    if training.precision not in gpu.peak_flops:
        have = ", ".join(sorted(gpu.peak_flops))
        raise SpecError(f"precision {training.precision} is not supported by {gpu.name} "
                        f"(cluster {cluster.name}); it supports {have}")
