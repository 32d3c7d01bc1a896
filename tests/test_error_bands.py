"""Error bands: quantiles of out-of-sample residuals, pooled over cross-validation and
never-fitted held-out runs."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.validation.fit.crossval import RowPrediction, error_bands
from parsearch.validation.published.run_conventions import MBRIDGE_HELDOUT


def _row(i: int, ratio: float, *, source: str = "MBRIDGE", kind: str = "dense",
         precision: str = "fp8") -> RowPrediction:
    measured = 1000.0
    return RowPrediction(id=f"x{i}", model="m", gpu="H100-SXM-80GB", generation="hopper",
                         family="f", source=source, kind=kind, layout="l", measured=measured,
                         in_sample=measured * ratio, out_of_sample=measured * ratio,
                         precision=precision)


@settings(max_examples=60, deadline=None)
@given(cv=st.lists(st.floats(0.5, 2.0), min_size=1, max_size=30),
       held=st.lists(st.floats(0.5, 2.0), max_size=30))
def test_pooled_band_counts_its_runs_and_brackets_the_middle(cv: list[float],
                                                             held: list[float]) -> None:
    rows = [_row(i, r) for i, r in enumerate(cv)]
    rows += [_row(100 + i, r, source=MBRIDGE_HELDOUT) for i, r in enumerate(held)]
    band = error_bands(rows, "family")["hopper/dense"]
    logs = sorted(math.log(r) for r in [*cv, *held])
    assert band.n == len(logs)
    assert logs[0] - 1e-12 <= band.low <= band.high <= logs[-1] + 1e-12
    inside = sum(band.low - 1e-12 <= v <= band.high + 1e-12 for v in logs)
    assert inside >= 0.8 * len(logs) - 2  # the 10th-90th percentile range
    assert band.method.startswith("leave-one-family-out")
    assert (f"+ {len(held)} held-out" in band.method) == bool(held)


@settings(max_examples=40, deadline=None)
@given(n_cv=st.integers(1, 10), n_older=st.integers(0, 10))
def test_superseded_release_runs_are_pooled_and_counted(n_cv: int, n_older: int) -> None:
    rows = [_row(i, 1.0 + 0.01 * i) for i in range(n_cv)]
    older = [_row(100 + i, 0.9) for i in range(n_older)]
    band = error_bands(rows + older, "family",
                       superseded=frozenset(r.id for r in older))["hopper/dense"]
    assert band.n == n_cv + n_older
    assert ("runs of superseded releases" in band.method) == bool(n_older)
    if n_older:
        assert f"+ {n_older} runs of superseded releases" in band.method


def test_held_out_runs_widen_a_one_sided_band() -> None:
    """Four runs of one family all measured 17-23% faster than predicted gave a band that
    excludes the prediction itself; runs of a new model measured slower widen it across."""
    cv = [_row(i, r) for i, r in enumerate((0.81, 0.83, 0.84, 0.85))]
    alone = error_bands(cv, "family")["hopper/dense"]
    assert alone.high < 0.0
    pooled = error_bands(cv + [_row(9 + i, r, source=MBRIDGE_HELDOUT)
                               for i, r in enumerate((1.05, 1.09, 1.14))],
                         "family")["hopper/dense"]
    assert pooled.low < 0.0 < pooled.high
    assert pooled.precisions == ("fp8",)


def test_shipped_hopper_dense_band_rests_on_more_than_one_family() -> None:
    band = efficiency_for_gpu("h100-sxm").uncertainty["dense"]
    assert "held-out Megatron-Bridge runs" in band.method and band.n >= 7
    assert band.low < 0.0 < band.high  # no longer a one-sided bias claim
