"""Enumerate every valid layout, axis by axis, with the rules of :mod:`constraints`.

The space is built one axis at a time (``AXIS_ORDER``).  When an axis is added,
every rule whose axes are now all assigned is evaluated -- but not on every
row: a rule reads only a few columns, so it is evaluated once per distinct
combination of the columns it depends on, crossed with the new axis's
candidates, and the verdict is joined back onto the rows.  The result is a
:class:`LayoutTable` of numpy columns, so millions of layouts cost a few
arrays, not millions of objects.

Candidate values per axis are the divisors of the GPU count for the degrees
(R2/R3 make every degree divide N), ``1..L+2`` for ``vpp`` (R8 bounds
``pp*vpp`` by L+2: the embedding and the loss may each take a virtual stage),
the user's candidate sets for ``mbs`` and ``recompute`` (R11) and both values
for ``sp``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from parsearch.errors import NoValidLayoutError
from parsearch.layout import Layout
from parsearch.layout.rules import (
    RECOMPUTE_CODES,
    RULES,
    RULES_BY_ID,
    Rule,
    RuleContext,
    derive_columns,
    rule_context,
)
from parsearch.model.specs import RECOMPUTE_MODES, ModelSpec, TrainingSpec, require_positive_int

AXIS_ORDER: tuple[str, ...] = ("pp", "vpp", "tp", "cp", "ep", "etp", "mbs", "sp", "recompute")

# Derived columns and the base axes they are computed from (constraints.derive_columns).
_DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "dp": ("tp", "cp", "pp"),
    "edp": ("pp", "ep", "etp"),
    "m": ("mbs", "tp", "cp", "pp"),
}

COLUMN_DTYPE = np.int64
#: Integer columns of a finished table are stored in 32 bits when their values fit (a
#: million-layout table then takes half the memory); the scorer widens what it reads.
TABLE_DTYPE = np.int32


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def axis_candidates(ctx: RuleContext, axis: str) -> np.ndarray:
    """The values the enumerator tries for ``axis`` before any rule prunes them."""
    if axis in ("tp", "pp", "cp", "ep", "etp"):
        values: list[int] = divisors(ctx.num_gpus)
    elif axis == "vpp":
        values = list(range(1, ctx.num_layers + 3))  # R8: pp*vpp <= L + 2
    elif axis == "mbs":
        values = sorted(set(ctx.micro_batch_sizes))
    elif axis == "sp":
        values = [0, 1]
    elif axis == "recompute":
        values = sorted(set(ctx.recompute_codes))
    else:  # pragma: no cover - AXIS_ORDER is closed
        raise ValueError(axis)
    return np.asarray(values, dtype=COLUMN_DTYPE)


#: Rules whose grid of candidates has at most this many points prune candidate values first.
_PREPRUNE_GRID = 1 << 16


def pruned_candidates(ctx: RuleContext, candidates: dict[str, np.ndarray],
                      rules: tuple[Rule, ...] = RULES) -> tuple[dict[str, np.ndarray], bool]:
    """Drop candidate values that no combination passes, rule by rule.

    A rule that reads a few axes (``tp`` alone, ``ep`` with ``etp``, ``tp``
    with ``cp`` and ``pp``, ...) is evaluated on the whole (small) grid of
    those axes' candidates; a value that passes with no combination of the
    others can be in no valid layout, so the enumerator never expands it.
    This only saves work: the enumerated table is the same row for row.
    Without it a dense model's ``ep`` and ``etp`` (each every divisor of the
    GPU count, pruned to 1 only when both are assigned) multiply the
    intermediate rows by the divisor count squared.

    Returns the candidates and whether some rule passes no combination at
    all (then the space is empty; the candidates are left for the enumerator
    to find and name that rule).
    """
    out = dict(candidates)
    # rules of fewer axes first: they shrink the grids of the wider ones
    for rule in sorted(rules, key=lambda r: len(_base_axes(r.axes))):
        axes = sorted(_base_axes(rule.axes))
        size = int(np.prod([len(out[a]) for a in axes], dtype=np.int64))
        if size == 0 or size > _PREPRUNE_GRID:
            continue
        if len(axes) == 1:
            probe = {axes[0]: out[axes[0]]}
        else:
            grids = np.meshgrid(*(out[a] for a in axes), indexing="ij")
            probe = {a: g.ravel() for a, g in zip(axes, grids, strict=True)}
        if rule.axes - set(axes):  # reads derived columns (dp, edp, m)
            probe.update(derive_columns(ctx, probe))
        ok = np.broadcast_to(np.asarray(rule.holds(ctx, probe), dtype=bool), (size,))
        if not ok.any():  # the space is empty: the enumerator finds and names the rule
            return out, True
        grid_ok = ok.reshape([len(out[a]) for a in axes])
        for i, axis in enumerate(axes):  # values that pass with some combination of the rest
            others = tuple(j for j in range(len(axes)) if j != i)
            out[axis] = out[axis][grid_ok.any(axis=others) if others else grid_ok]
    return out, False


def _base_axes(names: frozenset[str]) -> set[str]:
    base: set[str] = set()
    for name in names:
        base.update(_DERIVED_FROM.get(name, (name,)))
    return base


@dataclass(frozen=True)
class PruneStep:
    """What adding one axis did: rows before and after, rows each rule removed."""

    axis: str
    rows_in: int
    rows_out: int
    removed_by: dict[str, int]


@dataclass(frozen=True)
class LayoutTable:
    """Valid layouts of one query as numpy columns (one row per layout).

    Columns: ``tp pp cp ep etp vpp mbs sp recompute dp edp m`` (``recompute``
    as a code, index into ``RECOMPUTE_MODES``).
    """

    num_gpus: int
    columns: dict[str, np.ndarray]
    steps: tuple[PruneStep, ...] = field(default=(), compare=False)

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def layout(self, index: int) -> Layout:
        """Row ``index`` as a :class:`Layout`."""
        c = self.columns
        return Layout(
            num_gpus=self.num_gpus,
            tp=int(c["tp"][index]),
            pp=int(c["pp"][index]),
            cp=int(c["cp"][index]),
            ep=int(c["ep"][index]),
            etp=int(c["etp"][index]),
            vpp=int(c["vpp"][index]),
            mbs=int(c["mbs"][index]),
            sp=bool(c["sp"][index]),
            recompute=RECOMPUTE_MODES[int(c["recompute"][index])],  # type: ignore[arg-type]
        )

    def __iter__(self) -> Iterator[Layout]:
        return (self.layout(i) for i in range(len(self)))

    def select(self, mask_or_index: np.ndarray) -> LayoutTable:
        """The rows picked by a boolean mask or an index array."""
        return LayoutTable(
            self.num_gpus, {k: v[mask_or_index] for k, v in self.columns.items()}, self.steps
        )


def _expand_axis(
    ctx: RuleContext,
    index_cols: dict[str, np.ndarray],
    candidates: dict[str, np.ndarray],
    axis: str,
    rules: list[Rule],
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Add ``axis`` to every row, keeping only values that pass ``rules``.

    Rows hold *indices* into each axis's candidate array.  Each row's values
    of the axes the rules read form a mixed-radix code; the rules are
    evaluated once per distinct code (crossed with the new axis's
    candidates), and every row looks its verdict up by its code.
    """
    n_rows = len(next(iter(index_cols.values()))) if index_cols else 1
    read = sorted(set().union(*(_base_axes(r.axes) for r in rules)) - {axis}) if rules else []
    radices = [len(candidates[name]) for name in read]
    n_cand = len(candidates[axis])
    code = np.zeros(n_rows, dtype=np.int64)
    for name, size in zip(read, radices, strict=True):
        code = code * size + index_cols[name]
    n_codes = int(np.prod(radices, dtype=np.int64))
    if n_codes <= n_rows:  # evaluate on the whole (small) grid of read values
        present = np.arange(n_codes, dtype=np.int64)
        row_key = code
    else:  # evaluate only on the combinations that occur
        present, row_key = np.unique(code, return_inverse=True)
        row_key = row_key.reshape(-1)
    # decode each present code back to per-axis indices, cross with the candidates
    probe: dict[str, np.ndarray] = {}
    remainder = present
    for name, size in zip(reversed(read), reversed(radices), strict=True):
        probe[name] = candidates[name][np.repeat(remainder % size, n_cand)]
        remainder = remainder // size
    probe[axis] = np.tile(candidates[axis], len(present))
    if any(rule.axes & _DERIVED_FROM.keys() for rule in rules):  # dp, edp, m: when read
        probe.update(derive_columns(ctx, probe))
    verdict = np.ones(len(present) * n_cand, dtype=bool)
    failures: dict[str, np.ndarray] = {}
    for rule in rules:
        ok = np.broadcast_to(rule.holds(ctx, probe), verdict.shape)
        failures[rule.rule_id] = ~ok
        verdict &= ok
    rows_per_key = np.bincount(row_key, minlength=len(present))
    removed = {
        rule_id: int((fail.reshape(-1, n_cand).sum(axis=1) * rows_per_key).sum())
        for rule_id, fail in failures.items()
    }
    # each row repeated once per candidate it keeps, in row order then candidate order
    # (what gathering at np.nonzero of the row-by-candidate verdict gives, without the gather)
    each = np.tile(np.arange(n_cand, dtype=np.int16), n_rows)
    if verdict.all():
        out = {name: np.repeat(values, n_cand) for name, values in index_cols.items()}
        out[axis] = each
        return out, removed
    keep = verdict.reshape(-1, n_cand)[row_key]
    counts = keep.sum(axis=1)
    out = {name: np.repeat(values, counts) for name, values in index_cols.items()}
    out[axis] = each[keep.reshape(-1)]
    return out, removed


def enumerate_layouts(model: ModelSpec, training: TrainingSpec, num_gpus: int, *,
                      explain: bool = True) -> LayoutTable:
    """Every layout of ``num_gpus`` GPUs that satisfies rules R1--R11 (and R12 under a stack
    before MoE parallel folding).

    ``explain=False``: a space that a rule empties on its own is returned at
    once, without the per-axis record (``steps``) that names the rule.

    >>> from parsearch.model.specs import ModelSpec, TrainingSpec
    >>> m = ModelSpec("toy", 4, 256, 1024, 4, 4, 64, 1000)
    >>> t = TrainingSpec(seq_len=128, global_batch=8, micro_batch_sizes=(1,),
    ...                  recompute_modes=("none",), sequence_parallel="on")
    >>> sorted(layout.key() for layout in enumerate_layouts(m, t, 2))[:3]
    ['tp1-cp1-pp1-vpp1-ep1-etp1-mbs1-sp0-rnone', 'tp1-cp1-pp2-vpp1-ep1-etp1-mbs1-sp0-rnone', \
'tp1-cp1-pp2-vpp2-ep1-etp1-mbs1-sp0-rnone']
    """
    require_positive_int("query", "gpus", num_gpus)
    ctx = rule_context(model, training, num_gpus)
    candidates, empty = pruned_candidates(
        ctx, {axis: axis_candidates(ctx, axis) for axis in AXIS_ORDER})
    if empty and not explain:
        cols = {axis: np.zeros(0, dtype=COLUMN_DTYPE) for axis in (*AXIS_ORDER, *_DERIVED_FROM)}
        cols["sp"] = cols["sp"].astype(bool)
        return LayoutTable(num_gpus, cols)
    index_cols: dict[str, np.ndarray] = {}
    pending = list(RULES)
    if all(int(candidates[a].min(initial=1)) >= 1 for a in RULES_BY_ID["R1"].axes):
        # R1 (sizes >= 1) constrains each axis alone and every candidate passes it: checking
        # it on the joint values of its seven axes would cost the largest probe of all
        pending.remove(RULES_BY_ID["R1"])
    assigned: set[str] = set()
    steps: list[PruneStep] = []
    for axis in AXIS_ORDER:
        assigned.add(axis)
        ready = [rule for rule in pending if _base_axes(rule.axes) <= assigned]
        pending = [rule for rule in pending if rule not in ready]
        rows_in = (len(index_cols["pp"]) if index_cols else 1) * len(candidates[axis])
        index_cols, removed = _expand_axis(ctx, index_cols, candidates, axis, ready)
        steps.append(PruneStep(axis, rows_in, len(index_cols[axis]), removed))
    # valid rows: every degree divides N, so products stay below N * max(mbs) * batch
    largest = max(num_gpus, training.global_batch, *(int(v.max(initial=0))
                                                      for v in candidates.values()))
    dtype = TABLE_DTYPE if largest ** 2 < np.iinfo(TABLE_DTYPE).max else COLUMN_DTYPE
    cols = {}
    for axis in AXIS_ORDER:  # free each index column as soon as its values are gathered
        cols[axis] = candidates[axis].astype(dtype)[index_cols.pop(axis)]
    cols.update(_derive_in_chunks(ctx, cols))
    cols["sp"] = cols["sp"].astype(bool)
    return LayoutTable(num_gpus, cols, tuple(steps))


def _derive_in_chunks(ctx: RuleContext, cols: dict[str, np.ndarray],
                      chunk: int = 1 << 18) -> dict[str, np.ndarray]:
    """:func:`derive_columns` of a large table, a block of rows at a time (its temporaries
    stay the size of a block, not of the table)."""
    n = len(cols["tp"])
    if n <= chunk:
        return derive_columns(ctx, cols)
    out: dict[str, np.ndarray] = {}
    for start in range(0, n, chunk):
        part = derive_columns(ctx, {k: v[start:start + chunk] for k, v in cols.items()})
        for name, values in part.items():
            if name not in out:
                out[name] = np.empty(n, dtype=values.dtype)
            out[name][start:start + len(values)] = values
    return out


def require_layouts(model: ModelSpec, training: TrainingSpec, num_gpus: int) -> LayoutTable:
    """Like :func:`enumerate_layouts`, but an empty space raises a clear error.

    The error names the rule that removed the last candidates.
    """
    table = enumerate_layouts(model, training, num_gpus)
    if len(table):
        return table
    raise NoValidLayoutError(explain_empty_space(model, training, num_gpus, table.steps))


def explain_empty_space(
    model: ModelSpec, training: TrainingSpec, num_gpus: int, steps: tuple[PruneStep, ...]
) -> str:
    """A one-line reason why no layout survives, naming the binding rule."""

    step = next(s for s in steps if s.rows_out == 0)
    binding = [rule_id for rule_id, count in step.removed_by.items() if count]
    if "R10" in binding:  # rows R9 removes (m not a multiple of pp) break R10 as well
        binding = ["R10"]
    names = ", ".join(f"{rid} ({RULES_BY_ID[rid].name})" for rid in binding)
    where = f"model {model.name} on {num_gpus} GPUs"
    if "R10" in binding:
        products = sorted(
            {mbs * d for mbs in training.micro_batch_sizes for d in divisors(num_gpus)}
        )
        shown = ", ".join(map(str, products[:12])) + (", ..." if len(products) > 12 else "")
        return (
            f"no valid layout for {where}: rule {names}: global_batch={training.global_batch} "
            f"is not a multiple of mbs*dp for any micro-batch size in "
            f"{','.join(map(str, training.micro_batch_sizes))} and any dp that divides "
            f"{num_gpus} (mbs*dp in {shown}); use a global batch that is a multiple of the "
            f"GPU count's data-parallel sizes, or change --gpus"
        )
    return (
        f"no valid layout for {where}: every candidate for {step.axis} breaks rule {names}; "
        f"run `parsearch check` on a layout to see the values"
    )


__all__ = [
    "AXIS_ORDER",
    "RECOMPUTE_CODES",
    "LayoutTable",
    "PruneStep",
    "divisors",
    "enumerate_layouts",
    "pruned_candidates",
    "require_layouts",
]
