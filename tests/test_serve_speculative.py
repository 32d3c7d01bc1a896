"""Speculative decoding / MTP, prefix caching and the TensorRT-LLM launch line of ``serve``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.model.params import parameter_counts
from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.evaluate import evaluate_aggregated, instance_times
from parsearch.serve.launch import launch_settings
from parsearch.serve.launch_trtllm import trtllm_launch
from parsearch.serve.prefix_cache import computed_prompt_tokens, mean_prefill_attended
from parsearch.serve.spec import MAX_SPEC_TOKENS, ServingLayout, ServingWorkload
from parsearch.serve.speculative import (
    METHOD_DEFAULTS,
    Speculation,
    expected_tokens_per_step,
    head_draft_cost,
    speculative_tpot_s,
)
from tests.cli_helpers import assert_one_line_error, run_cli

_LLAMA = get_preset("llama3-70b")


def _times(batch: int, layout: tuple[int, int] = (4, 1), **fields: object):
    w = ServingWorkload(isl=2000, osl=500, precision="fp8", kv_precision="fp8", **fields)
    ctx = _context(_LLAMA, _cluster(), w, None, None)
    tp, pp = layout
    return instance_times(ctx, ServingLayout(tp=tp, pp=pp, ep=1, attention_dp=1, batch=batch))


def _cluster():
    from parsearch.topology.cluster import load_cluster
    return load_cluster("dgx-h100")


# --- expected tokens per verify step (Leviathan et al. 2023, eq. 1) --------------------

def test_deepseek_v3_mtp_golden() -> None:
    # DeepSeek-V3 report §5.4.3: second-token acceptance 85-90% -> 1.85-1.90 tokens per step
    assert expected_tokens_per_step(0.85, 1) == pytest.approx(1.85)
    assert expected_tokens_per_step(0.90, 1) == pytest.approx(1.90)
    assert METHOD_DEFAULTS["mtp"] == (1, 0.85)


@settings(max_examples=200, deadline=None)
@given(alpha=st.floats(0.0, 1.0), more=st.floats(0.0, 1.0), k=st.integers(1, MAX_SPEC_TOKENS))
def test_tokens_per_step_bounded_and_monotone(alpha, more, k) -> None:
    e = expected_tokens_per_step(alpha, k)
    assert 1.0 - 1e-12 <= e <= k + 1 + 1e-9
    assert expected_tokens_per_step(min(1.0, alpha + more), k) >= e - 1e-9
    assert expected_tokens_per_step(alpha, k + 1) >= e - 1e-12


def test_tokens_per_step_ends() -> None:
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.0, 4) == 1.0


@settings(max_examples=100, deadline=None)
@given(alpha=st.floats(0.0, 1.0), k=st.integers(1, 8), cost=st.floats(0.0, 1.0),
       verify=st.floats(1e-4, 1.0), plain=st.floats(1e-4, 1.0))
def test_tpot_formula(alpha, k, cost, verify, plain) -> None:
    spec = Speculation("eagle", k, alpha, cost)
    got = speculative_tpot_s(spec, verify, plain)
    assert got == pytest.approx((verify + k * cost * plain) / expected_tokens_per_step(alpha, k))


def test_head_draft_cost_is_one_layer_plus_head() -> None:
    counts = parameter_counts(_LLAMA)
    cost = head_draft_cost(_LLAMA, counts)
    # Llama 3 70B: 80 layers, an output layer of ~1 B of ~70 B: a bit over 1/80 + 1/70
    assert 1 / 80 < cost < 0.05


# --- priced in the serving model ------------------------------------------------------

def test_spec_off_is_unchanged() -> None:
    assert _times(8).tpot_decode_s == _times(8, spec_decode="none").tpot_decode_s
    assert _times(8).plain_tpot_s is None


def test_one_draft_speeds_up_a_memory_bound_small_batch() -> None:
    # one draft token at the MTP default acceptance (Llama has no MTP module: an EAGLE head)
    plain = _times(1)
    spec = _times(1, spec_decode="eagle", spec_tokens=1, acceptance_rate=0.85)
    assert spec.plain_tpot_s == pytest.approx(plain.tpot_decode_s)
    # weights read once for two tokens: close to the 1.85x of the token count, less drafts
    assert 1.5 < plain.tpot_decode_s / spec.tpot_decode_s < 1.85


def test_zero_acceptance_never_helps() -> None:
    for batch in (1, 64, 512):
        plain = _times(batch).tpot_decode_s
        assert _times(batch, spec_decode="eagle", acceptance_rate=0.0).tpot_decode_s >= plain


def test_gain_shrinks_when_the_verify_pass_is_compute_bound() -> None:
    def gain(batch: int) -> float:
        return _times(batch).tpot_decode_s / _times(
            batch, spec_decode="eagle", acceptance_rate=0.75).tpot_decode_s

    assert gain(1) > gain(256) > gain(2048)


@settings(max_examples=20, deadline=None)
@given(batch=st.sampled_from([1, 16, 128]), low=st.floats(0.0, 1.0), high=st.floats(0.0, 1.0))
def test_higher_acceptance_never_slower(batch, low, high) -> None:
    low, high = sorted((low, high))
    slow = _times(batch, spec_decode="eagle", acceptance_rate=low).tpot_decode_s
    fast = _times(batch, spec_decode="eagle", acceptance_rate=high).tpot_decode_s
    assert fast <= slow * (1 + 1e-12)


def test_verify_pass_reads_weights_once() -> None:
    plain, spec = _times(4), _times(4, spec_decode="eagle", spec_tokens=3)
    assert spec.decode.memory_s == pytest.approx(plain.decode.memory_s)
    assert spec.decode.compute_s > plain.decode.compute_s


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"spec_tokens": 2}, "without spec_decode"),
    ({"spec_decode": "mtp", "acceptance_rate": 1.2}, "--acceptance-rate) must be in [0, 1]"),
    ({"spec_decode": "mtp", "spec_tokens": MAX_SPEC_TOKENS + 1}, "--spec-tokens) must be in"),
    ({"spec_decode": "eagle", "draft_cost": -0.1}, "--draft-cost) must be in [0, 1]"),
    ({"spec_decode": "draft", "acceptance_rate": 0.7}, "needs acceptance_rate"),
    ({"spec_decode": "medusa"}, "spec_decode must be one of"),
    ({"prefix_cache_hit": 1.0}, "--prefix-cache-hit) must be in [0, 1)"),
    ({"prefix_cache_hit": -0.1}, "--prefix-cache-hit) must be in [0, 1)"),
])
def test_bad_knobs_name_the_flag_and_range(fields, fragment) -> None:
    with pytest.raises(SpecError, match=None) as info:
        ServingWorkload(isl=100, osl=100, **fields)
    assert fragment in str(info.value)


# --- prefix caching -------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(isl=st.integers(1, 100_000), hit=st.floats(0.0, 0.999))
def test_prefix_formulas(isl, hit) -> None:
    assert 1.0 <= computed_prompt_tokens(isl, hit) <= isl
    assert isl / 2 <= mean_prefill_attended(isl, hit) <= isl


def test_prefix_hit_zero_is_unchanged_and_ttft_falls_with_hits() -> None:
    base = _times(64)
    assert _times(64, prefix_cache_hit=0.0).ttft_s == base.ttft_s
    ttfts = [_times(64, prefix_cache_hit=h).ttft_s for h in (0.0, 0.25, 0.5, 0.9)]
    busy = [_times(64, prefix_cache_hit=h).prefill_busy_s for h in (0.0, 0.25, 0.5, 0.9)]
    assert ttfts == sorted(ttfts, reverse=True) and ttfts[-1] < 0.5 * ttfts[0]
    assert busy == sorted(busy, reverse=True)
    # decode is untouched: the cached prefix is still attended to
    assert _times(64, prefix_cache_hit=0.9).tpot_decode_s == base.tpot_decode_s


def test_prefix_hits_raise_throughput_of_prefill_heavy_traffic() -> None:
    def tput(hit: float) -> float:
        w = ServingWorkload(isl=8000, osl=100, precision="fp8", kv_precision="fp8",
                            prefix_cache_hit=hit)
        ctx = _context(_LLAMA, _cluster(), w, None, None)
        return evaluate_aggregated(ctx, ServingLayout(4, 1, 1, 1, 32, 2), 8).tokens_per_s

    assert tput(0.8) > 2 * tput(0.0)


# --- launch lines ---------------------------------------------------------------------

def test_trtllm_line_for_attention_dp_and_ep() -> None:
    w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8",
                        engine="trtllm", memory_fraction=0.95, max_num_batched_tokens=4096,
                        spec_decode="mtp", prefix_cache_hit=0.3)
    cmd, yaml = trtllm_launch("nvidia/DeepSeek-R1-FP4", ServingLayout(1, 1, 8, 8, 512, 1), w)
    line = " ".join(cmd)
    for part in ("--backend pytorch", "--tp_size 8", "--ep_size 8", "--max_batch_size 64",
                 "--max_num_tokens 4096", "--max_seq_len 2000",
                 "--kv_cache_free_gpu_memory_fraction 0.95", "--extra_llm_api_options"):
        assert part in line
    assert "--pp_size" not in line
    assert yaml == ("enable_attention_dp: true", "kv_cache_config:", "  dtype: fp8",
                    "  enable_block_reuse: true", "speculative_config:",
                    "  decoding_type: MTP", "  num_nextn_predict_layers: 1")


def test_trtllm_line_for_plain_tp_pp() -> None:
    w = ServingWorkload(isl=1000, osl=200)
    cmd, yaml = trtllm_launch("m", ServingLayout(2, 2, 1, 1, 16, 1), w)
    assert cmd == ("trtllm-serve", "m", "--backend", "pytorch", "--tp_size", "2", "--pp_size",
                   "2", "--max_batch_size", "16", "--max_num_tokens", "8192",
                   "--max_seq_len", "1200")
    assert yaml == ()


def test_all_three_engines_get_speculation_flags() -> None:
    w = ServingWorkload(isl=1000, osl=200, spec_decode="eagle", spec_tokens=4,
                        prefix_cache_hit=0.5)
    s = launch_settings("m", ServingLayout(2, 1, 1, 1, 16, 1), w)
    vllm, sglang = " ".join(s.vllm), " ".join(s.sglang)
    assert '"method": "eagle", "num_speculative_tokens": 4' in vllm
    assert "--enable-prefix-caching" in vllm
    assert "--speculative-algorithm EAGLE --speculative-num-steps 4" in sglang
    assert "  max_draft_len: 4" in s.trtllm_options
    assert s.to_dict()["trtllm"].startswith("trtllm-serve m")


def test_cli_flags_reach_the_result() -> None:
    import json
    out = run_cli("serve", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8",
                  "--isl", "1000", "--osl", "200", "--precision", "fp8", "--spec-decode",
                  "eagle", "--acceptance-rate", "0.9", "--prefix-cache-hit", "0.5", "--format",
                  "json", "--top", "1")
    assert out.code == 0, out.err
    data = json.loads(out.out)
    q = data["query"]
    assert (q["spec_decode"], q["acceptance_rate"], q["prefix_cache_hit"]) == ("eagle", 0.9, 0.5)
    assert data["results"][0]["launch"]["trtllm"].startswith("trtllm-serve")


@pytest.mark.parametrize(("argv", "fragments"), [
    (("--acceptance-rate", "0.8"), ("acceptance_rate", "without spec_decode")),
    (("--spec-decode", "mtp", "--acceptance-rate", "2"), ("--acceptance-rate", "[0, 1]")),
    (("--spec-decode", "draft",), ("--acceptance-rate", "--draft-cost")),
    (("--prefix-cache-hit", "1"), ("--prefix-cache-hit", "[0, 1)")),
    (("--spec-decode", "lookahead"), ("--spec-decode", "invalid choice")),
])
def test_cli_bad_knobs_are_one_line(argv, fragments) -> None:
    base = ("--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8", "--isl", "100",
            "--osl", "100")
    assert_one_line_error(run_cli("serve", *base, *argv), *fragments)


def test_eplb_reaches_the_launch_lines_only_with_ep() -> None:
    w = ServingWorkload(isl=1000, osl=200, eplb=True)
    with_ep = launch_settings("m", ServingLayout(1, 1, 8, 8, 64, 1), w)
    assert "--enable-eplb" in with_ep.vllm and "--enable-eplb" in with_ep.sglang
    assert "  load_balancer:" in with_ep.trtllm_options
    without = launch_settings("m", ServingLayout(8, 1, 1, 1, 64, 1), w)
    assert "--enable-eplb" not in without.vllm + without.sglang


def test_deepseek_v3_mtp_speedup_matches_the_report() -> None:
    # DeepSeek-V3 report §5.4.3: MTP with 85-90% second-token acceptance "enables the model to
    # decode at 1.8 times TPS"; priced here at 1.6-1.7x (verify pass of 2 tokens touches
    # twice the experts at small batch, plus the MTP module's draft pass)
    from parsearch.topology.cluster import load_cluster
    model = get_preset("deepseek-v3")
    for batch in (1, 32):
        tpot = []
        for fields in ({}, {"spec_decode": "mtp"}):
            w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8",
                                **fields)
            ctx = _context(model, load_cluster("dgx-h200"), w, None, None)
            lay = ServingLayout(8, 1, 1, 1, batch)
            tpot.append(instance_times(ctx, lay).tpot_decode_s)
        assert tpot[0] / tpot[1] == pytest.approx(1.8, rel=0.15)


def test_mtp_needs_a_model_with_an_mtp_module() -> None:
    w = ServingWorkload(isl=100, osl=100, spec_decode="mtp")
    with pytest.raises(SpecError, match="has no multi-token-prediction module"):
        _context(get_preset("qwen3-30b-a3b"), _cluster(), w, None, None)


def test_explain_ttft_parts_add_up_with_speculation() -> None:
    from parsearch.serve.explain import explain_serving
    w = ServingWorkload(isl=1000, osl=200, precision="fp8", kv_precision="fp8",
                        spec_decode="eagle", concurrency=32)
    r = explain_serving(model=_LLAMA, cluster="dgx-h100", num_gpus=8, workload=w,
                        layout="tp=4")
    p = r.prefill
    ttft_parts = ("queue", "ttft_alone", "tokenize_prompt", "wait_for_running_step",
                  "attention_dp_balance_wait",
                  "prefills_queued_ahead", "first_wave_burst", "decodes_riding_prefill_chunks")
    assert p["ttft"] == pytest.approx(sum(p[k] for k in ttft_parts), rel=1e-4)
