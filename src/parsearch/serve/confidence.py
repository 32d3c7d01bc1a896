"""How sure a serving ranking is: measured order agreement by predicted gap.

Two serving layouts whose predicted throughputs differ by a few percent are not told
apart by the model: its out-of-sample error on either is larger than the gap.  The
file ``cost_models/serving/order_confidence.yaml`` holds what the held-out serving
measurements say about it (``benchmarks/serving_order_confidence.py``, rows kept out
of every fit): for pairs of layouts measured on the same question (source, engine,
model, GPU, precision, lengths, load), the share whose measured order matched the
predicted one, binned by the predicted gap |log(pred_a / pred_b)|.  Its ``tie_band``
is the smallest gap from which every bin above kept the order in at least
``min_right`` of its pairs; layouts closer than that to the best are marked as ties
(``~``) by ``parsearch serve``, which keeps their point-estimate order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from parsearch.errors import SpecError
from parsearch.resources import data_dir


@dataclass(frozen=True)
class GapBin:
    """Pairs whose predicted gap |log ratio| is at least ``gap`` (up to the next bin)."""

    gap: float
    pairs: int
    kept: int  # pairs whose measured order matched the predicted one

    @property
    def right(self) -> float:
        """Share of the bin's pairs that kept their order (1 for an empty bin)."""
        return self.kept / self.pairs if self.pairs else 1.0


@dataclass(frozen=True)
class OrderConfidence:
    """Measured order agreement of serving predictions, by predicted gap."""

    measured: str
    source: str
    min_right: float
    tie_band: float
    bins: tuple[GapBin, ...]

    def right_share(self, gap: float) -> float | None:
        """Share of held-out pairs at predicted gap ``gap`` (|log ratio|) that kept their
        measured order, made non-decreasing in the gap (:func:`monotone_shares`: a wider
        predicted gap is never less sure; the raw bins dip where a bin holds few misses);
        None below the first bin (never: it starts at 0)."""
        share = None
        for b, right in zip(self.bins, self.monotone, strict=True):
            if gap >= b.gap:
                share = right
        return share

    @cached_property
    def monotone(self) -> list[float]:
        """:func:`monotone_shares` of the bins, computed once."""
        return monotone_shares(self.bins)

    def pairs_below_band(self) -> tuple[int, float]:
        """(pairs, share right) of the bins under the tie band, pooled."""
        return _pooled([b for b in self.bins if b.gap < self.tie_band])

    def pairs_from_band(self) -> tuple[int, float]:
        """(pairs, share right) of the bins at and above the tie band, pooled."""
        return _pooled([b for b in self.bins if b.gap >= self.tie_band])


def _pooled(bins: list[GapBin]) -> tuple[int, float]:
    n = sum(b.pairs for b in bins)
    return n, (sum(b.kept for b in bins) / n if n else 0.0)


def confidence_path() -> Path:
    return data_dir("cost_models") / "serving" / "order_confidence.yaml"


def load_order_confidence(path: Path | None = None) -> OrderConfidence:
    """The shipped (or given) order-confidence table, checked."""
    path = path or confidence_path()
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(f"cannot read the serving order confidence {path}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("bins"), list) or not data["bins"]:
        raise SpecError(f"{path}: needs a non-empty 'bins' list of {{gap, pairs, kept}}")
    bins = []
    for i, item in enumerate(data["bins"]):
        try:
            b = GapBin(float(item["gap"]), int(item["pairs"]), int(item["kept"]))
        except (KeyError, TypeError, ValueError):
            raise SpecError(f"{path}: bins[{i}] needs numbers gap, pairs and kept, "
                            f"got {item!r}") from None
        if b.gap < 0 or not 0 <= b.kept <= b.pairs:
            raise SpecError(f"{path}: bins[{i}] out of range (gap >= 0, 0 <= kept <= "
                            f"pairs): {item!r}")
        bins.append(b)
    if [b.gap for b in bins] != sorted({b.gap for b in bins}) or bins[0].gap != 0.0:
        raise SpecError(f"{path}: bin gaps must start at 0 and increase")
    band = float(data.get("tie_band", -1))
    if not 0.0 <= band < 1.0:
        raise SpecError(f"{path}: tie_band must be in [0, 1), got {data.get('tie_band')!r}")
    return OrderConfidence(measured=str(data.get("measured", "")),
                           source=str(data.get("source", "")),
                           min_right=float(data.get("min_right", 0.95)), tie_band=band,
                           bins=tuple(bins))


def monotone_shares(bins: tuple[GapBin, ...] | list[GapBin]) -> list[float]:
    """The bins' kept shares made non-decreasing in the gap by pooling adjacent violators
    (weighted by pairs: the isotonic fit of the share to the gap).

    >>> monotone_shares([GapBin(0.0, 12, 10), GapBin(0.1, 25, 20), GapBin(0.2, 4, 4)])
    [0.8108108108108109, 0.8108108108108109, 1.0]
    """
    blocks: list[list[int]] = []  # [kept, pairs, bins pooled]
    for b in bins:
        blocks.append([b.kept, b.pairs, 1])
        while len(blocks) > 1 and _share(blocks[-2]) > _share(blocks[-1]):
            kept, pairs, count = blocks.pop()
            blocks[-1] = [blocks[-1][0] + kept, blocks[-1][1] + pairs, blocks[-1][2] + count]
    out: list[float] = []
    for block in blocks:
        out += [_share(block)] * block[2]
    return out


def _share(block: list[int]) -> float:
    return block[0] / block[1] if block[1] else 1.0


def band_from_bins(bins: tuple[GapBin, ...] | list[GapBin], min_right: float) -> float:
    """The smallest bin edge from which every bin (with pairs) kept the measured order in
    at least ``min_right`` of its pairs; the last edge when none does.

    >>> band_from_bins([GapBin(0.0, 10, 6), GapBin(0.05, 10, 9), GapBin(0.1, 50, 50)], 0.95)
    0.1
    """
    band = bins[-1].gap
    for b in reversed(bins):
        if b.pairs and b.right < min_right:
            break
        band = b.gap
    return band


def gap_of(best_tokens_per_s: float, tokens_per_s: float) -> float:
    """Predicted gap |log ratio| of a layout to the best."""
    if best_tokens_per_s <= 0 or tokens_per_s <= 0:
        return math.inf
    return abs(math.log(best_tokens_per_s / tokens_per_s))


def serving_tie_note(conf: OrderConfidence) -> str:
    """The note under a serving table with ties: the band and what it rests on."""
    n_in, right_in = conf.pairs_below_band()
    n_out, right_out = conf.pairs_from_band()
    return (f"~ tie: within a predicted gap of {conf.tie_band:.2f} (log ratio, about "
            f"{1.0 - math.exp(-conf.tie_band):.0%}) of the best, closer than the tool can tell: "
            f"held-out pairs of layouts measured on the same question kept their predicted "
            f"order in {right_in:.1%} of {n_in} pairs under that gap and {right_out:.1%} of "
            f"{n_out} from it (measured {conf.measured}).\n"
            "  Ties keep the order of the point estimate; measure them to choose.")
