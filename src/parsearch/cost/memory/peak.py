"""Peak-stage memory of many layouts at once: the vectorised front of :mod:`parsearch.cost.memory`.

A layout's memory is that of its most loaded pipeline stage.  The stages that
can hold the peak (:func:`peak_candidates`) depend on the layout's pipeline
split ``(pp, vpp)``; this module evaluates every layout's candidates without a
Python loop over splits or stages:

* model state (:func:`~parsearch.cost.memory.states.stage_params`,
  :func:`~parsearch.cost.memory.states.stage_model_state`) depends on a
  stage's layer counts and on ``pp, tp, ep, etp, dp, cp, edp``: it is
  evaluated once per distinct pair of the two and looked up;
* activations are a sum of terms (:mod:`parsearch.cost.memory.activation_terms`):
  per-term bytes (once per distinct degree row) times copies held (once per
  candidate stage and distinct micro-batch count);
* layouts are ordered by their split's number of candidates, so the ``k``-th
  candidate of all layouts that have one is a single slice: the only loop is
  over ``k`` (at most a handful).

The arithmetic is :func:`~parsearch.cost.memory.stage_memory_core`'s, term by
term in the same order, so the numbers are those of the scalar front
(:func:`~parsearch.cost.memory.estimate_memory`); ties go to the lower rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from parsearch.cost.memory.activation_terms import HELD_TERMS, LAYER_KINDS, stage_terms, term_bytes
from parsearch.cost.memory.activations import ActDegrees, chunk_in_flight, num_microbatches
from parsearch.cost.memory.options import MemoryOptions
from parsearch.cost.memory.rows import RowOrder, Tables, Term, carve, score_rows
from parsearch.cost.memory.states import StageCounts, stage_model_state, stage_params
from parsearch.cost.stages import StageContent, effective_split, stage_contents
from parsearch.model.specs import ModelSpec, TrainingSpec

#: Up to this many representative rows, model state is evaluated per row, not grouped.
SMALL_GROUP = 256

#: The per-GPU quantities of the peak stage, in ``peak_memory``'s result.
PEAK_FIELDS = ("weights", "gradients", "optimizer", "activations", "other", "total",
               "offloaded_bytes")


@lru_cache(maxsize=4096)
def peak_candidates(model: ModelSpec, pp: int, vpp: int,
                    split: str) -> tuple[StageContent, ...]:
    """The stages that can hold the peak: each content's first rank (see
    :func:`_dominance_key`: a later rank with the same content holds at most as much)."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for content in stage_contents(model, pp, vpp, split):
        key = _dominance_key(model, content)
        if key not in seen:
            seen.add(key)
            out.append(content)
    return tuple(out)


def _dominance_key(model: ModelSpec, content: StageContent) -> tuple[object, ...]:
    """What a stage's memory depends on besides its rank.

    Two ranks with the same key hold the same model state and the same bytes per
    micro-batch in each chunk; the micro-batches in flight per chunk never grow with
    the rank (:func:`~parsearch.cost.memory.activations.chunk_in_flight`: ``min(m, p - r)``,
    and the interleaved warm-up window shrinks with ``r``), so the lower rank's total
    is at least the higher one's and wins the tie: the higher rank can never be the
    peak and need not be evaluated.
    """
    return (tuple(tuple(model.is_moe_layer(i) for i in chunk)
                  for chunk in content.chunk_layer_indices),
            content.num_dense_layers, content.num_moe_layers, content.has_embedding,
            content.has_output, content.num_mtp_layers, content.mtp_is_moe)


def _state_key(content: StageContent) -> tuple[int, ...]:
    """The :class:`StageCounts` fields of ``content``, in that order."""
    return (content.pp, content.num_dense_layers, content.num_moe_layers,
            content.num_mtp_layers, int(content.mtp_is_moe), int(content.has_embedding),
            int(content.has_output))


@dataclass(frozen=True, eq=False)  # hashed by identity (memoised per list of splits)
class _Candidates:
    """The candidate stages of a list of splits, as flat arrays (``C`` stages in all).

    Splits are reordered by falling number of candidates (``split_order``); the
    candidates of split ``i`` (in that order) are ``first[i] .. first[i] + count[i]``.
    ``entry_*``: one entry per model chunk of each candidate (``E`` in all; those of
    candidate ``c`` start at ``entry_start[c]``) with its held-term counts.
    """

    split_order: np.ndarray
    first: np.ndarray
    count: np.ndarray
    rank: np.ndarray  # (C,)
    state_keys: np.ndarray  # (K, 7): the distinct _state_key, sorted (by pp first)
    key_pps: np.ndarray  # the distinct pp among them, and where each one's keys start
    key_start: np.ndarray
    key_offset: np.ndarray  # (C,): the candidate's key, counted from its pp's first
    entry_start: np.ndarray  # (C,)
    entry_rank: np.ndarray  # (E,) ... the chunk's rank, pp, vpp and chunk index
    entry_pp: np.ndarray
    entry_vpp: np.ndarray
    entry_chunk: np.ndarray
    entry_held: np.ndarray  # (E, len(HELD_TERMS))
    offloaded: np.ndarray  # (C, LAYER_KINDS)
    output: np.ndarray  # (C, 2): output_norm, logits heads
    held_present: np.ndarray  # (len(HELD_TERMS), C): the candidate holds the term


@lru_cache(maxsize=64)
def _held_copies(cands: _Candidates, m_values: tuple[float, ...],
                 extra: int = 0) -> tuple[np.ndarray | None, ...]:
    """Per held term: copies each candidate holds with each micro-batch count, flattened
    ``m * C + c`` (``None`` where no candidate holds the term; memoised); ``extra``: the
    schedule's additional warm-up micro-batches (:func:`chunk_in_flight`)."""
    in_flight = chunk_in_flight(cands.entry_rank, cands.entry_pp, cands.entry_vpp,
                                cands.entry_chunk, np.asarray(m_values)[:, None], extra)
    return tuple(
        np.add.reduceat(in_flight * cands.entry_held[:, j], cands.entry_start,
                        axis=1).reshape(-1) if cands.held_present[j].any() else None
        for j in range(len(HELD_TERMS)))


@lru_cache(maxsize=64)
def _candidates(model: ModelSpec, splits: tuple[tuple[int, int, str], ...],
                term_options: tuple[int | None, int, bool, bool]) -> _Candidates:
    """:class:`_Candidates` of ``(pp, vpp, split)`` splits (memoised per list)."""
    per_split = [peak_candidates(model, pp, vpp, split) for pp, vpp, split in splits]
    assert per_split, "peak_memory returns before scoring no rows"
    order = sorted(range(len(splits)), key=lambda i: -len(per_split[i]))  # stable
    stages = [c for i in order for c in per_split[i]]
    count = np.array([len(per_split[i]) for i in order], dtype=np.int64)
    terms = [stage_terms(model, c, *term_options) for c in stages]
    chunks = [len(t.held) for t in terms]
    entry_start = np.concatenate(([0], np.cumsum(chunks)[:-1])).astype(np.int64)

    def per_entry(values: list[int]) -> np.ndarray:
        return np.repeat(np.asarray(values, dtype=np.int64), chunks)

    keys, key_of_cand = np.unique(np.array([_state_key(c) for c in stages], dtype=np.int64),
                                  axis=0, return_inverse=True)
    key_pps, key_start = np.unique(keys[:, 0], return_index=True)
    key_offset = (np.arange(len(keys)) - key_start[np.searchsorted(key_pps, keys[:, 0])])

    entry_held = np.array([row for t in terms for row in t.held], dtype=np.float64)
    return _Candidates(
        split_order=np.asarray(order, dtype=np.int64),
        first=np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64),
        count=count,
        rank=np.array([c.rank for c in stages], dtype=np.int64),
        state_keys=keys,
        key_pps=key_pps,
        key_start=key_start.astype(np.int64),
        key_offset=key_offset[key_of_cand.reshape(-1)],
        entry_start=entry_start,
        entry_rank=per_entry([c.rank for c in stages]),
        entry_pp=per_entry([c.pp for c in stages]),
        entry_vpp=per_entry([c.vpp for c in stages]),
        entry_chunk=np.concatenate([np.arange(n, dtype=np.int64) for n in chunks]),
        entry_held=entry_held,
        offloaded=np.array([t.offloaded for t in terms], dtype=np.float64),
        output=np.array([(t.output_norm, t.logits) for t in terms], dtype=np.float64),
        held_present=np.add.reduceat(entry_held, entry_start, axis=0).T > 0,
    )


def _dense_rank(values: np.ndarray) -> tuple[int, np.ndarray]:
    """``(number of distinct values, each value's rank among them)``."""
    values = np.asarray(values)
    if values.dtype.kind in "iub" and values.size:
        ints = values.astype(np.int64)
        low, high = int(ints.min()), int(ints.max())
        if high - low <= 4 * values.size + 4096:
            present = np.zeros(high - low + 1, dtype=bool)
            present[ints - low] = True
            rank = np.cumsum(present) - 1
            return int(rank[-1]) + 1, rank[ints - low]
    distinct, inverse = np.unique(values, return_inverse=True)
    return distinct.size, inverse.reshape(-1).astype(np.int64)


def _group(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(a representative row of each group, each row's group)`` of rows equal in
    every column."""
    n = np.asarray(columns[0]).size
    size, code = 1, np.zeros(n, dtype=np.int64)
    for column in columns:
        radix, rank = _dense_rank(column)
        code = code * radix + rank
        size *= radix
        if size > 1 << 31:  # keep the code small: renumber what is present
            size, code = _dense_rank(code)
    size, position = _dense_rank(code)
    representative = np.zeros(size, dtype=np.int64)
    representative[position] = np.arange(n, dtype=np.int64)
    return representative, position


@dataclass(frozen=True)
class RepDegrees:
    """Degrees of representative layouts (one per group of rows equal in all but vpp)."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    mbs: np.ndarray
    dp: np.ndarray
    edp: np.ndarray
    code: np.ndarray
    sp: np.ndarray


def _state_table(model: ModelSpec, training: TrainingSpec, options: MemoryOptions,
                 deg: RepDegrees, cands: _Candidates) -> tuple[dict[str, np.ndarray],
                                                               np.ndarray, np.ndarray]:
    """Model state of every (distinct stage counts, distinct state degrees) of one ``pp``.

    Returns the table (``weights``, ``gradients``, ``optimizer``, ``sum``: their sum
    in :class:`~parsearch.cost.memory.MemoryBreakdown` order), each representative's
    base position in it, and each candidate's offset from that base.
    """
    if deg.pp.size > SMALL_GROUP:
        reps, s_of_rep = _group(deg.pp, deg.tp, deg.ep, deg.etp, deg.dp, deg.cp, deg.edp)
    else:  # few rows: grouping them costs more than it saves
        reps = s_of_rep = np.arange(deg.pp.size)
    # Each state representative gets one entry per distinct stage counts of its pp.
    pp_of_s = np.searchsorted(cands.key_pps, deg.pp[reps])
    per_pp = np.diff(np.append(cands.key_start, len(cands.state_keys)))
    width = per_pp[pp_of_s]
    base = np.concatenate(([0], np.cumsum(width)[:-1])).astype(np.int64)
    s_of_entry = np.repeat(np.arange(len(reps)), width)
    key_of_entry = (cands.key_start[pp_of_s] - base)[s_of_entry] + np.arange(s_of_entry.size)
    keys = cands.state_keys
    k = keys[key_of_entry]
    counts = StageCounts(pp=k[:, 0], num_dense_layers=k[:, 1], num_moe_layers=k[:, 2],
                         num_mtp_layers=k[:, 3], mtp_is_moe=k[:, 4].astype(bool),
                         has_embedding=k[:, 5].astype(bool), has_output=k[:, 6].astype(bool))
    rows = reps[s_of_entry]

    def at(values: np.ndarray) -> np.ndarray:
        return values[rows].astype(np.float64)

    params = stage_params(model, counts, tp=at(deg.tp), ep=at(deg.ep), etp=at(deg.etp))
    state = stage_model_state(training, params, options, dp=at(deg.dp), cp=at(deg.cp),
                              edp=at(deg.edp))
    shape = rows.shape
    table = {name: np.broadcast_to(np.asarray(getattr(state, name), dtype=np.float64), shape)
             for name in ("weights", "gradients", "optimizer")}
    table["sum"] = table["weights"] + table["gradients"] + table["optimizer"]
    return table, base[s_of_rep], cands.key_offset


def peak_memory(model: ModelSpec, training: TrainingSpec, options: MemoryOptions,
                deg: RepDegrees, row_rep: np.ndarray | None,
                splits: list[tuple[int, int, np.ndarray]]) -> dict[str, np.ndarray]:
    """The peak stage's memory of every row: :data:`PEAK_FIELDS` and ``peak_stage``.

    ``deg``: the degrees of representative rows; ``row_rep``: each row's
    representative (``None``: every row is its own), rows with one representative
    being equal in every degree but ``vpp``; ``splits``: ``(pp, vpp, rows)`` of each
    distinct split (:func:`~parsearch.cost.stages.rows_by_split`).
    """
    n = sum(idx.size for _, _, idx in splits)
    names = (*PEAK_FIELDS, "peak_stage")
    if n == 0:
        return {name: np.zeros(0, dtype=np.int64 if name == "peak_stage" else np.float64)
                for name in names}
    term_options = (training.recompute_num_layers, training.activation_offload_layers,
                    options.activation_model == "korthikanti", options.fp32_logits)
    cands = _candidates(model, tuple((pp, vpp, effective_split(model, training, pp, vpp))
                                     for pp, vpp, _ in splits), term_options)
    sizes = [splits[i][2].size for i in cands.split_order]
    rows = RowOrder(order=np.concatenate([splits[i][2] for i in cands.split_order]),
                    row_start=np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
                    first=cands.first, count=cands.count)

    # Per representative: bytes of each activation term, micro-batch count, state base.
    tp, mbs = deg.tp.astype(np.float64), deg.mbs.astype(np.float64)
    act_deg = ActDegrees(tp=tp, cp=deg.cp.astype(np.float64), ep=deg.ep.astype(np.float64),
                         etp=deg.etp.astype(np.float64), mbs=mbs,
                         sp_div=np.where(deg.sp.astype(bool), tp, 1.0))
    arrays = term_bytes(model, training, act_deg, deg.code, options)
    m = num_microbatches(training.global_batch, mbs, deg.dp.astype(np.float64))
    m_count, m_of_rep = _dense_rank(m.astype(np.int64))
    m_values = np.zeros(m_count)
    m_values[m_of_rep] = m
    state, base_of_rep, key_offset = _state_table(model, training, options, deg, cands)

    def per_rep(values: object) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float64),
                                                    tp.shape))

    tables = Tables(
        held=[Term(copies, per_rep(per_copy), cands.held_present[j])
              for j, (copies, per_copy) in enumerate(zip(_held_copies(cands, tuple(m_values),
                                                                      options.extra_in_flight),
                                                         arrays.held, strict=True))
              if copies is not None and per_copy is not None],
        offload=[Term(cands.offloaded[:, k], per_rep(arrays.moved[k]), cands.offloaded[:, k] > 0)
                 for k in range(LAYER_KINDS) if cands.offloaded[:, k].any()],
        output=[Term(np.tile(cands.output[:, i], m_count), per_rep(values),
                     cands.output[:, i] > 0)
                for i, values in enumerate((arrays.output_norm, arrays.logits))
                if cands.output[:, i].any()]
        # fine-grained offloading: one layer's module inputs stay on every stage's GPU
        # (activation_terms.TermBytes.module_margin)
        + ([Term(np.ones(m_count * cands.rank.size), per_rep(arrays.module_margin),
                 np.ones(cands.rank.size, dtype=bool))] if training.offload_modules else []),
        state=state, base_of_rep=base_of_rep, key_offset=key_offset, m_of_rep=m_of_rep,
        rank=cands.rank, other=float(options.framework_overhead_bytes))
    out = carve({name: ((n,), np.dtype(np.int64 if name == "peak_stage" else np.float64))
                 for name in (*PEAK_FIELDS, "peak_stage")})
    out["other"][:] = tables.other
    out["offloaded_bytes"][:] = 0.0
    score_rows(tables, rows, row_rep, cands.rank.size, out)
    return out
