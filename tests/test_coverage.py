"""What a model has beyond the calibration runs (parsearch.cost.coverage), end to end.

The shipped profiles record the architectures of the runs they were fitted to
(``calibrated_on``, written by ``benchmarks/calibrate_efficiency.py``); ``explain`` and
``search`` name what a model has outside them, because the error bands say nothing
there (held-out gpt-oss-120b: predicted 1.1-1.4x too fast after its unfused ops were
priced on 2026-12-06, INDEPENDENT_RUNS.md; 1.09-1.30x after its window kernels were).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from parsearch.cost.coverage import coverage_of, parse_coverage, uncovered_features, widened
from parsearch.cost.efficiency import (
    efficiency_for_gpu,
    load_efficiency_profile,
    parse_efficiency_profile,
    profile_to_yaml,
)
from parsearch.errors import SpecError
from parsearch.model.presets import PRESETS
from parsearch.validation.fit.calibration import prepare_rows
from parsearch.validation.published.published_runs import load_published_runs
from tests.cli_helpers import run_cli

PRESET_NAMES = sorted(PRESETS)
models = st.sampled_from(PRESET_NAMES).map(PRESETS.__getitem__)


@given(model=models)
def test_a_model_is_always_covered_by_its_own_calibration(model) -> None:
    assert uncovered_features(model, coverage_of([model])) == ()


@given(model=models, first=st.lists(models, min_size=1, max_size=4),
       more=st.lists(models, max_size=4))
def test_more_calibration_models_never_uncover_a_feature(model, first, more) -> None:
    def features(calibration: list) -> set[str]:  # the feature, without what was calibrated
        return {note.split(" (")[0] for note in uncovered_features(model,
                                                                   coverage_of(calibration))}

    assert features(first + more) <= features(first)


@given(first=st.lists(models, min_size=1, max_size=4), more=st.lists(models, max_size=4))
def test_a_users_runs_widen_the_record_as_if_they_had_been_calibrated_with_it(
        first, more) -> None:
    """``parsearch calibrate`` adds the user's models to the shipped record."""
    assert widened(coverage_of(first), more) == coverage_of(first + more)
    assert widened(None, more) is None


def test_no_record_means_no_claim() -> None:
    assert uncovered_features(PRESETS["gpt-oss-120b"], None) == ()


def test_each_feature_outside_the_calibration_is_named() -> None:
    dense_only = coverage_of([PRESETS["llama3-8b"]])
    notes = uncovered_features(PRESETS["gpt-oss-120b"], dense_only)
    assert notes == ("attention head dim 64 (calibrated: 128)",
                     "sliding-window attention (128 tokens on 18 of 36 layers)",
                     "QKV bias", "mixture-of-experts layers")
    mla = next(m for m in PRESETS.values() if m.mla is not None)
    assert uncovered_features(mla, dense_only) == ("multi-head latent attention (MLA)",
                                                   "mixture-of-experts layers")


@pytest.mark.parametrize("generation", ["ampere", "hopper", "blackwell"])
def test_shipped_profiles_record_what_their_runs_had(generation: str) -> None:
    """The record in each profile equals the coverage of the runs the fit uses."""
    profile = load_efficiency_profile(generation)
    assert profile.coverage is not None
    rows = [r for r in prepare_rows(load_published_runs()) if r.generation == generation]
    assert rows
    assert profile.coverage == coverage_of(r.run.model_spec for r in rows)


def test_profiles_round_trip_their_record() -> None:
    profile = load_efficiency_profile("blackwell")
    again = parse_efficiency_profile(
        yaml.safe_load(profile_to_yaml(profile)), "round trip")
    assert again.coverage == profile.coverage
    assert parse_efficiency_profile(
        yaml.safe_load(profile_to_yaml(replace(profile, coverage=None))),
        "no record").coverage is None


@pytest.mark.parametrize(("raw", "fragment"), [
    ([], "calibrated_on must be a mapping"),
    ({"head_dims": [128]}, "missing"),
    ({**coverage_of([PRESETS["llama3-8b"]]).to_dict(), "extra": 1}, "unknown extra"),
    ({**coverage_of([PRESETS["llama3-8b"]]).to_dict(), "head_dims": [0]}, "head_dims"),
    ({**coverage_of([PRESETS["llama3-8b"]]).to_dict(), "mla": "no"}, "calibrated_on.mla"),
])
def test_a_bad_record_names_the_field(raw, fragment: str) -> None:
    with pytest.raises(SpecError, match="calibrated_on") as error:
        parse_coverage(raw, "x.yaml")
    assert fragment in str(error.value)
    assert "x.yaml" in str(error.value)


GPT_OSS = ("--model", "gpt-oss-120b", "--cluster", "gb200-nvl72", "--gpus", "64",
           "--global-batch", "1280", "--seq-len", "4096")


def test_explain_names_what_no_calibration_run_had() -> None:
    blackwell = efficiency_for_gpu("gb200").coverage
    assert blackwell is not None
    expected = list(uncovered_features(PRESETS["gpt-oss-120b"], blackwell))
    assert any("sliding-window" in note for note in expected)
    result = run_cli("explain", *GPT_OSS, "--layout", "ep=64,mbs=4", "--format", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["outside_calibration"] == expected
    text = run_cli("explain", *GPT_OSS, "--layout", "ep=64,mbs=4")
    assert "no calibration run of this GPU generation has" in text.out
    assert "sliding-window attention" in text.out
    covered = run_cli("explain", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--gpus",
                      "8", "--global-batch", "128", "--seq-len", "8192", "--layout", "tp=1",
                      "--format", "json")
    assert covered.code == 0, covered.err
    assert json.loads(covered.out)["outside_calibration"] == []


def test_search_prints_the_note_once_under_its_table() -> None:
    result = run_cli("search", *GPT_OSS, "--top", "3")
    assert result.code == 0, result.err
    assert result.out.count("no calibration run of this GPU generation has") == 1
    doc = run_cli("search", *GPT_OSS, "--top", "3", "--format", "json")
    assert any("head dim 64" in n for n in json.loads(doc.out)["outside_calibration"])
