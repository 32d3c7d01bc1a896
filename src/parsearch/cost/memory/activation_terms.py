"""A pipeline stage's activations, assembled from per-layer bytes and copies in flight.

A stage's activation bytes per GPU are a sum of *terms*: per-layer byte arrays
(:mod:`parsearch.cost.memory.activations`, which depend on the layout degrees) times
how many copies the stage holds (which depend on the stage's layers and the
micro-batches in flight only).  :func:`stage_terms` gives the counts of one
stage, :func:`term_bytes` the byte arrays of some layouts, and
:func:`stage_activations` their sum; the vectorised peak search
(:mod:`parsearch.cost.memory.peak`) evaluates the same sum, term by term in the
same order, for many layouts and stages at once.

Sources (``shared/reference/formulas.md`` §5.3, §5.4):

* per model chunk, each layer's bytes per micro-batch: a layer among the first
  ``TrainingSpec.recompute_num_layers`` of its chunk uses the layout's
  recompute mode, the others with ``full`` keep everything (Megatron
  ``--recompute-method block``, ``megatron/core/recompute.py``);
* the first ``TrainingSpec.activation_offload_layers`` layers of each chunk go
  to host memory (Megatron ``--cpu-offloading-num-layers``,
  ``fine_grained_activation_offload.py``) but for the tensors Transformer Engine's
  offload leaves behind (``activations.offload_kept_bytes``), held like a layer's;
  HBM keeps one such layer in flight;
* the rest is held once per micro-batch in flight in its chunk
  (:func:`~parsearch.cost.memory.activations.chunk_in_flight`);
* the MTP block (last chunk of the last rank, MCORE), the KOR22 embedding
  inputs (first chunk of rank 0) likewise; the output layer's inputs and fp32
  logits are held by the micro-batch in backward only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, reduce

import numpy as np

from parsearch.cost.memory.activations import (
    FULL,
    ActDegrees,
    LayerBytes,
    in_flight_chunk_microbatches,
    offload_kept_bytes,
    stage_layer_bytes,
)
from parsearch.cost.memory.cuda_graph_memory import cuda_graph_layer_bytes
from parsearch.cost.memory.options import (
    ACTIVATION_BYTES,
    FP32_BYTES,
    MemoryOptions,
    Num,
    gemm_input_bytes,
)
from parsearch.cost.stages import StageContent
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec, TrainingSpec

#: Terms held once per micro-batch in flight, in the order a stage sums them: a dense
#: layer under the layout's recompute mode, a dense layer past the chunk's first
#: ``recompute_num_layers`` (kept whole with ``full``), the same two for MoE layers,
#: an MTP layer, the KOR22 embedding inputs.  The first four are the layer kinds.
HELD_TERMS: tuple[str, ...] = ("dense", "dense_kept", "moe", "moe_kept", "mtp", "embedding",
                               "dense_offload_kept", "moe_offload_kept")
LAYER_KINDS = 4
#: the held term of what an offloaded dense / MoE layer leaves in HBM
#: (:func:`~parsearch.cost.memory.activations.offload_kept_bytes`)
OFFLOAD_KEPT = {False: HELD_TERMS.index("dense_offload_kept"),
                True: HELD_TERMS.index("moe_offload_kept")}


@dataclass(frozen=True)
class StageActivations:
    """Activation bytes of one GPU of a stage: HBM at the peak, and host offload."""

    hbm: Num  # held in GPU memory at the stage's peak
    offloaded: Num  # moved to host per micro-batch (all chunks of the rank)


@dataclass(frozen=True)
class StageTerms:
    """How many copies of each term a stage holds (no layout degrees involved).

    ``held[c][j]``: copies of :data:`HELD_TERMS` ``j`` held per micro-batch in
    flight in model chunk ``c``; ``offloaded[k]``: layers of kind ``k`` (the
    first four terms) moved to host per micro-batch; ``output_norm``: 1 on the
    last rank (final-norm and output-layer inputs); ``logits``: fp32 logits
    heads held there (``1 + MTP`` layers; 0 without ``fp32_logits``).
    """

    held: tuple[tuple[int, ...], ...]
    offloaded: tuple[int, ...]
    output_norm: int
    logits: int


def _position_counts(model: ModelSpec, indices: tuple[int, ...], recompute_first: int,
                     offload_first: int) -> dict[tuple[bool, bool, bool], int]:
    """Layers of one chunk by (is_moe, recomputed-by-block, offloaded)."""
    counts: dict[tuple[bool, bool, bool], int] = {}
    for pos, layer in enumerate(indices):
        key = (model.is_moe_layer(layer), pos < recompute_first, pos < offload_first)
        counts[key] = counts.get(key, 0) + 1
    return counts


@lru_cache(maxsize=16384)
def stage_terms(model: ModelSpec, content: StageContent, recompute_num_layers: int | None,
                offload_layers: int, korthikanti: bool, fp32_logits: bool) -> StageTerms:
    """The term counts of ``content``'s stage (memoised; see the module text)."""
    held = []
    offloaded = [0] * LAYER_KINDS
    mtp, embedding = HELD_TERMS.index("mtp"), HELD_TERMS.index("embedding")
    for chunk, indices in enumerate(content.chunk_layer_indices):
        row = [0] * len(HELD_TERMS)
        n_rec = len(indices) if recompute_num_layers is None else recompute_num_layers
        for (is_moe, rec, off), n in _position_counts(model, indices, n_rec,
                                                      offload_layers).items():
            kind = 2 * is_moe + (0 if rec else 1)
            if off:
                offloaded[kind] += n
                row[OFFLOAD_KEPT[is_moe]] += n
            else:
                row[kind] += n
        if content.num_mtp_layers and chunk == content.vpp - 1:
            row[mtp] += content.num_mtp_layers  # after the final layer (MCORE); never offloaded
        if content.has_embedding and chunk == 0 and korthikanti:
            row[embedding] += 1
        held.append(tuple(row))
    heads = 1 + content.num_mtp_layers if content.has_output and fp32_logits else 0
    return StageTerms(held=tuple(held), offloaded=tuple(offloaded),
                      output_norm=int(content.has_output), logits=heads)


def terms_of(model: ModelSpec, training: TrainingSpec, content: StageContent,
             options: MemoryOptions) -> StageTerms:
    """:func:`stage_terms` of ``content`` under ``training`` and ``options``."""
    return stage_terms(model, content, training.recompute_num_layers,
                       training.activation_offload_layers,
                       options.activation_model == "korthikanti", options.fp32_logits)


@dataclass(frozen=True)
class TermBytes:
    """Bytes of one copy of each term for some layouts (numbers or arrays).

    ``held[j]``: of :data:`HELD_TERMS` ``j`` (``None`` where the model has no
    such layer); ``moved[k]``: what an offloaded layer of kind ``k`` (the first
    :data:`LAYER_KINDS` terms) moves to host; ``output_norm``: the last rank's
    final-norm and output-layer inputs; ``logits``: one head's fp32 logits.
    """

    held: tuple[Num | None, ...]
    moved: tuple[Num | None, ...]
    output_norm: Num
    logits: Num
    #: one layer's module inputs that fine-grained offloading moves (the largest kind):
    #: Megatron keeps the forward's last group of each module on the GPU before the first
    #: backward (``PipelineOffloadManager.post_warmup_callback``), so the stage holds one
    module_margin: Num = 0.0


def resolve_recompute(kinds: dict[bool, LayerBytes],
                      code: Num) -> tuple[dict[bool, Num], dict[bool, Num]]:
    """Per layer kind: bytes of a layer under the layouts' recompute code, and of a layer
    past the first ``recompute_num_layers`` of its chunk (Megatron block method: with
    ``full`` such a layer keeps all its activations)."""
    recomputed = {k: b.of(code) for k, b in kinds.items()}
    kept_whole = {k: np.where(code == FULL, b.none, recomputed[k]) for k, b in kinds.items()}
    return recomputed, kept_whole


def term_bytes(model: ModelSpec, training: TrainingSpec, deg: ActDegrees, code: Num,
               options: MemoryOptions, layers: dict[bool, LayerBytes] | None = None,
               ) -> TermBytes:
    """The bytes of each term under the degrees ``deg`` and recompute code(s) ``code``.

    ``layers``: :func:`~parsearch.cost.memory.activations.stage_layer_bytes` of ``deg``
    when the caller has it.
    """
    kinds = layers if layers is not None else stage_layer_bytes(model, training, deg, options)
    recomputed, kept_whole = resolve_recompute(kinds, np.asarray(code))
    s, h = training.seq_len, model.hidden_size
    tokens = deg.mbs * s / deg.cp  # CP shards the sequence (formulas.md §5.3)
    if any(options.cuda_graph_layers):
        # per-layer CUDA graphs keep static buffers per micro-batch in flight, held like
        # the layer's activations (cost/memory/cuda_graph_memory.py)
        for is_moe, count in zip((False, True), options.cuda_graph_layers, strict=True):
            if is_moe in recomputed and count:
                extra = cuda_graph_layer_bytes(count, tokens, h, deg.sp_div)
                recomputed[is_moe] = recomputed[is_moe] + extra
                kept_whole[is_moe] = kept_whole[is_moe] + extra
    mtp: Num | None = None
    if model.mtp_layers:
        # An MTP layer is MoE iff the last layer is (formulas.md §3.3); plus two norm
        # inputs (2h) and the eh-proj input (2h), SP-sharded [derived].
        gemm_b = gemm_input_bytes(training.precision)
        mtp_extra = tokens * 2.0 * h / deg.sp_div * (ACTIVATION_BYTES + gemm_b)
        mtp = recomputed[model.is_moe_layer(model.num_layers - 1)] + mtp_extra
    embedding: Num | None = None
    if options.activation_model == "korthikanti":
        # KOR22 §4.3 as coded in MCORE: token ids 8·s·b + embedding dropout mask s·b·h.
        embedding = (8.0 * s * deg.mbs + s * deg.mbs * h) / deg.cp / deg.sp_div
    kept: dict[bool, Num] = {}
    moved: list[Num | None] = [None] * LAYER_KINDS
    if training.activation_offload_layers:
        # Megatron offloads only layers without recompute (rule R11); a recomputed row
        # (outside the rules) moves its whole layer, as before the split
        none = np.asarray(code) == RECOMPUTE_CODES["none"]
        for is_moe in recomputed:
            kept[is_moe] = np.where(
                none, offload_kept_bytes(model, training, is_moe, deg, options), 0.0)
            moved[2 * is_moe] = recomputed[is_moe] - kept[is_moe]
            moved[2 * is_moe + 1] = kept_whole[is_moe] - kept[is_moe]
    return TermBytes(
        held=(recomputed[False], kept_whole[False], recomputed.get(True),
              kept_whole.get(True), mtp, embedding, kept.get(False), kept.get(True)),
        moved=tuple(moved),
        # Final-norm and output-layer inputs (KOR22's 4·s·b·h/t) and fp32 logits
        # s·b·V·4/(t·c) per head (formulas.md §5.4).
        output_norm=tokens * 2.0 * h / deg.sp_div * ACTIVATION_BYTES,
        logits=tokens * model.vocab_size / deg.tp * FP32_BYTES,
        # block recompute (recompute_num_layers): the chunk's later layers keep everything
        # and offload their module inputs
        module_margin=(reduce(np.maximum, [
            b.moved_of(np.asarray(code), block=training.recompute_num_layers is not None)
            for b in kinds.values()]) if training.offload_modules else 0.0),
    )


def stage_activations(
    model: ModelSpec,
    training: TrainingSpec,
    content: StageContent,
    deg: ActDegrees,
    code: Num,
    num_microbatches: Num,
    options: MemoryOptions,
    layers: dict[bool, LayerBytes] | None = None,
) -> StageActivations:
    """All activations of one GPU of ``content``'s stage at its peak (bytes).

    The held terms times their copies in flight, in :data:`HELD_TERMS` order;
    then the largest offloaded layer's moved part (one is in flight in HBM, being copied);
    then the output layer's inputs and logits.  ``layers``: as in
    :func:`term_bytes`.
    """
    arrays = term_bytes(model, training, deg, code, options, layers)
    terms = terms_of(model, training, content, options)
    in_flight = in_flight_chunk_microbatches(content.rank, content.pp, content.vpp,
                                             num_microbatches)
    hbm: Num = 0.0
    for j, per_copy in enumerate(arrays.held):
        copies = [in_flight[c] * row[j] for c, row in enumerate(terms.held) if row[j]]
        if copies:
            hbm = hbm + sum(copies) * per_copy
    offloaded: Num = 0.0
    largest_offloaded: Num = 0.0
    for kind, count in enumerate(terms.offloaded):
        if count:
            offloaded = offloaded + count * arrays.moved[kind]
            largest_offloaded = np.maximum(largest_offloaded, arrays.moved[kind])
    hbm = hbm + largest_offloaded + arrays.module_margin
    if terms.output_norm:
        hbm = hbm + terms.output_norm * arrays.output_norm
    if terms.logits:
        hbm = hbm + terms.logits * arrays.logits
    return StageActivations(hbm=hbm, offloaded=offloaded)
