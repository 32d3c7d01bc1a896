"""Tied factors in calibration: FP8 GEMMs follow BF16 by the measured large-matmul ratio,
attention backward follows forward by the ratio of their cited priors."""

from __future__ import annotations

import pytest

from parsearch.cost.efficiency import load_efficiency_profile
from parsearch.topology.hardware import generation_profiles
from parsearch.validation.fit.calibration import (
    calibrate,
    candidate_factors,
    factor_prior,
    prepare_rows,
)
from parsearch.validation.fit.factor_ties import (
    ATTENTION_ANCHOR,
    ATTENTION_TIED,
    GEMM_ANCHOR,
    anchor_prior,
    factor_ties,
    with_ties,
)
from parsearch.validation.published.published_runs import load_published_runs


@pytest.fixture(scope="module")
def hopper_fp8_rows():
    # Every release line: the tie machinery is under test here, not the fitted set.
    rows = [r for r in prepare_rows(load_published_runs(), current_only=False)
            if r.generation == "hopper" and r.cost_model.training.precision == "fp8"]
    assert len(rows) >= 8
    return rows[:8]


@pytest.mark.parametrize("generation", ["hopper", "blackwell"])
def test_the_ratio_is_the_generations_measured_fp8_over_bf16_ceiling(generation: str) -> None:
    profile = load_efficiency_profile(generation)
    measured = [p for p in generation_profiles(tuple(profile.gpus))
                if {"bf16", "fp8"} <= set(p.large_matmul_fraction)]
    assert len(measured) >= 2  # a mean over several parts, not one GPU's number
    bf16 = sum(p.large_matmul_fraction["bf16"] for p in measured) / len(measured)
    fp8 = sum(p.large_matmul_fraction["fp8"] for p in measured) / len(measured)
    anchor, ratio = factor_ties(profile)["gemm_efficiency.fp8"]
    assert anchor == GEMM_ANCHOR and ratio == pytest.approx(fp8 / bf16)
    assert 0.85 < ratio < 1.0  # FP8 reaches a smaller share of its (2x) peak than BF16


def test_a_generation_without_fp8_ceilings_has_no_gemm_tie() -> None:
    ampere = load_efficiency_profile("ampere")
    assert "gemm_efficiency.fp8" not in factor_ties(ampere)
    assert factor_prior(ampere, GEMM_ANCHOR) == ampere.priors[GEMM_ANCHOR]


@pytest.mark.parametrize("generation", ["ampere", "hopper", "blackwell"])
def test_attention_backward_follows_forward_below_it(generation: str) -> None:
    """Fused attention's backward reaches a smaller share of the peak than its forward
    (FlashAttention-2/3): the tie keeps that order wherever calibration moves forward."""
    profile = load_efficiency_profile(generation)
    anchor, ratio = factor_ties(profile)[ATTENTION_TIED]
    assert anchor == ATTENTION_ANCHOR
    priors = profile.priors
    assert ratio == pytest.approx(priors[ATTENTION_TIED].value / priors[ATTENTION_ANCHOR].value)
    assert 0.6 <= ratio < 1.0
    assert profile.attention_backward_efficiency == pytest.approx(
        ratio * profile.attention_forward_efficiency, rel=1e-3)


@pytest.mark.parametrize("generation", ["hopper", "blackwell"])
def test_an_anchor_range_keeps_its_tied_factors_inside_their_cited_ranges(
        generation: str) -> None:
    profile = load_efficiency_profile(generation)
    ties = factor_ties(profile)
    for anchor_name in (GEMM_ANCHOR, ATTENTION_ANCHOR):
        prior = anchor_prior(profile, anchor_name, ties)
        own = profile.priors[anchor_name]
        assert own.low <= prior.low <= prior.value <= prior.high <= own.high
        for value in (prior.low, prior.value, prior.high):
            tied = with_ties({anchor_name: value}, ties)
            for name, (to, _) in ties.items():
                if to == anchor_name:
                    assert profile.priors[name].contains(tied[name]), (name, value)


def test_with_ties_never_overrides_a_value_given_explicitly() -> None:
    ties = {"gemm_efficiency.fp8": (GEMM_ANCHOR, 0.9)}
    assert with_ties({GEMM_ANCHOR: 0.7}, ties)["gemm_efficiency.fp8"] == pytest.approx(0.63)
    given = {GEMM_ANCHOR: 0.7, "gemm_efficiency.fp8": 0.5}
    assert with_ties(given, ties)["gemm_efficiency.fp8"] == 0.5
    assert with_ties({"memory_bound_factor": 1.0}, ties) == {"memory_bound_factor": 1.0}


def test_fp8_runs_calibrate_the_shared_gemm_factor(hopper_fp8_rows) -> None:
    profile = load_efficiency_profile("hopper")
    names = candidate_factors(hopper_fp8_rows, profile)
    assert GEMM_ANCHOR in names and "gemm_efficiency.fp8" not in names
    result = calibrate(hopper_fp8_rows, profile, max_evaluations=40)
    assert GEMM_ANCHOR in result.fitted and "gemm_efficiency.fp8" not in result.fitted
    _, ratio = factor_ties(profile)["gemm_efficiency.fp8"]
    fitted = result.profile.gemm_efficiency
    assert fitted["fp8"] == pytest.approx(fitted["bf16"] * ratio)
    assert not result.profile.out_of_range()


def test_naming_fp8_explicitly_fits_it_on_its_own(hopper_fp8_rows) -> None:
    profile = load_efficiency_profile("hopper")
    result = calibrate(hopper_fp8_rows, profile, factors=["gemm_efficiency.fp8"],
                       max_evaluations=40)
    assert result.fitted == ("gemm_efficiency.fp8",)
    # BF16 stays at its prior: nothing ties it to the FP8 value that was fitted.
    assert result.profile.gemm_efficiency["bf16"] == pytest.approx(
        profile.priors[GEMM_ANCHOR].value)


@pytest.mark.parametrize("generation", ["hopper", "blackwell"])
def test_the_shipped_profile_carries_the_tie(generation: str) -> None:
    profile = load_efficiency_profile(generation)
    _, ratio = factor_ties(profile)["gemm_efficiency.fp8"]
    gemm = profile.gemm_efficiency
    assert gemm["fp8"] == pytest.approx(ratio * gemm["bf16"], rel=1e-3)


@pytest.mark.parametrize(("generation", "fitted"), [("hopper", True), ("blackwell", False)])
def test_attention_is_fitted_only_where_the_runs_tell_it_apart(generation: str,
                                                                fitted: bool) -> None:
    """With backward tied to it, attention's cited range moves Llama 3 8B's Blackwell
    runs by 18%, but GEMMs and memory-bound work can mimic that (what they cannot stays
    under the 10% loss scale): it keeps its prior there.  Hopper's long-context Mixtral
    runs move with attention as nothing else does, so it is fitted there."""
    from parsearch.validation.fit.calibration import resolved, separable

    rows = [r for r in prepare_rows(load_published_runs()) if r.generation == generation]
    profile = load_efficiency_profile(generation)
    profile = profile.with_values({n: p.value for n, p in profile.priors.items()})
    informed = [n for n in candidate_factors(rows, profile) if resolved(rows, profile, n)]
    assert "attention_forward_efficiency" in informed
    assert ("attention_forward_efficiency" in separable(informed, rows, profile)) is fitted
