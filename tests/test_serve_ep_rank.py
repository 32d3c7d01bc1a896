"""Expert parallelism in a serving step: the busiest EP rank reads and computes the most
touched experts (each rank holds whole experts), so at small batch EP reads more per GPU
than tensor-sliced experts, whose every rank reads the mean."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.cost import decode_bytes, decode_step
from parsearch.serve.moe import busiest_rank_touched_share, expected_touched_share
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster


def _simulated_busiest_share(top_k: int, experts: int, ep: int, tokens: int,
                             trials: int = 2000) -> float:
    """Monte Carlo: each token picks ``top_k`` distinct experts uniformly; the mean over
    trials of the largest per-rank count of touched experts, over the experts a rank holds."""
    rng = np.random.default_rng(7)
    picks = np.argsort(rng.random((trials, tokens, experts)), axis=2)[:, :, :top_k]
    touched = np.zeros((trials, experts), dtype=bool)
    for j in range(tokens):
        np.put_along_axis(touched, picks[:, j, :], True, axis=1)
    per_rank = touched.reshape(trials, ep, experts // ep).sum(axis=2)
    return float(per_rank.max(axis=1).mean()) / (experts // ep)


def test_without_ep_every_rank_reads_the_mean_share() -> None:
    for tokens in (0.0, 1.0, 7.0, 64.0, 1e4):
        assert busiest_rank_touched_share(4, 128, 1, tokens) == expected_touched_share(
            4, 128, tokens)


@pytest.mark.parametrize(("ep", "tokens"), [(2, 1), (4, 4), (8, 1), (8, 16), (8, 64)])
def test_busiest_share_matches_simulated_routing(ep: int, tokens: int) -> None:
    # gpt-oss-120b's router shape: top-4 of 128 experts
    simulated = _simulated_busiest_share(4, 128, ep, tokens)
    assert busiest_rank_touched_share(4, 128, ep, tokens) == pytest.approx(simulated, rel=0.04)


@settings(max_examples=100, deadline=None)
@given(ep=st.sampled_from([2, 4, 8, 16]), k=st.integers(1, 8), tokens=st.floats(0.0, 5e3))
def test_busiest_share_lies_between_the_mean_and_all(ep: int, k: int, tokens: float) -> None:
    experts = 128
    mean = expected_touched_share(k, experts, tokens)
    busiest = busiest_rank_touched_share(k, experts, ep, tokens)
    assert mean - 1e-9 <= busiest <= 1.0 + 1e-9
    assert busiest_rank_touched_share(k, experts, 2 * ep, tokens) >= busiest - 1e-9


def _gpt_oss(layout: ServingLayout):
    model = get_preset("gpt-oss-120b")
    w = ServingWorkload(isl=1000, osl=1000, precision="fp4", kv_precision="fp8",
                        engine="vllm")
    ctx = _context(model, load_cluster("dgx-h200"), w, None, None)
    args = (model, w, layout, ctx.counts, ctx.rates, ctx.links(layout), ctx.window)
    return model, w, ctx, args


def test_small_batch_ep_reads_more_than_tensor_sliced_experts() -> None:
    # batch 4 on 8 GPUs: 16 routed copies touch ~15 experts, one rank of EP 8 holds ~3.9 of
    # them at most against the mean 1.9, so it reads more expert bytes than any TP-8 rank
    tp = ServingLayout(tp=8, pp=1, ep=1, attention_dp=1, batch=4)
    ep = ServingLayout(tp=8, pp=1, ep=8, attention_dp=1, batch=4)
    model, w, ctx, tp_args = _gpt_oss(tp)
    _m, _w, _c, ep_args = _gpt_oss(ep)
    tp_weights, tp_kv = decode_bytes(model, w, tp, ctx.counts, ctx.window)
    ep_weights, ep_kv = decode_bytes(model, w, ep, ctx.counts, ctx.window)
    assert ep_kv == tp_kv
    assert ep_weights > 1.1 * tp_weights
    assert decode_step(*ep_args).total_s > decode_step(*tp_args).total_s


def test_large_batch_ep_touches_every_expert_like_tp() -> None:
    # at batch 512 every expert is touched on every rank: no read imbalance left
    tp = ServingLayout(tp=8, pp=1, ep=1, attention_dp=1, batch=512)
    ep = ServingLayout(tp=8, pp=1, ep=8, attention_dp=1, batch=512)
    model, w, ctx, _args = _gpt_oss(tp)
    assert decode_bytes(model, w, ep, ctx.counts, ctx.window)[0] == pytest.approx(
        decode_bytes(model, w, tp, ctx.counts, ctx.window)[0], rel=1e-6)
