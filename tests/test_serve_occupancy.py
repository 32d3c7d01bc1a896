"""A fixed concurrency keeps only that many requests in flight over all replicas."""

from __future__ import annotations

import pytest

from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.evaluate import evaluate_aggregated, occupied_share
from parsearch.serve.space import batch_candidates
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster

MODEL = get_preset("llama3-8b")


def _estimate(concurrency: int, replicas: int):
    w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8",
                        concurrency=concurrency)
    ctx = _context(MODEL, load_cluster("dgx-h100"), w, None, None)
    batch = batch_candidates(w, replicas)[0]
    return evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, batch, replicas), replicas)


def test_fewer_requests_than_replicas_leave_replicas_idle() -> None:
    # 4 requests over 8 single-GPU replicas run one each on 4 of them: the group delivers
    # what 4 replicas at batch 1 deliver, not 8
    eight, four = _estimate(4, 8), _estimate(4, 4)
    assert eight.layout.batch == four.layout.batch == 1
    assert eight.tokens_per_s == pytest.approx(four.tokens_per_s)
    assert eight.tpot_ms == pytest.approx(four.tpot_ms)


def test_concurrency_a_multiple_of_the_replicas_fills_every_slot() -> None:
    # 16 over 8 replicas: 2 each, every slot busy, so twice the tokens/s of 8 over 4
    # replicas at 2 each
    assert _estimate(16, 8).tokens_per_s == pytest.approx(2 * _estimate(8, 4).tokens_per_s)
    assert occupied_share(16, 8, 2) == 1.0


def test_share_counts_the_requests_in_flight() -> None:
    # 12 over 8 replicas: batch ceil(12/8) = 2 per replica, 16 slots, 12 busy
    assert occupied_share(12, 8, 2) == pytest.approx(0.75)
    assert occupied_share(None, 8, 3) == 1.0
