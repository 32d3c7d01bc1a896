"""`parsearch models`, `layouts` and `check`: output formats and every bad-input path."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.cli_helpers import assert_one_line_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
QUERY = ("--gpus", "256", "--global-batch", "512", "--seq-len", "8192")
LAYOUT_KEYS = {"tp", "pp", "cp", "ep", "etp", "vpp", "dp", "edp", "mbs", "sp", "recompute",
               "min_gpus"}


def test_models_lists_presets_with_sources() -> None:
    result = run_cli("models", "--format", "json")
    assert result.code == 0
    models = {m["name"]: m for m in json.loads(result.out)["models"]}
    assert {"llama3-70b", "deepseek-v3", "mixtral-8x7b", "gpt-1t"} <= models.keys()
    assert all(m["source"] for m in models.values())
    assert models["deepseek-v3"]["kind"] == "moe"


def test_layouts_jsonl_every_line_is_a_valid_layout_object() -> None:
    result = run_cli("layouts", "--model", "llama3-70b", *QUERY, "--format", "jsonl")
    assert result.code == 0
    lines = [json.loads(line) for line in result.out.splitlines()]
    assert len(lines) > 100
    for obj in lines:
        assert set(obj) == LAYOUT_KEYS
        assert obj["tp"] * obj["cp"] * obj["pp"] * obj["dp"] == 256
        assert 512 % (obj["mbs"] * obj["dp"]) == 0
    assert f"{len(lines)} valid layouts" in result.err


def test_layouts_csv_and_table_agree_with_jsonl() -> None:
    jsonl = run_cli("layouts", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
                    "--seq-len", "4096", "--format", "jsonl")
    as_csv = run_cli("layouts", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
                     "--seq-len", "4096", "--format", "csv")
    table = run_cli("layouts", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
                    "--seq-len", "4096")
    rows = list(csv.DictReader(io.StringIO(as_csv.out)))
    assert len(rows) == len(jsonl.out.splitlines()) == len(table.out.splitlines()) - 1
    first = json.loads(jsonl.out.splitlines()[0])
    assert {k: str(v).lower() for k, v in first.items()} == rows[0]


def test_layouts_accepts_a_downloaded_config_json(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text((FIXTURES / "llama3-70b.json").read_text())
    from_file = run_cli("layouts", "--model", str(config), *QUERY, "--format", "jsonl")
    from_preset = run_cli("layouts", "--model", "llama3-70b", *QUERY, "--format", "jsonl")
    assert from_file.code == 0
    assert from_file.out == from_preset.out


def test_check_valid_and_invalid_layouts() -> None:
    ok = run_cli("check", "--model", "llama3-70b", *QUERY, "--layout", "tp=8,pp=4,sp=true")
    assert ok.code == 0 and ok.out.startswith("valid")
    bad = run_cli("check", "--model", "llama3-70b", *QUERY, "--layout", "tp=3,pp=4",
                  "--format", "json")
    assert bad.code == 1
    doc = json.loads(bad.out)
    assert not doc["valid"]
    rules = {v["rule"] for v in doc["violations"]}
    assert rules == {"R2", "R4"}
    r4 = next(v for v in doc["violations"] if v["rule"] == "R4")
    assert "num_attention_heads=64" in r4["message"] and "valid tp: 1, 2, 4, 8" in r4["message"]


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (("layouts", "--model", "lama3-70b", *QUERY),
         ("unknown model preset 'lama3-70b'", "llama3-70b", "parsearch models")),
        (("layouts", "--model", "llama3-70b", "--gpus", "0", "--global-batch", "8",
          "--seq-len", "8"), ("--gpus", "positive integer")),
        (("layouts", "--model", "llama3-70b", "--gpus", "2.5", "--global-batch", "8",
          "--seq-len", "8"), ("--gpus", "not an integer")),
        (("layouts", "--model", "llama3-70b", "--gpus", "8", "--global-batch", "-4",
          "--seq-len", "8"), ("--global-batch",)),
        (("check", "--model", "llama3-70b", *QUERY, "--layout", "tp=8,zz=2"),
         ("unknown key 'zz'", "valid keys are tp")),
        (("check", "--model", "llama3-70b", *QUERY, "--layout", "tp=two"),
         ("tp='two' is not an integer",)),
        (("check", "--model", "llama3-70b", *QUERY, "--layout", "tp=0"),
         ("tp=0 must be a positive integer",)),
        (("layouts", "--model", "llama3-70b", "--gpus", "256", "--global-batch", "3",
          "--seq-len", "8192", "--micro-batch-sizes", "2"),
         ("no valid layout", "R10", "global_batch=3")),
        (("layouts", "--model", "llama3-70b", *QUERY, "--micro-batch-sizes", "1,x"),
         ("--micro-batch-sizes",)),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    assert_one_line_error(run_cli(*argv), *fragments)


def test_malformed_config_json_names_the_problem(tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text('{"model_type": "llama", "hidden_size": 4096,,}')
    assert_one_line_error(run_cli("layouts", "--model", str(broken), *QUERY), "config.json",
                          "line 1")
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    assert_one_line_error(run_cli("layouts", "--model", str(missing), *QUERY),
                          "missing key")
    wrong = tmp_path / "wrong.json"
    data = json.loads((FIXTURES / "llama3-70b.json").read_text())
    data["num_hidden_layers"] = -80
    wrong.write_text(json.dumps(data))
    assert_one_line_error(run_cli("layouts", "--model", str(wrong), *QUERY), "num_hidden_layers",
                          "-80")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mamba", "hidden_size": 2048}))
    assert_one_line_error(run_cli("layouts", "--model", str(config), *QUERY), "mamba", "llama")


def test_unreadable_model_path(tmp_path: Path) -> None:
    assert_one_line_error(
        run_cli("layouts", "--model", str(tmp_path / "nope" / "config.json"), *QUERY),
        "nope",
    )
