"""Accuracy against the published runs, with one efficiency profile per GPU generation.

These are golden numbers from published measurements (see
src/parsearch/data/PROVENANCE.md): if a change to the cost model makes the
predictions worse than the targets, this fails.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from parsearch.published_runs import load_published_runs
from parsearch.validation import memory_saving_candidates, validate_runs


@pytest.fixture(scope="module")
def report():
    return validate_runs(load_published_runs())


def test_accuracy_targets_on_the_verified_dev_rows(report) -> None:
    assert len(report.rows) >= 100
    assert report.mape <= 0.15, f"MAPE {report.mape:.3f}"
    assert report.median_ape <= 0.10, f"median APE {report.median_ape:.3f}"
    assert report.spearman >= 0.70, f"Spearman {report.spearman:.3f}"


def test_no_published_run_is_predicted_out_of_memory(report) -> None:
    assert [r.id for r in report.rows if not r.fits] == []


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
    unstated = next(r for r in runs.values()
                    if any(a.startswith("recompute not stated") for a in r.assumptions))
    modes = [layout.recompute for _t, layout, _n in memory_saving_candidates(unstated)]
    assert modes[:3] == ["none", "selective", "full"]
    fsdp = replace(unstated, notes="FSDP=64")
    assert all(t.fsdp for t, _l, _n in memory_saving_candidates(fsdp))
