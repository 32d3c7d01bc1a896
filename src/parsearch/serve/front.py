"""The curve serving teams read: throughput per GPU against tokens/s per user, and the best
layout under latency targets.

>>> from parsearch.serve.spec import ServingLayout
>>> def est(per_gpu, per_user):
...     return ServingEstimate(ServingLayout(1, 1, 1, 1, 1), 1, per_gpu, per_user, 1.0, 1.0,
...                            1.0, 1.0, True, 1, "memory")
>>> points = [est(100.0, 10.0), est(50.0, 50.0), est(40.0, 40.0), est(10.0, 100.0)]
>>> [(p.tokens_per_s_per_gpu, p.tokens_per_s_per_user) for p in pareto_points(points)]
[(10.0, 100.0), (50.0, 50.0), (100.0, 10.0)]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from parsearch.search.pareto import pareto_mask
from parsearch.serve.evaluate import ServingEstimate


def pareto_points(estimates: Sequence[ServingEstimate]) -> list[ServingEstimate]:
    """Fitting estimates that serve (positive throughput) not beaten on both tokens/s per
    GPU and tokens/s per user, sorted by tokens/s per GPU (low to high: from the
    interactive end to the throughput end)."""
    fitting = [e for e in estimates if e.fits and e.serves]
    if not fitting:
        return []
    values = np.array([[e.tokens_per_s_per_gpu, e.tokens_per_s_per_user] for e in fitting])
    mask = pareto_mask(values, minimize=(False, False))
    front = [e for e, keep in zip(fitting, mask, strict=True) if keep]
    return sorted(front, key=lambda e: (e.tokens_per_s_per_gpu, -e.tokens_per_s_per_user))


def rank_estimates(estimates: Sequence[ServingEstimate], *, by_gpus: bool) -> list[ServingEstimate]:
    """Fitting estimates that serve and meet the latency targets, best first.

    ``by_gpus`` (a request rate was given): fewest GPUs that carry it first, then the
    highest tokens/s per GPU; otherwise the highest throughput of the whole group on the
    budget (GPUs a layout leaves idle earn nothing), then tokens/s per user.  Ties keep
    the smaller instance (fewer GPUs per replica) first.
    """
    ok = [e for e in estimates if e.fits and e.serves and e.meets_targets]

    def key(e: ServingEstimate) -> tuple[float, ...]:
        if by_gpus:
            lead = (float(e.gpus), -round(e.tokens_per_s_per_gpu, 6))
        else:
            lead = (-round(e.tokens_per_s, 6),)
        return (*lead, -round(e.tokens_per_s_per_user, 6), float(e.layout.gpus_per_replica))

    return sorted(ok, key=key)


def instance_shape(e: ServingEstimate) -> tuple[int, ...]:
    """What a user launches, without the batch: the instance's (tp, attention DP, pp, ep),
    and its prefill instance's too when prefill and decode are disaggregated."""
    lay = e.layout
    shape = (lay.tp, lay.attention_dp, lay.pp, lay.ep)
    pre = e.prefill_layout
    return shape if pre is None else (*shape, pre.tp, pre.attention_dp, pre.pp, pre.ep)


def best_per_shape(ranked: Sequence[ServingEstimate]) -> list[ServingEstimate]:
    """The first (best-ranked) estimate of each instance shape, in ranked order: the batch
    is a runtime setting of a launched layout, so its variants are one candidate to
    profile, as ``parsearch search --diverse`` keeps one layout per parallel shape."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for e in ranked:
        shape = instance_shape(e)
        if shape not in seen:
            seen.add(shape)
            out.append(e)
    return out


def best_under_latency(estimates: Sequence[ServingEstimate], *,
                       by_gpus: bool = False) -> ServingEstimate | None:
    """The top-ranked estimate meeting the targets, or None."""
    ranked = rank_estimates(estimates, by_gpus=by_gpus)
    return ranked[0] if ranked else None
