"""Older release lines that a newer one re-measured are set aside from the fit.

The rule (``current_releases``): for each model (recipe variants folded), GPU and
precision, only the newest NeMo release line's rows are fitted; point releases are one
line; rows without a release (papers) always stay.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.validation.published.published_runs import (
    PublishedRun,
    base_model,
    current_releases,
    release_line,
    supersede_key,
)
from parsearch.validation.published.runs import validate_runs


def test_base_model_folds_recipe_variants() -> None:
    assert base_model("DeepSeekV3 (w/ MTP)") == "DeepSeekV3"
    assert base_model("Qwen3_30B_a3B (tokendrop)") == "Qwen3_30B_a3B"
    assert base_model("LLAMA3_70B") == "LLAMA3_70B"
    assert release_line((26, 4, 1)) == release_line((26, 4)) == (26, 4)
    assert release_line(None) == ()


MODELS = ("DeepSeekV3", "DeepSeekV3 (w/ MTP)", "LLAMA3_70B")
RELEASES = (None, (25, 9), (25, 11), (26, 4), (26, 4, 1), (26, 8))


@st.composite
def run_sets(draw: st.DrawFn, template: PublishedRun) -> list[PublishedRun]:
    cells = draw(st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from(("B200", "GB200")),
                                    st.sampled_from(("fp8", "bf16")), st.sampled_from(RELEASES)),
                          min_size=1, max_size=12))
    return [replace(template, id=f"x{i:03d}", model=m, gpu=g, precision=p, release=r)
            for i, (m, g, p, r) in enumerate(cells)]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_newest_line_of_each_model_gpu_precision_is_kept(data: st.DataObject,
                                                          runs: list[PublishedRun]) -> None:
    sample = data.draw(run_sets(runs[0]))
    kept = current_releases(sample)
    # Order kept, and idempotent.
    assert kept == [run for run in sample if run in kept]
    assert current_releases(kept) == kept
    # No (model, GPU, precision) disappears: its newest line stays.
    assert {supersede_key(r) for r in kept} == {supersede_key(r) for r in sample}
    newest = {}
    for run in sample:
        key = supersede_key(run)
        newest[key] = max(newest.get(key, ()), release_line(run.release))
    for run in sample:
        expected = run.release is None or release_line(run.release) == newest[supersede_key(run)]
        assert (run in kept) == expected, (run.model, run.gpu, run.precision, run.release)


def test_documented_release_drift_is_superseded(runs: list[PublishedRun],
                                               by_id: dict[str, PublishedRun]) -> None:
    kept = {run.id for run in current_releases(runs)}
    # GB300 Llama 3 70B FP8: one recipe, 2,030 TFLOP/s in 25.11 and 2,348 in 26.04.01.
    assert by_id["r0226"].release == (25, 11) and "r0226" not in kept
    assert "r0064" in kept
    # DeepSeek-V3 on B200: the all-to-all rows of 25.09/25.11 give way to HybridEP (26.04);
    # 26.04 and 26.04.01 are one line, so both stay.
    assert not {"r0246", "r0272", "r0273"} & kept
    assert {"r0127", "r0081"} <= kept
    # Papers have no release and are never superseded.
    assert all(run.id in kept for run in runs if run.release is None)


def test_validation_scores_superseded_rows_apart(runs: list[PublishedRun]) -> None:
    subset = [run for run in runs if base_model(run.model) == "DeepSeekV3" and run.gpu == "B200"]
    report = validate_runs(subset)
    fitted = {row.id for row in report.rows}
    older = {row.id for row in report.superseded}
    assert {"r0246", "r0272", "r0273"} <= older
    assert "r0127" in fitted and not fitted & older
    assert report.summary()["superseded"] == len(report.superseded)
    everything = validate_runs(subset, deduplicate=False)
    assert {row.id for row in everything.rows} >= fitted | older
    assert not everything.superseded
