"""MoE serving: bytes of the touched experts only, the TP all-reduce of the MoE output."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.model.params import parameter_counts
from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.cost import _ACT, decode_bytes, decode_step, serving_all_reduce
from parsearch.serve.memory import stage_weights
from parsearch.serve.moe import (
    SMALL_TILE_ROWS,
    TILE_N,
    TILE_ROWS,
    ep_imbalance,
    expected_touched_share,
    expert_gemm_time,
    padded_rows,
    tile_shape_efficiency,
)
from parsearch.serve.spec import ELEMENT_BYTES, ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster


def test_touched_share_hand_counts() -> None:
    # one token touches exactly its top_k experts; the expected distinct experts of t tokens
    # are E * (1 - (1 - k/E)^t)
    assert expected_touched_share(8, 128, 1) == pytest.approx(8 / 128)
    assert 128 * expected_touched_share(8, 128, 4) == pytest.approx(128 * (1 - (120 / 128) ** 4))
    assert expected_touched_share(8, 128, 0) == 0.0
    assert expected_touched_share(8, 8, 1) == 1.0


@settings(max_examples=100, deadline=None)
@given(experts=st.integers(1, 512), data=st.data(), tokens=st.floats(0.0, 1e5),
       more=st.floats(0.0, 1e5))
def test_touched_share_is_a_share_that_grows_with_tokens(experts, data, tokens, more) -> None:
    k = data.draw(st.integers(1, experts))
    low, high = (expected_touched_share(k, experts, t) for t in (tokens, tokens + more))
    assert 0.0 <= low <= high <= 1.0
    if tokens >= 1:
        assert low >= k / experts - 1e-12


def _qwen235(batch: int):
    model = get_preset("qwen3-235b-a22b")
    w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8")
    ctx = _context(model, load_cluster("dgx-h100"), w, None, None)
    lay = ServingLayout(8, 1, 1, 1, batch)
    return model, w, ctx, lay


def test_decode_reads_only_the_touched_experts() -> None:
    model, w, ctx, lay = _qwen235(1)
    weights, _kv = decode_bytes(model, w, lay, ctx.counts, None)
    sw = stage_weights(model, lay, ctx.counts)
    fp8 = ELEMENT_BYTES["fp8"]
    k, e = model.moe.top_k, model.moe.num_experts
    assert weights == pytest.approx(sw.linear * fp8 + sw.routed * k / e * fp8
                                    + sw.output * _ACT)
    # at batch 64 nearly every expert is touched (1 - (120/128)^64 = 98.4%)
    big, _ = decode_bytes(model, w, _qwen235(64)[3], ctx.counts, None)
    assert big == pytest.approx(sw.linear * fp8 + sw.routed * (1 - (1 - k / e) ** 64) * fp8
                                + sw.output * _ACT)


def test_tp_moe_output_is_one_all_reduce_per_layer_beside_attention() -> None:
    # Experts tensor-sliced over TP 8 without EP: each of the 94 MoE layers all-reduces the
    # attention output and the MoE output over the TP group, nothing else.
    model, w, ctx, lay = _qwen235(16)
    step = decode_step(model, w, lay, ctx.counts, ctx.rates, ctx.links(lay), None)
    one = serving_all_reduce(ctx.links(lay).tp, 16 * model.hidden_size * _ACT, ctx.rates)
    assert step.comm_s == pytest.approx(model.num_layers * 2 * one)


# --- fused grouped GEMMs, tile padding, EP imbalance (serve.moe) -----------------------

def _expert_s(batch: float, layout: ServingLayout | None = None, imbalance: float = 1.0):
    model, _w, ctx, lay = _qwen235(1)
    return expert_gemm_time(model, layout or lay, ctx.counts, ctx.rates, batch, batch, imbalance)


@settings(max_examples=60, deadline=None)
@given(tokens=st.floats(1.0, 1e5), more=st.floats(0.0, 1e5))
def test_expert_time_grows_with_tokens_and_beats_the_flop_floor(tokens, more) -> None:
    model, _w, ctx, lay = _qwen235(1)
    low, high = _expert_s(tokens), _expert_s(tokens + more)
    assert high >= low * (1 - 1e-12)
    per_expert = ctx.counts.routed_experts_per_layer / model.moe.num_experts
    useful = 2 * tokens * model.moe.top_k * per_expert * model.num_layers / lay.stage_width
    assert low >= useful / ctx.rates.peak_flops


def test_one_token_pays_for_its_top_k_experts_only() -> None:
    # one fused kernel: an expert with no token gets no tile, so a token costs top_k expert
    # tiles, not a launch per expert of the layer (128 here)
    model, _w, ctx, lay = _qwen235(1)
    per_expert = ctx.counts.routed_experts_per_layer / model.moe.num_experts
    # one token: fewer tokens than experts, so 16-row tiles (vLLM fused_moe's small block)
    tiles = 2 * SMALL_TILE_ROWS * model.moe.top_k * per_expert / lay.expert_tp * model.num_layers
    rate = ctx.rates.peak_flops * ctx.rates.gemm * ctx.rates.grouped_gemm
    launches = 2 * model.num_layers * ctx.rates.kernel_s
    # each of the two grouped GEMMs at its tile-shape efficiency: gate/up (N = 2 f / etp,
    # K = h) holds 2/3 of the expert's FLOPs, down (N = h, K = f / etp) 1/3; the top_k
    # touched experts' output tiles fill a fraction of one wave over the SMs
    h, f = model.hidden_size, model.moe.expert_ffn_hidden_size / lay.expert_tp
    k, sms = model.moe.top_k, ctx.rates.sm_count
    up = tile_shape_efficiency(2 * f, h, k * math.ceil(2 * f / TILE_N), sms)
    down = tile_shape_efficiency(h, f, k * math.ceil(h / TILE_N), sms)
    shaped = tiles * (2 / 3 / up + 1 / 3 / down)
    assert _expert_s(1) == pytest.approx(shaped / rate + launches)
    assert _expert_s(1) > tiles / rate + launches  # the shape never speeds a GEMM up


def test_small_batch_tp8_decode_stays_near_the_weight_read() -> None:
    # Qwen3-235B TP8 without EP (vLLM's default) at batch 8: memory bound, not the 4-6x
    # over-pricing of a per-expert GEMM launch cost (issue 34)
    from parsearch.serve.cost import decode_tpot_s, hbm_read_floor_s
    model, w, ctx, lay = _qwen235(8)
    step = decode_step(model, w, lay, ctx.counts, ctx.rates, ctx.links(lay), None)
    floor = hbm_read_floor_s(model, w, lay, ctx.counts, ctx.gpu, None)
    # (10.3 ms: weights 4.5, TP all-reduces 2.1, kernels 3.4; the per-expert charge gave 93)
    assert floor < decode_tpot_s(step, 1) < 3 * floor


@settings(max_examples=200, deadline=None)
@given(rows=st.floats(0.0, 1e5))
def test_padded_rows_hold_the_rows(rows) -> None:
    for tile in (SMALL_TILE_ROWS, TILE_ROWS):
        padded = padded_rows(rows, tile)
        assert padded >= max(rows, tile)
        assert padded <= max(rows, tile) + tile / 2


@settings(max_examples=60, deadline=None)
@given(tokens=st.floats(1.0, 1e5), seqs=st.floats(1.0, 1e4), more=st.floats(0.0, 1e4))
def test_ep_imbalance_is_one_with_eplb_and_falls_with_more_sequences(tokens, seqs, more) -> None:
    model = get_preset("qwen3-235b-a22b")
    lay = ServingLayout(1, 1, 8, 8, 64)
    few = ep_imbalance(model, lay, tokens, seqs)
    many = ep_imbalance(model, lay, tokens, seqs + more)
    assert few >= many >= 1.0
    assert ep_imbalance(model, lay, tokens, seqs, balanced=True) == 1.0
    assert ep_imbalance(model, ServingLayout(8, 1, 1, 1, 64), tokens, seqs) == 1.0


def test_imbalance_scales_the_busiest_rank() -> None:
    lay = ServingLayout(1, 1, 8, 8, 64)
    assert _expert_s(4096, lay, 1.5) > _expert_s(4096, lay, 1.0)


def test_eplb_workload_removes_the_imbalance_from_decode() -> None:
    model = get_preset("qwen3-235b-a22b")
    lay = ServingLayout(1, 1, 8, 8, 4096)

    def step(eplb: bool):
        w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8", eplb=eplb)
        ctx = _context(model, load_cluster("dgx-h100"), w, None, None)
        return decode_step(model, w, lay, ctx.counts, ctx.rates, ctx.links(lay), None)

    assert step(True).compute_s < step(False).compute_s
    assert step(True).comm_s < step(False).comm_s


def test_engine_moe_factors_stay_inside_the_cited_range() -> None:
    from parsearch.serve.engines import (
        MIN_MOE_KERNEL_EFFICIENCY,
        MOE_KERNEL_EFFICIENCY,
        moe_kernel_efficiency,
    )
    from parsearch.serve.spec import SERVING_ENGINES
    for engine in SERVING_ENGINES:
        assert MIN_MOE_KERNEL_EFFICIENCY <= moe_kernel_efficiency(engine) <= 1.0
    assert set(MOE_KERNEL_EFFICIENCY) == set(SERVING_ENGINES)


def test_a_slower_moe_kernel_slows_prefill_more_than_memory_bound_decode() -> None:
    model = get_preset("qwen3-30b-a3b")
    lay = ServingLayout(1, 1, 1, 1, 64)

    def times(engine: str):
        w = ServingWorkload(isl=4000, osl=200, precision="fp8", kv_precision="fp8",
                            engine=engine)
        ctx = _context(model, load_cluster("dgx-h100"), w, None, None)
        from parsearch.serve.evaluate import instance_times
        return instance_times(ctx, lay)

    fast, slow = times("sglang"), times("trtllm")   # factors 1.0 and 0.3
    assert slow.prefill_busy_s > 1.3 * fast.prefill_busy_s
    assert slow.tpot_decode_s < 1.3 * fast.tpot_decode_s


def test_sglang_fp4_experts_run_tensorrt_llm_kernels_fp8_run_deepgemm() -> None:
    # SGLang's FP4 experts run FlashInfer's TensorRT-LLM kernels (flashinfer_trtllm), not
    # DeepGEMM (FP8 only): their prefill prices as TensorRT-LLM's, their FP8 one faster
    model = get_preset("deepseek-v3")
    lay = ServingLayout(8, 1, 1, 1, 16)

    def prefill(engine: str, precision: str) -> float:
        w = ServingWorkload(isl=4000, osl=200, precision=precision, kv_precision="fp8",
                            engine=engine)
        ctx = _context(model, load_cluster("dgx-b200"), w, None, None)
        from parsearch.serve.evaluate import instance_times
        return instance_times(ctx, lay).prefill_busy_s

    assert prefill("sglang", "fp4") == pytest.approx(prefill("trtllm", "fp4"), rel=0.05)
    assert prefill("sglang", "fp8") < prefill("trtllm", "fp8")


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"]),
       ep=st.sampled_from([2, 4, 8]), batch=st.sampled_from([1, 8, 64, 512]))
def test_expert_parallel_without_attention_dp_needs_no_all_to_all(name: str, ep: int,
                                                                  batch: int) -> None:
    # with TP attention every rank holds all tokens: EP combines by the same all-reduce as
    # tensor-sliced experts (vLLM use_all2all_kernels = dp > 1 and ep); with attention DP
    # the tokens live on one rank each and must be dispatched and combined
    from parsearch.serve.cost import _layer_comm
    model = get_preset(name)
    ctx = _context(model, load_cluster("dgx-h100"), ServingWorkload(isl=8, osl=8), None, None)
    tp_only = ServingLayout(8, 1, 1, 1, batch, 1)
    with_ep = ServingLayout(8, 1, ep, 1, batch, 1)
    assert _layer_comm(model, with_ep, ctx.links(with_ep), ctx.rates, batch, batch) == (
        _layer_comm(model, tp_only, ctx.links(tp_only), ctx.rates, batch, batch))
    dp = ServingLayout(1, 1, ep, 8, max(batch, 8), 1)
    assert _layer_comm(model, dp, ctx.links(dp), ctx.rates, batch / 8, batch)[2] > 0


@given(tp=st.sampled_from([2, 4, 8]), tokens=st.integers(1, 64))
def test_small_all_reduce_inside_nvlink_pays_the_custom_kernel_latency(tp: int,
                                                                      tokens: int) -> None:
    # a decode-sized all-reduce inside one NVLink domain runs the engines' one-kernel
    # custom all-reduce (sglang PR #2904: 3.7-5.9 us at TP 2-8), not NCCL's call latency
    from parsearch.serve.cost import CUSTOM_ALL_REDUCE_LATENCY_S
    model = get_preset("llama3-70b")
    ctx = _context(model, load_cluster("dgx-h100"), ServingWorkload(isl=8, osl=8), None, None)
    layout = ServingLayout(tp, 1, 1, 1, tokens, 1)
    size = tokens * model.hidden_size * _ACT
    t = serving_all_reduce(ctx.links(layout).tp, size, ctx.rates)
    assert 3.7e-6 <= CUSTOM_ALL_REDUCE_LATENCY_S <= 5.9e-6
    assert CUSTOM_ALL_REDUCE_LATENCY_S <= t < ctx.rates.collective_latency_s + 5e-6


@pytest.mark.parametrize(("cluster", "slower"), [("dgx-b200", True), ("dgx-h100", False)])
def test_fp8_activations_run_fp4_experts_at_the_fp8_rate(cluster: str, slower: bool) -> None:
    # Blackwell's mixed FP4 x FP8 MMA runs at the FP8 rate; Hopper has no FP4 MMA at all
    # (weight-only kernels), so the activations' precision changes nothing there
    from parsearch.serve.cost import expert_rate
    model = get_preset("gpt-oss-120b")
    fp4 = ServingWorkload(isl=8, osl=8, precision="fp4", engine="vllm")
    mixed = ServingWorkload(isl=8, osl=8, precision="fp4", engine="vllm",
                            expert_activations="fp8")
    rates = _context(model, load_cluster(cluster), fp4, None, None).rates
    ratio = expert_rate(mixed, rates) / expert_rate(fp4, rates)
    assert ratio == pytest.approx(0.5 if slower else 1.0)
    layout = ServingLayout(1, 1, 1, 1, 1, 1)
    counts = parameter_counts(model)
    t4 = expert_gemm_time(model, layout, counts, rates, 4096, 4096, 1.0, expert_rate(fp4, rates))
    t8 = expert_gemm_time(model, layout, counts, rates, 4096, 4096, 1.0,
                          expert_rate(mixed, rates))
    assert (t8 > t4) if slower else (t8 == pytest.approx(t4))
    with pytest.raises(SpecError, match="expert_activations"):
        ServingWorkload(isl=8, osl=8, expert_activations="int4")
