"""Memory per GPU: model state, activations and overhead, per pipeline stage.

The public entry of the memory model.  Everything is in bytes per GPU.
Sources (``shared/reference/formulas.md``) and the jobs, one module each:

* :mod:`parsearch.cost.memory.states` — weights, gradients (``grad_bytes``:
  fp32 or BF16 main gradients) and optimizer state, §5.1/§5.2, FP8 §7.7;
* :mod:`parsearch.cost.memory.activations` — activations per layer (§5.3, KOR22 or
  the FlashAttention form), micro-batches in flight per model chunk (§5.4),
  per-module (selective) recompute;
* :mod:`parsearch.cost.memory.activation_terms` — a stage's activations as terms
  (per-layer bytes × copies held), partial (block) recompute, host offload;
* :mod:`parsearch.cost.memory.peak` / :mod:`parsearch.cost.memory.rows` —
  the peak stage of many layouts at once (:func:`memory_arrays`);
* :mod:`parsearch.cost.memory.options` — constants and :class:`MemoryOptions`.

Every pipeline stage is evaluated and the most loaded one is reported.
The arithmetic core (:func:`stage_memory_core`) is elementwise: the layout
degrees may be Python numbers or numpy arrays; :func:`estimate_memory`
(scalar) calls it per stage, :func:`memory_arrays` (vectorised) evaluates
the same terms in the same order for all layouts and candidate stages at
once, so the two give identical numbers (``tests/test_memory.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from parsearch.cost.memory.activation_terms import stage_activations
from parsearch.cost.memory.activations import (
    ActDegrees,
    LayerBytes,
    num_microbatches,
)
from parsearch.cost.memory.options import (
    DEFAULT_MEMORY_OPTIONS,
    GIB,
    MemoryOptions,
    Num,
)
from parsearch.cost.memory.peak import PEAK_FIELDS, RepDegrees, peak_memory
from parsearch.cost.memory.states import (
    stage_model_state,
    stage_params,
)
from parsearch.cost.stages import StageContent, effective_split, rows_by_split, stage_contents
from parsearch.layout import Layout
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec, TrainingSpec


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU; ``total`` is the sum of the five parts.

    ``offloaded_bytes`` is not part of ``total``: activation bytes moved to
    host memory per micro-batch (``TrainingSpec.activation_offload_layers``),
    what a time model prices as host transfers.
    """

    weights: Num
    gradients: Num
    optimizer: Num
    activations: Num
    other: Num
    total: Num
    offloaded_bytes: Num = 0.0

    @classmethod
    def of(
        cls, *, weights: Num, gradients: Num, optimizer: Num, activations: Num, other: Num,
        offloaded_bytes: Num = 0.0,
    ) -> MemoryBreakdown:
        """Build a breakdown, computing ``total``."""
        total = weights + gradients + optimizer + activations + other
        return cls(weights, gradients, optimizer, activations, other, total, offloaded_bytes)

    def to_gib(self) -> dict[str, float]:
        """The CLI's ``memory_gib_per_gpu`` keys (without ``capacity``)."""
        return {f.name: float(getattr(self, f.name)) / GIB for f in fields(self)
                if f.name != "offloaded_bytes"}


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory of every pipeline stage, and the most loaded one."""

    per_stage: tuple[MemoryBreakdown, ...]
    peak_stage: int

    @property
    def peak(self) -> MemoryBreakdown:
        """Breakdown of the stage with the largest total."""
        return self.per_stage[self.peak_stage]


@dataclass(frozen=True)
class MemoryArrays:
    """Vectorised peak memory: one entry per layout (bytes per GPU).

    ``offloaded_bytes``: activation bytes the peak-memory stage moves to host
    per micro-batch per GPU (0 without ``activation_offload_layers``; not in
    ``total``).
    """

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    other: np.ndarray
    total: np.ndarray
    peak_stage: np.ndarray
    offloaded_bytes: np.ndarray


# ---------------------------------------------------------------------------
# Stage memory (the elementwise core) and its scalar and vectorised fronts
# ---------------------------------------------------------------------------


def _as_f64(value: Num) -> Num:
    return np.asarray(value, dtype=np.float64)


@dataclass(frozen=True)
class _Degrees:
    """A set of layouts' degrees made ready for evaluating any of their stages."""

    tp: Num
    cp: Num
    ep: Num
    etp: Num
    dp: Num
    edp: Num
    code: Num
    act: ActDegrees
    m: Num
    layers: dict[bool, LayerBytes] | None


def _prepare(model: ModelSpec, training: TrainingSpec, *, tp: Num, cp: Num, ep: Num,
             etp: Num, mbs: Num, dp: Num, edp: Num, recompute_code: Num, sp: Num,
             layers: dict[bool, LayerBytes] | None = None) -> _Degrees:
    tp, cp, ep, etp, mbs, dp, edp = (_as_f64(x) for x in (tp, cp, ep, etp, mbs, dp, edp))
    sp_div = np.where(np.asarray(sp, dtype=bool), tp, 1.0)
    return _Degrees(
        tp=tp, cp=cp, ep=ep, etp=etp, dp=dp, edp=edp, code=np.asarray(recompute_code),
        act=ActDegrees(tp=tp, cp=cp, ep=ep, etp=etp, mbs=mbs, sp_div=sp_div),
        m=num_microbatches(training.global_batch, mbs, dp),
        layers=layers,
    )


def _like(value: Num, ref: np.ndarray) -> Num:
    """``value`` with ``ref``'s shape (``value + 0·ref`` when it is not already)."""
    if np.shape(value) == np.shape(ref):
        return value
    return value + 0.0 * ref


def _stage_core(model: ModelSpec, training: TrainingSpec, content: StageContent,
                d: _Degrees, options: MemoryOptions) -> MemoryBreakdown:
    params = stage_params(model, content, tp=d.tp, ep=d.ep, etp=d.etp)
    state = stage_model_state(training, params, options, dp=d.dp, cp=d.cp, edp=d.edp)
    acts = stage_activations(model, training, content, d.act, d.code, d.m, options,
                             d.layers)
    tp = np.asarray(d.tp)
    other = np.full_like(tp, options.framework_overhead_bytes)
    return MemoryBreakdown.of(
        weights=_like(state.weights, tp),
        gradients=_like(state.gradients, tp),
        optimizer=_like(state.optimizer, tp),
        activations=_like(acts.hbm, tp),
        other=other,
        offloaded_bytes=_like(acts.offloaded, tp),
    )


def stage_memory_core(
    model: ModelSpec,
    training: TrainingSpec,
    content: StageContent,
    *,
    tp: Num,
    cp: Num,
    ep: Num,
    etp: Num,
    mbs: Num,
    dp: Num,
    edp: Num,
    recompute_code: Num,
    sp: Num,
    options: MemoryOptions = DEFAULT_MEMORY_OPTIONS,
    layers: dict[bool, LayerBytes] | None = None,
) -> MemoryBreakdown:
    """Memory of one GPU of ``content``'s stage, elementwise over the degrees.

    ``layers``: the per-layer activation bytes of these degrees
    (:func:`~parsearch.cost.memory.activations.stage_layer_bytes`), when known.
    """
    d = _prepare(model, training, tp=tp, cp=cp, ep=ep, etp=etp, mbs=mbs, dp=dp, edp=edp,
                 recompute_code=recompute_code, sp=sp, layers=layers)
    return _stage_core(model, training, content, d, options)


def _scalar_breakdown(b: MemoryBreakdown) -> MemoryBreakdown:
    return MemoryBreakdown(*(float(getattr(b, f.name)) for f in fields(b)))


def stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    content: StageContent,
    options: MemoryOptions = DEFAULT_MEMORY_OPTIONS,
) -> MemoryBreakdown:
    """Memory per GPU of one pipeline stage of ``layout`` (floats, bytes)."""
    result = stage_memory_core(
        model,
        training,
        content,
        tp=layout.tp,
        cp=layout.cp,
        ep=layout.ep,
        etp=layout.etp,
        mbs=layout.mbs,
        dp=layout.dp,
        edp=layout.edp,
        recompute_code=RECOMPUTE_CODES[layout.recompute],
        sp=layout.sp,
        options=options,
    )
    return _scalar_breakdown(result)


def estimate_memory(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    options: MemoryOptions = DEFAULT_MEMORY_OPTIONS,
) -> MemoryEstimate:
    """Memory per GPU of every pipeline stage of ``layout``; the peak is the largest total."""
    contents = stage_contents(model, layout.pp, layout.vpp,
                              effective_split(model, training, layout.pp, layout.vpp))
    per_stage = tuple(stage_memory(model, training, layout, c, options) for c in contents)
    totals = [b.total for b in per_stage]
    return MemoryEstimate(per_stage=per_stage, peak_stage=totals.index(max(totals)))


def memory_arrays(
    model: ModelSpec,
    training: TrainingSpec,
    tp: Num,
    cp: Num,
    pp: Num,
    ep: Num,
    etp: Num,
    vpp: Num,
    mbs: Num,
    dp: Num,
    edp: Num,
    recompute_code: Num,
    sp: Num,
    options: MemoryOptions = DEFAULT_MEMORY_OPTIONS,
    *,
    splits: list[tuple[int, int, np.ndarray]] | None = None,
    degree_rows: tuple[np.ndarray, np.ndarray] | None = None,
) -> MemoryArrays:
    """Peak memory per GPU for many layouts at once (elementwise over the arrays).

    Every stage that can hold a layout's peak is evaluated
    (:func:`~parsearch.cost.memory.peak.peak_memory`, the arithmetic of
    :func:`stage_memory_core`) and the largest total wins (the first such stage
    on ties, as in :func:`estimate_memory`).  ``offloaded_bytes`` is that of
    the peak stage.
    ``splits``: ``list(rows_by_split(pp, vpp))`` when the caller has it;
    ``degree_rows``: ``(representatives, position)`` of rows that are equal in
    every degree but ``vpp`` (``tp, cp, pp, ep, etp, mbs, sp, recompute, dp,
    edp``; a finer grouping is fine), so what does not depend on the stage split
    is computed once per group.
    Degrees must describe valid layouts (``dp, edp >= 1``; in ``even`` split
    mode ``L % (pp*vpp) == 0``, else :class:`SpecError`): filter first.
    The result's arrays are views of one allocation (keeping one keeps all).
    """
    arrays = np.broadcast_arrays(
        *(np.asarray(x) for x in (tp, cp, pp, ep, etp, vpp, mbs, dp, edp, recompute_code, sp))
    )
    tp_a, cp_a, pp_a, ep_a, etp_a, vpp_a, mbs_a, dp_a, edp_a, code_a, sp_a = (
        np.ravel(a) for a in arrays
    )
    reps, where = degree_rows if degree_rows is not None else (slice(None), None)
    deg = RepDegrees(tp=tp_a[reps], cp=cp_a[reps], pp=pp_a[reps], ep=ep_a[reps],
                     etp=etp_a[reps], mbs=mbs_a[reps], dp=dp_a[reps], edp=edp_a[reps],
                     code=code_a[reps], sp=sp_a[reps])
    peak = peak_memory(model, training, options, deg, where,
                       splits if splits is not None else list(rows_by_split(pp_a, vpp_a)))
    shape = arrays[0].shape
    return MemoryArrays(**{name: peak[name].reshape(shape)
                           for name in (*PEAK_FIELDS, "peak_stage")})
