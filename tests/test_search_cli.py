"""``parsearch search`` and ``parsearch pareto`` against the CLI contract."""

from __future__ import annotations

import json
from pathlib import Path

from parsearch.cost.analytic import TIME_KEYS
from tests.cli_helpers import assert_one_line_error, run_cli

COMMON = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64",
          "--seq-len", "4096", "--micro-batch-sizes", "1", "--recompute", "selective")
LAYOUT_KEYS = {"tp", "pp", "cp", "ep", "etp", "vpp", "dp", "edp", "mbs", "sp", "recompute",
               "min_gpus"}


def test_search_json_contract() -> None:
    result = run_cli("search", *COMMON, "--gpus", "16", "--top", "3", "--format", "json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert {"query", "considered", "valid", "feasible", "results"} <= doc.keys()
    assert doc["considered"] >= doc["valid"] >= doc["feasible"] > 0
    assert len(doc["results"]) == 3
    tokens = [r["tokens_per_s"] for r in doc["results"]]
    # best first (ties with the best are marked, not reordered); every result carries its
    # likely range
    assert all(r["tokens_per_s_per_gpu_range"] for r in doc["results"])
    low, high = doc["results"][0]["tokens_per_s_per_gpu_range"]
    assert tokens[0] >= max(tokens) * (1.0 - (high / low - 1.0) / 2.0) * (1 - 1e-9)
    first = doc["results"][0]
    assert set(first["layout"]) == LAYOUT_KEYS
    assert {"weights", "gradients", "optimizer", "activations", "other", "total",
            "capacity"} == set(first["memory_gib_per_gpu"])
    assert set(TIME_KEYS) == set(first["time_s"])
    assert first["launch"]["nodes"] == 2 and first["bottleneck"] in first["time_s"]
    assert "feasible" in result.err  # the summary goes to stderr


def test_search_table_names_the_mfu_denominator_for_low_precision() -> None:
    """The mfu% column is over the BF16 peak whatever the precision; an FP8 table says so
    (an FP8 run can pass 50%), a BF16 one needs no note."""
    fp8 = run_cli("search", *COMMON, "--gpus", "8", "--top", "2", "--precision", "fp8")
    bf16 = run_cli("search", *COMMON, "--gpus", "8", "--top", "2")
    assert fp8.code == 0 and bf16.code == 0, fp8.err + bf16.err
    assert "mfu%: model FLOPs over the GPU's dense BF16 peak; fp8" in fp8.out
    assert "mfu%:" not in bf16.out


def test_search_table_with_launch_and_diverse() -> None:
    result = run_cli("search", *COMMON, "--gpus", "8", "--top", "4", "--diverse", "--launch")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split()[:3] == ["#", "tp", "pp"]
    # layouts the tool cannot order carry "~" and the table says what the band is
    marked = [line for line in lines[1:5] if line.split()[0].endswith("~")]
    assert bool(marked) == ("~ tie: within" in result.out)
    assert "run_recipe.py --recipe" in result.out and \
        " ++model.tensor_model_parallel_size=" in result.out
    assert "pretrain_gpt.py" in result.out and " --tensor-model-parallel-size " in result.out
    assert result.out.count("torchrun --nnodes 1 --nproc-per-node 8") == 2 * 4


def test_search_errors_are_one_line() -> None:
    assert_one_line_error(run_cli("search", *COMMON, "--gpus", "1", "--seq-len", "131072"),
                          "fits in memory", "GiB per GPU")
    assert_one_line_error(run_cli("search", *COMMON, "--gpus", "8", "--top", "0"), "--top")


def test_pareto_json_and_plots(tmp_path: Path) -> None:
    png, page = tmp_path / "front.png", tmp_path / "front.html"
    result = run_cli("pareto", *COMMON, "--max-gpus", "32", "--format", "json",
                     "--plot", str(png))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["method"] == "exhaustive"
    gpus = [p["num_gpus"] for p in doc["front"]]
    assert gpus == sorted(gpus) and gpus[0] == 8
    for point in doc["front"]:
        assert {"num_gpus", "tokens_per_s", "layout", "scaling_efficiency"} <= point.keys()
        assert set(point["layout"]) == LAYOUT_KEYS
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = run_cli("pareto", *COMMON, "--max-gpus", "32", "--plot", str(page))
    assert table.code == 0, table.err
    assert table.out.splitlines()[0].split()[:3] == ["gpus", "nodes", "tokens/s"]
    text = page.read_text()
    assert "<svg" in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files


def test_pareto_optuna_in_memory() -> None:
    result = run_cli("pareto", *COMMON, "--max-gpus", "32", "--method", "optuna",
                     "--n-trials", "60", "--seed", "0", "--format", "json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["method"] == "optuna" and doc["study"]["trials_completed"] == 60
    assert doc["front"]


def test_pareto_errors_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("pareto", *COMMON, "--max-gpus", "32", "--plot",
                                  str(tmp_path / "front.pdf")), ".png or .html")
    assert_one_line_error(run_cli("pareto", *COMMON, "--max-gpus", "4"), "--min-gpus")
    assert_one_line_error(run_cli("pareto", *COMMON, "--max-gpus", "16", "--method",
                                  "exhaustive", "--storage", "sqlite:///x.db"),
                          "--method optuna")
    assert_one_line_error(run_cli("pareto", *COMMON, "--max-gpus", "16", "--method", "optuna",
                                  "--storage", "nowhere"), "storage")


def test_search_lists_one_layout_per_shape_unless_asked_for_every_variant() -> None:
    """The default shortlist has distinct (tp, pp, cp, ep, etp) shapes; --no-diverse keeps
    the variants (vpp, micro-batch, recompute) of one shape."""
    shapes = ("tp", "pp", "cp", "ep", "etp")

    def listed(*extra: str) -> list[dict]:
        result = run_cli("search", "--model", "llama3-70b", "--cluster", "dgx-h100",
                         "--gpus", "64", "--global-batch", "128", "--seq-len", "8192",
                         "--top", "8", "--format", "json", *extra)
        assert result.code == 0, result.err
        return [r["layout"] for r in json.loads(result.out)["results"]]

    default = listed()
    assert len({tuple(r[k] for k in shapes) for r in default}) == len(default)
    every = listed("--no-diverse")
    assert len({tuple(r[k] for k in shapes) for r in every}) < len(every)


def test_search_csv_says_which_rows_are_tied() -> None:
    import csv
    import io

    result = run_cli("search", *COMMON, "--gpus", "8", "--top", "4", "--format", "csv")
    assert result.code == 0, result.err
    rows = list(csv.DictReader(io.StringIO(result.out)))
    doc = json.loads(run_cli("search", *COMMON, "--gpus", "8", "--top", "4",
                             "--format", "json").out)
    assert [r["tied_with_best"] for r in rows] == [
        str(r["tied_with_best"]) for r in doc["results"]]
