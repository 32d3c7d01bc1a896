"""TTFT at fixed concurrency (serve/ttft.py) and the grouped-GEMM tile shape (serve/moe.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.model.params import parameter_counts
from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.evaluate import evaluate_aggregated
from parsearch.serve.moe import (
    TILE_K_OVERHEAD,
    TILE_N,
    expert_gemm_time,
    tile_shape_efficiency,
)
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.serve.ttft import (
    TtftInputs,
    burst_wait_s,
    chunk_iterations,
    pickup_wait_s,
    prefill_queue_wait_s,
    ttft_parts,
)
from parsearch.topology.cluster import load_cluster

_SLOW = settings(max_examples=12, deadline=None)


def _ttft(concurrency: int, isl: int, *, engine: str = "vllm", budget: int = 8192,
          waves: float | None = 10.0, recv: int = 1, name: str = "llama3-8b") -> float:
    w = ServingWorkload(isl=isl, osl=256, precision="fp8", kv_precision="fp8",
                        concurrency=concurrency, engine=engine, max_num_batched_tokens=budget,
                        burst_waves=waves, recv_interval=recv)
    ctx = _context(get_preset(name), load_cluster("dgx-h100"), w, None, None)
    return evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, concurrency, 1), 1).ttft_ms


@_SLOW
@given(c=st.integers(1, 96), dc=st.integers(1, 64), isl=st.integers(64, 6000),
       engine=st.sampled_from(["vllm", "sglang", "trtllm"]))
def test_ttft_never_decreases_with_concurrency(c: int, dc: int, isl: int, engine: str) -> None:
    assert _ttft(c + dc, isl, engine=engine) >= _ttft(c, isl, engine=engine) - 1e-6


@_SLOW
@given(c=st.integers(1, 64), isl=st.integers(64, 6000), di=st.integers(1, 4000),
       engine=st.sampled_from(["vllm", "sglang", "trtllm"]))
def test_ttft_never_decreases_with_input_length(c: int, isl: int, di: int, engine: str) -> None:
    assert _ttft(c, isl + di, engine=engine) >= _ttft(c, isl, engine=engine) - 1e-6


@_SLOW
@given(isl=st.integers(64, 16000), budget=st.integers(256, 16384), extra=st.integers(1, 16384))
def test_larger_chunk_budget_never_lengthens_a_lone_prefill(isl: int, budget: int,
                                                            extra: int) -> None:
    # nothing else runs (concurrency 1): the prompt alone, in fewer or as many chunks
    assert chunk_iterations(isl, budget + extra, 0, True) <= chunk_iterations(isl, budget, 0, True)
    assert _ttft(1, isl, budget=budget + extra) <= _ttft(1, isl, budget=budget) + 1e-6


@given(tokens=st.floats(1.0, 1e5), budget=st.integers(1, 65536), running=st.integers(0, 4096))
def test_chunks_cover_the_prompt(tokens: float, budget: int, running: int) -> None:
    n = chunk_iterations(tokens, budget, running, True)
    assert n * max(1, budget - running) >= tokens
    assert n >= chunk_iterations(tokens, budget, running, False)  # SGLang: no decodes inside


def test_parts_and_sources() -> None:
    assert pickup_wait_s(1, 0.02) == 0.0                      # alone: the engine is idle
    assert pickup_wait_s(8, 0.02) == pytest.approx(0.01)      # half a step (residual life)
    assert pickup_wait_s(8, 0.02, 30) == pytest.approx(0.3)   # SGLang polls every 30 steps
    assert prefill_queue_wait_s(0.0, 0.1) == 0.0
    assert prefill_queue_wait_s(0.5, 0.1) == pytest.approx(0.05)  # rho S / (2 (1 - rho))
    assert burst_wait_s(64, None, 0.1) == 0.0
    assert burst_wait_s(65, 10.0, 0.1) == pytest.approx(32 * 0.1 / 10)
    x = TtftInputs(engine="trtllm", prompt_tokens=7000, budget=2048, running=48,
                   step_decodes=48, in_flight=64, prefill_alone_s=0.2, busy_s=0.15,
                   step_s=0.02, ride_s=0.004, cycle_s=20.0, slot_queue_s=0.5,
                   balance_wait_iters=10, burst_waves=10.0)
    p = ttft_parts(x)
    assert p.ride_along_s == pytest.approx(math.ceil(7000 / 2000) * 0.004)
    assert p.balance_wait_s == pytest.approx(0.2)
    assert p.total_s == pytest.approx(sum((p.slot_queue_s, p.pickup_s, p.balance_wait_s,
                                           p.prefill_queue_s, p.burst_s, p.prefill_s,
                                           p.ride_along_s)))


def test_sglang_recv_interval_and_burst_lengthen_ttft() -> None:
    base = _ttft(32, 1000, engine="sglang", waves=None)
    assert _ttft(32, 1000, engine="sglang", waves=None, recv=30) > base
    assert _ttft(32, 1000, engine="sglang", waves=10.0) > base


def test_new_workload_fields_are_validated() -> None:
    with pytest.raises(SpecError, match="recv_interval"):
        ServingWorkload(isl=1, osl=1, recv_interval=0)
    with pytest.raises(SpecError, match="balance_wait_iters"):
        ServingWorkload(isl=1, osl=1, balance_wait_iters=-1)
    with pytest.raises(SpecError, match="burst_waves"):
        ServingWorkload(isl=1, osl=1, burst_waves=0)


@given(n=st.integers(1, 65536), k=st.integers(1, 65536), dk=st.integers(1, 8192))
def test_tile_shape_efficiency_bounded_and_monotone_in_depth(n: int, k: int, dk: int) -> None:
    e = tile_shape_efficiency(n, k)
    assert 0 < e <= 1
    assert tile_shape_efficiency(n, k + dk) >= e
    if n % TILE_N == 0:
        assert e == pytest.approx(k / (k + TILE_K_OVERHEAD))


def test_wave_quantization_when_the_sm_count_is_known() -> None:
    full = tile_shape_efficiency(1024, 4096, tiles=132, sm_count=132)
    assert full == pytest.approx(tile_shape_efficiency(1024, 4096))
    assert tile_shape_efficiency(1024, 4096, tiles=133, sm_count=132) == pytest.approx(
        full * 133 / 264)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["mixtral-8x7b", "qwen3-235b-a22b", "qwen3-30b-a3b"]),
       a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0))
def test_moe_useful_rate_never_falls_within_a_tile(name: str, a: float, b: float) -> None:
    # tokens above the expert count (64-row tiles) and at most half a tile of rows per
    # touched expert: the tile is padded anyway, more tokens fill it, so the time per
    # token never rises (the kernel's useful rate grows with tokens per expert)
    model = get_preset(name)
    moe = model.moe
    assert moe is not None
    rates = _context(model, load_cluster("dgx-h100"), ServingWorkload(isl=8, osl=8), None,
                     None).rates
    counts = parameter_counts(model)
    layout = ServingLayout(8, 1, 1, 1, 8, 1)
    lo, hi = moe.num_experts + 1.0, 32.0 * moe.num_experts / moe.top_k
    t1, t2 = sorted((lo + a * (hi - lo), lo + b * (hi - lo)))

    def per_token(t: float) -> float:
        return expert_gemm_time(model, layout, counts, rates, t, t) / t

    assert per_token(t2) <= per_token(t1) * (1 + 1e-9)
