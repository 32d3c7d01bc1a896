"""Pipeline sends with Megatron-LM's scatter/gather (NAR21 §4.1) against hand counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.options import CostOptions
from parsearch.launch import launch_for_cluster
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric

MODEL = ModelSpec("gpt-toy", 8, 4096, 16384, 32, 32, 128, 51200)
TRAINING = TrainingSpec(seq_len=2048, global_batch=64)
CLUSTER = load_cluster("dgx-a100")


def _p2p_seconds(layout: Layout, scatter_gather: bool) -> tuple[float, float]:
    """(the step's pp_p2p time, its micro-batch count) of ``layout`` on DGX A100."""
    options = CostOptions(pp_scatter_gather=scatter_gather)
    cm = build_cost_model(MODEL, TRAINING, build_fabric(CLUSTER, layout.num_gpus),
                          options=options)
    micro_batches = TRAINING.global_batch / (layout.mbs * layout.num_gpus
                                             // (layout.tp * layout.pp))
    return estimate(cm, layout).time_s["pp_p2p"], micro_batches


def test_split_sends_match_the_hand_count() -> None:
    # TP8 fills a node, so the two stages talk over the network: every TP rank sends
    # b*s*h BF16 bytes per micro-batch and direction (NAR21 §3.2), or 1/8 of it over its
    # own HDR rail followed by an 8-GPU all-gather over NVLink (NAR21 §4.1).
    layout = Layout(num_gpus=16, tp=8, pp=2, sp=False, mbs=1)
    direct, m = _p2p_seconds(layout, scatter_gather=False)
    split, _ = _p2p_seconds(layout, scatter_gather=True)
    size = 1 * 2048 * 4096 * 2                                   # bytes
    net = 25e9 * CLUSTER.network_efficiency                      # HDR 200 Gb/s rail
    nvlink = 300e9 * CLUSTER.nvlink_efficiency                   # NVLink3 per direction
    latency = 2 * (CLUSTER.network_latency_s + 1e-5)     # link + NCCL call, twice
    # 1F1B exposes both sends of every micro-batch: 2 per micro-batch
    assert direct == pytest.approx(m * (2 * size / net + latency), rel=0.02)
    gather = 7 / 8 * size / nvlink + 7 * CLUSTER.nvlink_latency_s
    assert split == pytest.approx(m * (2 * (size / 8 / net + gather) + latency), rel=0.02)
    assert split < direct / 3


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), sp=st.booleans())
def test_split_sends_change_only_layouts_that_send_whole_activations(tp: int, pp: int,
                                                                     sp: bool) -> None:
    sp = sp and tp > 1
    layout = Layout(num_gpus=tp * pp * 2, tp=tp, pp=pp, sp=sp, mbs=1)
    direct, _ = _p2p_seconds(layout, scatter_gather=False)
    split, _ = _p2p_seconds(layout, scatter_gather=True)
    if pp == 1 or tp == 1 or sp:
        assert split == direct
    elif tp == 8:       # a stage fills a node: the split saves network time
        assert split < direct
    else:               # stages inside a node: NVLink sends, split or not, plus the gather
        assert split != direct


def test_launch_says_current_megatron_cannot_split_the_sends() -> None:
    layout = Layout(num_gpus=16, tp=8, pp=2, sp=False, mbs=1)
    launch = launch_for_cluster(MODEL, TRAINING, layout, CLUSTER,
                                options=CostOptions(pp_scatter_gather=True))
    assert any("scatter/gather" in c for c in launch.conflicts)
    with_sp = launch_for_cluster(MODEL, TRAINING, Layout(num_gpus=16, tp=8, pp=2, sp=True),
                                 CLUSTER, options=CostOptions(pp_scatter_gather=True))
    assert not any("scatter/gather" in c for c in with_sp.conflicts)
