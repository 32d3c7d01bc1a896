"""Running batch capped by the KV pool and the engine's batch limit; the excess queues."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.presets import get_preset
from parsearch.serve.api import _context, serve_layouts
from parsearch.serve.evaluate import evaluate_aggregated, queue_delay_s, step_residual_s
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster


def _at(concurrency: int, *, name: str = "llama3-70b", cluster: str = "dgx-h200",
        tp: int = 1, isl: int = 128, osl: int = 2048, engine: str = "trtllm",
        async_scheduling: bool | None = None):
    w = ServingWorkload(isl=isl, osl=osl, precision="fp8", kv_precision="fp8",
                        concurrency=concurrency, engine=engine,
                        async_scheduling=async_scheduling)
    ctx = _context(get_preset(name), load_cluster(cluster), w, None, None)
    return evaluate_aggregated(ctx, ServingLayout(tp, 1, 1, 1, concurrency, 1), tp)


def test_concurrency_above_the_kv_pool_queues_instead_of_being_refused() -> None:
    cap = _at(1).max_batch_fit
    assert 100 < cap < 400
    full, over = _at(cap), _at(400)
    assert over.fits and over.running_batch == cap and over.layout.batch == 400
    # Throughput and TPOT are the running batch's; TTFT adds the wait for a slot.
    assert over.tokens_per_s == pytest.approx(full.tokens_per_s)
    assert over.tpot_ms == pytest.approx(full.tpot_ms)
    assert full.queue_ms == 0.0 and over.queue_ms > 1000.0
    assert over.ttft_ms == pytest.approx(full.ttft_ms + over.queue_ms)


def test_queueing_delay_is_littles_law() -> None:
    cap = _at(1).max_batch_fit
    over = _at(400)
    # requests finish at cap / (osl * tpot) per second; 400 - cap wait ahead on average
    completions = cap / (2048 * over.tpot_ms / 1e3)
    assert over.queue_ms == pytest.approx((400 - cap) / completions * 1e3)
    assert queue_delay_s(10, 10, 5.0) == 0.0
    assert queue_delay_s(30, 10, 5.0) == pytest.approx(4.0)
    assert queue_delay_s(30, 10, 0.0) == math.inf


def test_engine_batch_limit_caps_the_running_batch() -> None:
    w = ServingWorkload(isl=128, osl=128, precision="fp8", kv_precision="fp8",
                        concurrency=64, max_batch=16)
    ctx = _context(get_preset("llama3-8b"), load_cluster("dgx-h100"), w, None, None)
    est = evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, 64, 1), 1)
    assert est.running_batch == 16 and est.queue_ms > 0


def test_serve_at_a_concurrency_the_kv_cache_cannot_hold_gives_an_answer() -> None:
    w = ServingWorkload(isl=128, osl=2048, precision="fp8", kv_precision="fp8",
                        concurrency=2000, engine="trtllm")
    result = serve_layouts(model=get_preset("llama3-70b"), cluster="dgx-h200", num_gpus=1,
                           workload=w, top=1)
    best = result.best.estimate
    assert best.running_batch < 2000 and best.queue_ms > 0
    assert best.to_dict()["running_batch"] == best.running_batch


def test_space_chosen_batch_runs_at_the_cap_without_a_queue() -> None:
    w = ServingWorkload(isl=128, osl=2048, precision="fp8", kv_precision="fp8",
                        engine="trtllm")
    result = serve_layouts(model=get_preset("llama3-70b"), cluster="dgx-h200", num_gpus=1,
                           workload=w, top=20)
    batches = [e.estimate.layout.batch for e in result.entries]
    assert len(set(batches)) == len(batches)  # no layout repeated
    best = result.best.estimate
    assert best.queue_ms == 0.0 and best.layout.batch == best.max_batch_fit


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(("llama3-8b", "llama3-70b", "qwen3-30b-a3b")),
       tp=st.sampled_from((1, 2, 4)), isl=st.integers(64, 4000), osl=st.integers(16, 2000),
       low=st.integers(1, 3000), extra=st.integers(1, 3000),
       engine=st.sampled_from(("vllm", "sglang", "trtllm")))
def test_more_concurrency_never_lowers_ttft(name, tp, isl, osl, low, extra, engine) -> None:
    kw = {"name": name, "cluster": "dgx-h100", "tp": tp, "isl": isl, "osl": osl,
          "engine": engine}
    a, b = _at(low, **kw), _at(low + extra, **kw)
    if a.fits:
        assert b.fits
        assert b.ttft_ms >= a.ttft_ms * (1 - 1e-9)
        assert b.running_batch >= a.running_batch


def test_an_arriving_request_waits_half_the_running_step() -> None:
    assert step_residual_s(1, 0.04) == 0.0       # alone: the engine is idle
    assert step_residual_s(2, 0.04) == pytest.approx(0.02)
    kw = {"tp": 4, "cluster": "dgx-h100", "async_scheduling": False}
    alone, pair = _at(1, **kw), _at(2, **kw)
    # batch 1: TTFT is the prefill alone; batch 2 adds half of its decode step (TPOT here)
    assert pair.ttft_ms - alone.ttft_ms == pytest.approx(pair.tpot_ms / 2, rel=0.05)
    # an engine that forms its next batch while one runs admits the request a step later
    ahead = _at(2, tp=4, cluster="dgx-h100", async_scheduling=True)
    assert ahead.ttft_ms - pair.ttft_ms == pytest.approx(pair.tpot_ms, rel=0.05)
    assert _at(1, tp=4, cluster="dgx-h100", async_scheduling=True).ttft_ms == pytest.approx(
        alone.ttft_ms)  # alone, nothing runs ahead of it


def test_disaggregated_decode_above_the_kv_cache_queues() -> None:
    w = ServingWorkload(isl=2000, osl=500, precision="fp8", kv_precision="fp8",
                        concurrency=20000, mode="disaggregated")
    result = serve_layouts(model=get_preset("llama3-70b"), cluster="dgx-h100", num_gpus=16,
                           workload=w, top=1)
    best = result.best.estimate
    assert best.prefill_layout is not None
    assert best.running_batch < best.layout.batch and best.queue_ms > 0
    assert best.ttft_ms > best.queue_ms
