"""MoE serving: bytes of the touched experts only, the TP all-reduce of the MoE output."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.cost import _ACT, decode_bytes, decode_step, serving_all_reduce
from parsearch.serve.memory import stage_weights
from parsearch.serve.moe import expected_touched_share
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
