"""Host work before the engine (serve/frontend.py), one-step-ahead schedulers (serve/ttft.py)
and the engine's layout space (TensorRT-engine workflow without attention DP)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.engines import schedules_ahead
from parsearch.serve.evaluate import evaluate_aggregated
from parsearch.serve.frontend import (
    TEXT_BYTES_PER_TOKEN,
    TOKENIZER_BYTES_PER_S,
    burst_stage_s,
    tokenize_s,
)
from parsearch.serve.space import enumerate_serving_layouts, serving_violations
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.serve.ttft import TtftInputs, closed_loop_share, pickup_wait_s, ttft_parts
from parsearch.topology.cluster import load_cluster


@given(tokens=st.floats(0, 1e6), more=st.floats(0, 1e6))
def test_tokenization_grows_linearly_with_the_prompt(tokens: float, more: float) -> None:
    assert tokenize_s(tokens + more) == pytest.approx(tokenize_s(tokens) + tokenize_s(more))
    assert tokenize_s(tokens) == pytest.approx(
        tokens * TEXT_BYTES_PER_TOKEN / TOKENIZER_BYTES_PER_S)
    # inside the cited 1.3-4.2 MB/s single-thread range
    assert 1.3e6 <= TOKENIZER_BYTES_PER_S <= 4.2e6


@given(a=st.floats(0, 10), b=st.floats(0, 10))
def test_a_burst_leaves_at_the_pace_of_its_slower_stage(a: float, b: float) -> None:
    assert burst_stage_s(a, b) == max(a, b) == burst_stage_s(b, a)


def _ttft(concurrency: int, isl: int, **knobs: object) -> float:
    w = ServingWorkload(isl=isl, osl=256, precision="fp8", kv_precision="fp8",
                        concurrency=concurrency, engine="vllm", **knobs)  # type: ignore[arg-type]
    ctx = _context(get_preset("llama3-8b"), load_cluster("dgx-h100"), w, None, None)
    return evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, concurrency, 1), 1).ttft_ms


@settings(max_examples=12, deadline=None)
@given(c=st.integers(1, 64), isl=st.integers(64, 8000))
def test_text_prompts_add_at_least_their_tokenization(c: int, isl: int) -> None:
    """Under steady arrivals.  In a burst, tokenizing staggers the arrivals, so the engine
    packs fewer prompts per prefill and the first ones can finish sooner than when all
    arrive as token ids at once (ttft.burst_batches_wait_s): no such bound there."""
    ids = _ttft(c, isl)
    text = _ttft(c, isl, text_prompts=True)
    assert text >= ids + tokenize_s(isl) * 1e3 * (1 - 1e-9)


@given(running=st.integers(2, 4096), step=st.floats(1e-4, 1.0), recv=st.integers(1, 64))
def test_scheduling_ahead_costs_one_whole_step(running: int, step: float, recv: int) -> None:
    ahead = pickup_wait_s(running, step, recv, lookahead=True)
    assert ahead == pytest.approx(pickup_wait_s(running, step, recv) + step)
    assert pickup_wait_s(1, step, recv, lookahead=True) == 0.0  # alone: nothing runs


def test_tokenize_part_is_reported_and_summed() -> None:
    x = TtftInputs(engine="vllm", prompt_tokens=1000, budget=8192, running=8, step_decodes=8,
                   in_flight=8, prefill_alone_s=0.05, busy_s=0.01, step_s=0.01, ride_s=0.001,
                   cycle_s=5.0, burst_waves=10.0, tokenize_s=0.02, lookahead=True)
    p = ttft_parts(x)
    assert p.tokenize_s == 0.02
    # 8 prompts of 1,000 tokens fit the 8,192-token budget: the first is prefilled alone
    # (0.05 s, done at 0.07) while the next two are tokenized; they go in one batch (0.05 +
    # (8 x 0.01 - 0.05) / 7 each more), and so on: batches end at 0.07, 0.1243, 0.1829 and
    # 0.2371 s holding 1, 2, 3 and 2 prompts; less a lone request's 0.07 s, over 10 waves
    slope = (8 * 0.01 - 0.05) / 7
    ends = [0.07, 0.07 + 0.05 + slope, 0.0]
    ends[2] = ends[1] + 0.05 + 2 * slope
    last = ends[2] + 0.05 + slope
    mean = (ends[0] + 2 * ends[1] + 3 * ends[2] + 2 * last) / 8
    assert p.burst_s == pytest.approx((mean - 0.07) / 10)
    assert p.total_s == pytest.approx(sum((p.slot_queue_s, p.tokenize_s, p.pickup_s,
                                           p.balance_wait_s, p.prefill_queue_s, p.burst_s,
                                           p.prefill_s, p.ride_along_s)))


def test_engine_defaults_and_explicit_setting() -> None:
    assert all(schedules_ahead(e) for e in ("vllm", "sglang", "trtllm"))
    assert not schedules_ahead("vllm", False)
    with pytest.raises(SpecError, match="async_scheduling"):
        ServingWorkload(isl=1, osl=1, async_scheduling="yes")  # type: ignore[arg-type]
    for name in ("text_prompts", "tensorrt_engine"):
        with pytest.raises(SpecError, match=name):
            ServingWorkload(isl=1, osl=1, **{name: 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_tensorrt_engine_workflow_has_no_attention_dp(name: str) -> None:
    model = get_preset(name)
    pytorch = ServingWorkload(isl=128, osl=128, engine="trtllm")
    engine = ServingWorkload(isl=128, osl=128, engine="trtllm", tensorrt_engine=True)
    both = enumerate_serving_layouts(model, pytorch, 8, 8, 8)
    trt = enumerate_serving_layouts(model, engine, 8, 8, 8)
    assert any(lay.attention_dp > 1 for lay in both)
    assert trt and all(lay.attention_dp == 1 for lay in trt)
    assert set(trt) == {lay for lay in both if lay.attention_dp == 1}
    dp = next(lay for lay in both if lay.attention_dp > 1)
    assert any(v.rule == "S12" for v in serving_violations(model, engine, dp, 8, 8, 8))


@given(waves=st.floats(1.0, 100.0), c=st.integers(1, 4096), more=st.floats(0.0, 100.0))
def test_a_closed_loop_run_loses_at_most_half_a_request_per_slot(waves: float, c: int,
                                                                 more: float) -> None:
    share = closed_loop_share(waves, c)
    assert waves / (waves + 0.5) <= share <= 1.0
    assert closed_loop_share(waves + more, c) >= share  # longer runs drain relatively less
    assert closed_loop_share(None, c) == 1.0 and closed_loop_share(waves, 1) == 1.0


def test_closed_loop_client_lowers_throughput_not_latency() -> None:
    def est(waves: float | None):
        w = ServingWorkload(isl=1000, osl=500, precision="fp8", kv_precision="fp8",
                            concurrency=32, engine="vllm", burst_waves=waves)
        ctx = _context(get_preset("llama3-8b"), load_cluster("dgx-h100"), w, None, None)
        return evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, 32, 1), 1)
    steady, run = est(None), est(10.0)
    assert run.tpot_ms == pytest.approx(steady.tpot_ms)
    assert run.tokens_per_s == pytest.approx(steady.tokens_per_s * closed_loop_share(10.0, 32))
