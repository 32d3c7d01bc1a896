"""Routed experts in a serving step: which experts a batch touches and their grouped GEMMs.

Engines run all experts of a layer in one fused grouped kernel per projection (vLLM/SGLang
``fused_moe``: tokens sorted by expert, "moe_align_block_size" pads each expert's rows to the
kernel's block and gives an expert with no token no block; TensorRT-LLM's CUTLASS MoE
grouped GEMM likewise), so a step pays for the touched experts' rows, padded to the MMA
tile, at the GEMM rate of the kernel; not a fixed launch time per expert.  That rate depends
on the per-expert GEMM shape (:func:`tile_shape_efficiency`: N tile quantization, each tile's
fixed cost against its depth K, wave quantization over the SMs).

>>> round(expected_touched_share(8, 128, 1), 4)     # one token touches its top-8 of 128
0.0625
>>> round(expected_touched_share(8, 128, 64), 3)    # 64 tokens touch most experts
0.984
"""

from __future__ import annotations

import math

import numpy as np

from parsearch.cost.routing import trained_imbalance
from parsearch.model.params import ParameterCounts
from parsearch.model.specs import ModelSpec
from parsearch.serve.kv_cache import moe_layer_count, stage_layers
from parsearch.serve.rates import Rates
from parsearch.serve.spec import ServingLayout

#: Rows of one MMA tile: an expert's rows are padded up to a multiple of it.  vLLM's
#: fused_moe picks ``BLOCK_SIZE_M`` 64 once the tokens outnumber the experts and 16 below
#: (``get_default_config`` in vllm/model_executor/layers/fused_moe/fused_moe.py); 64 is also
#: Hopper's warpgroup MMA M (PTX ISA ``wgmma.mma_async`` m64nNk16) and the smallest M tile
#: of the CUTLASS grouped GEMMs TensorRT-LLM's MoE runs; 16 the M of ``mma.sync`` m16n8k16.
TILE_ROWS = 64
SMALL_TILE_ROWS = 16
#: N tile of the grouped GEMM: an expert's output columns are padded up to a multiple of it.
#: 128 is assumed: the N of Hopper's ``wgmma`` tiles in the CUTLASS and DeepGEMM grouped
#: kernels ranges over 64-256 and 128 is the common choice of their default configurations.
TILE_N = 128
#: Fixed cost of one output tile in K elements (pipeline prologue, epilogue, scale handling):
#: a tile of depth K runs at ``K / (K + K0)`` of the main-loop rate.  K0 = 480 reproduces
#: DeepGEMM's FP8 GEMM table on H800 at M = 4096 within ~5% across K = 512-16384 (775
#: TFLOPS at K = 512, 1212 at 1536, 1168-1214 at 2048, 1410 at 7168, 1520 at 16384;
#: deepseek-ai/DeepGEMM README "Performance" at commit 327ec92f6977e7fee022cb76a8f273b75483c3d8),
#: where the GEMMs are compute bound, so the K dependence is the kernel's own.
TILE_K_OVERHEAD = 480.0
#: GEMMs per expert and layer: gate/up (fused into one) and down, launched once per layer
#: for all experts (one grouped kernel each).
EXPERT_GEMMS = 2


def expected_touched_share(top_k: int, experts: int, tokens: float) -> float:
    """Expected share of the experts that at least one of ``tokens`` tokens is routed to, each
    token picking ``top_k`` of ``experts`` uniformly: ``1 - (1 - k/E)^tokens`` (an expert is
    missed by one token with probability ``1 - k/E``).  Skewed real routing touches fewer,
    so this is an upper bound on the bytes a step reads."""
    if tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - top_k / experts) ** tokens


def busiest_rank_touched_share(top_k: int, experts: int, ep: int, tokens: float) -> float:
    """Expected share of its ``E / ep`` local experts that the busiest of ``ep`` expert-parallel
    ranks must read in one pass of ``tokens`` tokens, each picking ``top_k`` of ``E``
    uniformly (:func:`expected_touched_share` for ``ep = 1``).  Each local expert is touched
    with probability ``p = 1 - (1 - k/E)^tokens``, so a rank's touched count is Binomial(E/ep,
    p) (experts taken as independent) and the ranks wait for the largest of ``ep`` such
    counts before the MoE output is summed: ``E[max] = sum_m (1 - F(m)^ep)`` (the tail sum
    ``E[X] = sum_m P(X > m)`` of a count, with ``P(max <= m) = F(m)^ep`` for independent
    ranks; vLLM's EP without DP sums the outputs by all-reduce, ``FusedMoEParallelConfig.
    use_all2all_kernels`` is ``dp_size > 1 and use_ep``).  A rank
    reads whole experts, so at small batch the busiest one reads more than the mean; with
    tensor-sliced experts (ep = 1) every rank reads its slice of every touched expert, the
    mean.  Skewed real routing spreads the counts further, so this is a lower bound.

    >>> round(busiest_rank_touched_share(4, 128, 8, 16), 3)   # mean share is 0.398
    0.573
    >>> round(busiest_rank_touched_share(4, 128, 1, 16), 3)
    0.398
    """
    share = expected_touched_share(top_k, experts, tokens)
    if ep <= 1 or share <= 0.0 or share >= 1.0:
        return share
    local = max(1, round(experts / ep))
    pmf = [math.comb(local, m) * share ** m * (1.0 - share) ** (local - m)
           for m in range(local + 1)]
    cdf = np.cumsum(pmf)
    expected_max = float(np.sum(1.0 - np.minimum(cdf[:-1], 1.0) ** ep))
    return expected_max / local


def ep_imbalance(model: ModelSpec, layout: ServingLayout, tokens_stage: float,
                 sequences: float, balanced: bool = False) -> float:
    """max / mean routed tokens per EP rank in one pass (1 without EP): the trained-router
    model of :func:`parsearch.cost.routing.trained_imbalance` (per-sequence expert skew,
    measured on Qwen3-30B-A3B, averaged over the ``sequences`` the pass routes, plus the
    multinomial sampling of the rank's routed copies).  The busiest rank sets the MoE
    layer's time (formulas.md §5.3).  A decode pass routes one token of each sequence, a
    prefill pass whole prompts.  ``balanced``: an EP load balancer (EPLB) replicates and
    places the hot experts so that every rank gets the mean (DeepSeek-V3 report §3.4,
    redundant experts "to achieve load balancing among different GPUs"): 1."""
    if model.moe is None or layout.ep <= 1 or balanced:
        return 1.0
    copies = tokens_stage * model.moe.top_k / layout.ep
    return float(trained_imbalance(model, np.array([float(layout.ep)]), np.array([copies]),
                                   np.array([max(1.0, sequences)]))[0])


def tile_rows(tokens: float, experts: int) -> int:
    """M tile of the grouped GEMM: 16 rows while the tokens are no more than the experts,
    else 64 (:data:`TILE_ROWS`)."""
    return SMALL_TILE_ROWS if tokens <= experts else TILE_ROWS


def padded_rows(rows: float, tile: int = TILE_ROWS) -> float:
    """Expected rows a touched expert's tiles hold for ``rows`` routed rows on average: at
    least one tile, and above that the rows plus half a tile (an expert's row count varies
    from step to step, so the unused part of its last tile is spread evenly over
    ``[0, tile)``)."""
    return max(float(tile), rows + tile / 2.0)


def tile_shape_efficiency(n: float, k: float, tiles: float = 0.0,
                          sm_count: int | None = None) -> float:
    """Share of the main-loop rate a grouped GEMM keeps for its per-expert shape: output
    columns ``n`` padded to :data:`TILE_N` (tile quantization in N; the rows' padding to the
    M tile is counted in the FLOPs, :func:`padded_rows`), each tile's fixed cost
    :data:`TILE_K_OVERHEAD` against its depth ``k``, and, when the GPU's SM count is known,
    wave quantization of ``tiles`` output tiles over the SMs (a persistent grouped kernel
    runs ``ceil(tiles / SMs)`` waves; NVIDIA "Matrix Multiplication Background User's Guide",
    wave quantization).  The engine's fitted factor multiplies it, so that one factor means
    the same for 8 large experts and 128 small ones."""
    if n <= 0 or k <= 0:
        return 1.0
    n_util = n / (math.ceil(n / TILE_N) * TILE_N)
    k_util = k / (k + TILE_K_OVERHEAD)
    wave = 1.0
    if sm_count and tiles > 0:
        wave = tiles / (math.ceil(tiles / sm_count) * sm_count)
    return n_util * k_util * wave


def expert_gemm_time(model: ModelSpec, layout: ServingLayout, counts: ParameterCounts,
                     rates: Rates, tokens_stage: float, rows_tokens: float,
                     imbalance: float = 1.0, kernel_efficiency: float = 1.0) -> float:
    """Routed-expert grouped-GEMM time on one GPU for ``tokens_stage`` tokens of the stage.

    ``rows_tokens`` tokens choose ``top_k`` of ``E`` experts; the GPU holds ``E / ep``
    experts, each sliced ``expert_tp`` ways, of which the expected touched share has work
    (:func:`expected_touched_share`).  A touched expert gets ``rows_tokens * top_k / E``
    rows over the touched share, padded up to the M tile (:func:`tile_rows`); its FLOPs are
    ``2 * padded rows * expert params / expert_tp``, run at the profile's large-GEMM rate
    times its grouped-GEMM factor (one fused kernel per projection, so no per-expert launch
    time), plus one kernel launch per grouped GEMM and layer.  ``imbalance``: the busiest
    EP rank's routed tokens over the mean (:func:`ep_imbalance`); ``kernel_efficiency``:
    the engine's fused-MoE kernel rate over that GEMM rate
    (:func:`parsearch.serve.engines.moe_kernel_efficiency`).
    """
    if model.moe is None or rows_tokens <= 0:
        return 0.0
    moe = model.moe
    per_expert = counts.routed_experts_per_layer / moe.num_experts
    n_moe = moe_layer_count(model) * stage_layers(model, layout.pp) / model.num_layers
    local = moe.num_experts / layout.ep
    # the busiest EP rank's touched experts (busiest_rank_touched_share; the mean share
    # without EP) share its routed copies, ``imbalance`` times the mean rank's
    share = busiest_rank_touched_share(moe.top_k, moe.num_experts, layout.ep, rows_tokens)
    rows = rows_tokens * moe.top_k / moe.num_experts / share * imbalance
    tile = tile_rows(rows_tokens, moe.num_experts)
    padded = padded_rows(rows, tile)
    # gate/up: N = (per-expert params / (h f) - 1) f / etp (2 f for a gated MLP), K = h;
    # down: N = h, K = f / etp
    h, f_rank = float(model.hidden_size), moe.expert_ffn_hidden_size / layout.expert_tp
    up_share = max(0.0, per_expert / (h * moe.expert_ffn_hidden_size) - 1.0)
    touched = share * local
    m_tiles = math.ceil(padded / tile)
    up_n, down_n = up_share * f_rank, h
    eff_up = tile_shape_efficiency(up_n, h, touched * m_tiles * math.ceil(up_n / TILE_N),
                                   rates.sm_count)
    eff_down = tile_shape_efficiency(down_n, f_rank,
                                     touched * m_tiles * math.ceil(down_n / TILE_N),
                                     rates.sm_count)
    flops_up = 2.0 * padded * touched * h * up_n * n_moe
    flops_down = 2.0 * padded * touched * h * f_rank * n_moe
    launches = EXPERT_GEMMS * n_moe * rates.kernel_s
    rate = rates.peak_flops * rates.gemm * rates.grouped_gemm * kernel_efficiency
    return (flops_up / eff_up + flops_down / eff_down) / rate + launches
