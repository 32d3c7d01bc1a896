"""Why a published shape trails the search's best: the parts of the step it spends more on."""

from __future__ import annotations

import pytest

from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.layout import parse_layout_string
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.ranking import _behind


@pytest.mark.parametrize(("fast", "slow"), [("tp=8,pp=1,mbs=1", "tp=8,pp=4,mbs=1"),
                                            ("tp=4,pp=2,mbs=1", "tp=8,pp=2,vpp=2,mbs=1")])
def test_behind_names_the_parts_the_slower_layout_spends_more_on(fast: str, slow: str) -> None:
    cm = build_cost_model(get_preset("llama3-70b"), TrainingSpec(seq_len=4096, global_batch=64),
                          build_fabric(load_cluster("dgx-h100"), 64), options=CostOptions())
    best, published = (parse_layout_string(text, 64) for text in (fast, slow))
    a, b = estimate(cm, best), estimate(cm, published)
    parts = _behind(cm, best, published, parts=20)
    extra = {k: (b.time_s[k] - a.time_s[k]) / a.step_time_s for k in b.time_s}
    # at the 1e-4 of the step they are reported to
    assert [k for k, _ in parts] == sorted((k for k, v in extra.items() if round(v, 4) > 0),
                                           key=lambda k: -extra[k])[:20]
    for k, share in parts:
        assert share == pytest.approx(extra[k], abs=1e-4) and share > 0
    # the parts add up: what the slower layout loses in all, over the faster one's step
    assert sum(extra.values()) == pytest.approx(b.step_time_s / a.step_time_s - 1.0, rel=1e-9)
    assert len(_behind(cm, best, published)) <= 3
