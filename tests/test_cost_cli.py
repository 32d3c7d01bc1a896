"""`parsearch explain` and `parsearch validate` against the CLI contract."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

import parsearch
from tests.cli_helpers import assert_one_line_error, run_cli

EXPLAIN = ("explain", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
           "--global-batch", "128", "--seq-len", "8192")
LAYOUT_KEYS = {"tp", "pp", "cp", "ep", "etp", "vpp", "dp", "edp", "mbs", "sp", "recompute",
               "min_gpus"}
MEMORY_KEYS = {"weights", "gradients", "optimizer", "activations", "other", "total", "capacity"}
TIME_KEYS = {"compute", "memory_bound", "overhead", "tp_comm", "cp_comm", "ep_comm", "offload",
             "pp_p2p", "pp_bubble", "stage_imbalance", "dp_comm", "optimizer"}


def test_explain_json_has_the_contract_keys_and_consistent_numbers() -> None:
    result = run_cli(*EXPLAIN, "--layout", "tp=4,pp=8,vpp=5,sp=true", "--precision", "fp8",
                     "--format", "json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert {"layout", "num_gpus", "fits", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
            "model_tflops_per_gpu", "mfu", "memory_gib_per_gpu", "time_s"} <= doc.keys()
    assert set(doc["layout"]) == LAYOUT_KEYS
    assert set(doc["memory_gib_per_gpu"]) == MEMORY_KEYS
    assert set(doc["time_s"]) == TIME_KEYS
    assert doc["layout"]["dp"] == 2 and doc["num_gpus"] == 64
    assert sum(doc["time_s"].values()) == pytest.approx(doc["step_time_s"])
    assert doc["tokens_per_s"] == pytest.approx(128 * 8192 / doc["step_time_s"])
    assert doc["tokens_per_s_per_gpu"] == pytest.approx(doc["tokens_per_s"] / 64)
    mem = doc["memory_gib_per_gpu"]
    parts = sum(mem[k] for k in ("weights", "gradients", "optimizer", "activations", "other"))
    assert parts == pytest.approx(mem["total"])
    assert doc["fits"] == (mem["total"] <= mem["capacity"])


def test_explain_says_what_the_number_assumes() -> None:
    plain = run_cli(*EXPLAIN, "--layout", "tp=4,pp=8,vpp=5,sp=true", "--precision", "fp8",
                    "--format", "json")
    fp8_attention = run_cli(*EXPLAIN, "--layout", "tp=4,pp=8,vpp=5,sp=true", "--precision",
                            "fp8", "--fp8-attention", "--no-tp-comm-overlap", "--format", "json")
    assert plain.code == 0 and fp8_attention.code == 0, plain.err + fp8_attention.err
    before, after = (json.loads(r.out)["priced_features"] for r in (plain, fp8_attention))
    assert before[0] == "FP8 (tensorwise)" and "TP comm overlap" in before
    assert "FP8 attention" not in before
    assert "FP8 attention" in after and "TP comm overlap" not in after
    table = run_cli(*EXPLAIN, "--layout", "tp=4,pp=8,vpp=5,sp=true", "--fp8-attention",
                    "--precision", "fp8")
    assert "priced with: FP8 (tensorwise), FP8 attention" in table.out


def test_explain_memory_options_change_the_accounting() -> None:
    def memory(*extra: str) -> dict[str, float]:
        result = run_cli(*EXPLAIN, "--layout", "tp=4,pp=4,sp=true", "--format", "json", *extra)
        assert result.code == 0, result.err
        return json.loads(result.out)["memory_gib_per_gpu"]

    default = memory()
    plain = memory("--no-distributed-optimizer")
    assert plain["optimizer"] == pytest.approx(default["optimizer"] * 4)  # dp*cp = 4
    light = memory("--grad-bytes", "2", "--optimizer-bytes", "4")
    assert light["gradients"] == pytest.approx(default["gradients"] / 2)
    assert light["optimizer"] == pytest.approx(default["optimizer"] / 3)
    fsdp = memory("--fsdp")
    assert fsdp["gradients"] == pytest.approx(default["gradients"] / 4)  # sharded over dp=4


def test_explain_table_names_the_bottleneck() -> None:
    result = run_cli(*EXPLAIN, "--layout", "tp=8,pp=8,sp=true")
    assert result.code == 0
    assert "bottleneck:" in result.out and "tokens/s" in result.out


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (("--layout", "tp=3,pp=8"), ("invalid", "R2")),
        (("--layout", "tp=8,pp=8", "--precision", "fp4"), ("fp4", "not supported", "h100")),
        (("--layout", "tp=8", "--cluster", "nope-cluster"), ("nope-cluster",)),
        (("--layout", "tp=8,pp=8", "--tp-overlap", "1.5"), ("--tp-overlap",)),
    ],
)
def test_explain_bad_input(extra: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    argv = list(EXPLAIN)
    if "--cluster" in extra:
        argv[argv.index("--cluster") + 1] = extra[extra.index("--cluster") + 1]
        extra = tuple(x for i, x in enumerate(extra)
                      if x != "--cluster" and (i == 0 or extra[i - 1] != "--cluster"))
    assert_one_line_error(run_cli(*argv, *extra), *fragments)


def test_validate_json_contract_and_summary() -> None:
    result = run_cli("validate", "--format", "json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    summary = doc["summary"]
    assert {"n", "skipped", "mape", "median_ape", "spearman"} <= summary.keys()
    assert summary["n"] == len(doc["rows"]) > 60
    # Older release lines a newer one re-measured are scored apart, never in the summary.
    assert summary["superseded"] == len(doc["superseded"]) > 0
    assert not {r["id"] for r in doc["rows"]} & {r["id"] for r in doc["superseded"]}
    for row in doc["rows"] + doc["superseded"]:
        assert {"id", "predicted_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu",
                "ape"} <= row.keys()
        measured = row["measured_tokens_per_s_per_gpu"]
        assert row["ape"] == pytest.approx(
            abs(row["predicted_tokens_per_s_per_gpu"] - measured) / measured)
    assert summary["skipped"] == len(doc["skipped"])
    assert all(item["reason"] for item in doc["skipped"])


def test_validate_rejects_a_missing_data_file(tmp_path) -> None:
    assert_one_line_error(run_cli("validate", "--data", str(tmp_path / "none.csv")), "none.csv")


def test_memory_margin_turns_a_tight_layout_infeasible() -> None:
    # Features pinned: searched, the margin may also change which feature set fits (CUDA
    # graphs hold static buffers) and with it the bytes.
    argv = (*EXPLAIN, "--layout", "tp=4,pp=8,vpp=5,sp=true", "--precision", "fp8",
            "--no-feature-search", "--format", "json")
    tight = json.loads(run_cli(*argv, "--memory-margin", "0").out)
    used = tight["memory_gib_per_gpu"]["total"] / tight["memory_gib_per_gpu"]["capacity"]
    assert tight["fits"] and used > 0.8
    strict = json.loads(run_cli(*argv, "--memory-margin", "0.2").out)
    assert not strict["fits"]
    # The same bytes are needed; only the usable capacity shrinks by the margin.
    assert strict["memory_gib_per_gpu"]["total"] == tight["memory_gib_per_gpu"]["total"]
    assert strict["memory_gib_per_gpu"]["capacity"] == pytest.approx(
        0.8 * tight["memory_gib_per_gpu"]["capacity"])


def test_the_likely_range_says_when_no_run_like_it_was_calibrated() -> None:
    """The shipped Hopper dense band comes from FP8 runs only: an FP8 dense prediction
    gets it, a BF16 one gets the union of the generation's bands, flagged as such."""
    def explain(precision: str) -> dict:
        result = run_cli(*EXPLAIN, "--layout", "tp=4,pp=8,vpp=5,sp=true", "--precision",
                         precision, "--format", "json")
        assert result.code == 0, result.err
        return json.loads(result.out)

    fp8, bf16 = explain("fp8"), explain("bf16")
    assert fp8["tokens_per_s_per_gpu_range_basis"].startswith("leave-one-family-out")
    assert bf16["tokens_per_s_per_gpu_range_basis"].startswith("no dense bf16 run")

    def width(doc: dict) -> float:
        low, high = doc["tokens_per_s_per_gpu_range"]
        return high / low

    # the union of the generation's bands is at least as wide as the dense one (wider when
    # the MoE band reaches beyond it)
    assert width(bf16) >= width(fp8) * (1.0 - 1e-12)
    table = run_cli(*EXPLAIN, "--layout", "tp=4,pp=8,vpp=5,sp=true", "--precision", "bf16")
    assert "no dense bf16 run in the calibration set" in table.out


def test_validate_cv_names_each_fold_that_put_a_factor_on_a_bound(tmp_path) -> None:
    """The Ampere runs alone (two sources, so leave one source out): the summary's count
    of fits on a bound is the in-sample fit plus one line per failing fold, and each line
    names the held-out source, its error there and the factor's value."""
    runs = tmp_path / "ampere.csv"
    bundled = Path(parsearch.__file__).parent / "data" / "published_runs.csv"
    with open(bundled, newline="", encoding="utf-8") as src:
        reader = csv.DictReader(src)
        kept = [row for row in reader if row["gpu"].startswith("A100")]
        fields = reader.fieldnames
    with open(runs, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)
    result = run_cli("validate", "--cv", "family", "--data", str(runs))
    assert result.code == 0, result
    summary = next(line for line in result.out.splitlines() if line.startswith("ampere "))
    on_bound, folds = re.search(r"(\d+) of (\d+)\s*$", summary).groups()
    fold_lines = [line for line in result.out.splitlines() if line.startswith("ampere without ")]
    in_sample = any(line.startswith("ampere: on a bound") for line in result.out.splitlines())
    assert int(on_bound) == len(fold_lines) + int(in_sample) and int(folds) == 3
    for line in fold_lines:
        match = re.match(r"ampere without (NAR21|KOR22) \(fitted on the others; [\d.]+% on its "
                         r"\d+ runs\): on a bound: ([a-z_.0-9]+ = [\d.e-]+(, )?)+$", line)
        assert match, line
