"""How transformer layers are split over pipeline stages.

Megatron-Core numbers virtual pipeline stages ``j = chunk * pp + rank``: model
chunk ``c`` of pipeline rank ``r`` holds virtual stage ``c * pp + r``, and
layers are assigned to virtual stages in order
(``megatron/core/transformer/transformer_layer.py::get_transformer_layer_offset``).

Two split modes (``shared/spec/layout-space.md`` R8):

* ``even``: every virtual stage holds ``L / (pp * vpp)`` layers; it is an error
  when that does not divide.
* ``uneven``: ``pp * vpp <= L + 2``; layers are spread as evenly as possible
  over the ``pp * vpp`` virtual stages.  When the division is not exact, the
  ``L % (pp*vpp)`` extra layers go to the interior virtual stages first (in
  virtual-stage order, which cycles through the ranks), so that the very
  first virtual stage (which also holds the embedding) and the very last one
  (output layer, loss and the MTP block) hold fewer.  Only when every
  interior stage already has an extra layer does the first stage get one
  (the output layer costs ``6·h·V`` FLOPs per token, the embedding lookup
  almost none), and the last stage never does.

  This one rule is Megatron's accounting wherever that accounting applies:
  ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
  (``megatron/training/arguments.py``: ``num_layers += 1`` for each;
  ``transformer_layer.py::get_transformer_layer_offset`` then gives the first
  (last) virtual stage one transformer layer fewer) count the embedding and
  the loss as one layer each.  When ``(L + 2) % (pp*vpp) == 0`` (both
  flags) the rule above gives every interior stage ``(L+2)/(pp*vpp)`` layers
  and the first and last one fewer, exactly Megatron's split (e.g. 126
  layers on 16 stages: ``7, 8, ..., 8, 7``); when ``(L + 1) % (pp*vpp) == 0``
  (loss flag only) it gives the last stage one fewer.  We prefer these
  readings and keep the rule for every other ``pp*vpp <= L``.

  When ``pp*vpp = L + 1`` the last virtual stage holds only the output
  layer and loss (Megatron layout string ``...|L``); when ``pp*vpp = L + 2``
  the first holds only the embedding as well (``E|t|...|t|L``; Llama 3.1
  405B, 126 layers on PP16 × VPP8 = 128 virtual stages).  Those are the only
  virtual stages with no transformer layer: every virtual stage holds at
  least one unit (a layer, the embedding or the loss).

  Where none of Megatron's accountings divides the layers (``L``, ``L + 1`` and ``L + 2``
  are all indivisible by ``pp*vpp``), a launch must name the split itself (a layout
  string), and :func:`effective_split` names the one that balances work: the last
  virtual stage also runs the output layer, the loss and the MTP blocks, worth
  ``k`` = floor(their forward FLOPs / a mean layer's) transformer layers
  (:func:`loss_stage_layers`), so it takes ``k`` layers fewer.  For DeepSeek-V3
  (``k`` = 3) this gives exactly the layouts Megatron-Bridge's DeepSeek-V3 recipes
  write by hand (``Et*4|(t*4|)*14tmL`` on 16 virtual stages, ``Et*8|(t*8|)*6t*5mL`` on
  8, ``Et|(tt|)*30mL`` on 32), Kimi-K2's (``Et*4|(t*4|)*14tL``, ``k`` = 2) and
  DeepSeek-V3 without MTP's (``Et*3|(t*4|)*14ttL``, ``k`` = 1); the naive rule
  left DeepSeek-V3's last stage of 16 with 3 layers plus about 4 layers' worth of
  head and MTP.

The split depends only on ``(L, pp, vpp, split)``; :func:`stage_contents` is
memoised so a vectorised scorer computes it once per distinct ``(pp, vpp)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np

from parsearch.cost.token_flops import model_flops_per_token
from parsearch.errors import SpecError
from parsearch.layout.pipeline import layout_layer_counts
from parsearch.layout.rank_split import RankSplit, rank_split
from parsearch.model.pipeline_layout import format_pipeline_layout
from parsearch.model.specs import PIPELINE_SPLITS, ModelSpec, TrainingSpec, require_choice


@dataclass(frozen=True)
class StageContent:
    """What one pipeline rank holds (all of its ``vpp`` model chunks together).

    ``chunk_layer_indices[c]`` are the 0-based transformer-layer indices of
    model chunk ``c`` (virtual stage ``c * pp + rank``).  A chunk is empty
    only for an embedding-only virtual stage (chunk 0 of rank 0) or a
    loss-only one (the last chunk of rank ``pp - 1``); see the module text.
    ``has_embedding`` / ``has_output`` are per pipeline rank (rank 0 / rank
    ``pp - 1``), whatever chunk holds them.  MTP layers are not
    transformer-layer indices: Megatron-Core places the MTP block after the
    final layer, on the last pipeline rank, so ``num_mtp_layers`` is non-zero
    only there (``mtp_is_moe``: an MTP layer is MoE iff the last layer is,
    formulas.md §3.3).
    """

    rank: int
    pp: int
    vpp: int
    chunk_layer_indices: tuple[tuple[int, ...], ...]
    num_dense_layers: int
    num_moe_layers: int
    has_embedding: bool
    has_output: bool
    num_mtp_layers: int
    mtp_is_moe: bool

    @property
    def num_layers(self) -> int:
        """Transformer layers on this rank (MTP excluded)."""
        return self.num_dense_layers + self.num_moe_layers

    @property
    def layer_indices(self) -> tuple[int, ...]:
        """All transformer-layer indices on this rank, in model order."""
        return tuple(sorted(i for chunk in self.chunk_layer_indices for i in chunk))

    @property
    def chunk_layer_counts(self) -> tuple[int, ...]:
        """Layers per model chunk of this rank."""
        return tuple(len(chunk) for chunk in self.chunk_layer_indices)

    @property
    def is_first(self) -> bool:
        """Pipeline rank 0."""
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        """Pipeline rank ``pp - 1``."""
        return self.rank == self.pp - 1


def _check_degrees(num_layers: int, pp: int, vpp: int, split: str) -> None:
    if split not in PIPELINE_SPLITS:  # a --pipeline-model-parallel-layout string
        try:
            counts = layout_layer_counts(split)
        except SpecError as error:
            raise SpecError(f"pipeline split {split!r} is neither even, uneven nor a Megatron "
                            f"pipeline layout string ({error})") from None
        if len(counts) != pp * vpp or sum(counts) != num_layers:
            raise SpecError(
                f"pipeline layout {split!r} has {len(counts)} virtual stages and "
                f"{sum(counts)} layers; the layout needs pp*vpp={pp * vpp} and "
                f"num_layers={num_layers}")
        return
    require_choice("pipeline", "split", split, PIPELINE_SPLITS)
    for name, value in (("num_layers", num_layers), ("pp", pp), ("vpp", vpp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"pipeline split: {name} must be a positive integer, got {value!r}")
    stages = pp * vpp
    if split == "first-last" and rank_split(num_layers, pp, vpp) is None:
        raise SpecError(
            f"R8 pipeline split: Megatron-Core <= 0.12 builds no split of num_layers="
            f"{num_layers} over pp={pp} with vpp={vpp}: every rank's layers must divide by "
            "vpp (L/pp each, the embedding or loss counted as a layer, or other counts on "
            "the first and last rank); use a pp*vpp that fits or --pipeline-split uneven "
            "with a Megatron-Core that takes layout strings")
    if split == "even" and num_layers % stages:
        raise SpecError(
            f"R8 pipeline split: even split needs num_layers % (pp*vpp) == 0; "
            f"num_layers={num_layers}, pp={pp}, vpp={vpp} (pp*vpp={stages}); "
            f"use --pipeline-split uneven or a pp*vpp that divides {num_layers}"
        )
    # R8 uneven: the embedding and the loss may each take a virtual stage of their own.
    if stages > num_layers + 2:
        raise SpecError(
            f"R8 pipeline split: pp*vpp={stages} (pp={pp}, vpp={vpp}) exceeds "
            f"num_layers+2={num_layers + 2}; every virtual stage needs at least one unit "
            f"(a layer, the embedding or the loss); use pp*vpp <= {num_layers + 2}"
        )


def _extra_layer_order(stages: int) -> list[int]:
    """Virtual stages in the order they receive one extra layer (uneven split).

    Interior stages first (virtual-stage order cycles through the ranks, so
    the per-rank totals stay balanced), then the first stage; the last never.
    """
    return [*range(1, stages - 1), 0] if stages > 1 else [0]


@lru_cache(maxsize=4096)
def virtual_stage_layer_counts(
    num_layers: int, pp: int, vpp: int, split: str = "uneven"
) -> tuple[int, ...]:
    """Layers per virtual stage ``j = chunk * pp + rank`` (length ``pp * vpp``).

    >>> virtual_stage_layer_counts(30, 4, 1)
    (7, 8, 8, 7)
    >>> virtual_stage_layer_counts(31, 4, 1)
    (8, 8, 8, 7)
    >>> virtual_stage_layer_counts(32, 4, 1, "even")
    (8, 8, 8, 8)
    >>> virtual_stage_layer_counts(4, 5, 1)  # L+1 stages: the loss alone on the last
    (1, 1, 1, 1, 0)
    >>> virtual_stage_layer_counts(4, 3, 2)  # L+2 stages: embedding and loss alone
    (0, 1, 1, 1, 1, 0)

    A 0 is an embedding-only (first) or loss-only (last) virtual stage.  ``split`` may
    also be a Megatron layout string (:mod:`parsearch.layout.pipeline`):

    >>> virtual_stage_layer_counts(5, 2, 1, "Et*2|t*3L")
    (2, 3)
    """
    _check_degrees(num_layers, pp, vpp, split)
    if split not in PIPELINE_SPLITS:
        return layout_layer_counts(split)
    if split == "first-last":  # checked above; the balance of layers alone (no head)
        found = rank_split(num_layers, pp, vpp)
        assert found is not None
        return found.virtual_stage_counts(pp, vpp)
    stages = pp * vpp
    base, extra = divmod(num_layers, stages)
    counts = [base] * stages
    for j in _extra_layer_order(stages)[:extra]:
        counts[j] += 1
    return tuple(counts)


def stage_layer_counts(
    num_layers: int, pp: int, vpp: int = 1, split: str = "uneven"
) -> tuple[int, ...]:
    """Transformer layers per pipeline rank (all model chunks together).

    >>> stage_layer_counts(61, 8, 1)
    (7, 8, 8, 8, 8, 8, 7, 7)
    >>> stage_layer_counts(80, 4, 5, "even")
    (20, 20, 20, 20)
    """
    counts = virtual_stage_layer_counts(num_layers, pp, vpp, split)
    return tuple(sum(counts[c * pp + r] for c in range(vpp)) for r in range(pp))


def _chunk_indices(num_layers: int, pp: int, vpp: int, split: str) -> list[list[range]]:
    """``result[rank][chunk]``: the layer indices of that model chunk."""
    counts = virtual_stage_layer_counts(num_layers, pp, vpp, split)
    starts = [sum(counts[:j]) for j in range(len(counts))]
    return [
        [range(starts[c * pp + r], starts[c * pp + r] + counts[c * pp + r]) for c in range(vpp)]
        for r in range(pp)
    ]


@lru_cache(maxsize=4096)
def stage_contents(
    model: ModelSpec, pp: int, vpp: int = 1, split: str = "uneven"
) -> tuple[StageContent, ...]:
    """One :class:`StageContent` per pipeline rank (memoised).

    DeepSeek-V3 (61 layers, first 3 dense) on pp=8: rank 0 holds the 3 dense
    layers and 5 MoE layers; the last rank holds the MTP block.
    """
    last_is_moe = model.is_moe_layer(model.num_layers - 1)
    result = []
    for rank, chunks in enumerate(_chunk_indices(model.num_layers, pp, vpp, split)):
        indices = [i for chunk in chunks for i in chunk]
        moe = sum(model.is_moe_layer(i) for i in indices)
        is_last = rank == pp - 1
        result.append(
            StageContent(
                rank=rank,
                pp=pp,
                vpp=vpp,
                chunk_layer_indices=tuple(tuple(chunk) for chunk in chunks),
                num_dense_layers=len(indices) - moe,
                num_moe_layers=moe,
                has_embedding=rank == 0,
                has_output=is_last,
                num_mtp_layers=model.mtp_layers if is_last else 0,
                mtp_is_moe=last_is_moe,
            )
        )
    return tuple(result)


def effective_split(model: ModelSpec, training: TrainingSpec, pp: int, vpp: int) -> str:
    """The split of ``(pp, vpp)``: the training's layout string where it has ``pp*vpp``
    virtual stages (a recipe's ``--pipeline-model-parallel-layout``); else, in ``uneven``
    mode where no Megatron accounting divides the layers, the work-balanced layout
    string (module docstring; the launch passes it on); else the split mode."""
    layout = training.pipeline_layout
    stages = pp * vpp
    if layout is not None and len(layout_layer_counts(layout)) == stages:
        return layout
    split = training.pipeline_split
    layers = model.num_layers
    if split == "first-last" and stages > 1:
        found = priced_rank_split(model, training, pp, vpp)
        if found is not None:
            return format_pipeline_layout(found.virtual_stage_counts(pp, vpp),
                                          model.mtp_layers)
        return split
    if split != "uneven" or stages < 2 or not all((layers + a) % stages for a in (0, 1, 2)):
        return split
    return _balanced_split(layers, stages, loss_stage_layers(model, training.seq_len),
                           model.mtp_layers) or split


def priced_rank_split(model: ModelSpec, training: TrainingSpec, pp: int,
                      vpp: int) -> RankSplit | None:
    """Under ``first-last`` (Megatron-Core <= 0.12), the split priced and launched: the
    form that balances the ranks' work, output layer and loss included; else ``None``."""
    if training.pipeline_split != "first-last" or pp < 2:
        return None
    return rank_split(model.num_layers, pp, vpp, loss_stage_layers(model, training.seq_len))


@lru_cache(maxsize=4096)
def _balanced_split(num_layers: int, stages: int, loss_layers: int, mtp_layers: int) -> str:
    """The work-balanced layout string ('' where the plain rule applies), memoised: the
    scorer asks for the same few splits at every (pp, vpp) group."""
    counts = work_balanced_counts(num_layers, stages, loss_layers)
    return format_pipeline_layout(counts, mtp_layers) if counts else ""


@lru_cache(maxsize=256)
def loss_stage_layers(model: ModelSpec, seq_len: int) -> int:
    """Whole transformer layers' worth of work the last virtual stage runs besides its
    layers: output layer and loss plus the MTP blocks (each a layer, its eh-projection and
    another output layer), floor of their forward FLOPs per token over a mean layer's
    (Megatron-Core ``num_floating_point_operations`` terms, :mod:`.token_flops`).

    >>> from parsearch.model.presets import get_preset
    >>> loss_stage_layers(get_preset("deepseek-v3"), 4096)
    3
    """
    flops = model_flops_per_token(model, seq_len)
    extras = flops.logits_flops + flops.mtp_flops
    mean_layer = (flops.model_flops - extras) / model.num_layers
    return int(extras // mean_layer) if mean_layer > 0 else 0


def work_balanced_counts(num_layers: int, stages: int, loss_layers: int) -> tuple[int, ...]:
    """Layers per virtual stage when the last one also carries ``loss_layers`` layers'
    worth of work: the uneven rule over ``num_layers + k`` units, the last stage's first
    ``k`` being that work (``k`` = the largest ``<= loss_layers`` the last stage holds);
    empty when ``k`` is 0 (the plain uneven rule applies).

    >>> work_balanced_counts(61, 16, 3)
    (4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1)
    >>> work_balanced_counts(61, 32, 3)[:2], work_balanced_counts(61, 32, 3)[-2:]
    ((1, 2), (2, 0))
    """
    for k in range(loss_layers, 0, -1):
        base, extra = divmod(num_layers + k, stages)
        if base >= k:
            counts = [base] * stages
            for j in _extra_layer_order(stages)[:extra]:
                counts[j] += 1
            counts[-1] -= k
            return tuple(counts)
    return ()


def rows_by_split(pp: np.ndarray, vpp: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(pp, vpp, row indices)`` for each distinct pipeline split among many layouts.

    Vectorized scorers price a whole column of layouts at once, but the stage
    contents depend on ``(pp, vpp)``; this groups the rows so each split's
    stages are built once.

    >>> [(p, v, rows.tolist()) for p, v, rows in rows_by_split(np.array([2, 1, 2]),
    ...                                                       np.array([1, 1, 1]))]
    [(1, 1, [1]), (2, 1, [0, 2])]
    """
    pp_a = np.ravel(pp).astype(np.int64)
    vpp_a = np.ravel(vpp).astype(np.int64)
    if pp_a.size == 0:
        return
    # One integer key per row (pp major), one stable sort: rows keep their order per group.
    key = pp_a * (int(vpp_a.max()) + 1) + vpp_a
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.flatnonzero(np.diff(sorted_key)) + 1
    bounds = [0, *starts.tolist(), key.size]
    for a, b in pairwise(bounds):
        row = order[a]
        yield int(pp_a[row]), int(vpp_a[row]), order[a:b]

