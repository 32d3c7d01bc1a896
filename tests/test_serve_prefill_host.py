"""Eager prefill host floor (serve/kernels.py) and prefill batching in a burst (serve/ttft.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.evaluate import evaluate_aggregated, instance_times, prefill_occupancy_s
from parsearch.serve.kernels import EAGER_LAUNCH_S, eager_prefill_host_s, kernels_per_layer
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.serve.ttft import (
    burst_batches_wait_s,
    burst_wait_s,
    separate_prefill_occupancy_s,
)
from parsearch.topology.cluster import load_cluster

DSV3 = get_preset("deepseek-v3")


def _prefill_ms(engine: str, isl: int, **knobs: object) -> float:
    w = ServingWorkload(isl=isl, osl=16, precision="fp8", kv_precision="bf16", engine=engine,
                        concurrency=1, max_num_batched_tokens=32768, **knobs)  # type: ignore
    ctx = _context(DSV3, load_cluster("dgx-h200"), w, None, None)
    return instance_times(ctx, ServingLayout(8, 1, 1, 1, 1, 1)).ttft_s * 1e3


def test_sglang_deepseek_short_prefill_sits_on_the_measured_eager_floor() -> None:
    """Golden row: sgl-project/sglang PR #12160 logs an eager DeepSeek-V3 prefill of one new
    token at 82.6 ms of "forward cost" (23.1 ms from a CUDA graph); the floor is 61 layers
    x 27.9 kernels x 48 us, and a one-token prefill is priced on it."""
    floor = eager_prefill_host_s(DSV3, ServingWorkload(isl=1, osl=1, engine="sglang"), 61)
    assert floor == pytest.approx(61 * kernels_per_layer(
        DSV3, ServingWorkload(isl=1, osl=1, engine="sglang")) * EAGER_LAUNCH_S)
    assert 75.0 <= floor * 1e3 <= 90.0
    assert _prefill_ms("sglang", 8) == pytest.approx(floor * 1e3, rel=0.02)
    # vLLM compiles and graphs its prefill: no floor, the one-token pass is GPU time only
    assert _prefill_ms("vllm", 8) < 0.6 * floor * 1e3


def test_floor_is_a_floor_not_an_addition() -> None:
    """The host issues kernels ahead of the GPU: a pass takes the longer of the two, so a
    long prompt whose GPU time exceeds the host time is unchanged by the floor."""
    for isl, host_bound in ((8, True), (16384, False)):
        w = ServingWorkload(isl=isl, osl=16, precision="fp8", kv_precision="bf16",
                            engine="sglang", max_num_batched_tokens=32768)
        ctx = _context(DSV3, load_cluster("dgx-h200"), w, None, None)
        step = ctx.prefill(ServingLayout(8, 1, 1, 1, 1, 1))[0][1]
        gpu = step.roofline_s + step.comm_s + step.overhead_s
        assert step.total_s == pytest.approx(max(gpu, step.host_s))
        assert (step.host_s > gpu) is host_bound


def test_tensorrt_engines_have_no_eager_floor() -> None:
    llama = get_preset("llama3-8b")
    eager = ServingWorkload(isl=1, osl=1, engine="trtllm")
    built = ServingWorkload(isl=1, osl=1, engine="trtllm", tensorrt_engine=True)
    assert eager_prefill_host_s(llama, eager, 32) > 0.0
    assert eager_prefill_host_s(llama, built, 32) == 0.0


@given(c=st.integers(2, 512), alone=st.floats(1e-3, 1.0), tok=st.floats(0.0, 0.05),
       waves=st.floats(1.0, 20.0))
def test_one_prompt_per_batch_is_the_sequential_burst(c: int, alone: float, tok: float,
                                                      waves: float) -> None:
    """Without packing, prompts are prefilled one after another at the slower stage's pace:
    the sequential formula, (C - 1) / 2 services."""
    got = burst_batches_wait_s(c, waves, alone, alone, 1, tok)
    assert got == pytest.approx(burst_wait_s(c, waves, max(alone, tok)), rel=1e-6, abs=1e-12)


@given(c=st.integers(1, 300), k=st.integers(1, 64), alone=st.floats(1e-3, 0.2),
       share=st.floats(0.05, 1.0), tok=st.floats(0.0, 0.02))
def test_burst_wait_grows_with_the_burst(c: int, k: int, alone: float, share: float,
                                         tok: float) -> None:
    """One more request in the burst never shortens the others' wait (first come, first
    served: it joins the last batch or starts a new one), and the wait is never negative."""
    busy = alone * share
    a = burst_batches_wait_s(c, 10.0, alone, busy, k, tok)
    b = burst_batches_wait_s(c + 1, 10.0, alone, busy, k, tok)
    assert 0.0 <= a <= b * (1 + 1e-9) + 1e-12


def test_packing_makes_the_batch_wait_for_its_last_prompt() -> None:
    """64 prompts at once, 35 per batch (SGLang's 32,768-token budget, 922-token prompts),
    no tokenizer: batches of 35 and 29 end at 35 and 64 packed services (a lone first
    prompt would not be packed only if the engine were free before the rest arrived)."""
    alone, busy, k = 0.08, 0.027, 35
    slope = (k * busy - alone) / (k - 1)
    first = alone + 34 * slope
    second = first + alone + 28 * slope
    mean = (35 * first + 29 * second) / 64
    assert burst_batches_wait_s(64, 10.0, alone, busy, k) == pytest.approx((mean - alone) / 10)
    # more than the sequential formula's (C - 1) / 2 packed services
    assert burst_batches_wait_s(64, 10.0, alone, busy, k) > burst_wait_s(64, 10.0, busy)


@settings(max_examples=10, deadline=None)
@given(c=st.integers(1, 96), more=st.integers(1, 64),
       engine=st.sampled_from(["vllm", "sglang", "trtllm"]),
       isl=st.sampled_from([128, 922, 7373]))
def test_ttft_never_falls_with_concurrency(c: int, more: int, engine: str, isl: int) -> None:
    """At a fixed instance layout, more requests in flight never shorten the mean TTFT
    (the InferenceMAX client: ten waves, text prompts)."""
    model = get_preset("llama3-8b")

    def ttft(conc: int) -> float:
        w = ServingWorkload(isl=isl, osl=256, precision="fp8", kv_precision="fp8",
                            engine=engine, concurrency=conc, burst_waves=10.0,
                            text_prompts=True)
        ctx = _context(model, load_cluster("dgx-h100"), w, None, None)
        return evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, conc, 1), 1).ttft_ms

    assert ttft(c + more) >= ttft(c) * (1 - 1e-9)


@given(alone=st.floats(1e-3, 0.5), share=st.floats(0.02, 1.0), k=st.integers(1, 64),
       rate=st.floats(0.0, 200.0), window=st.floats(0.0, 2.0))
def test_separate_prefill_occupancy_lies_between_packed_and_alone(
        alone: float, share: float, k: int, rate: float, window: float) -> None:
    """A prompt prefilled in a batch apart from the decodes occupies between the fully packed
    share and the whole lone pass; more arrivals in the window never make it dearer."""
    busy = alone * share
    occ = separate_prefill_occupancy_s(alone, busy, k, rate, window)
    assert busy * (1 - 1e-9) <= occ <= max(alone, busy) * (1 + 1e-9)
    assert separate_prefill_occupancy_s(alone, busy, k, rate * 2 + 1, window) <= occ * (
        1 + 1e-9)
    assert separate_prefill_occupancy_s(alone, busy, k, 0.0, window) == pytest.approx(
        max(busy, alone))


def test_sglang_decodes_wait_for_lone_prefills_mixed_engines_do_not() -> None:
    """At low concurrency SGLang prefills each arriving prompt in its own batch, apart from
    the decodes, so the decodes wait for a whole (eager-floored) pass per request; vLLM's
    chunks ride in decode steps and cost the packed share."""
    def tpot(engine: str) -> tuple[float, float]:
        w = ServingWorkload(isl=922, osl=922, precision="fp8", kv_precision="bf16",
                            engine=engine, concurrency=8, max_num_batched_tokens=32768)
        ctx = _context(DSV3, load_cluster("dgx-h200"), w, None, None)
        layout = ServingLayout(8, 1, 1, 1, 8, 1)
        t = instance_times(ctx, layout)
        return prefill_occupancy_s(ctx, layout, t), t.prefill_busy_s

    occ, busy = tpot("sglang")
    assert occ > 2.0 * busy  # a lone 922-token pass, not 1/35 of a packed 32K-token one
    occ, busy = tpot("vllm")
    assert occ == busy
