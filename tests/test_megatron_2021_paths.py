"""Megatron-LM's 2021-22 paths against hand counts: pipeline sends split over the TP group
(NAR21 §4.1), the backward TP all-reduce before it ran asynchronously, and attention
before FlashAttention (batched GEMMs over the score matrix plus softmax and dropout)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.compute import unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.options import CostOptions
from parsearch.cost.recompute import LayerShares
from parsearch.launch import launch_for_cluster
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.topology.hardware import load_gpu_profile

MODEL = ModelSpec("gpt-toy", 8, 4096, 16384, 32, 32, 128, 51200)
TRAINING = TrainingSpec(seq_len=2048, global_batch=64)
CLUSTER = load_cluster("dgx-a100")
A100 = load_gpu_profile("a100-sxm-80gb")
A100_PROFILE = efficiency_for_gpu("a100-sxm-80gb")


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


def test_exposed_backward_all_reduce_matches_the_hand_count() -> None:
    # TP8 without SP or userbuffers: per layer and micro-batch two all-reduces forward and
    # two backward (formulas.md §7.2), each 2 x 7/8 x b*s*h*2 bytes over NVLink3, plus the
    # vocab-parallel embedding's and output layer's share (0.2 + 0.6 of a layer block).
    # With the async path the backward half hides behind the dgrad/wgrad GEMMs (all but
    # the embedding's, which has none); without it (Megatron-LM before 2021-09) all of
    # them are exposed.
    layout = Layout(num_gpus=8, tp=8, pp=1, sp=False, mbs=1)

    def tp_seconds(async_grad: bool) -> float:
        options = CostOptions(tp_comm_overlap=False, tp_async_grad_comm=async_grad)
        cm = build_cost_model(MODEL, TRAINING, build_fabric(CLUSTER, 8), options=options)
        return estimate(cm, layout).time_s["tp_comm"]

    size = 1 * 2048 * 4096 * 2
    reduce_scatter = (7 / 8 * size / (300e9 * CLUSTER.nvlink_efficiency)
                      + 7 * CLUSTER.nvlink_latency_s + 1e-5)        # + the NCCL call
    micro_batches = TRAINING.global_batch / 1
    blocks = 2 * MODEL.num_layers + 0.6 + 0.2
    all_collectives = micro_batches * blocks * 4 * reduce_scatter
    assert tp_seconds(async_grad=False) == pytest.approx(all_collectives, rel=0.02)
    assert tp_seconds(async_grad=True) == pytest.approx(all_collectives / 2, rel=0.02)


def test_launch_says_current_megatron_always_overlaps_the_backward_collectives() -> None:
    layout = Layout(num_gpus=8, tp=8, pp=1, sp=False, mbs=1)
    launch = launch_for_cluster(MODEL, TRAINING, layout, CLUSTER,
                                options=CostOptions(tp_async_grad_comm=False))
    assert any("backward TP collectives" in c for c in launch.conflicts)
    single = launch_for_cluster(MODEL, TRAINING, Layout(num_gpus=8, tp=1), CLUSTER,
                                options=CostOptions(tp_async_grad_comm=False))
    assert not any("backward TP collectives" in c for c in single.conflicts)


def _unfused_layer(head_dim: int, flash_attention: bool = False):  # type: ignore[no-untyped-def]
    heads = 32
    model = ModelSpec("gpt-unfused", 8, heads * head_dim, 4 * heads * head_dim, heads, heads,
                      head_dim, 51200)
    cols = {k: np.array([v]) for k, v in
            {"tp": 1, "cp": 1, "ep": 1, "etp": 1, "mbs": 1, "sp": 0, "recompute": 0}.items()}
    no_recompute = LayerShares(**{f.name: np.zeros(1) for f in fields(LayerShares)})
    return unit_compute(model, TRAINING, A100, A100_PROFILE, cols, "dense",
                               recompute=no_recompute, causal=True, imbalance=1.0,
                               cuda_graphs=False, flash_attention=flash_attention)


@settings(max_examples=12, deadline=None)
@given(head_dim=st.sampled_from([32, 64, 96, 128, 256]))
def test_unfused_attention_gemms_are_never_faster_than_their_score_traffic(
        head_dim: int) -> None:
    # Forward QK^T writes and PV reads the 2-byte score matrix (4 B per element); the
    # backward's four GEMMs move 8 B per element (FlashAttention §2.2 roofline).
    layer = _unfused_layer(head_dim)
    scores = 2048 * 32 * 2048
    hbm = A100.hbm_bandwidth_Bps * A100_PROFILE.hbm_efficiency
    assert layer.attention[0] >= scores * (4 + 8) / hbm * (1 - 1e-9)


def test_unfused_score_kernels_match_the_hand_count() -> None:
    # Softmax (4 B) + dropout with its 1-byte mask (5 B) forward, their gradients 5 + 6 B
    # backward: 20 B per score element on top of what the fused path moves.
    unfused = _unfused_layer(128)
    fused = _unfused_layer(128, flash_attention=True)
    scores = 2048 * 32 * 2048
    hbm = A100.hbm_bandwidth_Bps * A100_PROFILE.hbm_efficiency
    expected = A100_PROFILE.memory_bound_factor * scores * 20 / hbm
    assert unfused.memory_bound[0] - fused.memory_bound[0] == pytest.approx(expected,
                                                                            rel=1e-9)


@pytest.mark.parametrize("run_id, grad_bytes", [("r0317", 2.0), ("r0323", 2.0), ("r0337", 4.0)])
def test_papers_are_priced_without_the_distributed_optimizer(run_id: str,
                                                             grad_bytes: float) -> None:
    # The distributed optimizer reached Megatron-LM main in June 2022, after NAR21 and KOR22
    # (KOR22 §6.3: "the gradient all-reduce"): optimizer state replicated over DP, one
    # gradient all-reduce per step; NAR21 --fp16 keeps and reduces FP16 gradients, KOR22 FP32.
    from parsearch.validation.published.published_runs import load_published_runs, training_spec
    from parsearch.validation.published.runs import source_accounting

    run = {r.id: r for r in load_published_runs()}[run_id]
    training, options = source_accounting(run, training_spec(run), CostOptions())
    assert not training.distributed_optimizer and not training.fsdp
    assert options.grad_reduce_bytes == grad_bytes
    assert training.grad_bytes == grad_bytes


def test_unsharded_optimizer_prices_an_all_reduce_and_no_gather() -> None:
    # Without the distributed optimizer the DP traffic is one all-reduce (twice a
    # reduce-scatter's bytes) and no parameter all-gather.
    layout = Layout(num_gpus=64, tp=8, pp=1, sp=False, mbs=1)
    fabric = build_fabric(CLUSTER, layout.num_gpus)

    def dp_time(distributed: bool) -> dict[str, float]:
        training = TrainingSpec(seq_len=2048, global_batch=64, distributed_optimizer=distributed)
        options = CostOptions(overlap_grad_reduce=False, overlap_param_gather=False,
                              grad_reduce_bytes=4.0, param_gather_bytes=2.0)
        return estimate(build_cost_model(MODEL, training, fabric, options=options), layout).time_s

    sharded, replicated = dp_time(True), dp_time(False)
    # 4-byte reduce-scatter + 2-byte gather against a 4-byte all-reduce: 8 / 6 of the bytes
    assert replicated["dp_comm"] == pytest.approx(sharded["dp_comm"] * 8 / 6, rel=0.02)
    # every rank steps the whole optimizer, not its 1/DP shard
    assert replicated["optimizer"] > sharded["optimizer"]
