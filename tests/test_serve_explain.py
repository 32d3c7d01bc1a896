"""``serve --layout``: one given layout priced, with where its time and memory go."""

from __future__ import annotations

import json

import pytest

from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.serve.api import serve_layouts
from parsearch.serve.explain import explain_serving, parse_serving_layout
from parsearch.serve.spec import ServingWorkload
from tests.cli_helpers import assert_one_line_error, run_cli

_BASE = ("serve", "--model", "llama3-70b", "--cluster", "dgx-h200", "--gpus", "8", "--isl",
         "128", "--osl", "2048", "--precision", "fp8", "--engine", "trtllm")


def _explain(*extra: str) -> dict:
    result = run_cli(*_BASE, *extra, "--format", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_parts_add_up_to_the_totals() -> None:
    d = _explain("--layout", "tp=2,pp=2", "--concurrency", "600")
    m, dec, pre = d["memory_gib"], d["decode_ms"], d["prefill_ms"]
    assert m["weights"] + m["activation_workspace"] + m["context_nccl"] + m["cuda_graphs"] \
        + m["kv_used"] == pytest.approx(d["memory_gib_per_gpu"], abs=1e-3)
    assert m["kv_used"] <= m["kv_pool"] + 1e-6
    assert m["weights_quantized"] + m["weights_bf16"] == pytest.approx(m["weights"], abs=1e-3)
    assert dec["gemm_and_attention_rooflines"] >= max(dec["memory"], dec["compute"]) - 1e-3
    # the calls' fixed times are a part of the rooflines, never the whole
    assert 0 < dec["dense_gemm_fixed_times"] < dec["gemm_and_attention_rooflines"]
    stage = dec["gemm_and_attention_rooflines"] + dec["communication"] \
        + dec["kernels_and_non_gemm"]
    assert dec["stage_pass"] == pytest.approx(stage, abs=1e-3)
    assert dec["tpot_decode_only"] == pytest.approx(
        2 * (dec["stage_pass"] + dec["pipeline_hop"]) + dec["host_step"], abs=1e-3)
    assert dec["tpot"] == pytest.approx(dec["tpot_decode_only"]
                                        + dec["prefill_stalls_per_token"], abs=1e-3)
    ttft_parts = ("queue", "ttft_alone", "tokenize_prompt", "wait_for_running_step",
                  "attention_dp_balance_wait",
                  "prefills_queued_ahead", "first_wave_burst", "decodes_riding_prefill_chunks")
    assert pre["ttft"] == pytest.approx(sum(pre[k] for k in ttft_parts), rel=1e-4)
    assert d["layout"]["replicas"] == 2 and d["batch"] == 300


def test_concurrency_above_the_kv_cache_shows_the_queue() -> None:
    d = _explain("--layout", "tp=1", "--concurrency", "2000")
    q = d["queue"]
    assert q["in_flight_per_instance"] == 250
    assert q["running_per_instance"] == q["kv_holds"] < 250
    assert q["wait_ms"] > 1000 and d["queue_ms"] == pytest.approx(q["wait_ms"], rel=1e-3)


def test_the_explained_layout_is_priced_as_the_search_prices_it() -> None:
    w = ServingWorkload(isl=1000, osl=500, precision="fp8", kv_precision="fp8")
    best = serve_layouts(model=get_preset("qwen3-30b-a3b"), cluster="dgx-h100", num_gpus=8,
                         workload=w, top=1).best.estimate
    lay = best.layout
    got = explain_serving(model=get_preset("qwen3-30b-a3b"), cluster="dgx-h100", num_gpus=8,
                          workload=w, layout={"tp": lay.tp, "pp": lay.pp, "ep": lay.ep,
                                              "attention_dp": lay.attention_dp,
                                              "replicas": lay.replicas, "batch": lay.batch})
    assert got.estimate.tokens_per_s == pytest.approx(best.tokens_per_s)
    assert got.estimate.ttft_ms == pytest.approx(best.ttft_ms)


def test_default_batch_is_what_the_kv_cache_holds() -> None:
    d = _explain("--layout", "tp=4")  # the KV pool holds more than the engine's 1024
    assert d["max_batch_fit"] > 1024
    assert d["batch"] == d["running_batch"] == d["queue"]["engine_batch_limit"] == 1024
    d = _explain("--layout", "tp=1")
    assert d["batch"] == d["running_batch"] == d["max_batch_fit"] < 1024
    assert d["queue_ms"] == 0


def test_parse_layout() -> None:
    assert parse_serving_layout("tp=8, adp=2 ,ep=16") == {"tp": 8, "attention_dp": 2, "ep": 16}
    for bad, fragment in (("tp=x", "must be a positive integer"), ("foo=1", "key=value"),
                          ("tp=0", "must be a positive integer"), ("tp=2,tp=4", "twice"),
                          ("", "empty")):
        with pytest.raises(SpecError, match=fragment):
            parse_serving_layout(bad)


@pytest.mark.parametrize(("extra", "fragments"), [
    (("--layout", "tp=3"), ("breaks rule S1", "tp=3 must divide the 64 attention heads")),
    (("--layout", "tp=8,replicas=2"), ("needs 16 GPUs", "--gpus 8")),
    (("--layout", "tp=q"), ("--layout", "tp='q' must be a positive integer")),
    (("--batch", "8"), ("--batch goes with --layout",)),
    (("--layout", "tp=1,batch=4", "--batch", "8"), ("give the batch once",)),
    (("--layout", "tp=1", "--mode", "disaggregated"), ("aggregated",)),
])
def test_bad_layouts_are_one_line(extra, fragments) -> None:
    assert_one_line_error(run_cli(*_BASE, *extra), *fragments)


def test_a_layout_that_cannot_hold_one_request_is_nothing_fits() -> None:
    result = run_cli("serve", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus",
                     "8", "--isl", "1000", "--osl", "1000", "--layout", "tp=2")
    assert_one_line_error(result, "nothing fits", "GiB of weights")


def test_table_output_names_the_parts() -> None:
    result = run_cli(*_BASE, "--layout", "tp=2", "--batch", "64")
    assert result.code == 0, result.err
    for title in ("memory per GPU (GiB)", "decode step (ms)", "prefill and first token (ms)",
                  "batch and queue", "kv pool", "tpot decode only"):
        assert title in result.out


def test_a_given_batch_above_the_cap_queues() -> None:
    d = _explain("--layout", "tp=1", "--batch", "400")
    assert d["batch"] == 400 and d["running_batch"] == d["max_batch_fit"] < 400
    assert d["queue_ms"] > 0
