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

CUDA graphs (``cuda_graphs`` searched) are levels, most captured first and off last
(:func:`graph_levels`): the whole layer for dense models and for MoE with padded expert
inputs; ``attn`` + ``moe_router`` (+ ``moe_preprocess``), then ``attn`` alone, for dropless
MoE, whose expert part has data-dependent shapes no graph can hold (Megatron-LM
``docs/user-guide/features/cuda_graph.md``: "MoE expert dispatch involves dynamic shapes and
cannot be captured").  A graph only removes host issue time
(:func:`parsearch.cost.compute.unit_compute`), so every unit is at most as slow at a higher
level under the same MoE features, while its static buffers
(:mod:`parsearch.cost.memory.cuda_graph_memory`) grow with the level.  Each layout is priced
at every level it can run and keeps the fastest that fits (:func:`score_graph_levels`): the
step is compared, not assumed, because the stage's pipeline sends and DP reduction hide
behind the same host gaps the units' traffic does.  Preconditions
(Megatron-Core ``TransformerConfig.__post_init__`` at cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54):
per-layer graphs not with full recompute ("full recompute is only supported with full
iteration CUDA graph") nor CPU offloading; the ``transformer_engine`` implementation's
``moe_router`` graph not beside selective recompute of ``moe``; ``moe_preprocess`` not with the
``alltoall`` dispatcher and a capacity factor (host copies in the preprocessing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import product

import numpy as np

from parsearch.cost.cost_model import CostModel
from parsearch.cost.ep_overlap import (
    a2a_overlap_pinned,
    a2a_schedulable,
    stands_in_for_pinned_overlap,
)
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.model.offload_modules import graph_conflict
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec, TrainingSpec

#: Compute capability from which the flex dispatcher's kernels run (DeepEP: Hopper).
FLEX_MIN_CAPABILITY = 9.0
#: A graph setting: (graphs on, captured scope; empty = the whole layer).
GraphLevel = tuple[bool, tuple[str, ...]]
GRAPHS_OFF: GraphLevel = (False, ())


def with_schedule_memory(options: CostOptions) -> CostOptions:
    """``options`` with the memory model told whether the all-to-all overlap's merged
    schedule holds an extra micro-batch."""
    extra = 1 if options.moe_a2a_overlap else 0
    if options.memory.extra_in_flight == extra:
        return options
    return replace(options, memory=replace(options.memory, extra_in_flight=extra))


def graph_levels(model: ModelSpec, options: CostOptions, dispatcher: str) -> tuple[GraphLevel, ...]:
    """The CUDA-graph settings a searched ``cuda_graphs`` tries, most captured first, off last.

    Captured kernels and static buffers shrink down the list (module docstring); every
    level a layout can run is priced (:func:`score_graph_levels`).

    >>> from parsearch.model.presets import get_preset
    >>> opts = CostOptions(search_features=("cuda_graphs",))
    >>> graph_levels(get_preset("llama3-8b"), opts, "alltoall")
    ((True, ()), (False, ()))
    >>> graph_levels(get_preset("qwen3-30b-a3b"), opts, "flex")[:2]
    ((True, ('attn', 'moe_router', 'moe_preprocess')), (True, ('attn',)))
    """
    if model.moe is None or (options.moe_capacity_factor is not None
                             and options.moe_pad_to_capacity):
        return ((True, ()), GRAPHS_OFF)  # static shapes: the whole layer
    router: tuple[str, ...] = ("attn", "moe_router")
    if not (dispatcher == "alltoall" and options.moe_capacity_factor is not None):
        # TransformerConfig.__post_init__ (cd4afffa): "moe_preprocess cuda graph is not
        # supported when there are DtoH copies and synchronizations in the preprocess step"
        # (alltoall with a capacity factor)
        router += ("moe_preprocess",)
    return ((True, router), (True, ("attn",)), GRAPHS_OFF)


def graph_level(options: CostOptions) -> GraphLevel:
    """The graph setting of ``options``."""
    return (True, options.cuda_graph_scope) if options.cuda_graphs else GRAPHS_OFF


def with_graph_level(options: CostOptions, level: GraphLevel) -> CostOptions:
    """``options`` with CUDA graphs set to ``level`` (per-layer Transformer Engine graphs,
    the implementation the launch settings name)."""
    on, scope = level
    impl = "transformer_engine" if on else options.cuda_graph_impl
    if (options.cuda_graphs, options.cuda_graph_scope, options.cuda_graph_impl) == (on, scope,
                                                                                      impl):
        return options
    return replace(options, cuda_graphs=on, cuda_graph_scope=scope, cuda_graph_impl=impl)


def feature_variants(model: ModelSpec, options: CostOptions,
                     compute_capability: float | None) -> tuple[CostOptions, ...]:
    """Every feature set to price: ``options`` first, then the searched combinations.

    Only the features in ``options.search_features`` vary; combinations Megatron refuses
    for every layout (the shared-expert overlap beside the all-to-all overlap, either
    overlap with ``allgather``, ``flex`` before Hopper) are left out.  Each MoE feature set
    comes at every CUDA-graph level when graphs are searched (:func:`graph_levels`).
    Empty when nothing is searched, or only MoE features for a model without experts.
    """
    searched = set(options.search_features)
    moe_sets = _moe_feature_sets(model, options, compute_capability, searched)
    if "cuda_graphs" not in searched:
        return moe_sets
    out = [with_schedule_memory(options)]
    for base in moe_sets or (with_schedule_memory(options),):
        for level in graph_levels(model, options, base.moe_dispatcher):
            variant = with_graph_level(base, level)
            if variant not in out:
                out.append(variant)
    return tuple(out)


def _moe_feature_sets(model: ModelSpec, options: CostOptions, compute_capability: float | None,
                      searched: set[str]) -> tuple[CostOptions, ...]:
    """The MoE feature combinations (``options`` first); empty without experts or without a
    searched MoE feature."""
    if model.moe is None or not searched - {"cuda_graphs"}:
        return ()
    flex_ok = compute_capability is None or compute_capability >= FLEX_MIN_CAPABILITY
    dispatchers = (tuple(d for d in options.moe_dispatchers_available
                         if d != "flex" or flex_ok)
                   if "moe_dispatcher" in searched else (options.moe_dispatcher,))
    a2a = (False, True) if "moe_a2a_overlap" in searched else (options.moe_a2a_overlap,)
    shared_possible = model.moe.shared_expert_ffn_hidden_size > 0
    shared = ((False, True) if "moe_shared_expert_overlap" in searched and shared_possible
              else (options.moe_shared_expert_overlap,))
    combos = list(product(dispatchers, a2a, shared))
    if a2a_overlap_pinned(options):
        # the pinned overlap's stand-ins: the same searched features with the overlap off,
        # for the layouts Megatron cannot run it on (stands_in_for_pinned_overlap)
        combos += product(dispatchers, (False,), (*shared, False))
    out = [with_schedule_memory(options)]
    for dispatcher, overlap, shared_overlap in combos:
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


def runnable(options: CostOptions, cols: dict[str, np.ndarray],
             training: TrainingSpec | None = None) -> np.ndarray:
    """Which layouts Megatron accepts ``options`` with (module docstring's preconditions;
    without ``training``, the CUDA-graph ones that depend on the layout only)."""
    ok = graphs_runnable(options, training, cols)
    if (options.moe_shared_expert_overlap and training is not None
            and "shared_experts" in training.recompute_modules):
        # Megatron-Core TransformerConfig.__post_init__ (d98e8a64): "shared_experts recompute
        # cannot work with --moe-shared-expert-overlap" (selective granularity only)
        ok &= cols["recompute"] != RECOMPUTE_CODES["selective"]
    if options.moe_a2a_overlap:
        ok &= a2a_schedulable(cols, options.dualpipe)
    return ok


def graphs_runnable(options: CostOptions, training: TrainingSpec | None,
                    cols: dict[str, np.ndarray]) -> np.ndarray:
    """Which layouts Megatron accepts ``options``' CUDA graphs with (module docstring;
    Megatron-Core ``TransformerConfig.__post_init__`` at
    cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54)."""
    n = len(cols["tp"])
    if not options.cuda_graphs or options.cuda_graph_impl == "full_iteration":
        return np.ones(n, dtype=bool)
    if training is not None and training.activation_offload_layers:
        return np.zeros(n, dtype=bool)  # "CUDA graphs not supported with CPU offloading."
    if training is not None and graph_conflict(training.offload_modules, options.cuda_graph_impl,
                                               options.cuda_graph_scope) is not None:
        return np.zeros(n, dtype=bool)  # beside fine-grained offloading (offload_modules)
    code = np.asarray(cols["recompute"])
    # "full recompute is only supported with full iteration CUDA graph."
    ok = code != RECOMPUTE_CODES["full"]
    if (training is not None and options.cuda_graph_impl == "transformer_engine"
            and "moe" in training.recompute_modules
            and "moe_router" in options.cuda_graph_scope):
        # "moe recompute is not supported with moe_router CUDA graph with:
        # --cuda-graph-impl transformer_engine."
        ok &= code != RECOMPUTE_CODES["selective"]
    return ok


def graph_rank(options: CostOptions) -> int:
    """Order of ``options``' graph level among :func:`graph_levels`' (0: most captured)."""
    on, scope = graph_level(options)
    return 99 if not on else 0 if not scope else 10 - len(scope)


def searches_graphs(cm: CostModel) -> bool:
    """Whether ``cm`` chooses CUDA graphs per layout (several graph levels among its sets)."""
    return len({graph_level(v) for v in cm.variants}) > 1


def score_graph_levels(cm: CostModel, cols: dict[str, np.ndarray], with_memory: bool,
                       score: Callable[..., dict[str, np.ndarray]],
                       memory: Callable[[CostModel, dict[str, np.ndarray]],
                                        dict[str, np.ndarray]] | None = None
                       ) -> dict[str, np.ndarray]:
    """Scores with each layout's CUDA-graph level chosen (module docstring), and within it
    its MoE features as :func:`score_fitting_variants` chooses them.

    ``score(cm, cols, with_memory=...)`` scores under one level (``cm.variants``: that
    level's sets, or none for one).  Every level a layout can run is priced and the
    fastest kept (time only), or the fastest that fits (with memory; none fitting: graphs
    off).  A graph only removes host time, but the time model lets some traffic hide in
    the host's gaps at more than one place (a unit's TP and CP traffic, the stage's
    pipeline sends and DP reduction), so a level is compared, never assumed faster.
    ``feature_variant`` indexes ``cm.variants``.  With memory, ``memory(cm, cols)`` (the
    memory model alone) first drops from a level the layouts none of its memory classes
    fits (:func:`level_may_fit`): they could not take it, so they are not priced there.
    """
    n = len(cols["tp"])
    levels = sorted({graph_level(v) for v in cm.variants},
                    key=lambda lv: graph_rank(with_graph_level(cm.options, lv)))
    per_level = [tuple(v for v in cm.variants if graph_level(v) == lv) for lv in levels]
    out: dict[str, np.ndarray] = {}
    best = np.full(n, np.inf)
    # graphs off first (every layout runs it: its scores are the table the levels with
    # graphs then overwrite where they are faster and fit), then the rest, most captured first
    for sets in (per_level[-1], *per_level[:-1]):
        off = not sets[0].cuda_graphs
        rows = (np.arange(n) if off
                else np.nonzero(graphs_runnable(sets[0], cm.training, cols))[0])
        if not off and with_memory and memory is not None and len(rows):
            rows = rows[level_may_fit(cm, sets, {k: v[rows] for k, v in cols.items()},
                                       memory)]
        if not len(rows):
            continue
        sub = replace(cm, options=sets[0], variants=sets if len(sets) > 1 else ())
        part = score(sub, cols if off else {k: v[rows] for k, v in cols.items()},
                     with_memory=with_memory)
        mapping = np.array([cm.variants.index(v) for v in sets], dtype=np.int64)
        part["feature_variant"] = mapping[np.asarray(part.get("feature_variant",
                                                              np.zeros(len(rows), np.int64)))]
        step = np.asarray(part["step_time_s"], dtype=np.float64)
        fits = np.asarray(part["fits"], dtype=bool)
        if off:  # a layout nothing fits keeps graphs off
            out = dict(part)
            if not with_memory:  # memory is NaN throughout: one array for every mem_ key
                for key in [k for k in out if k.startswith("mem_")]:
                    out[key] = out["mem_total"]
            best = np.where(fits, step, np.inf)
            del part
            continue
        take = fits & (step < best[rows])
        where = rows[take]
        best[where] = step[take]
        del step, fits
        for key in list(part):  # key by key, freeing as it goes (the search's peak memory)
            values = part.pop(key)
            if np.ndim(values):
                out[key][where] = np.asarray(values)[take]
    return out


def level_may_fit(cm: CostModel, sets: tuple[CostOptions, ...], cols: dict[str, np.ndarray],
                   memory: Callable[[CostModel, dict[str, np.ndarray]], dict[str, np.ndarray]]
                   ) -> np.ndarray:
    """Which layouts may fit at one graph level: :func:`score_fitting_variants` judges a
    layout's memory under the level's first set, the first set with the all-to-all overlap
    or the first without it, so a layout none of those fits cannot take the level."""
    judged = [sets[0]] + [next((v for v in sets if v.moe_a2a_overlap == on), sets[0])
                          for on in (True, False)]
    fits = np.zeros(len(cols["tp"]), dtype=bool)
    for options in dict.fromkeys(o.memory for o in judged):
        owner = next(o for o in judged if o.memory == options)
        fits |= np.asarray(memory(replace(cm, options=owner, variants=()), cols)["fits"],
                           dtype=bool)
    return fits


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
        ok = [runnable(v, cols, cm.training) for v in cm.variants]
        stand_in = stands_in_for_pinned_overlap(cm.variants)
        pinned_runs = np.zeros(n, dtype=bool)
        for index in np.nonzero(~stand_in)[0]:
            pinned_runs |= ok[index]
        for index, parts in enumerate(priced):
            assert parts is not None
            total = sum(parts.values())
            # only sets Megatron runs with the layout compete, the base set (the user's or
            # the recipe's) included; a set standing in for a pinned all-to-all overlap
            # only where no set with it runs; a row that no set can run keeps the base set
            # (index 0)
            allowed = ok[index] & ~pinned_runs if stand_in[index] else ok[index]
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
                                           dict[str, np.ndarray]],
                           memory: Callable[[CostModel, dict[str, np.ndarray]],
                                            dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Scores with each layout's fastest feature set among those whose memory fits.

    ``score(cm, cols)`` prices with the fastest feature set per layout (time only decides)
    and memory under ``cm.options``; ``memory(cm, cols)`` prices the memory alone.  Layouts
    whose fastest set overlaps the all-to-all may hold one more warm-up chunk: their memory
    is priced again under the overlapping sets' (their time stays: the fastest of all sets
    is the fastest of the overlapping ones), and those that then do not fit are priced
    among the sets without the overlap.  ``feature_variant`` indexes ``cm.variants``.
    """
    scores = score(cm, cols)
    with_overlap = tuple(v for v in cm.variants if v.moe_a2a_overlap)
    without = tuple(v for v in cm.variants if not v.moe_a2a_overlap)
    if not with_overlap or not without:
        return scores  # one memory class: the base options' memory is every set's
    chosen = np.asarray(scores["feature_variant"])
    # each row gets the memory of the class its set belongs to: the base options priced
    # one class, the rows on a set of the other class are priced again
    other = without if cm.options.moe_a2a_overlap else with_overlap
    moved = np.nonzero(np.isin(chosen, [cm.variants.index(v) for v in other]))[0]
    if len(moved):
        _merge(scores, moved, memory(replace(cm, options=other[0], variants=()),
                                     {k: v[moved] for k, v in cols.items()}))
    overlap_rows = np.nonzero(np.isin(chosen, [cm.variants.index(v) for v in with_overlap]))[0]
    if not len(overlap_rows):
        return scores
    misfit = overlap_rows[~np.asarray(scores["fits"], dtype=bool)[overlap_rows]]
    # a pinned overlap stays on where Megatron runs it, fitting or not
    if len(misfit) and not a2a_overlap_pinned(cm.options):
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
    "GRAPHS_OFF",
    "SEARCHABLE_FEATURES",
    "cheapest_unit_prices",
    "feature_variants",
    "graph_level",
    "graph_levels",
    "graphs_runnable",
    "level_may_fit",
    "runnable",
    "score_fitting_variants",
    "score_graph_levels",
    "searches_graphs",
    "with_graph_level",
    "with_schedule_memory",
]
