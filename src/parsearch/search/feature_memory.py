"""Memory of the layouts a bounded scan may keep, with the features chosen per layout.

:func:`~parsearch.search.exhaustive.scan_bounded` prices time first and memory only for the
layouts fast enough to enter the answer; this module prices that memory where features are
chosen per layout: each layout's fastest MoE / CUDA-graph feature set
(:mod:`parsearch.cost.feature_search`), and the memory-saving features
(:mod:`parsearch.cost.memory_features`): a layout whose pinned setting fits with its fastest
other features, and where no numerics-changing feature can save enough, is settled by a
memory-only check (:func:`quick_memory_choice`); the rest are priced with memory by the rule
that prices the answer (:func:`full_memory_choice`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from parsearch.cost.analytic import (
    CostModel,
    memory_scores,
    score_columns,
    usable_memory_bytes,
    wide_columns,
)
from parsearch.cost.ep_overlap import a2a_overlap_pinned
from parsearch.cost.feature_search import graph_level, level_may_fit, searches_graphs
from parsearch.cost.memory import memory_arrays
from parsearch.cost.memory_bounds import least_memory_models, most_offloaded
from parsearch.cost.memory_features import memory_settings, needs_full_choice, with_setting
from parsearch.cost.offload import offload_allowed


def peak_memory(cm: CostModel, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Peak bytes per GPU of each layout (``memory_arrays``' total)."""
    if not len(cols["tp"]):
        return np.zeros(0)
    cols = wide_columns(cols)
    mem = memory_arrays(cm.model, cm.training, cols["tp"], cols["cp"], cols["pp"], cols["ep"],
                        cols["etp"], cols["vpp"], cols["mbs"], cols["dp"], cols["edp"],
                        cols["recompute"], cols["sp"], cm.options.memory)
    return np.asarray(mem.total, dtype=np.float64).reshape(-1)


def quick_memory_choice(cm: CostModel, cols: dict[str, np.ndarray],
                         timed: dict[str, np.ndarray], variant: np.ndarray | None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """With memory features searched (:mod:`~parsearch.cost.memory_features`): ``timed``
    holds the time-only scores under the base setting (pinned numerics, cheapest recompute
    set).  Where that setting fits with the row's fastest feature set and no numerics
    feature can save :data:`NUMERICS_MIN_GAIN`, it is the choice (memory only); rows that
    fit under no setting stay out.  Returns memory, tokens/s and the positions still to be
    chosen by :func:`full_memory_choice`."""
    n = len(cols["tp"])
    if not n:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    base = with_setting(cm, memory_settings(cm)[0][0])
    total = variant_memory(base, cols, variant)
    tokens = np.array(timed["tokens_per_s"], dtype=np.float64, copy=True)
    hbm = usable_memory_bytes(cm.fabric.gpu, cm.options)
    full = np.nonzero(needs_full_choice(cm, timed, total <= hbm))[0]
    if len(full):  # those that fit under no setting (the least-memory one) stay out
        sub = {k: v[full] for k, v in cols.items()}
        least = np.min([peak_memory(m, sub) for m in least_memory_models(cm, offload=False)],
                       axis=0)
        offloaded = most_offloaded(cm)  # pp=1, recompute none: with the most layers offloaded
        if offloaded is not None:
            rows = np.nonzero((least > hbm) & offload_allowed(
                {k: v[full] for k, v in cols.items()}))[0]
            if len(rows):
                least[rows] = peak_memory(offloaded, {k: v[full[rows]] for k, v in cols.items()})
        total[full] = np.inf
        full = full[least <= hbm]
    return total, tokens, full


def full_memory_choice(cm: CostModel, cols: dict[str, np.ndarray]
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Memory and tokens/s of rows the base setting may not be the choice of, with each
    row's memory features chosen by the rule that prices the answer
    (:func:`~parsearch.cost.memory_features.score_memory_features`), so that a layout's
    number in the scan is the one the answer reports.  The caller passes only the rows
    whose upper bound (``tokens_per_s_bound``) can still enter the answer."""
    if not len(cols["tp"]):
        return np.zeros(0), np.zeros(0)
    scores = score_columns(cm, cols)
    tokens = np.asarray(scores["tokens_per_s"], dtype=np.float64)
    total = np.where(np.asarray(scores["fits"], dtype=bool),
                     np.asarray(scores["mem_total"], dtype=np.float64), np.inf)
    return total, tokens


def variant_memory(cm: CostModel, cols: dict[str, np.ndarray],
                    variant: np.ndarray | None) -> np.ndarray:
    """Peak bytes per GPU of each layout under its feature set ``variant`` (an index into
    ``cm.variants``; ``None``: ``cm.options``)."""
    if not cm.variants or variant is None:
        return peak_memory(cm, cols)
    total = np.zeros(len(variant))
    memory = [v.memory for v in cm.variants]
    for options in dict.fromkeys(memory):  # one memory model per distinct memory options
        rows = np.nonzero(np.isin(variant, [i for i, m in enumerate(memory) if m == options]))[0]
        if len(rows):
            owner = cm.variants[memory.index(options)]
            total[rows] = peak_memory(replace(cm, options=owner, variants=()),
                                       {k: v[rows] for k, v in cols.items()})
    return total


def memory_and_tokens(cm: CostModel, cols: dict[str, np.ndarray], tokens: np.ndarray,
                       variant: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Peak bytes per GPU and tokens/s of layouts whose time-only tokens/s is ``tokens``.

    Without feature sets to choose from, the memory model alone (the time is already
    known).  With them, ``variant`` is each layout's fastest set from the time-only pass;
    a set with the all-to-all overlap holds one more warm-up chunk when interleaved, so
    those layouts get that memory, and the ones it does not fit are priced again among the
    sets without the overlap (the fastest that fits; never faster than the time-only
    number).
    """
    if not cm.variants or variant is None:
        return peak_memory(cm, cols), tokens
    if not len(cols["tp"]):
        return np.zeros(0), np.zeros(0)
    if searches_graphs(cm):
        return graph_level_memory(cm, cols, tokens, np.asarray(variant))
    total = peak_memory(cm, cols)
    tokens = np.array(tokens, dtype=np.float64, copy=True)
    overlapping = [i for i, v in enumerate(cm.variants) if v.moe_a2a_overlap]
    plain = [i for i, v in enumerate(cm.variants) if not v.moe_a2a_overlap]
    without = tuple(cm.variants[i] for i in plain)
    if not overlapping or not without:
        return total, tokens  # one memory class: the base options' memory is every set's
    # the classes differ only when interleaved (the overlap's extra warm-up chunk): the
    # rows on a set of the class the base options did not price are priced again
    other = plain if cm.options.moe_a2a_overlap else overlapping
    moved = np.nonzero(np.isin(variant, other) & (cols["vpp"] > 1))[0]
    if len(moved):
        total[moved] = peak_memory(replace(cm, options=cm.variants[other[0]], variants=()),
                                   {k: v[moved] for k, v in cols.items()})
    rows = np.nonzero(np.isin(variant, overlapping) & (cols["vpp"] > 1))[0]
    if len(rows) and not a2a_overlap_pinned(cm.options):  # a pinned overlap stays on
        misfit = rows[total[rows] > usable_memory_bytes(cm.fabric.gpu, cm.options)]
        if len(misfit):
            sub = {k: v[misfit] for k, v in cols.items()}
            scores = score_columns(replace(cm, options=without[0], variants=without), sub)
            total[misfit] = np.asarray(scores["mem_total"], dtype=np.float64)
            tokens[misfit] = np.asarray(scores["tokens_per_s"], dtype=np.float64)
    return total, tokens


def graph_level_memory(cm: CostModel, cols: dict[str, np.ndarray], tokens: np.ndarray,
                        variant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`memory_and_tokens` when CUDA graphs are chosen per layout: each layout's
    memory under its fastest set (its graph level's static buffers included); those it
    does not fit are scored again, choosing among the sets that fit
    (:func:`~parsearch.cost.feature_search.score_graph_levels`)."""
    total = variant_memory(cm, cols, variant)
    tokens = np.array(tokens, dtype=np.float64, copy=True)
    hbm = usable_memory_bytes(cm.fabric.gpu, cm.options)
    misfit = np.nonzero(total > hbm)[0]
    if len(misfit):  # those that fit no set (the base set holds the least) stay out
        least = peak_memory(cm, {k: v[misfit] for k, v in cols.items()})
        total[misfit] = least
        misfit = misfit[least <= hbm]
    if len(misfit):
        # where no graph level fits even its least-memory set, only the eager sets can be
        # chosen: scored among those alone (the same choice, one level instead of all)
        sub = {k: v[misfit] for k, v in cols.items()}
        eager = no_graph_fits(cm, sub)
        off = tuple(v for v in cm.variants if not v.cuda_graphs)
        for rows, model in ((misfit[eager], replace(cm, options=off[0], variants=off)),
                            (misfit[~eager], cm)):
            if len(rows):
                scores = score_columns(model, {k: v[rows] for k, v in cols.items()})
                total[rows] = np.asarray(scores["mem_total"], dtype=np.float64)
                tokens[rows] = np.asarray(scores["tokens_per_s"], dtype=np.float64)
    return total, tokens


def no_graph_fits(cm: CostModel, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Which layouts no CUDA-graph level of ``cm.variants`` may fit (none of a level's
    memory classes fits: :func:`~parsearch.cost.feature_search.level_may_fit`)."""
    fits = np.zeros(len(cols["tp"]), dtype=bool)
    for level in dict.fromkeys(graph_level(v) for v in cm.variants if v.cuda_graphs):
        sets = tuple(v for v in cm.variants if graph_level(v) == level)
        fits |= level_may_fit(cm, sets, cols, memory_scores)
    return ~fits


__all__ = [
    "full_memory_choice",
    "graph_level_memory",
    "memory_and_tokens",
    "no_graph_fits",
    "peak_memory",
    "quick_memory_choice",
    "variant_memory",
]
