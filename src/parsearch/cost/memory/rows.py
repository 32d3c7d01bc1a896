"""Peak-stage search over rows, block by block: the inner loop of
:mod:`parsearch.cost.memory.peak`.

Rows are taken in the order of :class:`RowOrder` (by pipeline split, splits by
falling number of candidate stages), so candidate ``k`` of every row that has
one is a prefix of the rows.  They are scored in blocks of :data:`BLOCK_ROWS`
with buffers allocated once per call and reused by every block: fresh memory
costs more than the arithmetic on it (first-touch page faults), so the only
arrays the size of the input are the results, and buffers and results are
each carved from one huge-page-backed arena (:func:`carve`).

Per candidate: activations are the terms of
:func:`~parsearch.cost.memory.activation_terms.stage_activations`, in its order
(copies held × bytes per copy), model state is looked up, and the total is
``weights + gradients + optimizer + activations + other`` as in
:class:`~parsearch.cost.memory.MemoryBreakdown`; the strictly larger total
wins, so ties go to the lower rank (evaluated first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Rows per block (each block costs some Python; a block's buffers stay small: at
#: 2**16 rows they held `search` DeepSeek-V3 on 1,024 GPUs at 257 MB peak, over the
#: 250 MB target of benchmarks/bench_search.py; 2**14 keeps it at 246 MB, same speed).
BLOCK_ROWS = 1 << 14

#: numpy backs an allocation of at least 4 MiB with transparent huge pages where the
#: kernel offers them (``numpy/_core/src/multiarray/alloc.c``: ``madvise(MADV_HUGEPAGE)``):
#: arrays carved from one such arena fault in a few 2 MiB pages, not one per 4 KiB.
#: Arenas of at least a quarter of that are padded up to it; smaller ones are not.
ARENA_MIN_BYTES = 1 << 22
_ALIGN = 64


def carve(shapes: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, np.ndarray]:
    """Empty arrays of the given shapes and dtypes, all views of one allocation (of at
    least :data:`ARENA_MIN_BYTES` when they need a quarter of it; the arrays keep it
    alive)."""
    layout, total = {}, 0
    for name, (shape, dtype) in shapes.items():
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        layout[name] = (total, nbytes)
        total += -(-nbytes // _ALIGN) * _ALIGN
    arena = np.empty(max(total, ARENA_MIN_BYTES) if 4 * total >= ARENA_MIN_BYTES else total,
                     dtype=np.uint8)
    return {name: arena[at:at + nbytes].view(shapes[name][1]).reshape(shapes[name][0])
            for name, (at, nbytes) in layout.items()}


@dataclass(frozen=True)
class Term:
    """One activation term: ``copies`` held by candidate ``c`` with micro-batch count
    ``m`` at ``m * C + c`` (offloaded layers: at ``c``), the bytes of one copy per
    representative row, and which candidates hold it at all."""

    copies: np.ndarray
    per_rep: np.ndarray
    present: np.ndarray


@dataclass(frozen=True)
class Tables:
    """What rows look up: activation terms (held per micro-batch in flight, offloaded
    layers, output layer), the model-state table (``weights``, ``gradients``,
    ``optimizer`` and ``sum``, their sum) at ``base_of_rep[rep] + key_offset[c]``, each
    representative's micro-batch count index, each candidate's rank."""

    held: list[Term]
    offload: list[Term]
    output: list[Term]
    state: dict[str, np.ndarray]
    base_of_rep: np.ndarray
    key_offset: np.ndarray
    m_of_rep: np.ndarray
    rank: np.ndarray
    other: float


@dataclass(frozen=True)
class RowOrder:
    """Rows by split: ``order[row_start[i]:row_start[i + 1]]`` are split ``i``'s rows,
    its candidates ``first[i] .. first[i] + count[i]`` (``count`` falling)."""

    order: np.ndarray
    row_start: np.ndarray
    first: np.ndarray
    count: np.ndarray


class _Buffers:
    """Scratch arrays of one block, reused by every block (carved from one arena)."""

    INTS = ("base", "cand0", "at0", "index", "k_row", "arange")
    FLOATS = ("tmp", "total", "best_total", "largest")

    def __init__(self, size: int, slots: int, terms: int, rep_type: np.dtype) -> None:
        self.size = size
        self.k_type = np.int8 if slots < 128 else np.int32
        i8, f8 = np.dtype(np.int64), np.dtype(np.float64)
        shapes = {name: ((size,), i8) for name in self.INTS}
        shapes.update({name: ((size,), f8) for name in self.FLOATS})
        shapes.update(rep=((size,), np.dtype(rep_type)), per_row=((terms, size), f8),
                      acts=((slots, size), f8), better=((size,), np.dtype(bool)),
                      best_k=((size,), np.dtype(self.k_type)),
                      k_of_better=((size,), np.dtype(self.k_type)))
        arrays = carve(shapes)
        self.ints = {name: arrays[name] for name in (*self.INTS, "rep")}
        self.floats = {name: arrays[name] for name in self.FLOATS}
        self.per_row, self.acts, self.better = arrays["per_row"], arrays["acts"], arrays["better"]
        self.best_k, self.k_of_better = arrays["best_k"], arrays["k_of_better"]
        self.ints["arange"][:] = np.arange(size)


def _spans(rows: RowOrder, term: Term, k: int) -> tuple[int, int] | None:
    """The rows whose candidate ``k`` holds ``term``: one run ``(first, stop)`` (all rows
    with a candidate ``k`` when they are not one run), or ``None``."""
    splits = int(np.count_nonzero(rows.count > k))
    holds = np.flatnonzero(term.present[rows.first[:splits] + k])
    if holds.size == 0:
        return None
    first, last = int(holds[0]), int(holds[-1])
    if last - first + 1 != holds.size:
        return 0, int(rows.row_start[splits])
    return int(rows.row_start[first]), int(rows.row_start[last + 1])


def score_rows(tables: Tables, rows: RowOrder, row_rep: np.ndarray | None,
               n_cands: int, out: dict[str, np.ndarray]) -> None:
    """Write each row's peak stage (``out``: the :data:`~parsearch.cost.memory.peak.PEAK_FIELDS`
    and ``peak_stage``, indexed by row) block by block."""
    n = rows.order.size
    slots = int(rows.count[0])
    terms = [*tables.held, *tables.offload, *tables.output]
    spans = [[_spans(rows, term, k) for term in terms] for k in range(slots)]
    slot_rows = [int(rows.row_start[np.count_nonzero(rows.count > k)]) for k in range(slots)]
    size = min(n, BLOCK_ROWS)
    buf = _Buffers(size, slots, len(terms),
                   row_rep.dtype if row_rep is not None else np.dtype(np.int64))
    for start in range(0, n, size):
        _score_block(tables, rows, row_rep, n_cands, terms, spans, slot_rows, buf,
                     start, min(n, start + size), out)


def _score_block(tables: Tables, rows: RowOrder, row_rep: np.ndarray | None, n_cands: int,
                 terms: list[Term], spans: list[list[tuple[int, int] | None]],
                 slot_rows: list[int], buf: _Buffers, start: int, stop: int,
                 out: dict[str, np.ndarray]) -> None:
    size = stop - start
    ints, floats = buf.ints, buf.floats
    where = rows.order[start:stop]
    rep = where if row_rep is None else np.take(row_rep, where, out=ints["rep"][:size],
                                                mode="clip")
    base = np.take(tables.base_of_rep, rep, out=ints["base"][:size], mode="clip")
    cand0 = ints["cand0"][:size]
    first_split = int(np.searchsorted(rows.row_start, start, side="right")) - 1
    for split in range(first_split, rows.first.size):
        a, b = int(rows.row_start[split]), int(rows.row_start[split + 1])
        if a >= stop:
            break
        cand0[max(a, start) - start:min(b, stop) - start] = rows.first[split]
    at0 = np.take(tables.m_of_rep, rep, out=ints["at0"][:size], mode="clip")
    at0 *= n_cands
    at0 += cand0
    for i, term in enumerate(terms):
        np.take(term.per_rep, rep, out=buf.per_row[i, :size], mode="clip")

    best_total, best_k = floats["best_total"][:size], buf.best_k[:size]
    best_k[:] = 0
    for k in range(len(slot_rows)):
        r = min(slot_rows[k], stop) - start
        if r <= 0:
            break
        # Candidate k of a row is its first plus k: tables indexed by candidate are read
        # from k on (``table[k:][first] == table[first + k]``).
        act = buf.acts[k, :r]
        _activations(act, tables, terms, spans[k], buf, at0[:r], cand0[:r], k, start)
        total = floats["total"][:r] if k else best_total[:r]
        index = np.take(tables.key_offset[k:], cand0[:r], out=ints["index"][:r], mode="clip")
        index += base[:r]
        np.take(tables.state["sum"], index, out=total, mode="clip")
        total += act
        total += tables.other
        if k:
            better = np.greater(total, best_total[:r], out=buf.better[:r])
            np.maximum(best_total[:r], total, out=best_total[:r])
            # best_k < k wherever set so far: the maximum sets k exactly where better.
            k_of_better = np.multiply(better.view(np.int8), buf.k_type(k),
                                      out=buf.k_of_better[:r])
            np.maximum(best_k[:r], k_of_better, out=best_k[:r])

    # The best candidate's activations (acts[k, row]), rank, state; into the results.
    k_row = ints["k_row"][:size]
    k_row[:] = best_k
    cand = np.add(cand0, k_row, out=ints["at0"][:size])
    k_row *= buf.size
    k_row += ints["arange"][:size]
    out["activations"][where] = np.take(buf.acts.reshape(-1), k_row,
                                        out=floats["tmp"][:size], mode="clip")
    out["total"][where] = best_total
    out["peak_stage"][where] = np.take(tables.rank, cand, out=ints["index"][:size],
                                       mode="clip")
    index = np.take(tables.key_offset, cand, out=ints["index"][:size], mode="clip")
    index += base
    for name in ("weights", "gradients", "optimizer"):
        out[name][where] = np.take(tables.state[name], index, out=floats["tmp"][:size],
                                   mode="clip")
    if tables.offload:
        offloaded = floats["largest"][:size]
        offloaded[:] = 0.0
        first = len(tables.held)
        for i, term in enumerate(tables.offload):
            tmp = np.take(term.copies, cand, out=floats["tmp"][:size], mode="clip")
            tmp *= buf.per_row[first + i, :size]
            offloaded += tmp
        out["offloaded_bytes"][where] = offloaded


def _activations(act: np.ndarray, tables: Tables, terms: list[Term],
                 spans: list[tuple[int, int] | None], buf: _Buffers, at0: np.ndarray,
                 cand0: np.ndarray, k: int, start: int) -> None:
    """Write into ``act`` the HBM activations of candidate ``k`` of the block's first
    ``act.size`` rows: the held terms, the largest offloaded layer, the output terms
    (a term a row's candidate does not hold would add an exact 0: outside its span it
    is skipped; the first term written over every row is stored, ``0 + x == x``)."""
    n_held, n_off = len(tables.held), len(tables.offload)
    blank = _add_terms(act, terms, range(n_held), spans, buf, at0, k, start, True)
    if n_off:
        if blank:
            act[:] = 0.0
        _add_largest_offloaded(act, tables, buf, cand0, k, n_held)
        blank = False
    if _add_terms(act, terms, range(n_held + n_off, len(terms)), spans, buf, at0, k, start,
                  blank):
        act[:] = 0.0


def _add_terms(act: np.ndarray, terms: list[Term], which: range,
               spans: list[tuple[int, int] | None], buf: _Buffers, at0: np.ndarray, k: int,
               start: int, blank: bool) -> bool:
    """``act += copies × bytes`` of the terms ``which`` on the rows within their spans;
    returns whether ``act`` is still unwritten."""
    rows = act.size
    for i in which:
        span = spans[i]
        if span is None:
            continue
        a, b = max(span[0] - start, 0), min(span[1] - start, rows)
        if a >= b:
            continue
        copies = terms[i].copies[k:]
        if blank and (a, b) == (0, rows):
            np.take(copies, at0, out=act, mode="clip")
            act *= buf.per_row[i, :rows]
        else:
            if blank:
                act[:] = 0.0
            part = np.take(copies, at0[a:b], out=buf.floats["tmp"][a:b], mode="clip")
            part *= buf.per_row[i, a:b]
            act[a:b] += part
        blank = False
    return blank


def _add_largest_offloaded(act: np.ndarray, tables: Tables, buf: _Buffers, cand0: np.ndarray,
                           k: int, first: int) -> None:
    """One offloaded layer is in flight in HBM: the largest kind the stage offloads."""
    rows = act.size
    largest = buf.floats["largest"][:rows]
    largest[:] = 0.0
    tmp, holds = buf.floats["tmp"][:rows], buf.better[:rows]
    for i, term in enumerate(tables.offload):
        np.greater(np.take(term.copies[k:], cand0, out=tmp, mode="clip"), 0.0, out=holds)
        np.multiply(holds, buf.per_row[first + i, :rows], out=tmp)  # exact: 0 or the bytes
        np.maximum(largest, tmp, out=largest)
    act += largest
