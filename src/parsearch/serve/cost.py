"""Time of prefill and decode on one serving instance.

Decode is memory-bandwidth bound: each step reads the stage's weights (of MoE layers,
only the experts some token was routed to) and the KV cache of every sequence once
(roofline, Williams et al. 2009; LLM decode analysis in Pope et al. 2022, arXiv
2211.05102 §2-3).  Prefill is compute bound: ``2 * params_active * tokens`` GEMM FLOPs
(Kaplan et al. 2020, arXiv 2001.08361 §2.1) plus causal attention FLOPs.  On top come
the per-layer TP all-reduces (two per layer, Megatron-LM arXiv 1909.08053 §3), the MoE
dispatch/combine all-to-alls, pipeline hand-offs, and per-kernel and per-step overheads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from parsearch.cost.collectives import LinkArrays, all_reduce_time, all_to_all_time, p2p_time
from parsearch.model.params import ParameterCounts
from parsearch.model.specs import ModelSpec
from parsearch.serve.engines import moe_kernel_efficiency
from parsearch.serve.gemm_rooflines import dense_gemm_time_s, gemm_rooflines_s
from parsearch.serve.kernels import eager_prefill_host_s, kernels_per_layer
from parsearch.serve.kv_cache import (
    kv_bytes_per_sequence,
    stage_mix,
)
from parsearch.serve.memory import linear_bytes, stage_weights
from parsearch.serve.moe import (
    busiest_rank_touched_share,
    ep_imbalance,
    expert_gemm_time,
)
from parsearch.serve.prefix_cache import computed_prompt_tokens, mean_prefill_attended
from parsearch.serve.rates import Rates, gemm_eff, rates_for
from parsearch.serve.spec import ELEMENT_BYTES, ServingLayout, ServingWorkload, SlidingWindow
from parsearch.topology.fabric import Fabric
from parsearch.topology.hardware import GpuProfile

__all__ = ["Rates", "dense_gemm_time_s", "expert_gemm_time", "gemm_rooflines_s",
           "rates_for"]  # re-exported (moved to rates/moe/gemm_rooflines)

_ACT = ELEMENT_BYTES["bf16"]  # activations and all-reduce payloads are BF16
#: Scheduler, sampling and detokenization time per decode step that is not hidden by
#: asynchronous scheduling (assumption: vLLM V1 and TensorRT-LLM overlap most host work;
#: 0.3 ms remains, the order of the gaps between steps in their published traces).
STEP_OVERHEAD_S = 3e-4
#: Call latency of the engines' own one-kernel NVLink all-reduce (vLLM/SGLang custom
#: all-reduce, TensorRT-LLM ONESHOT/TWOSHOT): 3.7-5.9 us on H100 for 512 B-4 KB at TP 2-8,
#: against 8.5-10.1 us for the same sizes through vLLM's NCCL-era path (sgl-project/sglang
#: PR #2904 table, without CUDA graphs); the middle of that range.  NCCL's ring keeps the
#: profile's collective latency.
CUSTOM_ALL_REDUCE_LATENCY_S = 5e-6
#: Bytes per element of MoE dispatch (FP8) and combine (BF16) traffic (DeepEP README:
#: "FP8 dispatching and BF16 combining").
DISPATCH_BYTES, COMBINE_BYTES = 1.0, 2.0


@dataclass(frozen=True)
class InstanceLinks:
    """Placed process groups of one instance (ranks 0..g-1, TP fastest, then attention DP,
    then PP; experts: ``expert_tp`` contiguous ranks, ``ep`` groups strided by it)."""

    tp: LinkArrays
    width: LinkArrays
    ep: LinkArrays
    etp: LinkArrays
    pp: LinkArrays


def _link(fabric: Fabric, stride: int, size: int) -> LinkArrays:
    g = fabric.group_link(stride, size)
    return LinkArrays(size=float(g.size), members_per_domain=float(g.members_per_domain),
                      nvlink_bandwidth_Bps=g.nvlink_bandwidth_Bps,
                      network_bandwidth_Bps=g.network_bandwidth_Bps,
                      nvlink_latency_s=fabric.cluster.nvlink_latency_s,
                      network_latency_s=g.latency_s)


def instance_links(fabric: Fabric, layout: ServingLayout) -> InstanceLinks:
    """Links of the instance's groups on ``fabric`` (built for ``gpus_per_replica`` GPUs)."""
    width, etp = layout.stage_width, layout.expert_tp
    return InstanceLinks(tp=_link(fabric, 1, layout.tp), width=_link(fabric, 1, width),
                         ep=_link(fabric, etp, max(1, width // etp)), etp=_link(fabric, 1, etp),
                         pp=_link(fabric, width, layout.pp))


def serving_all_reduce(link: LinkArrays, size_bytes: float, rates: Rates) -> float:
    """All-reduce of ``size_bytes`` as serving engines run it: the fastest of NCCL's ring
    (alpha-beta, :func:`all_reduce_time`) and, inside one NVLink domain, the one-shot
    (each rank reads every peer's buffer: ``(n-1) S / B``) and two-shot (reduce-scatter +
    all-gather through peer memory: ``2 (n-1)/n S / B``) custom kernels, each paying one
    call latency per pass (vLLM ``custom_all_reduce.cuh`` 1-stage/2-stage kernels;
    TensorRT-LLM ``AllReduceStrategy`` ONESHOT/TWOSHOT)."""
    n = float(link.size)
    if n <= 1:
        return 0.0
    ring = float(all_reduce_time(link, size_bytes)) + rates.collective_latency_s
    if float(link.members_per_domain) < n:  # crosses domains: NCCL only
        return ring
    bw = float(link.nvlink_bandwidth_Bps)
    alpha = CUSTOM_ALL_REDUCE_LATENCY_S  # one kernel and a peer flag exchange, not NCCL's
    one_shot = alpha + (n - 1.0) * size_bytes / bw
    two_shot = 2.0 * alpha + 2.0 * (n - 1.0) / n * size_bytes / bw
    return min(ring, one_shot, two_shot)


def _alltoall(link: LinkArrays, size_bytes: float, rates: Rates) -> float:
    """Dispatch or combine all-to-all: alpha-beta time, plus one call latency (DeepEP
    low-latency kernels are latency bound at decode batch sizes).  Inside an NVLink domain
    all-to-all runs at the ring rate; across the network at the all-to-all efficiency
    (:func:`parsearch.cost.communication.dispatch_time` gives the sources)."""
    if float(link.size) <= 1:
        return 0.0
    efficiency = rates.alltoall if float(link.network_bandwidth_Bps) > 0 else 1.0
    return float(all_to_all_time(link, size_bytes)) / efficiency + rates.collective_latency_s


def attention_context_tokens(model: ModelSpec, context: float,
                             window: SlidingWindow | None) -> float:
    """Mean over layers of the tokens one query attends to (windowed layers cap at the window)."""
    if window is None:
        return context
    share = window.windowed_layers / model.num_layers
    return (1.0 - share) * context + share * min(context, window.window)


def attention_flops_per_token_layer(model: ModelSpec, attended: float) -> float:
    """Attention-core FLOPs of one query token against ``attended`` keys, one layer, all heads.

    GQA/MHA: QK^T and PV, ``4 * attended * heads * head_dim``.  MLA decode with the absorbed
    projections (DeepSeek-V2 arXiv 2405.04434 §2.1.2 / Appendix C): scores over the latent
    and the RoPE key, ``2 * attended * heads * (d_c + d_rope)``, values over the latent,
    ``2 * attended * heads * d_c``.
    """
    heads = model.num_attention_heads
    if model.mla is not None:
        c, r = model.mla.kv_lora_rank, model.mla.qk_rope_head_dim
        return 2.0 * attended * heads * (2 * c + r)
    return 4.0 * attended * heads * model.head_dim


@dataclass(frozen=True)
class StepTime:
    """One pass of a stage over a micro-batch, seconds, with its parts."""

    memory_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    hop_s: float  # pipeline hand-off to the next stage
    busy_s: float | None = None  # instance time per request when not total_s (prefill)
    overlapped_comm_s: float = 0.0  # EP all-to-alls run beside the other micro-batch's work
    kernels_s: float | None = None  # sum of per-kernel-group rooflines (None: one roofline)
    host_s: float = 0.0  # host time to issue an eager pass (serve.kernels.eager_prefill_host_s)

    @property
    def roofline_s(self) -> float:
        """Time of the GEMM and attention kernels: their own rooflines summed when known
        (kernels run one after another), else the roofline of the whole pass."""
        if self.kernels_s is not None:
            return self.kernels_s
        return max(self.memory_s, self.compute_s)

    @property
    def total_s(self) -> float:
        work = self.roofline_s + self.comm_s + self.overhead_s
        # the host issues an eager pass's kernels ahead of the GPU: the slower of the two
        return max(work, self.overlapped_comm_s, self.host_s)


def _expert_shapes(model: ModelSpec, counts: ParameterCounts) -> tuple[float, float, int]:
    """(parameters of one routed expert, of the shared experts, top_k) of one MoE layer."""
    if model.moe is None:
        return 0.0, 0.0, 0
    per_expert = counts.routed_experts_per_layer / model.moe.num_experts
    return per_expert, float(counts.shared_experts_per_layer), model.moe.top_k


def expert_rate(workload: ServingWorkload, rates: Rates) -> float:
    """The routed experts' grouped-GEMM rate over the profile's: the engine's fused-MoE factor
    (:func:`parsearch.serve.engines.moe_kernel_efficiency`), times the FP8 over FP4 rate when
    FP4 experts are fed 8-bit activations (``expert_activations`` ``fp8``, e.g. vLLM's
    ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8``; :attr:`Rates.w4a8_scale`)."""
    mixed = workload.precision == "fp4" and workload.expert_activations == "fp8"
    scale = rates.w4a8_scale if mixed else 1.0
    return moe_kernel_efficiency(workload.engine, workload.precision,
                                 workload.fused_moe_runner) * scale


def _layer_comm(model: ModelSpec, layout: ServingLayout, links: InstanceLinks, rates: Rates,
                tokens_rank: float, tokens_stage: float,
                imbalance: float = 1.0) -> tuple[float, float, float]:
    """(communication of a dense layer, of an MoE layer, the MoE layer's all-to-alls
    alone) for one pass.

    Attention output and dense MLP output (both split over the attention TP group, the
    dense MLP replicated over attention-DP ranks as in SGLang/DeepSeek large-EP serving):
    one all-reduce over tp of the rank's tokens each.  Routed experts with ep = 1 are
    tensor-sliced over the stage width: with attention DP the stage's tokens are gathered
    and the outputs reduce-scattered (priced as one all-reduce of the stage's tokens),
    without it one all-reduce over tp, with or without ep (below).  With ep > 1 and
    attention DP: FP8 dispatch + BF16 combine
    all-to-alls of the tokens each GPU owns over the EP group, an all-reduce over the
    expert-TP slices, and one over tp for the shared experts' partial sums.  The busiest
    EP rank receives ``imbalance`` times the mean routed tokens (:func:`ep_imbalance`).
    """
    h = model.hidden_size
    attn = serving_all_reduce(links.tp, tokens_rank * h * _ACT, rates)
    dense = attn + attn
    if model.moe is None:
        return dense, dense, 0.0
    if layout.ep == 1 or layout.attention_dp == 1:
        # Without attention DP every rank of the stage already holds all its tokens, so
        # expert parallelism needs no all-to-all: each rank runs its experts on the tokens
        # routed to them and the stage's one MoE all-reduce sums the partial outputs, as
        # with tensor-sliced experts (vLLM FusedMoEParallelConfig.use_all2all_kernels is
        # ``dp_size > 1 and use_ep``; SGLang's default ``--moe-a2a-backend none``
        # combines by all-reduce; TensorRT-LLM's MoE all-to-all serves attention DP).
        if layout.attention_dp > 1:
            gathered = serving_all_reduce(links.width, tokens_stage * h * _ACT, rates)
            return dense, attn + gathered, 0.0
        return dense, dense, 0.0
    per_gpu = tokens_stage / layout.stage_width * model.moe.top_k * h * imbalance
    a2a = (_alltoall(links.ep, per_gpu * DISPATCH_BYTES, rates)
           + _alltoall(links.ep, per_gpu * COMBINE_BYTES, rates))
    etp = serving_all_reduce(links.etp, tokens_stage / layout.ep * h * _ACT, rates)
    return dense, attn + a2a + etp + attn, a2a


def _split_overlap(workload: ServingWorkload, comm: float, a2a: float) -> tuple[float, float]:
    """(exposed communication, communication hidden behind compute).  With ``ep_overlap``
    the pass is split into two micro-batches whose EP dispatch/combine run while the other
    computes (SGLang two-batch overlap, following DeepSeek's inference system,
    github.com/deepseek-ai/profile-data): the all-to-alls leave the critical path unless
    they outlast the rest of the pass."""
    if not workload.ep_overlap:
        return comm, 0.0
    return comm - a2a, a2a


def activation_bytes(model: ModelSpec, layout: ServingLayout, tokens_rank: float,
                     tokens_stage: float) -> float:
    """HBM bytes the non-GEMM kernels of one pass move on one GPU (norms, RoPE, residual
    adds, activation function, MoE permute/combine), BF16, counted per token and layer:
    attention side ``~14 h + 4 a d / tp + 6 f / tp`` elements (each kernel reads its input
    and writes its output once); per routed copy ``~4 h + 6 f_e / etp`` (permute, expert
    activation, combine), spread over the stage width."""
    layers, n_moe, n_dense = stage_mix(model, layout.pp)
    h = model.hidden_size
    ad = model.num_attention_heads * model.head_dim / layout.tp
    dense_f = model.ffn_hidden_size / layout.tp
    per_token = 14.0 * h + 4.0 * ad
    elements = tokens_rank * (layers * per_token + n_dense * 6.0 * dense_f)
    if model.moe is not None:
        moe = model.moe
        f_shared = moe.shared_expert_ffn_hidden_size / layout.tp
        routed = tokens_stage * moe.top_k / layout.stage_width
        elements += n_moe * (tokens_rank * 6.0 * f_shared
                             + routed * (4.0 * h + 6.0 * moe.expert_ffn_hidden_size
                                         / layout.expert_tp))
    return elements * _ACT


def _non_gemm_s(model: ModelSpec, layout: ServingLayout, rates: Rates, tokens_rank: float,
                tokens_stage: float) -> float:
    """Time of the memory-bound non-GEMM kernels: their counted bytes times the profile's
    memory-bound factor (fusion and copies the count does not see) at achievable HBM
    bandwidth; they run between the GEMMs, so their time adds to the GEMMs'."""
    nbytes = activation_bytes(model, layout, tokens_rank, tokens_stage)
    return nbytes * rates.memory_bound / rates.hbm_Bps


def decode_bytes(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                 counts: ParameterCounts, window: SlidingWindow | None,
                 query_tokens: float = 1.0) -> tuple[float, float]:
    """(weight bytes, KV bytes) one GPU of the heaviest stage reads in one decode pass.

    Weights: the stage's linears and output layer (the input embedding is a row lookup);
    of the routed experts only those some token picked: with ``b_m`` tokens choosing
    top_k of E uniformly an expert is idle with probability ``(1 - k/E)^b_m``
    (uniform-routing assumption; skewed routing touches fewer).  KV: every sequence of
    the attention-DP rank at the mean decode context.
    """
    dense, routed = decode_weight_bytes(model, workload, layout, counts)
    return dense + routed, decode_kv_bytes(model, workload, layout, window)


def decode_kv_bytes(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                    window: SlidingWindow | None) -> float:
    """KV bytes one GPU of the heaviest stage reads in one decode pass: every sequence of
    the attention-DP rank at the mean decode context (:func:`decode_bytes`)."""
    t_rank = max(1.0, max(1.0, layout.batch / layout.pp) / layout.attention_dp)
    return t_rank * kv_bytes_per_sequence(model, workload.kv_precision,
                                          workload.mean_decode_context, tp=layout.tp,
                                          pp=layout.pp, window=window)


def decode_weight_bytes(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                        counts: ParameterCounts) -> tuple[float, float]:
    """(dense, routed-expert) weight bytes one GPU of the heaviest stage reads in one decode
    pass (:func:`decode_bytes`): the linears and the BF16 output layer; of the routed experts
    only those some token picked."""
    b_m = max(1.0, layout.batch / layout.pp)
    w = stage_weights(model, layout, counts)
    prec = ELEMENT_BYTES[workload.precision]
    moe = model.moe
    # the busiest EP rank's touched experts (each rank reads whole experts; the MoE output's
    # all-reduce waits for it): moe.busiest_rank_touched_share, the mean share without EP
    touched = (busiest_rank_touched_share(moe.top_k, moe.num_experts, layout.ep, b_m)
               if moe is not None else 0.0)
    # attention projections at their checkpoint precision (BF16 in gpt-oss's MXFP4 release)
    return (linear_bytes(model, w, workload.precision) + w.output * _ACT,
            w.routed * touched * prec)


def _rank_params(model: ModelSpec, layout: ServingLayout,
                 counts: ParameterCounts) -> tuple[float, float]:
    """(attention, dense-MLP + shared-expert) parameters of the heaviest stage on one GPU:
    both split over the attention TP group (replicated over attention-DP ranks)."""
    layers, n_moe, n_dense = stage_mix(model, layout.pp)
    _per_expert, shared, _k = _expert_shapes(model, counts)
    attn = layers * counts.attention_per_layer / layout.tp
    return attn, (n_dense * counts.dense_mlp_per_layer + n_moe * shared) / layout.tp


def decode_step(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                counts: ParameterCounts, rates: Rates, links: InstanceLinks,
                window: SlidingWindow | None, query_tokens: float = 1.0) -> StepTime:
    """One decode pass of the heaviest stage over one micro-batch of ``batch / pp`` requests,
    each carrying ``query_tokens`` tokens (1; ``k + 1`` when a speculative verify step checks
    ``k`` draft tokens: GEMMs, attention FLOPs, expert routing and activations grow with the
    tokens, the weights and KV cache are read once, Leviathan et al. 2023 arXiv 2211.17192
    §3-4)."""
    seqs = max(1.0, layout.batch / layout.pp)
    b_m = seqs * query_tokens
    t_rank = max(1.0, seqs / layout.attention_dp) * query_tokens
    layers, n_moe, n_dense = stage_mix(model, layout.pp)
    w = stage_weights(model, layout, counts)
    kv = decode_kv_bytes(model, workload, layout, window)
    ctx = workload.mean_decode_context
    dense_b, routed_b = decode_weight_bytes(model, workload, layout, counts)
    memory = (dense_b + kv) / rates.hbm_Bps + routed_b / rates.expert_read_Bps
    # FLOPs on one GPU: 2 per parameter per token; attention, dense MLP and shared experts
    # on the rank's tokens, routed experts over the stage width on all the stage's tokens.
    attn_params, mlp_params = _rank_params(model, layout, counts)
    attended = attention_context_tokens(model, ctx, window)
    core = t_rank * layers * attention_flops_per_token_layer(model, attended) / layout.tp
    # one token of each of the ``seqs`` sequences goes to the experts per query position
    imbalance = ep_imbalance(model, layout, b_m, seqs, workload.eplb)
    out_b = w.output * _ACT
    dense_s, dense_kernels = dense_gemm_time_s(model, layout, rates, t_rank,
                                               attn_params + mlp_params, dense_b - out_b,
                                               w.output, out_b)
    experts_s = expert_gemm_time(model, layout, counts, rates, b_m, b_m, imbalance,
                                 expert_rate(workload, rates))
    gemm_s = dense_s + experts_s
    attention_s = core / (rates.bf16_flops * rates.attention)
    compute = gemm_s + attention_s
    # The dense GEMMs, the routed experts' grouped GEMMs (both bound by their weight reads
    # or FLOPs) and the attention kernels (bound by KV reads or FLOPs) run one after the
    # other, each on its own roofline (gemm_rooflines_s): a compute-bound GEMM does not
    # hide a memory-bound attention or a memory-bound expert kernel.
    kernels = (gemm_rooflines_s(dense_kernels, routed_b, experts_s, rates.expert_read_Bps)
               + max(kv / rates.hbm_Bps, attention_s))
    dense_comm, moe_comm, a2a = _layer_comm(model, layout, links, rates, t_rank, b_m,
                                            imbalance)
    comm, hidden = _split_overlap(workload, n_dense * dense_comm + n_moe * moe_comm, n_moe * a2a)
    overhead = layers * kernels_per_layer(model, workload) * rates.kernel_s + _non_gemm_s(
        model, layout, rates, t_rank, b_m)
    hop = float(p2p_time(links.pp, t_rank * model.hidden_size * _ACT)) if layout.pp > 1 else 0.0
    return StepTime(memory, compute, comm, overhead, hop, overlapped_comm_s=hidden,
                    kernels_s=kernels)


def decode_tpot_s(step: StepTime, pp: int) -> float:
    """Time per output token of a request at a fixed batch: its micro-batch passes all ``pp``
    stages and returns to the first (each stage serves the pp micro-batches in turn), so
    ``pp * (stage pass + hand-off)`` plus the per-step host time.  PP therefore adds its
    hand-off latency per stage to TPOT and gains throughput only through micro-batching."""
    return pp * (step.total_s + step.hop_s) + STEP_OVERHEAD_S


def prefill_packed_tokens(workload: ServingWorkload, layout: ServingLayout) -> float:
    """Prompt tokens one scheduler step packs per attention-DP rank under load: the
    prompts in flight, up to ``max_num_batched_tokens`` (at least one whole prompt); of a
    prompt only the tokens missing from the prefix cache count."""
    s = computed_prompt_tokens(workload.isl, workload.prefix_cache_hit)
    return max(s, min(float(workload.max_num_batched_tokens), s * layout.batch))


def _prefill_pass(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                  counts: ParameterCounts, rates: Rates, links: InstanceLinks,
                  window: SlidingWindow | None, tokens_rank: float,
                  tokens_stage: float) -> StepTime:
    """One prefill pass of the heaviest stage with ``tokens_rank`` prompt tokens on the
    busiest attention-DP rank and ``tokens_stage`` on all of them (the routed experts'
    share); prompts of ``isl`` tokens, of which the prefix cache holds a share
    (:mod:`parsearch.serve.prefix_cache`)."""
    s = float(workload.isl)
    hit = workload.prefix_cache_hit
    layers, n_moe, n_dense = stage_mix(model, layout.pp)
    w = stage_weights(model, layout, counts)
    attn_params, mlp_params = _rank_params(model, layout, counts)
    h = model.hidden_size
    gemm_flops = 2.0 * tokens_rank * (attn_params + mlp_params) + 2.0 * w.output
    heads = model.num_attention_heads / layout.tp
    if model.mla is not None:
        dim = (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim + model.mla.v_head_dim) / 2
    else:
        dim = float(model.head_dim)
    # mean causal span of a computed token: the cached prefix plus half the computed part
    attended = attention_context_tokens(model, mean_prefill_attended(s, hit), window)
    core = layers * 4.0 * tokens_rank * attended * heads * dim
    block = s / (s + rates.attention_half_block)
    gemm_rate = rates.peak_flops * max(gemm_eff(rates, 2.0 * tokens_rank * h * h / layout.tp),
                                       1e-6)
    # whole prompts go to the experts: the pass routes tokens_stage / (computed tokens of a
    # prompt) sequences
    imbalance = ep_imbalance(model, layout, tokens_stage,
                             tokens_stage / computed_prompt_tokens(s, hit), workload.eplb)
    compute = (gemm_flops / gemm_rate + core / (rates.bf16_flops * rates.attention * block)
               + expert_gemm_time(model, layout, counts, rates, tokens_stage, tokens_stage,
                                  imbalance, expert_rate(workload, rates)))
    prec = ELEMENT_BYTES[workload.precision]
    memory = ((linear_bytes(model, w, workload.precision) + w.output * _ACT) / rates.hbm_Bps
              + w.routed * prec / rates.expert_read_Bps)
    dense_comm, moe_comm, a2a = _layer_comm(model, layout, links, rates, tokens_rank,
                                            tokens_stage, imbalance)
    comm, hidden = _split_overlap(workload, n_dense * dense_comm + n_moe * moe_comm, n_moe * a2a)
    overhead = layers * kernels_per_layer(model, workload) * rates.kernel_s + _non_gemm_s(
        model, layout, rates, tokens_rank, tokens_stage)
    hop = float(p2p_time(links.pp, tokens_rank * h * _ACT)) if layout.pp > 1 else 0.0
    return StepTime(memory, compute, comm, overhead, hop, overlapped_comm_s=hidden,
                    host_s=eager_prefill_host_s(model, workload, layers))


def prefill_step(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                 counts: ParameterCounts, rates: Rates, links: InstanceLinks,
                 window: SlidingWindow | None) -> StepTime:
    """Prefill of one request's ``isl`` tokens on the heaviest stage (compute bound).

    Attention FLOPs are causal: ``2 * s^2 * heads * d`` per layer (half of QK^T and PV,
    FlashAttention-2 arXiv 2307.08691 §4 FLOP count), windowed layers ``4 * s * w * heads * d``
    for ``s >> w``; MLA prefill runs unabsorbed with qk dim ``d_nope + d_rope`` and v dim
    ``d_v`` (DeepSeek-V2 §2.1.2).  Each routed expert sees ``tokens * top_k / E`` rows of
    the stage's tokens (grouped GEMM at the profile's grouped-GEMM efficiency).

    The returned times are the latency of the request alone (its TTFT); ``busy_s`` is the
    instance time one request occupies under load, when a scheduler step packs prompts up
    to ``max_num_batched_tokens`` tokens on every attention-DP rank (TensorRT-LLM/vLLM/SGLang
    chunked-prefill schedulers): that step's time divided by the prompts it carries, so
    weight reads, collective latencies and kernel overheads are shared by them.
    """
    args = (model, workload, layout, counts, rates, links, window)
    computed = computed_prompt_tokens(workload.isl, workload.prefix_cache_hit)
    alone = _prefill_pass(*args, computed, computed)
    packed = prefill_packed_tokens(workload, layout)
    step = _prefill_pass(*args, packed, packed * layout.attention_dp)
    busy = step.total_s * computed / (packed * layout.attention_dp)
    return replace(alone, busy_s=busy)


def prefill_latency_s(step: StepTime, pp: int) -> float:
    """Time to first token of one request: all stages in turn, hand-offs between them."""
    return pp * step.total_s + (pp - 1) * step.hop_s + STEP_OVERHEAD_S


def hbm_read_floor_s(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                     counts: ParameterCounts, gpu: GpuProfile,
                     window: SlidingWindow | None) -> float:
    """Lower bound of a decode step per token round: the heaviest stage reads its touched
    weights and its share of the KV cache once at the datasheet HBM bandwidth, ``pp`` times
    (once per micro-batch).  :func:`decode_tpot_s` never goes below it (property test)."""
    weights, kv = decode_bytes(model, workload, layout, counts, window)
    return layout.pp * (weights + kv) / gpu.hbm_bandwidth_Bps
