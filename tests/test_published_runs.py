"""Tests of the published-runs loader (``parsearch.validation.published.published_runs``)."""

from __future__ import annotations

import collections
import hashlib
import re
from importlib import resources
from pathlib import Path

import pytest

from parsearch.validation.published.published_runs import (
    CLUSTER_BY_GPU,
    PublishedRun,
    dedupe,
    dev_rows,
    group_key,
    load_published_runs,
    training_spec,
)
from parsearch.validation.published.run_conventions import (
    CONV_KOR22,
    CONV_MCORE_2025,
    CONV_NAR21,
    CONV_REPORTED,
    CONVERSIONS,
    FOLD,
    KOR22,
    MBRIDGE,
    NAR21,
    padded_vocab,
    release_of,
)
from parsearch.validation.published.run_layouts import layout_problems, normalise_precision

SHARED_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "published_runs_dev.csv"
NEMOTRON_SKIP = "architecture unknown (hybrid Mamba: Nemotron 3)"


# ------------------------------------------------------------------ loading


def test_loads_every_row(runs: list[PublishedRun]) -> None:
    assert len(runs) == 252
    assert len({run.id for run in runs}) == 252


def test_packaged_csv_is_an_unchanged_copy() -> None:
    packaged = resources.files("parsearch.data").joinpath("published_runs.csv").read_bytes()
    digest = "f97d4ebf8888ea14796de50dc7a1ea207ca933f43ab0d7c194431c692bacdf3a"
    assert hashlib.sha256(packaged).hexdigest() == digest
    if SHARED_CSV.is_file():
        assert SHARED_CSV.read_bytes() == packaged


def test_corrections_are_applied_and_say_why(by_id: dict[str, PublishedRun]) -> None:
    """The bundled table stays a verbatim copy; each correction departs from it on purpose
    and leaves its reason in the row's notes."""
    from parsearch.validation.published.run_corrections import load_corrections

    corrections = load_corrections()
    assert corrections, "run_corrections.csv is empty"
    for run_id, fixes in corrections.items():
        run = by_id[run_id]
        for field, value, reason in fixes:
            assert reason and f"corrected {field}" in run.notes and reason in run.notes
            if field == "vpp":
                assert run.layout.vpp == int(value)
            elif field == "micro_batch_size":
                assert run.layout.mbs == int(value)
            else:
                assert run.verified == value


def test_documented_regression_and_stale_layout_rows_are_not_fitted(
        by_id: dict[str, PublishedRun]) -> None:
    """Qwen3-30B-A3B dropless on H100/B200 in 25.11 and 26.02 is the regression
    Megatron-Bridge issue #1998 documents; the 26.02.01 H100 row's layout cells are stale
    (its release's preset moved to EP16 PP1 HybridEP, PR #2477).  Both readings rest on the
    source's statement and stay out of the fit, whichever way the model misses them."""
    regression = {"r0254", "r0218", "r0248", "r0217"}
    for run_id in regression | {"r0181"}:
        assert by_id[run_id].verified == "partial"
    assert all("#1998" in by_id[i].notes for i in regression)
    assert "#2477" in by_id["r0181"].notes
    kept = {run.id for run in dedupe(dev_rows(list(by_id.values())))}
    assert not kept & (regression | {"r0181"})
    # the releases around them, the same model and GPUs, are still fitted
    assert {"r0050", "r0282", "r0090"} <= kept


def test_a_user_file_is_read_as_written(tmp_path: Path) -> None:
    """Corrections belong to the bundled rows: a user's file with the same id is not changed."""
    text = resources.files("parsearch.data").joinpath("published_runs.csv").read_text(
        encoding="utf-8")
    header, *lines = text.splitlines()
    row = next(line for line in lines if line.startswith("r0259,"))
    path = tmp_path / "mine.csv"
    path.write_text(header + "\n" + row + "\n", encoding="utf-8")
    (run,) = load_published_runs(path)
    assert run.layout.mbs == 2 and "corrected" not in run.notes


def test_explicit_path_loads_the_same_rows(tmp_path: Path, runs: list[PublishedRun]) -> None:
    copy = tmp_path / "runs.csv"
    copy.write_bytes(resources.files("parsearch.data").joinpath("published_runs.csv").read_bytes())
    assert load_published_runs(copy) == runs


# ------------------------------------------------------------------ skip reasons


def test_skip_reason_counts(runs: list[PublishedRun]) -> None:
    counts = collections.Counter(run.skip_reason for run in runs)
    assert counts["verified=no"] == 16
    assert counts[NEMOTRON_SKIP] == 53
    assert counts["no preset/arch for DeepSeekV4 Flash"] == 2
    layout_invalid = [r for r in runs if (r.skip_reason or "").startswith("layout invalid")]
    # r0263 (DeepSeek-V3 tokendrop, 256 GB200): pp=8 × ep=64 = 512 GPUs > 256.
    assert [r.id for r in layout_invalid] == ["r0263"]
    assert "pp·ep·etp=512" in layout_invalid[0].skip_reason
    # a table error, recorded as such: the release's recipe ran PP4 VP4 (run_corrections.csv)
    assert layout_invalid[0].verified == "partial"
    assert counts[None] == 180
    assert sum(counts.values()) == 252


def test_every_skip_reason_is_one_of_the_known_kinds(runs: list[PublishedRun]) -> None:
    pattern = re.compile(
        r"verified=no|architecture unknown \(.+\)|no preset/arch for .+|"
        r"preset .+ disagrees with row .+|layout invalid: .+|unknown GPU .+|no measurement"
    )
    for run in runs:
        if run.skip_reason is not None:
            assert pattern.fullmatch(run.skip_reason), (run.id, run.skip_reason)


def test_every_nemotron_hybrid_row_is_skipped(runs: list[PublishedRun]) -> None:
    nemotron = [run for run in runs if run.model.startswith("Nemotron_3")]
    assert len(nemotron) == 53
    assert all(run.skip_reason == NEMOTRON_SKIP for run in nemotron)
    assert all(run.model_spec is None for run in nemotron)


def test_every_verified_llama3_70b_row_is_kept(runs: list[PublishedRun]) -> None:
    llama = [run for run in runs if run.model == "LLAMA3_70B" and run.verified == "yes"]
    assert len(llama) == 32  # 34 in the table, less r0155 and r0157 (run_corrections.csv)
    for run in llama:
        assert run.kept, (run.id, run.skip_reason)
        assert run.model_spec is not None and run.model_spec.num_layers == 80


def test_verified_no_rows_are_never_kept(runs: list[PublishedRun]) -> None:
    for run in runs:
        if run.verified == "no":
            assert run.skip_reason == "verified=no"


def test_dev_rows_are_verified_kept_and_measured(runs: list[PublishedRun]) -> None:
    dev = dev_rows(runs)
    assert len(dev) == 159  # 180 kept, less 13 verified=partial and 8 corrected to partial
    for run in dev:
        assert run.verified == "yes" and run.kept
        assert run.model_spec is not None and run.cluster is not None
        assert run.measured_tokens_per_s_per_gpu is not None


# ------------------------------------------------------------------ layouts


def test_kept_layouts_cover_the_world_size(runs: list[PublishedRun]) -> None:
    for run in runs:
        if not run.kept:
            continue
        lay = run.layout
        assert lay.dp >= 1, run.id
        assert lay.tp * lay.cp * lay.dp * lay.pp == run.num_gpus, run.id
        assert layout_problems(lay, run.model_spec, run.seq_len, run.global_batch) == []


def test_moe_rows_derive_expert_data_parallel(runs: list[PublishedRun]) -> None:
    moe = [run for run in runs if run.kept and run.is_moe]
    assert moe
    for run in moe:
        lay = run.layout
        assert run.num_gpus % (lay.pp * lay.ep * lay.etp) == 0, run.id
        assert lay.edp == run.num_gpus // (lay.pp * lay.ep * lay.etp), run.id
        assert lay.etp * lay.ep * lay.edp * lay.pp == run.num_gpus, run.id


def test_dense_rows_have_no_expert_parallelism(runs: list[PublishedRun]) -> None:
    for run in runs:
        if run.kept and not run.is_moe:
            assert run.layout.ep == 1 and run.layout.etp == 1


def test_blank_etp_is_one_for_megatron_bridge_moe_rows(by_id: dict[str, PublishedRun]) -> None:
    run = by_id["r0280"]  # DeepSeek-V3 on 1,024 H100, tp=2, ep=64, ETP not listed
    assert run.source_tag == MBRIDGE and run.layout.etp == 1
    assert any("etp" in note for note in run.assumptions)
    assert run.layout.edp == 1024 // (8 * 64)


def test_fold_rows_take_etp_from_the_table(by_id: dict[str, PublishedRun]) -> None:
    coupled, folded = by_id["r0343"], by_id["r0344"]  # MCore vs MCore w/ Folding
    assert (coupled.layout.tp, coupled.layout.etp, coupled.layout.ep) == (2, 2, 4)
    assert (folded.layout.tp, folded.layout.etp, folded.layout.ep) == (2, 1, 8)
    assert coupled.layout.edp == 2 and folded.layout.edp == 2  # 128 / (pp 8 · ep·etp 8)


def test_sequence_parallel_and_recompute(by_id: dict[str, PublishedRun]) -> None:
    assert by_id["r0313"].layout.sp is False  # NAR21 states no SP
    assert by_id["r0313"].layout.recompute == "full"
    assert by_id["r0329"].layout.sp is True  # KOR22 'present work'
    assert by_id["r0329"].layout.recompute == "selective"
    assert by_id["r0330"].layout.sp is False and by_id["r0330"].layout.recompute == "full"
    assert by_id["r0065"].layout.sp is False  # Megatron-Bridge, tp=1
    assert by_id["r0070"].layout.sp is True  # Megatron-Bridge, tp=4: default on
    assert by_id["r0070"].layout.recompute == "none"


# ------------------------------------------------------------------ precision, cluster, model


def test_precision_normalisation() -> None:
    assert normalise_precision("MXFP8") == ("fp8", "mxfp8")
    assert normalise_precision("FP8-CS") == ("fp8", "tensorwise")
    assert normalise_precision("FP8 (delayed scaling)") == ("fp8", "delayed")
    assert normalise_precision("FP8-blockwise(128x128 w,1x128 act)") == ("fp8", "blockwise")
    assert normalise_precision("FP8 (see note)") == ("fp8", "tensorwise (presumed)")
    assert normalise_precision("NVFP4") == ("fp4", None)
    assert normalise_precision("BF16") == ("bf16", None)
    assert normalise_precision("mixed 16-bit") == ("bf16", None)


def test_every_row_has_a_normalised_precision(runs: list[PublishedRun]) -> None:
    for run in runs:
        assert run.precision in ("bf16", "fp8", "fp4")
        assert run.precision_raw
        assert (run.fp8_recipe is not None) == (run.precision == "fp8")


def test_cluster_mapping(runs: list[PublishedRun]) -> None:
    assert CLUSTER_BY_GPU["H100-SXM-80GB (Eos)"] == "dgx-h100"
    assert CLUSTER_BY_GPU["GB200"] == "gb200-nvl72"
    for run in runs:
        assert run.cluster == CLUSTER_BY_GPU[run.gpu]


def test_model_resolution(by_id: dict[str, PublishedRun]) -> None:
    gpt = by_id["r0313"].model_spec
    assert gpt is not None
    assert (gpt.num_layers, gpt.hidden_size, gpt.vocab_size) == (24, 2304, 51200)
    assert gpt.mlp_activation == "gelu" and gpt.norm == "layernorm" and gpt.tied_embeddings
    assert gpt.num_query_groups == gpt.num_attention_heads
    deepseek = by_id["r0001"].model_spec
    assert deepseek is not None and deepseek.mla is not None and deepseek.moe is not None
    without_mtp = by_id["r0228"].model_spec  # "DeepSeekV3 (w/o MTP)"
    assert without_mtp is not None and without_mtp.mtp_layers == 0
    qwen2 = by_id["r0347"].model_spec
    assert qwen2 is not None and qwen2.moe is not None and qwen2.moe.num_experts == 64
    assert by_id["r0003"].model_spec is None  # DeepSeekV4 Flash


# ------------------------------------------------------------------ conversions


def test_conversion_per_source(runs: list[PublishedRun]) -> None:
    expected = {NAR21: CONV_NAR21, KOR22: CONV_KOR22, MBRIDGE: CONV_REPORTED, FOLD: CONV_MCORE_2025}
    for run in runs:
        if run.source_tag in expected:
            assert run.conversion == expected[run.source_tag], run.id
        if run.conversion is not None:
            assert run.conversion in CONVERSIONS


def test_converted_tokens_per_second_are_positive(runs: list[PublishedRun]) -> None:
    converted = [run for run in runs if run.conversion not in (None, CONV_REPORTED)]
    assert len(converted) == 76  # 16 NAR21 + 10 KOR22 + 42 FOLD + 8 NeMo long-sequence
    for run in converted:
        assert run.measured_tokens_per_s_per_gpu is not None
        assert run.measured_tokens_per_s_per_gpu > 0, run.id


def test_nar21_gpt_1_7b_matches_eq3_by_hand(by_id: dict[str, PublishedRun]) -> None:
    run = by_id["r0313"]
    B, s, L, h, V = 512, 2048, 24, 2304, 51200
    assert (run.global_batch, run.seq_len) == (B, s)
    flops_per_iteration = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    expected = 137e12 / (flops_per_iteration / (B * s))
    assert run.measured_tflops_per_gpu == 137
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(expected, rel=1e-12)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(9287.9, abs=0.1)


def test_nar21_throughput_reproduces_paper_training_time_estimate(
    by_id: dict[str, PublishedRun],
) -> None:
    # NAR21 Eq. 4: time ≈ 8·T·P/(n·X), i.e. tokens/s/GPU ≈ X/(8·P) when s ≪ 6h and
    # V ≪ 16Lh. For the 1T row (P = 1008e9, X = 163 TFLOP/s) the exact Eq. 3
    # conversion must agree with that approximation within a few per cent.
    run = by_id["r0322"]
    approx = 163e12 / (8 * 1008e9)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(approx, rel=0.03)


@pytest.mark.parametrize(
    ("row_id", "iteration_s"),
    [("r0329", 1.10), ("r0331", 13.75), ("r0333", 37.83), ("r0335", 71.49), ("r0337", 39.15)],
)
def test_kor22_mfu_conversion_matches_iteration_time(
    by_id: dict[str, PublishedRun], row_id: str, iteration_s: float
) -> None:
    run = by_id[row_id]
    from_time = run.global_batch * run.seq_len / (iteration_s * run.num_gpus)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(from_time, rel=0.01)


def test_kor22_gpt_22b_by_hand(by_id: dict[str, PublishedRun]) -> None:
    run = by_id["r0329"]
    s, L, h, V = 2048, 48, 6144, 51200
    model_flops_per_token = 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(
        0.415 * 312e12 / model_flops_per_token, rel=1e-12
    )


def test_fold_mixtral_by_hand(by_id: dict[str, PublishedRun]) -> None:
    # Megatron-Core early-2025 formula, Mixtral 8x22B, s = 4096, tp = 2.
    run = by_id["r0344"]
    L, h, a, g, d, f, k, s = 56, 6144, 48, 8, 128, 16384, 2, 4096
    V = padded_vocab(32000, 2)
    per_token = 12 * L * h**2 * (
        (1 + g / a + s / h) * (a * d / h) + (f / h) * k * 1.5 + V / (2 * L * h)
    )
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(487.7e12 / per_token, rel=1e-3)


def test_fold_tflops_and_mfu_agree(by_id: dict[str, PublishedRun]) -> None:
    run = by_id["r0343"]  # Table 2 TFLOP/s 458.3 and Table 3 MFU 46.3 %
    assert run.measured_tflops_per_gpu == 458.3 and run.measured_mfu == 0.463
    ratio = run.measured_mfu * 989.5 / run.measured_tflops_per_gpu
    assert ratio == pytest.approx(1.0, abs=1e-3)


def test_reported_rows_keep_the_published_value(by_id: dict[str, PublishedRun]) -> None:
    assert by_id["r0001"].measured_tokens_per_s_per_gpu == 6288
    assert by_id["r0001"].conversion == CONV_REPORTED


# ------------------------------------------------------------------ grouping, dedupe


def test_release_parsing() -> None:
    assert release_of("Megatron-Bridge perf summary (NeMo 26.06.01 container)") == (26, 6, 1)
    assert release_of("Megatron-Bridge perf summary (NeMo 26.06 container)") == (26, 6)
    assert (26, 6, 1) > (26, 6)


def test_dedupe_keeps_latest_release(runs: list[PublishedRun]) -> None:
    same_layout = [
        run
        for run in runs
        if run.model == "Qwen3_30B_a3B"
        and run.gpu == "GB300"
        and run.precision_raw == "MXFP8"
        and run.layout.mbs == 8
    ]
    assert len(same_layout) >= 5
    survivors = dedupe(same_layout)
    assert [run.id for run in survivors] == ["r0007"]  # NeMo 26.08, the latest


def test_dedupe_is_stable_and_idempotent(runs: list[PublishedRun]) -> None:
    once = dedupe(runs)
    assert dedupe(once) == once
    positions = [runs.index(run) for run in once]
    assert positions == sorted(positions)
    # Papers have no release and no repeated layouts: all kept.
    for tag in (NAR21, KOR22, FOLD):
        assert sum(r.source_tag == tag for r in once) == sum(r.source_tag == tag for r in runs)


def test_group_key(by_id: dict[str, PublishedRun]) -> None:
    assert group_key(by_id["r0343"]) == ("Mixtral-8x22B", "H100-SXM-80GB (Eos)", 128, 256)
    assert group_key(by_id["r0343"]) == group_key(by_id["r0344"])


def test_training_spec_admits_the_run(by_id: dict[str, PublishedRun]) -> None:
    run = by_id["r0318"]
    spec = training_spec(run)
    assert (spec.seq_len, spec.global_batch) == (2048, 1792)
    assert spec.micro_batch_sizes == (2,) and spec.recompute_modes == ("full",)
    assert spec.sequence_parallel == "off"
    assert training_spec(by_id["r0329"]).sequence_parallel == "on"
