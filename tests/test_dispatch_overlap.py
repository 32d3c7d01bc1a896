"""MoE dispatch volumes against hand counts; overlap as a bound from the schedule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import CostOptions, build_cost_model, estimate, score_columns
from parsearch.cost.collectives import LinkArrays
from parsearch.cost.communication import (
    dispatch_copies,
    dispatch_time,
    domains_reached,
)
from parsearch.cost.ep_overlap import a2a_overlap_hidden
from parsearch.layout import parse_layout_string
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import MoeSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric


def _link(size: int, per_domain: int, network_Bps: float = 40e9) -> LinkArrays:
    return LinkArrays(size=np.array([size], float), members_per_domain=np.array([per_domain],
                      float), nvlink_bandwidth_Bps=np.array([400e9]),
                      network_bandwidth_Bps=np.array([network_Bps]), nvlink_latency_s=0.0,
                      network_latency_s=0.0)


def test_alltoall_network_bytes_match_the_hand_count_of_the_gpt_oss_example() -> None:
    # GPT-OSS-120B, EP=64 over 8 nodes of 8: 16,384 tokens per rank, top-4, 7/8 of the
    # copies leave the node, 2,880 bf16 elements (5,760 B) per copy.
    _seconds, sent = dispatch_time(_link(64, 8), 16_384, 5_760.0, 4, "alltoall", 1.0, 0.0)
    assert float(sent[0]) == pytest.approx(16_384 * 4 * 7 / 8 * 5_760)


def test_allgather_sends_every_token_to_every_other_rank() -> None:
    intra, inter = dispatch_copies(8, 32, 6, "allgather")
    assert (float(intra), float(inter)) == (7.0, 24.0)  # independent of top-k


@given(per_domain=st.sampled_from([1, 2, 4, 8]), domains=st.integers(1, 32),
       top_k=st.integers(1, 16))
def test_deduplicating_dispatch_never_sends_more_over_the_network(per_domain: int,
                                                                   domains: int,
                                                                   top_k: int) -> None:
    n = per_domain * domains
    _, plain = dispatch_copies(per_domain, n, top_k, "alltoall")
    _, dedup = dispatch_copies(per_domain, n, top_k, "flex")
    assert float(dedup) <= float(plain) + 1e-12
    assert float(dedup) <= domains - 1 + 1e-12  # at most one copy per remote domain
    if domains == 1:
        assert float(plain) == 0.0


@given(per_domain=st.sampled_from([2, 4, 8]), efficiency=st.floats(0.55, 1.0),
       dispatcher=st.sampled_from(["alltoall", "allgather", "flex"]))
def test_alltoall_efficiency_prices_the_network_only(per_domain: int, efficiency: float,
                                                     dispatcher: str) -> None:
    """Inside one NVLink domain the all-to-all runs at the ring rate, whatever the
    network all-to-all efficiency; across domains NCCL's efficiency can only slow it."""
    inside = [float(dispatch_time(_link(per_domain, per_domain), 4096, 7168.0, 8, dispatcher,
                                  eff, 0.0)[0][0]) for eff in (efficiency, 1.0)]
    assert inside[0] == pytest.approx(inside[1])
    if dispatcher == "alltoall":  # 4096 tokens x 8 copies, (p-1)/p leave the rank, 400 GB/s
        assert inside[1] == pytest.approx(4096 * 8 * (per_domain - 1) / per_domain * 7168.0
                                          / 400e9)
    spread = [float(dispatch_time(_link(8 * per_domain, per_domain), 4096, 7168.0, 8,
                                  dispatcher, eff, 0.0)[0][0]) for eff in (efficiency, 1.0)]
    assert spread[0] >= spread[1] - 1e-15


def _gpt_oss(ep: int, cuda_graphs: bool = False) -> float:
    model = get_preset("gpt-oss-120b")
    training = TrainingSpec(seq_len=4096, global_batch=1280)
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-b200"), 64),
                          # NVIDIA's performance runs force balanced routing (page footnote)
                          options=replace(CostOptions(), cuda_graphs=cuda_graphs,
                                          routing="balanced"))
    return estimate(cm, parse_layout_string(f"ep={ep},mbs=1", 64)).tokens_per_s_per_gpu


def test_expert_parallelism_inside_the_node_beats_spilling_over_eight_nodes() -> None:
    """Published GPT-OSS-120B on 64 B200s (issue 8): EP=8 near 13.6k tokens/s/GPU, EP=64
    near 8k.  With whole-layer CUDA graphs both are predicted within 15% and EP=8 wins
    by more than 1.5x; eager, the host issue time of EP=8's 16 local experts (and since
    2026-12-06 their per-expert FC2 bias adds, issued one expert at a time by
    ``TEGroupedMLP._apply_bias``) narrows the gap to a few per cent, but the order holds
    (the eager runs were not measured, so only the order is asserted)."""
    assert _gpt_oss(8, cuda_graphs=True) == pytest.approx(13_600, rel=0.15)
    assert _gpt_oss(64, cuda_graphs=True) == pytest.approx(8_000, rel=0.15)
    assert _gpt_oss(8, cuda_graphs=True) > 1.5 * _gpt_oss(64, cuda_graphs=True)
    assert _gpt_oss(8) > _gpt_oss(64)


FEATURES = ("tp_comm_overlap", "tp_async_grad_comm", "moe_a2a_overlap", "overlap_grad_reduce",
            "overlap_param_gather")


@pytest.fixture(scope="module")
def moe_space():  # type: ignore[no-untyped-def]
    model = get_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2))
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    table = enumerate_layouts(model, training, 32)
    return model, training, fabric, table.columns


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(feature=st.sampled_from(FEATURES), base=st.fixed_dictionaries(
    {f: st.booleans() for f in FEATURES}))
def test_turning_an_overlap_feature_off_never_makes_a_layout_faster(moe_space, feature: str,
                                                                     base: dict) -> None:
    model, training, fabric, cols = moe_space
    if feature == "overlap_grad_reduce":
        # Overlapping the reduction splits it into buckets, one NCCL call each (Megatron-Core
        # DDP): where the calls' latency outweighs the little backward left to hide behind,
        # turning the overlap off is truly faster (Mixtral 8x7B TP1 CP8 on 32 H100: 1,167
        # calls of 40M parameters, 0.23 s); the overlap itself never costs time, which is
        # what a cluster without latency shows
        fabric = build_fabric(replace(fabric.cluster, nvlink_latency_s=0.0,
                                      network_latency_s=0.0, switch_latency_s=0.0), 32)
    on = CostOptions(**{**base, feature: True})
    off = replace(on, **{feature: False})
    fast = score_columns(build_cost_model(model, training, fabric, options=on), cols,
                         with_memory=False)
    slow = score_columns(build_cost_model(model, training, fabric, options=off), cols,
                         with_memory=False)
    assert np.all(slow["step_time_s"] >= fast["step_time_s"] * (1 - 1e-12))


def test_overlap_never_hides_more_than_the_compute_available(moe_space) -> None:
    """With every overlap on, the communication hidden is at most the compute next to it:
    the step can never drop below the compute alone, nor below the exposed-free bound."""
    model, training, fabric, cols = moe_space
    everything = CostOptions(tp_comm_overlap=True, moe_a2a_overlap=True)
    nothing = CostOptions(tp_comm_overlap=False, moe_a2a_overlap=False,
                          overlap_grad_reduce=False, overlap_param_gather=False)
    on = score_columns(build_cost_model(model, training, fabric, options=everything), cols,
                       with_memory=False)
    off = score_columns(build_cost_model(model, training, fabric, options=nothing), cols,
                        with_memory=False)
    comm = ("tp_comm", "cp_comm", "ep_comm")
    hidden = sum(off[f"time_{k}"] - on[f"time_{k}"] for k in comm)
    work = off["time_compute"] + off["time_memory_bound"] + off["time_overhead"]
    assert np.all(hidden <= work * (1 + 1e-9) + 1e-12)
    assert np.all(on["step_time_s"] >= off["time_compute"] * (1 - 1e-12))


def test_node_limited_routing_matches_the_hand_count_for_deepseek_v3_on_eight_nodes() -> None:
    # EP=64 over 8 nodes of 8, 256 experts in 8 groups (one per node), a token uses 4
    # groups: a remote node is missed with probability C(7,4)/C(8,4) = 35/70, so
    # 7 x 1/2 = 3.5 remote nodes, against 7 x (1 - (7/8)^8) = 4.595 without the limit.
    assert float(domains_reached(8, 64, 8, (8, 4))) == pytest.approx(3.5)
    assert float(domains_reached(8, 64, 8)) == pytest.approx(7 * (1 - (7 / 8) ** 8))
    # EP=32 over 4 nodes: 2 groups per node, a node is missed when neither of its 2
    # groups is chosen: C(6,4)/C(8,4) = 15/70.
    assert float(domains_reached(8, 32, 8, (8, 4))) == pytest.approx(3 * (1 - 15 / 70))


@given(per_domain=st.sampled_from([1, 2, 4, 8, 72]), domains=st.integers(1, 16),
       top_k=st.integers(1, 8), groups=st.sampled_from([2, 4, 8, 16]),
       chosen=st.integers(1, 16))
def test_group_limited_routing_never_reaches_more_domains(per_domain: int, domains: int,
                                                          top_k: int, groups: int,
                                                          chosen: int) -> None:
    chosen = min(chosen, groups)
    n = per_domain * domains
    free = float(domains_reached(per_domain, n, top_k))
    limited = float(domains_reached(per_domain, n, top_k, (groups, chosen)))
    assert 0.0 <= limited <= free + 1e-12


def test_group_limited_routing_rejects_groups_that_cannot_hold_top_k() -> None:
    with pytest.raises(Exception, match="router_group_topk"):
        MoeSpec(num_experts=16, top_k=8, expert_ffn_hidden_size=64, router_num_groups=8,
                router_group_topk=2)  # 2 groups x 2 experts < top-8
    with pytest.raises(Exception, match="does not divide"):
        MoeSpec(num_experts=10, top_k=2, expert_ffn_hidden_size=64, router_num_groups=4,
                router_group_topk=2)


class _Unit:
    def __init__(self, routed: float, total: float) -> None:
        self.routed, self.total = np.array([routed]), np.array([total])


@given(ep=st.floats(0.0, 50.0), routed=st.floats(0.0, 10.0), rest=st.floats(0.0, 10.0),
       used=st.floats(0.0, 1.0), pp=st.integers(1, 16), m=st.integers(1, 512))
def test_a2a_overlap_hides_at_most_the_traffic_and_the_compute_left(
        ep: float, routed: float, rest: float, used: float, pp: int, m: int) -> None:
    unit = _Unit(routed, routed + rest)
    budget = np.array([(routed + rest) * (1.0 - used)])
    hidden = float(a2a_overlap_hidden(np.array([ep]), unit, budget, np.array([pp]),
                                      np.array([m]))[0])
    assert 0.0 <= hidden <= ep * (1 + 1e-12) + 1e-12
    assert hidden <= float(budget[0]) * (1 + 1e-12) + 1e-12


def test_a2a_overlap_needs_a_partner_micro_batch() -> None:
    """Warm-up forwards and cool-down backwards run alone: one micro-batch hides
    nothing; with PP the first stage's pp-1 of m stay exposed."""
    unit = _Unit(6.0, 9.0)
    args = (np.array([4.0]), unit, np.array([9.0]))
    assert float(a2a_overlap_hidden(*args, np.array([1]), np.array([1]))[0]) == 0.0
    alone = float(a2a_overlap_hidden(*args, np.array([1]), None)[0])
    piped = float(a2a_overlap_hidden(*args, np.array([8]), np.array([28]))[0])
    assert piped == pytest.approx(alone * (1 - 7 / 28))


def test_a2a_overlap_slots_cannot_pool_compute() -> None:
    """A slot hides only the compute beside it: traffic equal to the whole layer's
    compute is not fully hidden when the slots are unequal (attention vs experts)."""
    unit = _Unit(6.0, 9.0)  # experts 6, the rest 3: slots of 1, 2, 2, 4
    hidden = float(a2a_overlap_hidden(np.array([9.0]), unit, np.array([9.0]), np.array([1]),
                                      None)[0])
    assert hidden == pytest.approx(1.0 + 2.0 + 2.0 + 2.25)


@given(per_domain=st.sampled_from([1, 2, 4, 8, 72]), domains=st.integers(1, 16),
       top_k=st.integers(1, 16))
def test_flex_sends_a_token_once_per_rank_and_never_more_copies_in_all(
        per_domain: int, domains: int, top_k: int) -> None:
    """DeepEP/HybridEP send a token once per destination rank: inside one NVLink domain
    (n-1)(1-(1-1/n)^k) copies instead of k(n-1)/n; over all links never more copies
    than one per routed expert."""
    n = per_domain * domains
    a_intra, a_inter = dispatch_copies(per_domain, n, top_k, "alltoall")
    f_intra, f_inter = dispatch_copies(per_domain, n, top_k, "flex")
    assert float(f_intra + f_inter) <= float(a_intra + a_inter) + 1e-9
    if domains == 1:
        assert float(f_intra) == pytest.approx((n - 1) * (1 - (1 - 1 / n) ** top_k))


# ------------------------------------------------------------ SMs the dispatch kernels hold


def _a2a_step(backend: str, cluster: str = "gb200-nvl72", gpus: int = 72) -> tuple[float, float]:
    """(step time, compute part) of DeepSeek-V3-like EP traffic hidden by the A2A overlap."""
    from parsearch.cost.analytic import build_cost_model, estimate
    from parsearch.cost.options import CostOptions
    from parsearch.layout import parse_layout_string
    from parsearch.model.presets import get_preset
    from parsearch.model.specs import TrainingSpec
    from parsearch.topology.cluster import load_cluster
    from parsearch.topology.fabric import build_fabric

    model = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=576, precision="bf16")
    options = CostOptions(moe_dispatcher="flex", moe_a2a_overlap=True,
                          moe_flex_backend=backend)
    cm = build_cost_model(model, training, build_fabric(load_cluster(cluster), gpus),
                          options=options)
    est = estimate(cm, parse_layout_string("tp=1,pp=1,ep=8,mbs=1", gpus))
    return est.step_time_s, est.time_s["compute"]


def test_flex_kernels_take_their_sm_budget_from_the_compute_they_overlap() -> None:
    """HybridEP's 32 SMs slow the overlapped compute more than DeepEP's 20 (of 148 on a
    GB200); the traffic and what the schedule hides are the same."""
    deepep, hybridep = _a2a_step("deepep"), _a2a_step("hybridep")
    assert hybridep[1] > deepep[1] and hybridep[0] > deepep[0]
    # auto on an NVL72 rack is HybridEP, as the launch settings choose
    assert _a2a_step("auto") == hybridep


def test_sm_share_is_the_backend_budget_over_the_gpu_sms() -> None:
    from parsearch.cost.communication import FLEX_DISPATCH_SMS, ep_sm_share
    from parsearch.cost.efficiency import efficiency_for_gpu
    from parsearch.cost.options import CostOptions
    from parsearch.topology.hardware import load_gpu_profile

    profile = efficiency_for_gpu("h100-sxm")
    gpu = load_gpu_profile("h100-sxm")
    flex = CostOptions(moe_dispatcher="flex")
    assert ep_sm_share(flex, profile, gpu.sm_count, "deepep") == 20 / 132
    assert FLEX_DISPATCH_SMS["hybridep"] == 32
    # NCCL-based dispatchers keep the profile's share
    assert ep_sm_share(CostOptions(), profile, gpu.sm_count, "deepep") == profile.comm_sm_share
