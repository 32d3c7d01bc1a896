"""Pipeline splits of Megatron-Core before layout strings (``--pipeline-split first-last``).

Megatron-Core 0.9 to 0.12 has no ``--pipeline-model-parallel-layout`` (it first appears in
Megatron-Core 0.13.0's ``arguments.py``).  It builds ``L_r / vpp`` layers in every model
chunk of pipeline rank ``r`` (``transformer_block.py::get_num_layers_to_build``, core_v0.11.0:
"num_layers_per_pipeline_rank should be divisible by vp_size"), with ``L_r`` one of:

* ``L / pp`` on every rank (the plain split);
* ``(L + a) / pp`` with the embedding and/or the loss counted as a layer
  (``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``):
  the first (last) model chunk builds one transformer layer fewer;
* ``f`` on the first rank and ``l`` on the last, the rest shared evenly by the middle ranks
  (``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``;
  ``TransformerConfig.__post_init__`` requires each to divide by ``vpp``, and rejects them
  together with the embedding or loss accounting).

:func:`rank_split` picks, among the forms that divide, the one whose slowest rank holds the
least work: the last rank also runs the output layer and loss, worth ``loss_layers``
transformer layers (:func:`parsearch.cost.stages.loss_stage_layers`).  Ties go to the plain
split, then the accounting, then the fewest layers moved to the first and last rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class RankSplit:
    """One Megatron-Core <= 0.12 split: layers per rank and the flags that produce it."""

    first: int  # transformer layers on the first rank (all its chunks)
    middle: int  # on every other rank
    last: int  # on the last rank
    account_embedding: bool = False
    account_loss: bool = False

    @property
    def accounted(self) -> bool:
        """The embedding or the loss is counted as a layer."""
        return self.account_embedding or self.account_loss

    @property
    def first_last(self) -> bool:
        """The split needs ``--decoder-first/last-pipeline-num-layers``."""
        return not self.accounted and (self.first != self.middle or self.last != self.middle)

    def virtual_stage_counts(self, pp: int, vpp: int) -> tuple[int, ...]:
        """Layers per virtual stage ``j = chunk * pp + rank``.

        >>> RankSplit(8, 16, 16).virtual_stage_counts(4, 8)[:5]
        (1, 2, 2, 2, 1)
        >>> RankSplit(6, 7, 6, True, True).virtual_stage_counts(4, 1)
        (6, 7, 7, 6)
        """
        if self.accounted:  # every chunk holds middle/vpp units; the first/last one fewer
            counts = [self.middle // vpp] * (pp * vpp)
            counts[0] -= self.account_embedding
            counts[-1] -= self.account_loss
            return tuple(counts)
        totals = [self.first, *[self.middle] * (pp - 2), self.last] if pp > 1 else [self.first]
        return tuple(totals[j % pp] // vpp for j in range(pp * vpp))


def _candidates(num_layers: int, pp: int, vpp: int) -> list[tuple[int, RankSplit]]:
    """Every split Megatron-Core <= 0.12 builds, with its preference (0 plain, 1 accounting,
    2 first/last)."""
    stages = pp * vpp
    out: list[tuple[int, RankSplit]] = []
    if num_layers % stages == 0:
        share = num_layers // pp
        out.append((0, RankSplit(share, share, share)))
    if pp > 1:
        for embedding, loss in ((False, True), (True, True), (True, False)):
            total = num_layers + embedding + loss
            if total % stages == 0:
                share = total // pp
                # the accounted chunk keeps at least zero transformer layers
                out.append((1, RankSplit(share - embedding, share, share - loss,
                                         embedding, loss)))
        for first in range(vpp, num_layers + 1, vpp):
            for last in range(vpp, num_layers - first + 1, vpp):
                rest = num_layers - first - last
                if pp == 2:
                    if rest == 0:
                        out.append((2, RankSplit(first, first, last)))
                    continue
                if rest >= (pp - 2) * vpp and rest % ((pp - 2) * vpp) == 0:
                    middle = rest // (pp - 2)
                    if first != middle or last != middle:
                        out.append((2, RankSplit(first, middle, last)))
    return out


@lru_cache(maxsize=4096)
def rank_split(num_layers: int, pp: int, vpp: int, loss_layers: int = 0) -> RankSplit | None:
    """The best-balanced split Megatron-Core <= 0.12 builds for ``(pp, vpp)``, or ``None``.

    >>> rank_split(28, 4, 7)                  # 7 layers a rank, one a chunk
    RankSplit(first=7, middle=7, last=7, account_embedding=False, account_loss=False)
    >>> rank_split(28, 2, 9) is None          # no rank count divides by 9
    True
    >>> rank_split(56, 4, 8)                  # 8 + 16 + 16 + 16: the first rank lighter
    RankSplit(first=8, middle=16, last=16, account_embedding=False, account_loss=False)
    >>> rank_split(61, 8, 1, loss_layers=2)   # the last rank also runs the head
    RankSplit(first=7, middle=8, last=6, account_embedding=False, account_loss=False)
    """
    if pp == 1:
        return RankSplit(num_layers, num_layers, num_layers) if vpp == 1 else None
    found = _candidates(num_layers, pp, vpp)
    if not found:
        return None

    def work(item: tuple[int, RankSplit]) -> tuple[int, int, int]:
        rank, split = item[0], item[1]
        slowest = max(split.first, split.middle, split.last + loss_layers)
        return slowest, rank, abs(split.first - split.middle) + abs(split.last - split.middle)

    return min(found, key=work)[1]
