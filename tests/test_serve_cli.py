"""``parsearch serve`` and ``serve_layouts``: targets, replicas, the front, JSON, errors; the
serving dataset's provenance."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch import data as data_pkg
from parsearch.errors import NoValidLayoutError
from parsearch.model.presets import PRESETS, get_preset
from parsearch.serve.api import _context, serve_layouts
from parsearch.serve.evaluate import ServingEstimate, _finite, evaluate_aggregated
from parsearch.serve.front import pareto_points, rank_estimates
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster, preset_names
from tests.cli_helpers import assert_one_line_error, run_cli

_FIELDS = ("layout", "batch", "tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
           "ttft_ms", "tpot_ms", "kv_cache_gib_per_gpu", "memory_gib_per_gpu", "fits")


def _strict(text: str) -> dict:
    def reject(token: str) -> None:
        raise AssertionError(f"non-strict JSON constant {token}")
    return json.loads(text, parse_constant=reject)


def test_json_has_the_issue_fields_and_meets_targets() -> None:
    result = run_cli("serve", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8",
                     "--isl", "1000", "--osl", "500", "--precision", "fp8", "--tpot-ms", "25",
                     "--ttft-ms", "500", "--top", "4", "--format", "json")
    assert result.code == 0, result.err
    doc = _strict(result.out)
    assert 1 <= len(doc["results"]) <= 4 and doc["front"]
    for row in doc["results"]:
        assert set(_FIELDS) <= set(row)
        assert set(row["layout"]) == {"tp", "pp", "ep", "attention_dp", "replicas",
                                      "gpus_per_replica"}
        assert row["tpot_ms"] <= 25 and row["ttft_ms"] <= 500 and row["fits"]
        lay = row["layout"]
        assert row["gpus"] == lay["replicas"] * lay["gpus_per_replica"] <= 8
        assert math.isclose(row["tokens_per_s_per_gpu"] * row["gpus"], row["tokens_per_s"],
                            rel_tol=1e-3)
        assert "--tensor-parallel-size" in row["launch"]["vllm"] or lay["tp"] == 1
    throughputs = [r["tokens_per_s"] for r in doc["results"]]
    assert throughputs == sorted(throughputs, reverse=True)


def test_table_output_lists_front_and_launch_lines() -> None:
    result = run_cli("serve", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus",
                     "4", "--isl", "512", "--osl", "256", "--top", "3")
    assert result.code == 0, result.err
    assert "Pareto front" in result.out
    assert "vllm serve Qwen/Qwen3-30B-A3B" in result.out
    assert "python -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B" in result.out


def test_front_is_non_dominated_and_best_is_on_it() -> None:
    w = ServingWorkload(isl=2000, osl=200, precision="fp8", kv_precision="fp8")
    result = serve_layouts(model=get_preset("mixtral-8x7b"), cluster="dgx-h100", num_gpus=8,
                           workload=w, top=50)
    front = result.front
    everything = [e.estimate for e in result.entries]
    for p in front:
        for q in everything:
            assert not (q.tokens_per_s_per_gpu > p.tokens_per_s_per_gpu * (1 + 1e-9)
                        and q.tokens_per_s_per_user > p.tokens_per_s_per_user * (1 + 1e-9))
    per_gpu = [p.tokens_per_s_per_gpu for p in front]
    per_user = [p.tokens_per_s_per_user for p in front]
    assert per_gpu == sorted(per_gpu) and per_user == sorted(per_user, reverse=True)
    assert pareto_points([]) == []


def test_request_rate_gives_the_smallest_group_that_carries_it() -> None:
    w = ServingWorkload(isl=1000, osl=200, precision="fp8", kv_precision="fp8",
                        request_rate=5.0, tpot_ms=40)
    result = serve_layouts(model=get_preset("llama3-8b"), cluster="dgx-h100", num_gpus=16,
                           workload=w, top=20)
    gpus = [e.estimate.gpus for e in result.entries]
    assert gpus == sorted(gpus)
    best = result.best.estimate
    assert best.tokens_per_s / 200 >= 5.0 * (1 - 1e-9)   # requests/s carried >= the rate
    # One replica fewer would not carry it.
    fewer = best.layout.replicas - 1
    assert fewer * best.tokens_per_s / best.layout.replicas / 200 < 5.0


def test_more_replicas_scale_the_group() -> None:
    """The whole group's throughput is replicas times an instance's (independent replicas)."""
    model = get_preset("llama3-8b")
    w = ServingWorkload(isl=500, osl=500, precision="fp8", kv_precision="fp8")
    one = serve_layouts(model=model, cluster="dgx-h100", num_gpus=1, workload=w).best.estimate
    result = serve_layouts(model=model, cluster="dgx-h100", num_gpus=4, workload=w, top=50)
    ctx = _context(model, load_cluster("dgx-h100"), w, None, None)
    four = evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, one.layout.batch, 4), 4)
    assert four.tokens_per_s == pytest.approx(4 * one.tokens_per_s)
    assert result.best.estimate.tokens_per_s >= four.tokens_per_s * (1 - 1e-9)


def test_disaggregated_mode_places_prefill_and_decode() -> None:
    w = ServingWorkload(isl=4000, osl=500, precision="fp8", kv_precision="fp8",
                        mode="disaggregated")
    result = serve_layouts(model=get_preset("llama3-70b"), cluster="dgx-h100", num_gpus=16,
                           workload=w, top=3)
    best = result.best
    assert best.estimate.prefill_layout is not None
    pre, dec = best.estimate.prefill_layout, best.estimate.layout
    assert best.estimate.gpus == pre.gpus + dec.gpus <= 16
    assert "--disaggregation-mode prefill" in " ".join(best.launch.prefill_sglang)
    assert _strict(json.dumps(result.to_dict()))["results"][0]["prefill_layout"]


@pytest.mark.parametrize(("argv", "fragments"), [
    (("--isl", "0"), ("--isl", "must be a positive integer")),
    (("--model", "llama-70b"), ("unknown model preset",)),
    (("--kv-precision", "fp4"), ("kv_precision fp4 needs FP4 tensor cores",)),
    (("--sliding-window", "128"), ("--sliding-window and --windowed-layers go together",)),
    (("--tpot-ms", "0.001"), ("no layout meets the latency targets", "best reachable")),
    (("--gpus", "1", "--model", "llama3.1-405b"), ("no serving layout of llama3.1-405b fits",)),
    (("--precision", "int4"), ("--precision", "invalid choice")),
    (("--cluster", "dgx-h1000"), ("unknown cluster 'dgx-h1000'",)),
    (("--mix", "1000:x"), ("--mix", "is not input:output[:share]")),
    (("--mix", "1000:100:0.5"), ("give either --isl/--osl or --mix, not both",)),
])
def test_bad_input_is_one_line(argv, fragments) -> None:
    base = {"--model": "llama3-70b", "--cluster": "dgx-h100", "--gpus": "8", "--isl": "100",
            "--osl": "100"}
    extra = list(argv)
    for key in list(base):
        if key in extra:
            i = extra.index(key)
            base[key] = extra[i + 1]
            del extra[i:i + 2]
    args = [x for kv in base.items() for x in kv] + extra
    assert_one_line_error(run_cli("serve", *args), *fragments)


def test_no_fit_raises_from_the_api() -> None:
    w = ServingWorkload(isl=100, osl=100)
    with pytest.raises(NoValidLayoutError, match="fits on 1 GPUs"):
        serve_layouts(model=get_preset("llama3.1-405b"), cluster="dgx-h100", num_gpus=1,
                      workload=w)


def test_serving_dataset_has_provenance() -> None:
    csv_path = Path(data_pkg.__file__).parent / "serving_runs.csv"
    rows = list(csv.DictReader(csv_path.open(encoding="utf-8")))
    assert len(rows) >= 100
    assert len({r["id"] for r in rows}) == len(rows)
    clusters = set(preset_names())
    for r in rows:
        assert r["url"].startswith("https://"), r["id"]
        assert r["source"] and r["notes"], r["id"]
        assert r["model"] in PRESETS and r["cluster"] in clusters, r["id"]
        measured = [r[k] for k in ("output_tokens_per_s", "input_tokens_per_s", "tpot_ms") if r[k]]
        assert measured and all(float(v) > 0 for v in measured), r["id"]
        assert r["phase"] in ("", "prefill", "decode"), r["id"]
        width = int(r["tp"]) if r["framework"] == "tensorrt-llm" else (
            int(r["tp"]) * int(r["attention_dp"] or 1))
        assert int(r["num_gpus"]) % (width * int(r["pp"])) == 0, r["id"]


def test_config_json_sliding_window_reaches_the_kv_cache(tmp_path) -> None:
    """A GPT-OSS-style config.json: alternate layers windowed at 128 tokens; with long
    requests the windowed layers hold 128 tokens, so more requests fit than without."""
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
           "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "vocab_size": 201088, "num_local_experts": 128, "num_experts_per_tok": 4,
           "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 18,
           "tie_word_embeddings": False, "hidden_act": "silu"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    common = ("serve", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "1",
              "--isl", "16000", "--osl", "1000", "--precision", "fp4", "--format", "json")
    windowed = run_cli(*common)
    assert windowed.code == 0, windowed.err
    doc = _strict(windowed.out)
    assert doc["query"]["sliding_window"] == {"window": 128, "windowed_layers": 18}
    full = run_cli(*common, "--sliding-window", "128", "--windowed-layers", "1")
    assert full.code == 0, full.err
    fit_windowed = doc["results"][0]["max_batch_fit"]
    fit_full = _strict(full.out)["results"][0]["max_batch_fit"]
    # 18 of 36 layers keep 128 instead of 17,000 tokens: close to twice the requests.
    assert 1.8 * fit_full <= fit_windowed <= 2.0 * fit_full + 1


def test_vllm_max_num_seqs_is_per_data_parallel_engine() -> None:
    from parsearch.serve.launch import launch_settings

    w = ServingWorkload(isl=100, osl=100, precision="fp8", kv_precision="fp8")
    s = launch_settings("deepseek-ai/DeepSeek-V3", ServingLayout(1, 1, 8, 8, 512, 1), w)
    vllm = " ".join(s.vllm)
    assert "--data-parallel-size 8 --enable-expert-parallel --max-num-seqs 64" in vllm
    sglang = " ".join(s.sglang)
    assert "--tp-size 8 --dp-size 8 --enable-dp-attention --ep-size 8" in sglang
    assert "--max-running-requests 512" in sglang


# --- issue 35: a result that serves nothing is "nothing fits", never a result --------------


def test_request_beyond_the_context_window_is_nothing_fits() -> None:
    # The campaign's reproducer: a 4M-token prompt on DeepSeek-V3 (163,840-token window)
    # exited 0 with tokens/s per GPU printed as 0.
    result = run_cli("serve", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus",
                     "32", "--mix", "4194304:1", "--ttft-ms", "1e9", "--tpot-ms", "1e9",
                     "--precision", "fp4")
    assert_one_line_error(result, "nothing fits", "4,194,305 tokens", "163,840")


def test_request_at_the_context_window_is_served() -> None:
    w = ServingWorkload(isl=163_839, osl=1, precision="fp8", kv_precision="fp8")
    result = serve_layouts(model=get_preset("deepseek-v3"), cluster="gb300-nvl72",
                           num_gpus=8, workload=w, top=1)
    assert result.best is not None and result.best.estimate.tokens_per_s_per_gpu > 0


def test_tiny_positive_rates_never_print_as_zero() -> None:
    # No window is known for the Llama presets: a 4M-token prompt is priced, and its tiny
    # rate must show as what it is, not as 0 (JSON rounded to 4 decimals did).
    result = run_cli("serve", "--model", "llama3-70b", "--cluster", "gb300-nvl72", "--gpus",
                     "32", "--mix", "4194304:1", "--precision", "fp4", "--format", "json")
    assert result.code == 0, result.err
    data = _strict(result.out)
    for entry in data["results"] + data["front"]:
        assert entry["tokens_per_s_per_gpu"] > 0
        assert entry["tokens_per_s_per_user"] > 0
        assert entry["tokens_per_s"] / entry["gpus"] == pytest.approx(
            entry["tokens_per_s_per_gpu"], rel=2e-3)


def _estimate(tokens_per_s: float, per_user: float = 1.0) -> ServingEstimate:
    return ServingEstimate(ServingLayout(1, 1, 1, 1, 1), 1, tokens_per_s, per_user, 1.0, 1.0,
                           1.0, 1.0, True, 1, "memory")


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan, math.inf])
def test_zero_or_undefined_throughput_is_never_ranked_nor_on_the_front(rate) -> None:
    bad, good = _estimate(rate), _estimate(5.0)
    assert not bad.serves and good.serves
    assert rank_estimates([bad, good], by_gpus=False) == [good]
    assert pareto_points([bad, good]) == [good]
    assert not _estimate(5.0, per_user=0.0).serves


def test_layouts_that_fit_but_serve_nothing_raise_nothing_fits(monkeypatch) -> None:
    import parsearch.serve.api as api

    def zero(ctx, num_gpus, layouts):
        return [replace(e, tokens_per_s=0.0) for e in real(ctx, num_gpus, layouts)]

    real = api.score_layouts
    monkeypatch.setattr(api, "score_layouts", zero)
    with pytest.raises(NoValidLayoutError, match="carries any tokens"):
        serve_layouts(model=get_preset("llama3-8b"), cluster="dgx-h100", num_gpus=1,
                      workload=ServingWorkload(isl=100, osl=100))


@settings(max_examples=200, deadline=None)
@given(value=st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
def test_reported_numbers_keep_sign_and_four_significant_digits(value) -> None:
    shown = _finite(value)
    assert shown is not None
    assert (shown > 0) == (value > 0) and (shown < 0) == (value < 0)
    # 4 decimals from 1 up (plus float64's own spacing), 4 significant digits below
    tolerance = 5e-5 + 4e-16 * abs(value) if abs(value) >= 1 else 5e-4 * abs(value)
    assert abs(shown - value) <= tolerance + 1e-300


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(("llama3-8b", "qwen3-30b-a3b", "deepseek-v3")),
       gpus=st.sampled_from((1, 2, 8)), isl=st.integers(1, 4_000_000),
       osl=st.integers(1, 100_000), concurrency=st.one_of(st.none(), st.integers(1, 10**6)),
       engine=st.sampled_from(("vllm", "sglang", "trtllm")))
def test_every_answer_serves_or_says_nothing_fits(name, gpus, isl, osl, concurrency,
                                                  engine) -> None:
    w = ServingWorkload(isl=isl, osl=osl, precision="fp8", kv_precision="fp8",
                        concurrency=concurrency, engine=engine)
    try:
        result = serve_layouts(model=get_preset(name), cluster="dgx-h100", num_gpus=gpus,
                               workload=w, top=3)
    except NoValidLayoutError as error:
        assert "\n" not in str(error)
        return
    for entry in result.entries:
        d = entry.to_dict()
        for key in ("tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
                    "ttft_ms", "tpot_ms"):
            assert d[key] is not None and d[key] > 0, (key, d)
        assert d["running_batch"] <= d["batch"]
