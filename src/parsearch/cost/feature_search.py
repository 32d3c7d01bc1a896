"""Features chosen with the layout: each layout priced under every feature set it can run.

Experts choose the MoE token dispatcher and the all-to-all overlaps together with the
layout (DeepSeek-V3 technical report §3.2; Megatron-Bridge's performance recipes set
``moe_token_dispatcher_type``, ``overlap_moe_expert_parallel_comm`` and
``moe_shared_expert_overlap`` per model and cluster).  A feature the user pins stays
as given; each one named in ``CostOptions.search_features`` is an axis: every layout is
priced under each combination Megatron accepts for it, and keeps the fastest that fits.

The combinations are few (at most seven), and a layout's features do not interact with
another layout's, so the choice is exact per layout: no sampling, no product of the
layout table with the feature grid beyond pricing each row once per combination.

Preconditions, as Megatron-LM ``arguments.py`` ``validate_args`` and Megatron-Core
``TransformerConfig.__post_init__`` enforce them:

* ``--overlap-moe-expert-parallel-comm``: expert parallelism (``ep > 1``), the ``alltoall``
  or ``flex`` dispatcher, no full recompute (``recompute_granularity != full``, no
  ``recompute_method``), and without a pipeline or with an interleaved one (``pp == 1``
  or a virtual pipeline); not with ``--moe-shared-expert-overlap``.
* ``--moe-shared-expert-overlap``: a model with shared experts, ``alltoall`` or ``flex``.
* ``flex`` (DeepEP / HybridEP kernels): Hopper or newer (DeepEP README, "Hopper GPUs";
  compute capability >= 9.0).

With an interleaved pipeline the all-to-all overlap also holds one more warm-up chunk of
activations (:func:`~parsearch.cost.memory.activations.chunk_in_flight`), so its memory is priced
too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import product

import numpy as np

from parsearch.cost.cost_model import CostModel
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.layout.rules import RECOMPUTE_CODES
from parsearch.model.specs import ModelSpec

#: Compute capability from which the flex dispatcher's kernels run (DeepEP: Hopper).
FLEX_MIN_CAPABILITY = 9.0


def with_schedule_memory(options: CostOptions) -> CostOptions:
    """``options`` with the memory model told whether the all-to-all overlap's merged
    schedule holds an extra micro-batch."""
    extra = 1 if options.moe_a2a_overlap else 0
    if options.memory.extra_in_flight == extra:
        return options
    return replace(options, memory=replace(options.memory, extra_in_flight=extra))


def feature_variants(model: ModelSpec, options: CostOptions,
                     compute_capability: float | None) -> tuple[CostOptions, ...]:
    """Every feature set to price: ``options`` first, then the searched combinations.

    Only the features in ``options.search_features`` vary; combinations Megatron refuses
    for every layout (the shared-expert overlap beside the all-to-all overlap, either
    overlap with ``allgather``, ``flex`` before Hopper) are left out.  Empty when nothing
    is searched or the model has no experts.
    """
    searched = set(options.search_features)
    if not searched or model.moe is None:
        return ()
    flex_ok = compute_capability is None or compute_capability >= FLEX_MIN_CAPABILITY
    dispatchers = (tuple(d for d in options.moe_dispatchers_available
                         if d != "flex" or flex_ok)
                   if "moe_dispatcher" in searched else (options.moe_dispatcher,))
    a2a = (False, True) if "moe_a2a_overlap" in searched else (options.moe_a2a_overlap,)
    shared_possible = model.moe.shared_expert_ffn_hidden_size > 0
    shared = ((False, True) if "moe_shared_expert_overlap" in searched and shared_possible
              else (options.moe_shared_expert_overlap,))
    out = [with_schedule_memory(options)]
    for dispatcher, overlap, shared_overlap in product(dispatchers, a2a, shared):
        if dispatcher == "allgather" and (overlap or shared_overlap):
            continue
        if overlap and shared_overlap:
            continue
        variant = with_schedule_memory(replace(
            options, moe_dispatcher=dispatcher, moe_a2a_overlap=overlap,
            moe_shared_expert_overlap=shared_overlap))
        if variant not in out:
            out.append(variant)
    return tuple(out)


def runnable(options: CostOptions, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Which layouts Megatron accepts ``options`` with (module docstring's preconditions)."""
    n = len(cols["tp"])
    ok = np.ones(n, dtype=bool)
    if options.moe_a2a_overlap:
        ok &= cols["ep"] > 1
        ok &= cols["recompute"] != RECOMPUTE_CODES["full"]
        ok &= (cols["pp"] == 1) | (cols["vpp"] > 1)
    return ok


def cheapest_unit_prices(cm: CostModel, cols: dict[str, np.ndarray], unit: str,
                         price: Callable[[CostModel], dict[str, np.ndarray]],
                         choice: np.ndarray | None
                         ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One MoE unit's per-micro-batch prices under the feature set each layout runs fastest.

    The searched features change only the MoE units' prices (dispatcher kernels and
    traffic, the overlaps; :mod:`parsearch.cost.communication`); every other term of the
    step is the same, and the step grows with each unit's time (a sum over stages of
    unit times, :mod:`parsearch.cost.stage_time`), so the fastest unit is the fastest
    step: the choice is exact without pricing whole steps per feature set.  ``price``
    prices the unit under a cost model; ``choice`` (from the first MoE unit) makes later
    MoE units (an MTP layer) follow the same feature set.  Returns the prices and the
    index into ``cm.variants`` of each row's set.
    """
    n = len(cols["tp"])
    priced = []
    for index, variant in enumerate(cm.variants):
        if choice is not None and not np.any(choice == index):
            priced.append(None)
            continue
        parts = price(replace(cm, options=variant, variants=()))
        priced.append({k: np.broadcast_to(np.asarray(v, dtype=np.float64), (n,))
                       for k, v in parts.items()})
    if choice is None:
        best = np.full(n, np.inf)
        choice = np.zeros(n, dtype=np.int64)
        for index, parts in enumerate(priced):
            assert parts is not None
            total = sum(parts.values())
            allowed = runnable(cm.variants[index], cols) | (index == 0)
            better = allowed & (total < best)
            choice[better] = index
            best = np.where(better, total, best)
    first = next(p for p in priced if p is not None)
    out = {k: np.zeros(n) for k in first}
    for index, parts in enumerate(priced):
        if parts is None:
            continue
        rows = choice == index
        for k in out:
            out[k][rows] = parts[k][rows]
    return out, choice


def score_fitting_variants(cm: CostModel, cols: dict[str, np.ndarray],
                           score: Callable[[CostModel, dict[str, np.ndarray]],
                                           dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Scores with each layout's fastest feature set among those whose memory fits.

    ``score(cm, cols)`` prices with the fastest feature set per layout (time only decides)
    and memory under ``cm.options``.  Layouts whose fastest set overlaps the all-to-all
    may hold one more warm-up chunk: they are priced again among the overlapping sets with that
    memory, and those that then do not fit, among the sets without the overlap.
    ``feature_variant`` indexes ``cm.variants``.
    """
    scores = score(cm, cols)
    with_overlap = tuple(v for v in cm.variants if v.moe_a2a_overlap)
    without = tuple(v for v in cm.variants if not v.moe_a2a_overlap)
    if not with_overlap or not without or cm.options.moe_a2a_overlap:
        return scores  # one memory class: the base options' memory is every set's
    chosen = np.asarray(scores["feature_variant"])
    overlap_rows = np.nonzero(np.isin(chosen, [cm.variants.index(v) for v in with_overlap]))[0]
    if not len(overlap_rows):
        return scores
    _merge(scores, overlap_rows, _sub_scores(cm, with_overlap, cols, overlap_rows, score))
    misfit = overlap_rows[~np.asarray(scores["fits"], dtype=bool)[overlap_rows]]
    if len(misfit):
        _merge(scores, misfit, _sub_scores(cm, without, cols, misfit, score))
    return scores


def _sub_scores(cm: CostModel, variants: tuple[CostOptions, ...], cols: dict[str, np.ndarray],
                rows: np.ndarray, score: Callable[[CostModel, dict[str, np.ndarray]],
                                                  dict[str, np.ndarray]]
                ) -> dict[str, np.ndarray]:
    """Scores of ``rows`` choosing among ``variants`` only (indices mapped to ``cm``'s)."""
    sub = replace(cm, options=variants[0], variants=variants)
    out = score(sub, {k: v[rows] for k, v in cols.items()})
    mapping = np.array([cm.variants.index(v) for v in variants], dtype=np.int64)
    out["feature_variant"] = mapping[np.asarray(out["feature_variant"])]
    return out


def _merge(scores: dict[str, np.ndarray], rows: np.ndarray,
           update: dict[str, np.ndarray]) -> None:
    for key, values in update.items():
        target = np.asarray(scores[key])
        if target.ndim == 0:
            continue
        target[rows] = np.asarray(values)
        scores[key] = target


__all__ = [
    "FLEX_MIN_CAPABILITY",
    "SEARCHABLE_FEATURES",
    "cheapest_unit_prices",
    "feature_variants",
    "runnable",
    "score_fitting_variants",
    "with_schedule_memory",
]
