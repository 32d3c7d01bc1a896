"""Serving layouts: space rules, KV-cache hand counts, memory and the decode HBM floor."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.model.files import resolve_model
from parsearch.model.params import parameter_counts
from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.cost import decode_bytes, decode_step, decode_tpot_s, hbm_read_floor_s
from parsearch.serve.kv_cache import (
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_bytes_per_token_layer,
    sliding_window_for,
)
from parsearch.serve.memory import stage_weights, weight_bytes_per_gpu
from parsearch.serve.space import enumerate_serving_layouts, serving_violations
from parsearch.serve.spec import LengthClass, ServingLayout, ServingWorkload, SlidingWindow
from parsearch.topology.cluster import load_cluster
from parsearch.topology.hardware import load_gpu_profile
from tests.strategies import small_models

# --- KV cache: hand counts ------------------------------------------------------------------


def test_kv_gqa_llama3_70b_hand_count() -> None:
    model = get_preset("llama3-70b")  # 80 layers, 8 KV heads, head_dim 128
    assert kv_bytes_per_token(model, "bf16") == 80 * 2 * 8 * 128 * 2 == 327_680
    assert kv_bytes_per_token(model, "fp8") == 80 * 2 * 8 * 128 * 1
    # TP 8: one KV head per rank; TP 16 replicates heads, still one per rank.
    assert kv_bytes_per_token(model, "bf16", tp=8) == 80 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token(model, "bf16", tp=16) == 80 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token(model, "bf16", tp=2) == 80 * 2 * 4 * 128 * 2
    # A 1000+1000-token request on PP 2: half of the layers per stage.
    assert kv_bytes_per_sequence(model, "bf16", 2000, tp=8, pp=2) == 40 * 2 * 128 * 2 * 2000


def test_kv_mla_deepseek_v3_hand_count() -> None:
    model = get_preset("deepseek-v3")  # 61 layers, kv_lora_rank 512, rope dim 64
    assert kv_bytes_per_token(model, "bf16") == 61 * (512 + 64) * 2 == 70_272
    assert kv_bytes_per_token(model, "fp8") == 61 * 576
    # The latent is not split over heads: every TP rank stores all of it.
    assert kv_bytes_per_token(model, "bf16", tp=8) == kv_bytes_per_token(model, "bf16")


def test_kv_sliding_window_gpt_oss_hand_count() -> None:
    model = get_preset("gpt-oss-120b")  # 36 layers, 8 KV heads of 64; 18 windowed at 128
    window = sliding_window_for(model)
    assert window == SlidingWindow(window=128, windowed_layers=18)
    per_layer = 2 * 8 * 64 * 2
    assert kv_bytes_per_token_layer(model, "bf16") == per_layer
    expected = 18 * per_layer * 4096 + 18 * per_layer * 128
    assert kv_bytes_per_sequence(model, "bf16", 4096, window=window) == expected == 155_713_536
    # A context shorter than the window: windows do not matter.
    assert kv_bytes_per_sequence(model, "bf16", 100, window=window) == 36 * per_layer * 100


def test_sliding_window_from_config(tmp_path) -> None:
    base = {"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512,
            "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}
    mixed = tmp_path / "gpt_oss.json"
    mixed.write_text(json.dumps({**base, "sliding_window": 128, "num_hidden_layers": 4,
                                 "layer_types": ["sliding_attention", "full_attention",
                                                 "sliding_attention", "full_attention"]}))
    assert sliding_window_for(resolve_model(str(mixed))) == SlidingWindow(128, 2)
    everywhere = tmp_path / "mistral.json"
    everywhere.write_text(json.dumps({**base, "sliding_window": 4096, "num_hidden_layers": 32}))
    assert sliding_window_for(resolve_model(str(everywhere))) == SlidingWindow(4096, 32)
    none = tmp_path / "llama.json"
    none.write_text(json.dumps({**base, "sliding_window": None, "num_hidden_layers": 32}))
    assert sliding_window_for(resolve_model(str(none))) is None
    off = tmp_path / "qwen2.json"  # Qwen2/3 name a window but switch it off
    off.write_text(json.dumps({**base, "sliding_window": 32768, "use_sliding_window": False,
                               "num_hidden_layers": 32}))
    assert sliding_window_for(resolve_model(str(off))) is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**base, "sliding_window": -5, "num_hidden_layers": 32}))
    with pytest.raises(SpecError, match="sliding_window"):
        resolve_model(str(bad))


def test_window_with_more_layers_than_model_is_rejected() -> None:
    with pytest.raises(SpecError, match="windowed_layers=99 exceeds"):
        sliding_window_for(get_preset("llama3-8b"), SlidingWindow(4096, 99))


# --- memory ------------------------------------------------------------------------------


def test_stage_weights_shard_the_linears_exactly() -> None:
    model = get_preset("llama3-70b")
    counts = parameter_counts(model)
    for tp in (1, 2, 4, 8):
        layout = ServingLayout(tp=tp, pp=1, ep=1, attention_dp=1, batch=1)
        w = stage_weights(model, layout, counts)
        per_layer = counts.attention_per_layer + counts.dense_mlp_per_layer
        assert w.linear * tp == pytest.approx(80 * per_layer)
    # FP8 halves the quantized linears, not the BF16 embedding and output layer.
    one = ServingLayout(1, 1, 1, 1, 1)
    bf16, fp8 = weight_bytes_per_gpu(model, one, "bf16"), weight_bytes_per_gpu(model, one, "fp8")
    ends = (counts.embedding + counts.output) * 2
    assert bf16 - fp8 == pytest.approx(80 * (counts.attention_per_layer
                                             + counts.dense_mlp_per_layer))
    assert fp8 > ends


def test_moe_experts_spread_over_the_stage_width() -> None:
    model = get_preset("deepseek-v3")
    counts = parameter_counts(model)
    lay = ServingLayout(tp=1, pp=1, ep=8, attention_dp=8, batch=8)
    w = stage_weights(model, lay, counts)
    assert w.routed * 8 == pytest.approx(model.num_moe_layers * counts.routed_experts_per_layer)
    assert w.local_experts == pytest.approx(model.num_moe_layers * 256 / 8)


# --- the space: generated == brute-force filter ----------------------------------------------


@settings(max_examples=25, deadline=None)
@given(model=small_models(), num_gpus=st.integers(1, 6), domain=st.sampled_from([2, 4, 8]),
       max_batch=st.sampled_from([1, 4, 8]), concurrency=st.sampled_from([None, 5]),
       largest=st.integers(1, 8), node=st.sampled_from([1, 2, 4]))
def test_space_matches_brute_force(model, num_gpus, domain, max_batch, concurrency,
                                   largest, node) -> None:
    workload = ServingWorkload(isl=64, osl=64, max_batch=max_batch, concurrency=concurrency,
                               max_instance_gpus=largest)
    got = {(x.tp, x.attention_dp, x.pp, x.ep, x.batch): x.replicas
           for x in enumerate_serving_layouts(model, workload, num_gpus, domain, node)}
    want = {}
    r = range(1, num_gpus + 1)
    for tp in r:
        for adp in r:
            for pp in r:
                for ep in r:
                    for batch in range(1, max(max_batch * num_gpus, concurrency or 0) + 1):
                        layout = ServingLayout(tp, pp, ep, adp, batch, 1)
                        if not serving_violations(model, workload, layout, num_gpus, domain,
                                                  node):
                            want[(tp, adp, pp, ep, batch)] = num_gpus // (tp * adp * pp)
    assert got == want


def test_space_rules_name_the_values() -> None:
    model = get_preset("llama3-70b")
    w = ServingWorkload(isl=10, osl=10)
    bad = ServingLayout(tp=3, pp=4, ep=2, attention_dp=2, batch=3)
    rules = {v.rule for v in serving_violations(model, w, bad, 8, 8)}
    assert rules == {"S1", "S2", "S5", "S7", "S8", "S9"}
    assert any("tp=16 exceeds the NVLink domain of 8" in v.message for v in serving_violations(
        model, w, ServingLayout(16, 1, 1, 1, 16), 16, 8))


# --- decode never beats one HBM read of weights + KV ----------------------------------------

_PRESETS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3",
            "gpt-oss-120b", "gpt-1.7b")


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(_PRESETS), isl=st.integers(1, 20000), osl=st.integers(1, 4000),
       precision=st.sampled_from(["bf16", "fp8", "fp4"]), kv=st.sampled_from(["bf16", "fp8"]),
       pick=st.integers(0, 10**6))
def test_decode_time_never_below_hbm_read(name, isl, osl, precision, kv, pick) -> None:
    model = get_preset(name)
    cluster = load_cluster("dgx-h100")
    gpu = load_gpu_profile(cluster.gpu)
    w = ServingWorkload(isl=isl, osl=osl, precision=precision, kv_precision=kv, max_batch=256)
    layouts = enumerate_serving_layouts(model, w, 16, cluster.job_domain_size,
                                        cluster.gpus_per_node)
    layout = layouts[pick % len(layouts)]
    ctx = _context(model, cluster, w, None, None)
    step = decode_step(model, w, layout, ctx.counts, ctx.rates, ctx.links(layout), ctx.window)
    tpot = decode_tpot_s(step, layout.pp)
    assert tpot >= hbm_read_floor_s(model, w, layout, ctx.counts, gpu, ctx.window)
    if model.moe is None:  # independent hand floor: stage weights (less the input
        # embedding, a row lookup) and the KV of the rank's sequences, once per micro-batch
        weights = weight_bytes_per_gpu(model, layout, precision)
        if layout.pp == 1 and not model.tied_embeddings:
            weights -= model.vocab_size * model.hidden_size / layout.tp * 2
        seqs = max(1.0, layout.batch / layout.pp)
        kv_bytes = seqs * kv_bytes_per_sequence(model, kv, isl + osl / 2, tp=layout.tp,
                                                pp=layout.pp, window=ctx.window)
        assert tpot >= layout.pp * (weights + kv_bytes) / gpu.hbm_bandwidth_Bps * 0.999


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(("llama3-8b", "llama3-70b", "mixtral-8x7b")),
       isl=st.integers(1, 8000), osl=st.integers(1, 2000))
def test_tpot_grows_with_batch(name, isl, osl) -> None:
    model = get_preset(name)
    cluster = load_cluster("dgx-h100")
    w = ServingWorkload(isl=isl, osl=osl, precision="fp8", kv_precision="fp8")
    ctx = _context(model, cluster, w, None, None)
    times = []
    for batch in (1, 4, 16, 64, 256):
        layout = ServingLayout(8, 1, 1, 1, batch)
        step = decode_step(model, w, layout, ctx.counts, ctx.rates, ctx.links(layout), None)
        times.append(decode_tpot_s(step, 1))
    assert times == sorted(times)


def test_small_batch_tp_all_reduce_is_latency_bound() -> None:
    """At batch 1 the TP all-reduces of a 70B decode step cost about their call latency
    (2 per layer x 80 layers x the custom all-reduce's ~5 us), not their bytes."""
    model = get_preset("llama3-70b")
    cluster = load_cluster("dgx-h100")
    w = ServingWorkload(isl=100, osl=100, precision="fp8", kv_precision="fp8")
    ctx = _context(model, cluster, w, None, None)
    layout = ServingLayout(8, 1, 1, 1, 1)
    step = decode_step(model, w, layout, ctx.counts, ctx.rates, ctx.links(layout), None)
    from parsearch.serve.cost import CUSTOM_ALL_REDUCE_LATENCY_S
    latency = 2 * 80 * CUSTOM_ALL_REDUCE_LATENCY_S
    assert latency <= step.comm_s <= 1.5 * latency


# --- workload validation ---------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"isl": 0}, "isl must be a positive integer, got 0"),
    ({"precision": "int3"}, "precision must be one of bf16, fp8, fp4; got 'int3'"),
    ({"tpot_ms": -1.0}, "tpot_ms must be a positive number, got -1.0"),
    ({"mode": "split"}, "mode must be one of aggregated, disaggregated"),
    ({"memory_fraction": 1.5}, "memory_fraction must be in (0, 1]"),
    ({"engine": "tgi"}, "engine must be one of vllm, sglang, trtllm"),
])
def test_workload_errors_name_the_field(changes, fragment) -> None:
    base = ServingWorkload(isl=10, osl=10)
    with pytest.raises(SpecError) as info:
        replace(base, **changes)
    assert fragment in str(info.value)


# --- request length mixes ----------------------------------------------------------------------


def test_mix_slot_weighted_contexts_hand_count() -> None:
    w = ServingWorkload.from_mix([LengthClass(1000, 200, 0.7), LengthClass(8000, 500, 0.3)])
    assert (w.isl, w.osl) == (3100, 290)         # request-weighted means
    assert w.mean_osl == pytest.approx(290.0)
    # Batch slots are held in proportion to requests x output tokens: 140 : 150.
    assert w.context == pytest.approx((140 * 1200 + 150 * 8500) / 290)
    assert w.mean_decode_context == pytest.approx((140 * 1100 + 150 * 8250) / 290)
    assert w.max_context == 8500


def test_one_class_mix_equals_fixed_lengths() -> None:
    from parsearch.serve.api import serve_layouts

    model = get_preset("mixtral-8x7b")
    fixed = ServingWorkload(isl=3000, osl=300, precision="fp8", kv_precision="fp8")
    split = ServingWorkload.from_mix([LengthClass(3000, 300, 0.4), LengthClass(3000, 300, 0.6)],
                                     precision="fp8", kv_precision="fp8")
    a = serve_layouts(model=model, cluster="dgx-h100", num_gpus=4, workload=fixed, top=5)
    b = serve_layouts(model=model, cluster="dgx-h100", num_gpus=4, workload=split, top=5)
    for x, y in zip(a.entries, b.entries, strict=True):
        assert x.estimate.layout == y.estimate.layout
        assert x.estimate.tokens_per_s == pytest.approx(y.estimate.tokens_per_s)
        assert x.estimate.ttft_ms == pytest.approx(y.estimate.ttft_ms)


def test_bad_length_class_is_rejected() -> None:
    with pytest.raises(SpecError, match="weight must be a positive number, got 0"):
        LengthClass(100, 10, 0)
    with pytest.raises(SpecError, match="mix is empty"):
        ServingWorkload.from_mix([])


@pytest.mark.parametrize("batch", [8, 256, 4096])
def test_ep_overlap_hides_all_to_alls_but_never_below_them(batch) -> None:
    model = get_preset("deepseek-v3")
    cluster = load_cluster("dgx-h100")
    layout = ServingLayout(tp=1, pp=1, ep=16, attention_dp=16, batch=batch)
    plain = ServingWorkload(isl=2000, osl=100, precision="fp8", kv_precision="bf16")
    overlapped = replace(plain, ep_overlap=True)
    steps = []
    for w in (plain, overlapped):
        ctx = _context(model, cluster, w, None, None)
        steps.append(decode_step(model, w, layout, ctx.counts, ctx.rates, ctx.links(layout),
                                 None))
    a, b = steps
    assert b.total_s <= a.total_s
    hidden = b.overlapped_comm_s
    assert hidden > 0 and a.comm_s == pytest.approx(b.comm_s + hidden)
    assert b.total_s >= max(hidden, a.total_s - hidden) * (1 - 1e-12)


def test_decode_kernels_each_on_their_own_roofline() -> None:
    # Llama 3 70B FP8 on one H200 at batch 190: the GEMMs are compute bound, attention is
    # bound by its KV reads; run one after the other, their times add.
    model = get_preset("llama3-70b")
    w = ServingWorkload(isl=128, osl=2048, precision="fp8", kv_precision="fp8")
    ctx = _context(model, load_cluster("dgx-h200"), w, None, None)
    lay = ServingLayout(1, 1, 1, 1, 190)
    step = decode_step(model, w, lay, ctx.counts, ctx.rates, ctx.links(lay), None)
    weights, kv = decode_bytes(model, w, lay, ctx.counts, None)
    hbm = ctx.rates.hbm_Bps
    assert step.kernels_s is not None
    assert step.kernels_s >= max(step.memory_s, step.compute_s)
    assert step.kernels_s <= step.memory_s + step.compute_s
    # memory-bound attention adds to compute-bound GEMMs: more than the whole-pass roofline
    assert step.kernels_s > max(step.memory_s, step.compute_s) + 0.5 * kv / hbm
    assert step.memory_s == pytest.approx((weights + kv) / hbm)
