"""The AIConfigurator comparison's contract (benchmarks/compare_aiconfigurator.py, issue 34).

AIConfigurator is never imported here: the driver runs in the interpreter named by
``PARSEARCH_AIC_PYTHON`` (a separate virtualenv with ``pip install aiconfigurator``), and
the test that needs it skips when none is configured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
DRIVER = BENCH / "aiconfigurator_driver.py"


def _compare_module():
    spec = importlib.util.spec_from_file_location("compare_aiconfigurator",
                                                  BENCH / "compare_aiconfigurator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_aiconfigurator_prints_parsearch_and_exits_0(monkeypatch, capsys):
    monkeypatch.delenv("PARSEARCH_AIC_PYTHON", raising=False)
    assert _compare_module().main(["--rows", "s0003"]) == 0
    out = capsys.readouterr().out
    assert "AIConfigurator not installable here: no AIConfigurator python given" in out
    assert "s0003" in out and "parsearch alone: MAPE" in out


def test_questions_follow_the_published_layout():
    compare = _compare_module()
    rows = {r["id"]: r for r in compare.vs.load_rows()}
    q, why = compare.question(rows["s0042"])  # Qwen3-235B FP8, TP8 with attention DP 8
    assert why is None
    assert q["layouts"] == [{"tp": 1, "pp": 1, "attention_dp": 8, "moe_tp": 1, "moe_ep": 8}]
    assert q["model_path"] == "Qwen/Qwen3-235B-A22B-FP8" and q["system"] == "h200_sxm"
    assert q["max_batch"] > 0 and q["ctx_tokens"] >= q["isl"]
    q, _ = compare.question(rows["s0148"])  # a latency row: concurrency 1 as the batch
    assert q["batch"] == 1 and q["mode"] == "static"
    assert q["layouts"] == [{"tp": 4, "pp": 1, "attention_dp": 1}]


@pytest.mark.skipif(not os.environ.get("PARSEARCH_AIC_PYTHON"),
                    reason="no AIConfigurator python configured: set PARSEARCH_AIC_PYTHON to "
                    "a python with aiconfigurator installed (optional, issue 34)")
def test_driver_json_contract():
    exe = os.environ["PARSEARCH_AIC_PYTHON"]
    question = {"id": "t1", "model_path": "meta-llama/Meta-Llama-3.1-8B", "system": "h200_sxm",
                "backend": "trtllm", "isl": 128, "osl": 128, "num_gpus": 2,
                "layouts": [{"tp": 1, "pp": 1, "attention_dp": 1}], "gemm_quant": "fp8",
                "kv_quant": "fp8", "ctx_tokens": 2048, "batch": 8}
    bad = dict(question, id="t2", model_path="no-such/model")
    done = subprocess.run([exe, str(DRIVER)], input=json.dumps({"questions": [question, bad]}),
                          capture_output=True, text=True, timeout=600, check=True)
    out = json.loads(done.stdout)
    assert out["aiconfigurator"]
    good, failed = out["answers"]
    assert good["id"] == "t1" and good["ok"] and good["error"] is None
    assert good["tokens_per_s"] > 0 and good["ttft_ms"] > 0 and good["tpot_ms"] > 0
    assert good["tokens_per_s_per_gpu"] == pytest.approx(good["tokens_per_s"] / 2)
    assert good["batch"] == 8 and good["calls"] == 1
    assert failed["id"] == "t2" and not failed["ok"] and failed["error"]
