"""Out-of-sample accuracy: leave one model family (or source) out, per GPU generation.

For every generation and every held-out group (a model family, or a source),
the generation's profile is calibrated on the other runs of that generation
(:func:`~parsearch.validation.fit.calibration.calibrate`) and the held-out runs
are predicted with it.  The report gives, per generation, the out-of-sample
MAPE beside the in-sample one (calibrated on everything), the pairwise order
accuracy within (model, GPU) groups for pairs whose measurements differ by
more than :data:`ORDER_MIN_GAP`, and the error band of each kind of
prediction (dense or MoE) from the out-of-sample log ratios.

A generation with a single family (Ampere: GPT-style models only) cannot be
validated by family; it falls back to leave-one-source-out and says so.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parsearch.cost.efficiency import EfficiencyProfile, ErrorBand
from parsearch.validation.fit.calibration import (
    PRIOR_WEIGHT,
    CalibrationResult,
    PreparedRow,
    calibrate,
    predict,
)
from parsearch.validation.published.run_conventions import MBRIDGE_HELDOUT

#: Pairs whose measurements differ by less than this are not counted for order accuracy
#: (run-to-run and release-to-release noise is of that order).
ORDER_MIN_GAP = 0.15
#: Quantiles of the out-of-sample log ratio that bound a prediction's error band.
BAND_QUANTILES = (0.1, 0.9)


@dataclass(frozen=True)
class RowPrediction:
    """One run, predicted in and out of sample."""

    id: str
    model: str
    gpu: str
    generation: str
    family: str
    source: str
    kind: str
    layout: str
    measured: float
    in_sample: float
    out_of_sample: float
    precision: str = ""

    @property
    def ape_in(self) -> float:
        return abs(self.in_sample / self.measured - 1.0)

    @property
    def ape_out(self) -> float:
        return abs(self.out_of_sample / self.measured - 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ape_in_sample": self.ape_in,
                "ape_out_of_sample": self.ape_out}


@dataclass(frozen=True)
class GenerationSummary:
    generation: str
    n: int
    holdout: str
    mape_in: float
    mape_out: float
    median_ape_out: float
    order_pairs: int
    order_accuracy_in: float
    order_accuracy_out: float
    fits_on_bound: int
    folds: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class FoldFit:
    """One fold: the generation's runs but one family (or source), fitted, and how
    the fit went; ``mape_out`` is over the held-out runs."""

    generation: str
    held_out: str
    n_held_out: int
    mape_out: float
    values: dict[str, float]
    on_bound: tuple[str, ...]
    held_at_prior: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "on_bound": list(self.on_bound),
                "held_at_prior": list(self.held_at_prior)}


@dataclass(frozen=True)
class CrossValidation:
    rows: tuple[RowPrediction, ...]
    generations: tuple[GenerationSummary, ...]
    bands: dict[str, ErrorBand] = field(default_factory=dict)
    in_sample_profiles: dict[str, CalibrationResult] = field(default_factory=dict)
    folds: tuple[FoldFit, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "generations": [g.to_dict() for g in self.generations],
            "bands": {k: b.__dict__ for k, b in self.bands.items()},
            "rows": [r.to_dict() for r in self.rows],
            "folds": [f.to_dict() for f in self.folds],
            "in_sample_fits": {g: {"fitted": list(c.fitted), "on_bound": list(c.on_bound),
                                   "held_at_prior": list(c.unresolved),
                                   "values": {n: c.profile.get(n) for n in c.fitted}}
                               for g, c in self.in_sample_profiles.items()},
        }


def _holdout_key(row: PreparedRow, by: str) -> str:
    return row.family if by == "family" else row.run.source_tag


def pairwise_order_accuracy(groups: dict[tuple[str, str], list[tuple[float, float]]],
                            min_gap: float = ORDER_MIN_GAP) -> tuple[int, float]:
    """(pairs counted, share ordered right) over pairs within each group.

    Each group holds (measured, predicted) points; a pair counts when the larger
    measurement exceeds the smaller by more than ``min_gap``.

    >>> pairwise_order_accuracy({("m", "g"): [(100.0, 10.0), (130.0, 12.0), (110.0, 9.0)]})
    (2, 1.0)
    >>> pairwise_order_accuracy({("m", "g"): [(100.0, 12.0), (130.0, 10.0)]})
    (1, 0.0)
    """
    total = right = 0
    for points in groups.values():
        for i in range(len(points)):
            for j in range(i + 1, len(points)):
                (mi, pi), (mj, pj) = points[i], points[j]
                if max(mi, mj) <= (1.0 + min_gap) * min(mi, mj):
                    continue
                total += 1
                right += int((mi - mj) * (pi - pj) > 0)
    return total, (right / total if total else math.nan)


def _order(rows: Sequence[RowPrediction], attr: str) -> tuple[int, float]:
    groups: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        groups[(r.model.split(" (")[0], r.gpu)].append((r.measured, getattr(r, attr)))
    return pairwise_order_accuracy(groups)


def cross_validate(rows: Sequence[PreparedRow], *, by: str = "family",
                   max_evaluations: int = 150,
                   profiles: dict[str, EfficiencyProfile] | None = None,
                   prior_weight: float = PRIOR_WEIGHT) -> CrossValidation:
    """Leave-one-``by``-out (``family`` or ``source``) per GPU generation."""
    if by not in ("family", "source"):
        raise ValueError(f"by must be family or source, got {by!r}")
    out_rows: list[RowPrediction] = []
    summaries: list[GenerationSummary] = []
    fits: dict[str, CalibrationResult] = {}
    fold_fits: list[FoldFit] = []
    by_generation: dict[str, list[PreparedRow]] = defaultdict(list)
    for row in rows:
        by_generation[row.generation].append(row)
    for generation, members in sorted(by_generation.items()):
        start = (profiles or {}).get(generation)
        holdout = by
        if len({_holdout_key(r, by) for r in members}) < 2:
            holdout = "source" if by == "family" else "family"
        keys = sorted({_holdout_key(r, holdout) for r in members})
        full = calibrate(members, start, max_evaluations=max_evaluations,
                         prior_weight=prior_weight)
        fits[generation] = full
        in_pred = predict(members, full.profile)
        oos = np.full(len(members), np.nan)
        for key in keys:
            test = [i for i, r in enumerate(members) if _holdout_key(r, holdout) == key]
            train = [r for r in members if _holdout_key(r, holdout) != key]
            held_out = [members[i] for i in test]
            if len(keys) < 2 or not train:
                oos[test] = predict(held_out, start)
                continue
            fold = calibrate(train, start, max_evaluations=max_evaluations,
                             prior_weight=prior_weight)
            oos[test] = predict(held_out, fold.profile)
            measured = np.array([r.measured for r in held_out])
            fold_fits.append(FoldFit(
                generation=generation, held_out=key, n_held_out=len(test),
                mape_out=float(np.mean(np.abs(oos[test] / measured - 1.0))),
                values={n: fold.profile.get(n) for n in fold.fitted},
                on_bound=fold.on_bound, held_at_prior=fold.unresolved))
        gen_rows = [
            RowPrediction(id=r.id, model=r.run.model, gpu=r.run.gpu, generation=generation,
                          family=r.family, source=r.run.source_tag, kind=r.kind,
                          layout=r.run.layout.key(), measured=r.measured,
                          in_sample=float(a), out_of_sample=float(b),
                          precision=r.run.precision)
            for r, a, b in zip(members, in_pred, oos, strict=True)]
        out_rows.extend(gen_rows)
        pairs, acc_out = _order(gen_rows, "out_of_sample")
        _, acc_in = _order(gen_rows, "in_sample")
        summaries.append(GenerationSummary(
            generation=generation, n=len(gen_rows), holdout=holdout,
            mape_in=float(np.mean([r.ape_in for r in gen_rows])),
            mape_out=float(np.mean([r.ape_out for r in gen_rows])),
            median_ape_out=float(np.median([r.ape_out for r in gen_rows])),
            order_pairs=pairs, order_accuracy_in=acc_in, order_accuracy_out=acc_out,
            fits_on_bound=sum(bool(f.on_bound) for f in fold_fits if f.generation == generation)
            + int(not full.ok), folds=len(keys)))
    return CrossValidation(tuple(out_rows), tuple(summaries), error_bands(out_rows, by), fits,
                           tuple(fold_fits))


def heldout_predictions(rows: Sequence[PreparedRow],
                        profiles: dict[str, EfficiencyProfile]) -> list[RowPrediction]:
    """Never-fitted runs predicted with their generation's fitted profile.

    No fit saw these runs, so the prediction is out of sample as it stands: it goes in
    both the in- and out-of-sample fields.  Runs of a generation without a profile here
    are left out.
    """
    out = []
    for row in rows:
        profile = profiles.get(row.generation)
        if profile is None:
            continue
        predicted = float(predict([row], profile)[0])
        out.append(RowPrediction(id=row.id, model=row.run.model, gpu=row.run.gpu,
                                 generation=row.generation, family=row.family,
                                 source=row.run.source_tag, kind=row.kind,
                                 layout=row.run.layout.key(), measured=row.measured,
                                 in_sample=predicted, out_of_sample=predicted,
                                 precision=row.run.precision))
    return out


def error_bands(rows: Sequence[RowPrediction], method: str,
                superseded: frozenset[str] = frozenset()) -> dict[str, ErrorBand]:
    """Per ``generation/kind`` (e.g. ``hopper/moe``) quantiles of the out-of-sample log ratio.

    ``rows`` may mix the cross-validation's rows with never-fitted runs
    (:func:`heldout_predictions`): held-out models' runs and, by id in ``superseded``,
    the calibration table's runs of superseded release lines; a band's label counts both.
    """
    logs: dict[str, list[float]] = defaultdict(list)
    precisions: dict[str, set[str]] = defaultdict(set)
    heldout: dict[str, int] = defaultdict(int)
    older: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.out_of_sample > 0 and math.isfinite(r.out_of_sample):
            key = f"{r.generation}/{r.kind}"
            logs[key].append(math.log(r.out_of_sample / r.measured))
            heldout[key] += int(r.source == MBRIDGE_HELDOUT)
            older[key] += int(r.id in superseded)
            if r.precision:
                precisions[key].add(r.precision)
    bands = {}
    for key, values in sorted(logs.items()):
        lo, hi = np.quantile(values, BAND_QUANTILES)
        label = f"leave-one-{method}-out"
        if heldout[key]:
            label += f" + {heldout[key]} held-out Megatron-Bridge runs"
        if older[key]:
            label += f" + {older[key]} runs of superseded releases"
        bands[key] = ErrorBand(float(lo), float(hi), len(values), label,
                               tuple(sorted(precisions[key])))
    return bands
