"""The held-out serving rows (issue 34): sources added after the serving model and its one
fitted factor were set, kept out of every fit and reported apart
(``src/parsearch/data/SERVING_RUNS.md``, ``benchmarks/validate_serving.py``).

Checks the data file's integrity: every held-out row names a pinned source, parses into a
workload, is priced without error on its published layout, and never reaches a fit.
"""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from parsearch.model.presets import PRESETS
from parsearch.topology.cluster import preset_names
from tests.bench_modules import benchmark_module

#: A URL pinned to one document version: a 40-hex commit or a release tag in the path.
PINNED = re.compile(r"/blob/([0-9a-f]{40}|v\d+\.\d+\.\d+)/")


def _module(name: str) -> ModuleType:
    return benchmark_module(name)


@pytest.fixture(scope="module")
def vs() -> ModuleType:
    return _module("validate_serving")


@pytest.fixture(scope="module")
def held(vs: ModuleType) -> list[dict[str, str]]:
    return [r for r in vs.load_rows() if vs.is_held_out(r)]


def test_held_out_marker_is_yes_or_blank(vs: ModuleType) -> None:
    assert {r["held_out"] for r in vs.load_rows()} == {"", "yes"}


def test_held_out_set_is_large_and_varied(held: list[dict[str, str]]) -> None:
    assert len(held) >= 20
    assert len({r["source"] for r in held}) >= 2
    assert {r["framework"] for r in held} >= {"tensorrt-llm", "vllm", "sglang"}
    latency = [r for r in held if r["ttft_ms"] and r["tpot_ms"]]
    assert len(latency) >= 20


def test_every_held_out_row_has_pinned_provenance(held: list[dict[str, str]]) -> None:
    for r in held:
        assert r["source"] and r["notes"], r["id"]
        assert r["url"].startswith("https://github.com/") and PINNED.search(r["url"]), r["id"]


def test_every_held_out_row_parses(vs: ModuleType, held: list[dict[str, str]]) -> None:
    clusters = set(preset_names())
    for r in held:
        assert r["model"] in PRESETS and r["cluster"] in clusters, r["id"]
        assert r["framework"] in vs.ENGINE_OF and r["phase"] == "", r["id"]
        w = vs.workload_for(r)  # raises SpecError on a bad field
        assert w.engine == vs.ENGINE_OF[r["framework"]] and not w.eplb, r["id"]
        assert r["kv_precision"], r["id"]  # read from the run, never a fallback
        measured = [r[k] for k in ("output_tokens_per_s", "ttft_ms", "tpot_ms") if r[k]]
        assert measured and all(float(v) > 0 for v in measured), r["id"]
        if r["ttft_ms"] or r["tpot_ms"]:
            assert r["concurrency"], r["id"]  # latencies only mean something at a load
        gpus, tp, pp = int(r["num_gpus"]), int(r["tp"]), int(r["pp"])
        assert gpus % (tp * pp) == 0, r["id"]
        if r["attention_dp"]:
            assert tp % int(r["attention_dp"]) == 0, r["id"]


def _sample(held: list[dict[str, str]]) -> list[dict[str, str]]:
    """One row per source, engine, model, GPU, precision and kind (throughput or latency)."""
    seen: dict[tuple[str, ...], dict[str, str]] = {}
    for r in held:
        key = (r["source"], r["framework"], r["model"], r["gpu"], r["precision"],
               str(bool(r["output_tokens_per_s"])), str(bool(r["ttft_ms"])))
        seen.setdefault(key, r)
    return list(seen.values())


def test_held_out_rows_are_priced_on_their_published_layout(
        vs: ModuleType, held: list[dict[str, str]]) -> None:
    sample = _sample(held)
    assert len(sample) >= 10
    for r in sample:
        out = vs.evaluate_row(r)
        assert out["rank"] is not None, r["id"]  # the published layout fits and is ranked
        if r["output_tokens_per_s"]:
            assert out["predicted"] > 0 and out["ape"] >= 0, r["id"]
        for name in ("ttft_ms", "tpot_ms"):
            if r[name]:
                assert out[name]["predicted"] > 0, r["id"]


def test_held_out_rows_never_reach_a_fit(vs: ModuleType, held: list[dict[str, str]]) -> None:
    ids = {r["id"] for r in held}
    fit = vs.fit_rows()
    assert fit and not ids & {r["id"] for r in fit}
    assert len(fit) + len(held) == len(vs.load_rows())
    fit_moe = _module("fit_serving_moe")
    for engine in ("trtllm", "vllm", "sglang"):
        assert not ids & {r["id"] for r in fit_moe.moe_rows(engine)}, engine
    # The fitted factor's rows are the in-sample TensorRT-LLM Qwen3 MoE rows only.
    assert {r["model"] for r in fit_moe.moe_rows("trtllm")} == {"qwen3-235b-a22b",
                                                                "qwen3-30b-a3b"}
    assert fit_moe.moe_rows("vllm") == [] and fit_moe.moe_rows("sglang") == []


def test_held_out_summary_groups_by_engine(vs: ModuleType, held: list[dict[str, str]]) -> None:
    rows = [vs.evaluate_row(r) for r in _sample(held)[:6]]
    rows[0] = {**rows[0], "stall": "first-wave"}  # a row whose every repeat stalled
    summary = vs.held_out_summary(rows)
    assert summary["all"]["rows"] == len(rows) - 1
    assert summary[vs.ALL_STALLS_IN]["rows"] == len(rows)
    assert summary[vs.STALLED]["rows"] == 1
    for e in {r["engine"] for r in rows[1:]}:
        assert summary[f"engine {e}"]["rows"] == sum(r["engine"] == e for r in rows[1:])


def test_a_sweep_point_beaten_by_replicas_of_a_measured_layout_is_dominated() -> None:
    """validate_serving.dominated_by: TP8 at concurrency 8 measured 800 tokens/s; TP4 at
    concurrency 4 measured 500 on 4 GPUs, so two copies carry the same 8 requests at 1,000:
    TP8 is dominated.  TP4 at concurrency 8 (the wrong share) and a layout of another
    question do not count; neither does one that is not faster."""
    vs = _module("validate_serving")
    base = {"source": "s", "engine": "vllm", "model": "m", "gpu": "b200", "precision": "fp4",
            "isl": 922, "osl": 922, "ape": 0.1, "throughput": True, "top5": False}
    tp8 = {**base, "gpus": 8, "concurrency": "8", "measured": 800.0}
    tp4 = {**base, "gpus": 4, "concurrency": "4", "measured": 500.0}
    assert vs.dominated_by(tp8, [tp8, tp4]) is tp4
    wrong_share = {**tp4, "concurrency": "8", "measured": 900.0}
    other = {**tp4, "isl": 7373}
    slower = {**tp4, "measured": 350.0}
    assert vs.dominated_by(tp8, [tp8, wrong_share, other, slower]) is None
    offline8 = {**tp8, "concurrency": ""}
    offline2 = {**tp8, "gpus": 2, "concurrency": "", "measured": 250.0}
    assert vs.dominated_by(offline8, [offline8, offline2]) is offline2
    summary = vs.top5_undominated([tp8, tp4])
    assert summary["rows"] == 1 and summary["dominated"] == 1
