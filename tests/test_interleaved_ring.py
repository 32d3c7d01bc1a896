"""The interleaved schedule's warm-up and cool-down wait for their sends (issue 32 item 3).

Megatron-Core runs a model chunk for a group of ``pp`` micro-batches before the next
(``microbatch_group_size_per_vp_stage`` defaults to ``pp``), so in the all-forward warm-up
rank 0's next chunk waits for a ring of ``pp`` chunks and ``pp`` sends: ``pp`` sends per
chunk round, ``vpp - 1`` rounds, and the cool-down's backward mirrors it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.cost.stage_time import interleaved_ring_wait
from parsearch.layout import parse_layout_string
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric


@given(pp=st.integers(2, 64), vpp=st.integers(1, 40),
       send=st.floats(1e-6, 1e-2, allow_nan=False))
@settings(max_examples=200, deadline=None)
def test_ring_wait_grows_with_rounds_and_ring_length(pp: int, vpp: int, send: float) -> None:
    wait = float(interleaved_ring_wait(pp, vpp, np.array([send]))[0])
    assert wait >= 0.0
    assert (wait == 0.0) == (vpp == 1)
    # one more chunk round adds one more ring of pp sends forward and one backward
    more = float(interleaved_ring_wait(pp, vpp + 1, np.array([send]))[0])
    assert more - wait == pytest.approx(2.0 * pp * send)
    # a longer ring waits longer
    assert float(interleaved_ring_wait(pp + 1, vpp, np.array([send]))[0]) >= wait


@pytest.mark.parametrize("vpp", [2, 5, 10])
def test_an_interleaved_step_pays_its_warm_up_rings_once(vpp: int) -> None:
    # Llama 3 70B, TP8 PP4 across four H100 nodes: every send crosses the network.
    model = get_preset("llama3-70b")
    fabric = build_fabric(load_cluster("dgx-h100"), 32)

    def pp_p2p(batch: int, layout: str) -> tuple[float, float]:
        training = TrainingSpec(seq_len=8192, global_batch=batch, precision="bf16")
        cm = build_cost_model(model, training, fabric, options=CostOptions())
        e = estimate(cm, parse_layout_string(layout, 32))
        assert sum(e.time_s.values()) == pytest.approx(e.step_time_s)  # the step carries it
        return e.time_s["pp_p2p"], e.step_time_s

    # without interleaving 1F1B waits for its two sends per micro-batch (dp = 1: m = batch)
    send = pp_p2p(64, "tp=8,pp=4,mbs=1")[0] / (2.0 * 64)
    assert send > 0.0
    # per-micro-batch costs double with the micro-batches; the rings are paid once a step
    layout = f"tp=8,pp=4,vpp={vpp},mbs=1"
    once = 2.0 * pp_p2p(64, layout)[0] - pp_p2p(128, layout)[0]
    assert once == pytest.approx(2.0 * (vpp - 1) * 4 * send, rel=1e-6)


@pytest.mark.parametrize("vpp", [2, 5])
def test_interleaved_sends_before_the_p2p_overlap_are_waited_on(vpp: int) -> None:
    # Megatron-LM before --overlap-p2p-comm (f9283c5a8a, 2023-05-31) waited on every send:
    # each of the 2 x vpp sends per micro-batch is paid in full, as 1F1B pays its two, and
    # no warm-up ring is waited on beside them (each stage's own timeline carries its sends).
    model = get_preset("llama3-70b")
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    training = TrainingSpec(seq_len=8192, global_batch=64, precision="bf16")

    def price(layout: str, overlap: bool):  # type: ignore[no-untyped-def]
        cm = build_cost_model(model, training, fabric,
                              options=CostOptions(pp_p2p_overlap=overlap))
        return estimate(cm, parse_layout_string(layout, 32))

    send = price("tp=8,pp=4,mbs=1", True).time_s["pp_p2p"] / (2.0 * 64)
    layout = f"tp=8,pp=4,vpp={vpp},mbs=1"
    waited, overlapped = price(layout, False), price(layout, True)
    assert waited.time_s["pp_p2p"] == pytest.approx(2.0 * vpp * 64 * send, rel=1e-6)
    assert waited.step_time_s > overlapped.step_time_s
    assert sum(waited.time_s.values()) == pytest.approx(waited.step_time_s)
    # 1F1B waited on its sends already: the switch changes nothing there
    assert price("tp=8,pp=4,mbs=1", False).step_time_s == pytest.approx(
        price("tp=8,pp=4,mbs=1", True).step_time_s)
