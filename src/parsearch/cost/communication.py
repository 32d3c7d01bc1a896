"""Exposed communication time of one pipeline unit per micro-batch: TP, CP and EP.

Overlap is a bound from the schedule, never a fitted fraction: a collective
is hidden only where the feature that overlaps it is on, and only up to the
independent compute available next to it; the hidden part still slows that
compute by the share of SMs the communication kernels occupy.

* TP / SP (formulas.md §7.2).  Per block (attention, MLP) Megatron-Core runs
  forward an all-gather and a reduce-scatter (an all-reduce without SP), and
  backward an all-gather of the output gradient, a reduce-scatter of the
  input gradient and (SP) a re-gather of the input for wgrad
  (``megatron/core/tensor_parallel/layers.py``,
  ``LinearWithGradAccumulationAndAsyncCommunication``).  Without TP overlap
  the last two run asynchronously beside the dgrad and wgrad GEMMs; the rest
  are exposed.  With ``--tp-comm-overlap`` (Transformer Engine userbuffers,
  SP and an NVLink-local group only) all of them are split and pipelined with
  the GEMMs they feed: exposed = max(0, comm - GEMM time).
* CP (formulas.md §7.3): the ring exchange of K/V blocks runs beside the
  attention of the previous block (``docs/user-guide/features/context_parallel.md``).
* EP (formulas.md §7.5), per dispatcher: ``alltoall`` sends one copy per routed
  expert; ``allgather`` gathers every token over the EP group and
  reduce-scatters the result; ``flex`` (DeepEP / HybridEP) sends a token once
  per remote NVLink domain.  Four calls per layer and micro-batch (dispatch
  and combine forward, their gradients backward), two more with full
  recompute; with ETP an all-gather / reduce-scatter of the received tokens.
  ``--overlap-moe-expert-parallel-comm`` hides them, slot by slot behind
  the compute of the other micro-batch in the merged forward-backward step
  (:func:`parsearch.cost.ep_overlap.a2a_overlap_hidden`); without it,
  ``--moe-shared-expert-overlap`` hides them behind the same micro-batch's shared experts
  (:func:`parsearch.cost.ep_overlap.shared_expert_overlap_hidden`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parsearch.cost.collectives import (
    LinkArrays,
    p2p_time,
    reduce_scatter_time,
    safe_div,
    split_group,
)
from parsearch.cost.compute import ACT_BYTES, UnitCompute, is_moe_unit
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.cost.ep_overlap import (
    a2a_overlap_hidden,
    a2a_schedulable,
    shared_expert_overlap_hidden,
    shared_expert_overlap_on,
)
from parsearch.cost.options import CostOptions
from parsearch.cost.recompute import LayerShares
from parsearch.cost.routing import priced_imbalance
from parsearch.model.specs import ModelSpec, TrainingSpec

#: TP blocks per unit: a dense layer has two (attention, MLP); an MoE layer one plus
#: one for TP-sharded shared experts; the output layer's vocab-parallel GEMM gathers its
#: input forward and reduce-scatters its gradient backward (~3 of a block's 5 ops); the
#: vocab-parallel embedding reduces its output forward (1 of 5).
OUTPUT_TP_BLOCKS = 0.6
EMBEDDING_TP_BLOCKS = 0.2


@dataclass(frozen=True)
class Groups:
    """The placed process groups of every layout (``LinkArrays`` per kind)."""

    tp: LinkArrays
    cp: LinkArrays
    dp: LinkArrays
    ep: LinkArrays
    etp: LinkArrays
    edp: LinkArrays
    pp: LinkArrays


@dataclass(frozen=True)
class UnitComm:
    """Exposed seconds per micro-batch of one unit, plus what overlap costs in SMs.

    ``sm_slowdown`` is compute time added because overlapped communication
    kernels hold SMs; ``network_bytes`` the bytes this GPU sends across the
    NVLink-domain boundary (for the NIC-sharing floor).
    """

    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    sm_slowdown: np.ndarray
    network_bytes: np.ndarray


def _tp_blocks(model: ModelSpec, unit: str) -> float:
    moe_unit = is_moe_unit(model, unit)
    if unit in ("dense", "mtp") and not moe_unit:
        return 2.0
    if moe_unit:
        shared = model.moe is not None and model.moe.shared_expert_ffn_hidden_size > 0
        return 1.0 + (1.0 if shared else 0.0)
    return OUTPUT_TP_BLOCKS if unit == "output" else EMBEDDING_TP_BLOCKS


def domains_reached(members_per_domain: Any, group_size: Any, top_k: int,
                    groups: tuple[int, int] = (1, 1)) -> Any:
    """Remote NVLink domains a token's ``top_k`` experts sit in, on average.

    Uniform routing over ``M = n / k`` domains: ``(M-1)(1 - (1 - 1/M)^top_k)``.
    Group-limited routing (``groups = (G, t)``: experts cut into ``G`` equal groups, a
    token uses at most ``t`` of them; Megatron-Core ``--moe-router-num-groups`` /
    ``--moe-router-group-topk``, DeepSeek-V3 arXiv 2412.19437 §3.2.2 "each token will
    be sent to at most M nodes") caps it: with ``g = kG/n`` groups per domain, a remote
    domain is missed when none of its groups is among the ``t`` chosen
    (hypergeometric: ``C(G-g, t) / C(G, t)``); a group wider than a domain reaches
    at most ``t n / (G k)`` domains.  [derived]

    >>> round(float(domains_reached(8, 64, 8)), 3)              # 7 * (1 - (7/8)**8)
    4.595
    >>> float(domains_reached(8, 64, 8, (8, 4)))                # 7 * (1 - C(7,4)/C(8,4))
    3.5
    """
    k = np.asarray(members_per_domain, dtype=np.float64)
    n = np.asarray(group_size, dtype=np.float64)
    k = np.clip(k, 1.0, np.maximum(n, 1.0))
    m = n / k
    uniform = (m - 1.0) * (1.0 - (1.0 - 1.0 / np.maximum(m, 1.0)) ** top_k)
    num_groups, chosen = groups
    if chosen >= num_groups:
        return uniform
    per_domain = np.clip(k * num_groups / np.maximum(n, 1.0), 0.0, float(num_groups))
    missed = np.ones_like(per_domain)
    for i in range(chosen):
        missed = missed * np.maximum(num_groups - per_domain - i, 0.0) / (num_groups - i)
    within = (m - 1.0) * (1.0 - missed)
    spanning = chosen / np.maximum(per_domain, 1e-12) * (m - 1.0) / np.maximum(m, 1.0)
    limited = np.where(per_domain >= 1.0, within, spanning)
    return np.minimum(uniform, limited)


def rank_hit(group_size: Any, top_k: int) -> Any:
    """The chance a token's ``top_k`` experts, spread evenly over ``n`` ranks, hit a given
    rank: ``1 - (1 - 1/n)^top_k`` (uniform routing)."""
    return 1.0 - (1.0 - 1.0 / np.maximum(group_size, 1.0)) ** top_k


def dispatch_copies(members_per_domain: Any, group_size: Any, top_k: int,
                    dispatcher: str, groups: tuple[int, int] = (1, 1)) -> tuple[Any, Any]:
    """(copies over NVLink, copies over the network) per token for one dispatch call.

    Experts spread evenly over the ``n`` ranks of the EP group, ``k`` per NVLink
    domain, ``M = n / k`` domains, uniform routing:

    * ``alltoall``: a token goes once to each chosen expert: ``top_k (k-1)/n`` copies
      stay in the domain, ``top_k (n-k)/n`` cross the network;
    * ``flex``: once to each remote domain that hosts a chosen expert
      (:func:`domains_reached`, group-limited routing included), fanned out on
      NVLink there [derived; DeepEP README: "forwarding from NVLink to RDMA"];
      on NVLink once per destination *rank*, not per expert (DeepEP / HybridEP
      dispatch a token to a rank with all its local top-k slots): a rank is hit
      with ``p = 1 - (1 - 1/n)^top_k``, so ``(k-1) p`` copies to the own domain's
      ranks plus the forwarding of the tokens that arrive from other domains,
      ``(M-1) k p - reached`` (each reached domain's landing rank needs none)
      [derived];
    * ``allgather``: every token to every other rank: ``k-1`` and ``n-k`` copies.

    >>> [float(x) for x in dispatch_copies(8, 64, 4, "alltoall")]  # 8 domains of 8, top-4
    [0.4375, 3.5]
    >>> round(float(dispatch_copies(8, 64, 4, "flex")[1]), 3)      # 7 * (1 - (7/8)**4)
    2.897
    >>> round(float(dispatch_copies(8, 8, 8, "flex")[0]), 3)       # 7 * (1 - (7/8)**8), not 7
    4.595
    """
    k = np.asarray(members_per_domain, dtype=np.float64)
    n = np.asarray(group_size, dtype=np.float64)
    k = np.clip(k, 1.0, np.maximum(n, 1.0))
    if dispatcher == "allgather":
        return k - 1.0, n - k
    intra = top_k * (k - 1.0) / np.maximum(n, 1.0)
    if dispatcher == "flex":
        inter = domains_reached(k, n, top_k, groups)
        hit = rank_hit(n, top_k)
        domains = n / k
        intra = (k - 1.0) * hit + np.maximum(0.0, (domains - 1.0) * k * hit - inter)
    else:
        inter = top_k * (n - k) / np.maximum(n, 1.0)
    return intra, inter


def dispatch_time(link: LinkArrays, tokens: Any, bytes_per_token: float, top_k: int,
                  dispatcher: str, alltoall_efficiency: float,
                  call_latency_s: float,
                  groups: tuple[int, int] = (1, 1),
                  forward_Bps: float | None = None,
                  rdma_share: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, network bytes) of one dispatch (or combine) call of ``tokens`` per rank.

    NVLink and network copies proceed at once; the slower link sets the time
    (formulas.md §7.1 hierarchical all-to-all).  Inside an NVSwitch domain every
    pair has its own path, so all-to-all reaches the ring-collective rate the
    cluster file states (NCCL maintainer: about 370 of 450 GB/s on 8x H100 for
    the collectives other than all-reduce, nccl-tests issue #212; DeepEP v2
    726 of 900 GB/s on B200, references/microbenchmarks.yaml).  Across the
    network, NCCL all-to-all reaches ``alltoall_efficiency`` of the ring rate
    (nccl-tests all-to-all vs all-reduce busbw over NDR); DeepEP's RDMA kernels
    run near line rate (DeepEP README: 43-58 GB/s per 400 Gb/s NIC), so ``flex``
    uses the full network rate.  Latency: one call plus one network step per
    remote domain (NCCL sends to every peer).  ``forward_Bps``: DeepEP's internode
    NVLink forwarding stage (:data:`DEEPEP_FORWARD_BPS`), a third bound where the group
    spans several domains: every rank forwards the ``n p`` copies it receives per token.
    ``rdma_share``: the share of the network rate DeepEP's RDMA stage reaches
    (:data:`DEEPEP_RDMA_SHARE`).
    """
    k, m, n = split_group(link)
    intra, inter = dispatch_copies(k, n, top_k, dispatcher, groups)
    t = np.asarray(tokens, dtype=np.float64)
    # NVLink at the cluster's ring rate (docstring; HybridEP's 546 of 900 GB/s on a
    # 24-rank NVL72 domain is the slower exception); the network: NCCL all-to-all at
    # alltoall_efficiency of the ring rate, DeepEP's RDMA near line rate.
    network_eff = rdma_share if dispatcher == "flex" else alltoall_efficiency
    net_bytes = t * inter * bytes_per_token
    intra_s = safe_div(t * intra * bytes_per_token,
                       np.asarray(link.nvlink_bandwidth_Bps, dtype=np.float64))
    inter_s = safe_div(net_bytes,
                       np.asarray(link.network_bandwidth_Bps, dtype=np.float64) * network_eff)
    peers = (m - 1.0) if dispatcher != "flex" else np.minimum(m - 1.0, 1.0)
    latency = call_latency_s + peers * np.asarray(link.network_latency_s, dtype=np.float64)
    busiest = np.maximum(intra_s, inter_s)
    if dispatcher == "flex" and forward_Bps:
        forward_s = t * n * rank_hit(n, top_k) * bytes_per_token / forward_Bps
        busiest = np.where(m > 1, np.maximum(busiest, forward_s), busiest)
    seconds = np.where(n > 1, busiest + latency, 0.0)
    return seconds, np.where(n > 1, net_bytes, 0.0)


#: SMs the flex dispatcher's kernels hold while they run: DeepEP's normal kernels default
#: to 20 (``Buffer.num_sms``, deepseek-ai/DeepEP ``deep_ep/buffers/legacy.py``; Megatron-Core
#: ``moe_deepep_num_sms``, "historical default 20"); Megatron-Bridge's performance recipes
#: give HybridEP 32 (``perf_recipes/_common.py``: ``moe_hybridep_num_sms = 32``).
FLEX_DISPATCH_SMS = {"deepep": 20, "hybridep": 32}
#: DeepEP's internode normal kernels land each token once per remote node by RDMA and then
#: forward it on NVLink to every rank of that node that holds one of its experts; that
#: NVLink stage moves what a rank receives, ``n p`` copies per token (``p`` the chance a
#: rank is hit), at about 140 GB/s per GPU on Hopper with 24 SMs, whatever its NVLink:
#: 125-145 GB/s on 2 x 8 H200 (deepseek-ai/DeepEP#493), 144-148 on 2 x 8 H20 (#361),
#: "exceeds 140 GB/s, making NVLink the bottleneck" of the README's EP16 row on H800
#: (maintainer, #285).  On 2 nodes it binds before the NIC (RDMA 41-44 GB/s logical,
#: 20-22 physical); from 4 nodes the RDMA stage does (the README's EP32/EP64 rows).
#: Keyed by the CUDA major version; no Blackwell measurement, so not priced there.
DEEPEP_FORWARD_BPS: dict[int, float] = {9: 140e9}


def deepep_forward_Bps(options: CostOptions, backend: str,
                       compute_capability: float | None) -> float | None:
    """DeepEP's internode NVLink forwarding rate per GPU (:data:`DEEPEP_FORWARD_BPS`) where
    the flex dispatcher runs DeepEP on a GPU it was measured on; else ``None``.

    >>> from types import SimpleNamespace
    >>> deepep_forward_Bps(SimpleNamespace(moe_dispatcher="flex"), "deepep", 9.0)
    140000000000.0
    >>> deepep_forward_Bps(SimpleNamespace(moe_dispatcher="flex"), "deepep", 10.0) is None
    True
    """
    if options.moe_dispatcher != "flex" or backend != "deepep" or compute_capability is None:
        return None
    return DEEPEP_FORWARD_BPS.get(int(compute_capability))


#: Share of the cluster's network rate (line rate x ``network_efficiency``) DeepEP's
#: internode RDMA stage reaches, by CUDA major version.  Hopper: 1.0 (the README's EP32 and
#: EP64 rows on H800, 57-60 and 49-51 GB/s logical, sit at 0.93-1.0 of it:
#: tests/test_dispatch_deepep_rates.py).  Blackwell: Megatron-Bridge's performance guide
#: measured DeepEP's ``test_internode.py`` on 4 DGX-B200 nodes (EP32, one 400 Gb/s CX7 per
#: GPU) at about 55 GB/s logical with IBGDA (50 with IBRC), where the full rate gives
#: 46 x 4/3 = 61.3: 0.90 (NVIDIA-NeMo/Megatron-Bridge@067f987d
#: ``docs/fern/versions/nightly/pages/performance-guide.mdx``, "cross-EP is about 50 GB/s
#: with IBRC ... roughly 55 GB/s" with IBGDA).
DEEPEP_RDMA_SHARE: dict[int, float] = {10: 0.90}


def deepep_rdma_share(options: CostOptions, backend: str,
                      compute_capability: float | None) -> float:
    """Share of the network rate DeepEP's RDMA stage reaches (:data:`DEEPEP_RDMA_SHARE`);
    1.0 for other dispatchers and backends.

    >>> from types import SimpleNamespace
    >>> deepep_rdma_share(SimpleNamespace(moe_dispatcher="flex"), "deepep", 10.0)
    0.9
    >>> deepep_rdma_share(SimpleNamespace(moe_dispatcher="flex"), "hybridep", 10.0)
    1.0
    """
    if options.moe_dispatcher != "flex" or backend != "deepep" or compute_capability is None:
        return 1.0
    return DEEPEP_RDMA_SHARE.get(int(compute_capability), 1.0)


def flex_backend(options: CostOptions, nvlink_domain_size: int, gpus_per_node: int) -> str:
    """The flex backend that runs: the option, or for ``auto`` HybridEP where one NVLink
    domain spans several nodes (NVL72) and DeepEP otherwise (the launch settings' choice)."""
    if options.moe_flex_backend != "auto":
        return options.moe_flex_backend
    return "hybridep" if nvlink_domain_size > gpus_per_node else "deepep"


def ep_sm_share(options: CostOptions, profile: EfficiencyProfile, sm_count: int | None,
                backend: str) -> float:
    """Share of the GPU's SMs the EP dispatch kernels take from the compute they overlap.

    The flex dispatcher's kernels hold a fixed SM budget (:data:`FLEX_DISPATCH_SMS`) out
    of the GPU's ``sm_count``; NCCL-based dispatchers keep the profile's share.

    >>> from types import SimpleNamespace
    >>> opts, prof = SimpleNamespace(moe_dispatcher="flex"), SimpleNamespace(comm_sm_share=0.1)
    >>> round(ep_sm_share(opts, prof, 132, "deepep"), 4), ep_sm_share(opts, prof, None, "deepep")
    (0.1515, 0.1)
    """
    if options.moe_dispatcher != "flex" or not sm_count:
        return profile.comm_sm_share
    return FLEX_DISPATCH_SMS[backend] / float(sm_count)


def _ep_traffic(model: ModelSpec, training: TrainingSpec, profile: EfficiencyProfile,
                options: CostOptions, cols: dict[str, np.ndarray], groups: Groups,
                recompute: LayerShares, forward_Bps: float | None = None,
                rdma_share: float = 1.0) -> tuple[Any, Any, Any, Any, Any]:
    """EP and ETP traffic of one MoE unit per micro-batch, before any overlap:
    ``(imbalance, all_to_all, ep_time, network_bytes, calls)`` (``ep_time`` is the
    busiest rank's dispatch, combine and ETP time)."""
    assert model.moe is not None
    tp, cp, etp, mbs = (cols[k].astype(np.float64) for k in ("tp", "cp", "etp", "mbs"))
    s, h = training.seq_len, model.hidden_size
    latency = profile.collective_latency_s
    k = model.moe.top_k
    imbalance = priced_imbalance(model, training, options, cols)
    tokens = mbs * s / (tp * cp)  # tokens entering the MoE on this rank (SP layout)
    low = options.fp8_dispatch and training.precision != "bf16"
    dispatch_bytes = h * (1.0 if low else ACT_BYTES)
    calls = 4.0 + 2.0 * recompute.ep_comm
    if options.moe_dispatcher == "allgather":
        # Megatron-Core MoEAllGatherTokenDispatcher: all-gather of the hidden states over
        # the EP group, reduce-scatter on combine (volume independent of top-k).
        one = reduce_scatter_time(groups.ep, np.asarray(groups.ep.size) * tokens * h
                                  * ACT_BYTES) + latency
        ep_time = calls * one
        _, bytes_one = dispatch_time(groups.ep, tokens, h * ACT_BYTES, k, "allgather",
                                     1.0, 0.0)
        network_bytes = calls * bytes_one
    else:
        limit = (model.moe.router_num_groups, model.moe.router_group_topk)
        first, bytes_first = dispatch_time(groups.ep, tokens, dispatch_bytes, k,
                                           options.moe_dispatcher,
                                           profile.alltoall_efficiency, latency, limit,
                                           forward_Bps, rdma_share)
        other, bytes_other = dispatch_time(groups.ep, tokens, h * ACT_BYTES, k,
                                           options.moe_dispatcher,
                                           profile.alltoall_efficiency, latency, limit,
                                           forward_Bps, rdma_share)
        ep_time = first + (calls - 1.0) * other
        network_bytes = bytes_first + (calls - 1.0) * bytes_other
    routed_copies = tokens * k
    etp_time = np.where(etp > 1, 4.0 * (reduce_scatter_time(
        groups.etp, etp * routed_copies * h * ACT_BYTES) + latency), 0.0)
    all_to_all = ep_time
    ep_time = imbalance * (ep_time + etp_time)
    return imbalance, all_to_all, ep_time, network_bytes, calls


def unit_comm(model: ModelSpec, training: TrainingSpec, profile: EfficiencyProfile,
              options: CostOptions, cols: dict[str, np.ndarray], groups: Groups, unit: str,
              compute: UnitCompute, recompute: LayerShares,
              ep_share: float | None = None,
              traffic_cache: dict[tuple[object, ...], Any] | None = None,
              forward_Bps: float | None = None, rdma_share: float = 1.0) -> UnitComm:
    """Exposed TP, CP and EP time of ``unit`` for every layout (module docstring).

    Recompute re-runs the forward collectives of what it recomputes (``recompute.tp_comm``
    and ``recompute.ep_comm`` of the two forward TP ops per block and the two forward
    dispatch/combine calls).  ``traffic_cache``: EP traffic already priced for these rows
    under options with the same dispatcher and routing (feature sets that differ only in
    what overlaps it share it).  ``forward_Bps``: DeepEP's NVLink forwarding rate
    (:func:`deepep_forward_Bps`; ``None``: not bound by it); ``rdma_share``: its RDMA
    stage's share of the network rate (:func:`deepep_rdma_share`).
    """
    tp, cp, mbs = (cols[k].astype(np.float64) for k in ("tp", "cp", "mbs"))
    sp = cols["sp"].astype(bool)
    s, h = training.seq_len, model.hidden_size
    latency = profile.collective_latency_s
    share = profile.comm_sm_share
    zeros = np.zeros_like(tp)

    # --- TP / SP ---------------------------------------------------------------------
    op = reduce_scatter_time(groups.tp, mbs * (s / cp) * h * ACT_BYTES)
    op = np.where(tp > 1, op + latency, 0.0)
    blocks = _tp_blocks(model, unit)
    ops_per_block = np.where(sp, 5.0, 4.0) + 2.0 * recompute.tp_comm
    tp_total = blocks * ops_per_block * op
    # Each collective overlaps only with the GEMM of its own linear layer: Transformer
    # Engine's userbuffers pairs qkv/fc1 fprop and proj/fc2 dgrad (ring exchange),
    # proj/fc2 fprop (pipelined reduce-scatter) and qkv/fc1 dgrad+wgrad (bulk) with
    # that layer's GEMM (TE pytorch/module/base.py initialize_ub, default methods);
    # Megatron's async path overlaps a linear's gradient collectives with its own
    # dgrad/wgrad GEMMs (LinearWithGradAccumulationAndAsyncCommunication).  So a
    # block's traffic hides behind that block's GEMMs only: the attention block's
    # small QKV/projection GEMMs cannot borrow the MLP's (compute.tp_attention_share).
    share_attention = compute.tp_attention_share
    shares = (share_attention, 1.0 - share_attention) if blocks == 2.0 else (1.0,)
    per_block = 1.0 / len(shares)
    # Plain Megatron: the wgrad input re-gather (SP) or the dgrad all-reduce (no SP) and the
    # dgrad reduce-scatter run asynchronously beside the backward GEMMs.
    # Megatron-LM before September 2021 ran them on the compute stream, exposed
    # (``options.tp_async_grad_comm``; Megatron-LM commit 16c90445, 2021-09-02).
    async_ops = blocks * 2.0 * op if options.tp_async_grad_comm else zeros
    # Where the GPU waits for the host to issue kernels (a host-paced unit), the traffic on
    # its own stream runs through those gaps too (CUDA streams execute concurrently: CUDA C
    # Programming Guide, "Asynchronous Concurrent Execution"), so the room beside a block
    # is its GEMMs plus its share of the wait: a slower GEMM then never hides more traffic
    # than it adds to the unit's time.
    room = compute.tp_gemm + compute.host_wait
    async_block = [np.minimum(per_block * async_ops, room * (2.0 / 3.0) * f)
                   for f in shares]
    tp_in_domain = np.asarray(groups.tp.members_per_domain) >= np.asarray(groups.tp.size)
    userbuffers = options.tp_comm_overlap & sp & tp_in_domain
    ub_block = [np.minimum(per_block * tp_total, room * f) for f in shares]
    # One budget of compute per unit: what hides TP traffic cannot also hide CP or EP.
    budget = compute.total
    tp_hidden = np.minimum(np.where(userbuffers, sum(ub_block), sum(async_block)), budget)
    budget = budget - tp_hidden
    tp_exposed = tp_total - tp_hidden
    # the SMs the collectives hold slow the GEMMs they run beside, not the host's gaps
    sm_slowdown = share * np.minimum(tp_hidden, compute.tp_gemm)

    # --- CP (p2p ring of K/V blocks beside the attention) --------------------------------
    cp_exposed = zeros
    if unit in ("dense", "moe", "mtp"):
        if model.mla is not None:
            kv_width = model.num_attention_heads * (
                model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim + model.mla.v_head_dim)
            kv_rank = kv_width / tp
        else:
            kv_width = 2.0 * model.num_query_groups * model.head_dim
            kv_rank = kv_width / np.minimum(tp, model.num_query_groups)
        kv_bytes = mbs * (s / cp) * kv_rank * ACT_BYTES
        cp_time = np.where(cp > 1, 3.0 * (cp - 1.0) * (p2p_time(groups.cp, kv_bytes) + latency),
                           0.0)
        # the host's gaps are one pool: the part each TP block's traffic ran through (beyond
        # what the block's GEMMs hid, at the share of its room it uses) is not there for CP;
        # else removing host time, as CUDA graphs do, could expose more than it saves
        used = np.where(userbuffers, 1.0, 2.0 / 3.0)
        tp_wait = sum(np.maximum(np.where(userbuffers, ub, asy) - used * f * compute.tp_gemm,
                                 0.0) for ub, asy, f in zip(ub_block, async_block, shares,
                                                            strict=True)) / used
        wait_left = np.maximum(compute.host_wait - tp_wait, 0.0)
        cp_hidden = np.minimum(np.minimum(cp_time, compute.attention + wait_left), budget)
        budget = budget - cp_hidden
        cp_exposed = cp_time - cp_hidden
        sm_slowdown = sm_slowdown + share * np.minimum(cp_hidden, compute.attention)

    # --- EP / ETP ----------------------------------------------------------------------
    ep_exposed, network_bytes = zeros, zeros
    if is_moe_unit(model, unit) and model.moe is not None:
        key = ("ep", unit, options.moe_dispatcher, options.moe_flex_backend, forward_Bps,
               rdma_share, options.fp8_dispatch, options.routing, options.moe_imbalance,
               options.moe_capacity_factor, options.moe_pad_to_capacity)
        if traffic_cache is not None and key in traffic_cache:
            imbalance, all_to_all, ep_time, network_bytes, calls = traffic_cache[key]
        else:
            imbalance, all_to_all, ep_time, network_bytes, calls = _ep_traffic(
                model, training, profile, options, cols, groups, recompute, forward_Bps,
                rdma_share)
            if traffic_cache is not None:
                traffic_cache[key] = (imbalance, all_to_all, ep_time, network_bytes, calls)
        if options.moe_a2a_overlap:
            ep_hidden = np.where(a2a_schedulable(cols, options.dualpipe), a2a_overlap_hidden(
                ep_time, compute, budget, cols["pp"], cols.get("m")), 0.0)
        elif shared_expert_overlap_on(model, options, unit):
            # The MLP block of an MoE unit is its shared experts (attention_block_share);
            # what of their GEMMs already hides their own TP collectives hides nothing else.
            # Not priced: Megatron-Core turns userbuffers off for the shared linears under
            # this overlap (shared_experts.py, ub_overlap_* = False); the launch says so.
            own_tp = (np.where(userbuffers, ub_block[1], async_block[1]) if blocks == 2.0
                      else 0.0)
            shared_gemm = np.maximum(compute.gemm * (1.0 - compute.tp_attention_share)
                                     - own_tp, 0.0)
            fc1_share = 2.0 / 3.0 if model.mlp_activation == "swiglu" else 0.5
            ep_hidden = shared_expert_overlap_hidden(imbalance * all_to_all, calls,
                                                     shared_gemm, fc1_share,
                                                     recompute.ep_comm, budget)
        else:
            ep_hidden = zeros
        ep_exposed = ep_time - ep_hidden
        sm_slowdown = sm_slowdown + (share if ep_share is None else ep_share) * ep_hidden
    return UnitComm(tp=tp_exposed, cp=cp_exposed, ep=ep_exposed, sm_slowdown=sm_slowdown,
                    network_bytes=network_bytes)
