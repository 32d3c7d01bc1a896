"""Accuracy against the published runs, with one efficiency profile per GPU generation.

These are golden numbers from published measurements (see
src/parsearch/data/PROVENANCE.md): if a change to the cost model makes the
predictions worse than the targets, this fails.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from parsearch.validation.published.published_runs import load_published_runs
from parsearch.validation.published.recipes import load_run_setups
from parsearch.validation.published.runs import memory_saving_candidates, validate_runs


@pytest.fixture(scope="module")
def report():
    return validate_runs(load_published_runs())


def test_in_sample_accuracy_of_the_shipped_profiles(report) -> None:
    """In-sample only (the profiles were fitted to these rows); the out-of-sample numbers
    come from ``parsearch validate --cv family`` (docs/accuracy.md)."""
    assert len(report.rows) >= 70
    assert len(report.superseded) >= 15  # older release lines, scored apart
    assert report.mape <= 0.20, f"MAPE {report.mape:.3f}"
    assert report.median_ape <= 0.12, f"median APE {report.median_ape:.3f}"
    assert report.spearman >= 0.60, f"Spearman {report.spearman:.3f}"


def test_no_published_run_is_predicted_out_of_memory_under_its_recipe(report) -> None:
    # r0259's table shares one MBS cell (2) between two configurations; its own GA (16)
    # and its recipe give 1 for the one measured (data/RUN_SETUPS.md).
    assert not [r.id for r in report.rows if not r.fits]
    assert not [r.id for r in report.rows if r.assumed], "a reading guessed a memory saving"


def test_leave_one_source_out_on_ampere_is_within_ten_percent() -> None:
    from parsearch.validation.fit.calibration import prepare_rows
    from parsearch.validation.fit.crossval import cross_validate

    rows = [r for r in prepare_rows(load_published_runs()) if r.generation == "ampere"]
    cv = cross_validate(rows, by="source", max_evaluations=60)
    (summary,) = cv.generations
    assert summary.holdout == "source" and summary.folds == 2
    assert summary.mape_out <= 0.10, f"out-of-sample MAPE {summary.mape_out:.3f}"
    assert summary.mape_in <= summary.mape_out + 1e-9 or summary.mape_in <= 0.05
    # the report names what the fit left at the prior, and never both fits and holds one
    fit = cv.to_dict()["in_sample_fits"]["ampere"]
    assert fit["held_at_prior"] == list(cv.in_sample_profiles["ampere"].unresolved)
    assert fit["held_at_prior"] and not set(fit["held_at_prior"]) & set(fit["fitted"])
    # each fold says what it held out, how it did there, and which factor hit a bound
    assert sorted(f.held_out for f in cv.folds) == sorted({r.run.source_tag for r in rows})
    assert sum(f.n_held_out for f in cv.folds) == len(rows)
    in_sample_bound = int(bool(cv.in_sample_profiles["ampere"].on_bound))
    assert summary.fits_on_bound == sum(bool(f.on_bound) for f in cv.folds) + in_sample_bound
    for fold in cv.folds:
        assert set(fold.on_bound) <= set(fold.values)
        held = [r.ape_out for r in cv.rows if r.source == fold.held_out]
        assert fold.mape_out == pytest.approx(sum(held) / len(held))
    assert [f["held_out"] for f in cv.to_dict()["folds"]] == [f.held_out for f in cv.folds]


def test_every_source_and_generation_is_covered(report) -> None:
    sources = {r.source for r in report.rows}
    assert {"NAR21", "KOR22", "MBRIDGE", "FOLD"} <= sources
    gpus = {r.gpu.split(" ")[0] for r in report.rows}
    assert {"A100-SXM-80GB", "H100-SXM-80GB", "B200", "GB200", "GB300"} <= gpus


def test_rows_report_consistent_errors(report) -> None:
    for row in report.rows:
        assert row.predicted_tokens_per_s_per_gpu > 0
        expected = abs(row.predicted_tokens_per_s_per_gpu - row.measured_tokens_per_s_per_gpu)
        assert row.ape == pytest.approx(expected / row.measured_tokens_per_s_per_gpu)
        assert math.isfinite(row.memory_gib)


def test_skips_are_explained(report) -> None:
    reasons = dict(report.skipped)
    assert all(reasons.values())
    nemotron = [r.id for r in load_published_runs() if r.model.startswith("Nemotron")]
    assert nemotron and all("Mamba" in reasons[i] for i in nemotron)


def test_all_releases_mode_scores_every_measurement() -> None:
    full = validate_runs(load_published_runs(), deduplicate=False)
    latest = validate_runs(load_published_runs())
    assert len(full.rows) > len(latest.rows)
    assert {r.id for r in latest.rows} <= {r.id for r in full.rows}


def test_memory_readings_never_override_stated_settings() -> None:
    runs = {r.id: r for r in load_published_runs()}
    stated = runs["r0331"]  # KOR22 GPT-175B: selective recompute stated by the source
    candidates = memory_saving_candidates(stated)
    assert {layout.recompute for _t, layout, _n in candidates} == {"selective"}
    setups = load_run_setups()
    unstated = next(r for r in runs.values()
                    if any(a.startswith("recompute not stated") for a in r.assumptions)
                    and (r.id not in setups or setups[r.id].recompute is None))
    modes = [layout.recompute for _t, layout, _n in memory_saving_candidates(unstated)]
    assert modes[:3] == ["none", "selective", "full"]
    # Where the public recipe states the recompute, the reading follows it, no guessing.
    from_recipe = runs["r0250"]  # Llama3 8B H100 25.11: full recompute of 5 layers
    readings = memory_saving_candidates(from_recipe)
    assert {layout.recompute for _t, layout, _n in readings} == {"full"}
    fsdp = replace(unstated, notes="FSDP=64")
    assert all(t.fsdp for t, _l, _n in memory_saving_candidates(fsdp))


def test_recipe_recompute_layers_count_only_with_the_block_method() -> None:
    """Megatron's --recompute-num-layers is a layer count with --recompute-method block but
    a checkpoint-group size with uniform (every layer recomputed)."""
    from parsearch.cost.analytic import CostOptions
    from parsearch.validation.published.recipes import apply_setup

    setups = load_run_setups()
    runs = {r.id: r for r in load_published_runs()}
    for run_id, layers in (("r0316", None), ("r0250", 5)):  # NAR21 uniform; Bridge block
        run = runs[run_id]
        training, _ = apply_setup(setups[run_id], _training(run), CostOptions(), moe=False,
                                  precision=run.precision)
        assert training.recompute_num_layers == layers


def test_selective_recompute_with_an_empty_module_list_recomputes_nothing() -> None:
    """Megatron-Core defaults the modules to core_attn only when the list is None; a recipe
    that sets ``recompute_modules=[]`` (DeepSeek-V3 GB300, r0001) recomputes nothing, while a
    listed module is still priced."""
    setups = load_run_setups()
    runs = {r.id: r for r in load_published_runs()}
    empty = [i for i in ("r0001", "r0040", "r0041", "r0228", "r0229") if i in setups]
    assert empty
    for run_id in empty:
        assert setups[run_id].recompute == "none"
        readings = memory_saving_candidates(runs[run_id])
        assert {layout.recompute for _t, layout, _n in readings} == {"none"}
    listed = setups["r0043"]  # DeepSeek-V3 B300: selective, mla_up_proj
    assert listed.recompute == "selective" and listed.recompute_modules == ("mla_up_proj",)


def _training(run):  # type: ignore[no-untyped-def]
    from parsearch.validation.published.published_runs import training_spec

    return training_spec(run)


def test_calibration_does_not_depend_on_values_an_earlier_fit_left() -> None:
    """Each fit starts from the priors, so held-out folds never inherit in-sample values."""
    from parsearch.cost.efficiency import load_efficiency_profile
    from parsearch.validation.fit.calibration import calibrate, prepare_rows

    rows = [r for r in prepare_rows(load_published_runs()) if r.generation == "ampere"][:8]
    shipped = load_efficiency_profile("ampere")
    skewed = shipped.with_values({"memory_bound_factor": 1.9, "gemm_efficiency.bf16": 0.66})
    a = calibrate(rows, shipped, max_evaluations=30)
    b = calibrate(rows, skewed, max_evaluations=30)
    assert a.fitted == b.fitted
    for name in shipped.priors:
        assert a.profile.get(name) == pytest.approx(b.profile.get(name))


def test_a_factor_no_run_resolves_is_not_fitted_and_keeps_its_prior() -> None:
    """Only factors some run can tell apart from the scatter are fitted.

    A factor whose whole cited range moves no run's prediction by more than the loss
    scale is not identified by the runs; fitting it would let it drift onto a bound.
    """
    from parsearch.cost.efficiency import load_efficiency_profile
    from parsearch.validation.fit.calibration import (
        FIT_ORDER,
        LOSS_SCALE,
        calibrate,
        candidate_factors,
        prepare_rows,
        range_effect,
    )

    rows = [r for r in prepare_rows(load_published_runs()) if r.generation == "ampere"][:8]
    shipped = load_efficiency_profile("ampere")
    at_priors = shipped.with_values({n: p.value for n, p in shipped.priors.items()})
    reach = {n: float(max(abs(range_effect(rows, at_priors, n))))
             for n in FIT_ORDER if n in shipped.priors}
    unresolved = [n for n, r in reach.items() if r <= LOSS_SCALE]
    assert unresolved and len(unresolved) < len(reach), reach
    result = calibrate(rows, shipped, max_evaluations=30)
    assert result.fitted, "the resolved factors are fitted"
    for name in result.fitted:
        assert reach[name] > LOSS_SCALE, name
    for name in unresolved:
        assert name not in result.fitted
        assert result.profile.get(name) == pytest.approx(shipped.priors[name].value), name
    priced = candidate_factors(rows, at_priors)
    assert set(result.unresolved) == {n for n in unresolved if n in priced}
