"""Decode GEMMs on their rooflines: the dense projections call by call, the routed experts'
grouped GEMMs apart (used by :func:`parsearch.serve.cost.decode_step`)."""

from __future__ import annotations

from parsearch.model.specs import ModelSpec
from parsearch.serve.rates import Rates, gemm_call_s
from parsearch.serve.spec import ServingLayout


def dense_gemm_time_s(model: ModelSpec, layout: ServingLayout, rates: Rates, tokens: float,
                      block_params: float, block_bytes: float, output_params: float,
                      output_bytes: float) -> tuple[float, float]:
    """(compute time, time on the per-call rooflines) of one decode pass's dense GEMMs on one
    GPU, for ``tokens`` rows.

    A GEMM call costs a fixed time ``t0 = F_half / (peak eta_max)`` (launch, prologue and
    epilogue, the last wave) plus ``F / (peak eta_max)`` on the compute side (the profile's
    size curve ``eta(F) = eta_max F / (F + F_half)``; ``cost/compute.py``
    ``gemm_half_flops``), and streams its weights at HBM bandwidth on the memory side; each
    call takes the slower of the two (Williams et al. 2009 apply the roofline per kernel).
    The transformer blocks' GEMMs keep their count of one call per ``h x h/tp`` square of
    parameters, each square reading its share of the blocks' weight bytes.  The output layer
    (``lm_head``, ``vocab/tp x h``) is one call: one ``t0`` against all its reads, not one
    per square (that count charged gpt-oss-120b's output layer, vocabulary 201,088 over
    hidden 2,880, 70 fixed times, 0.53 ms a step on Hopper at every TP, against 0.28 ms of
    BF16 reads at TP 1 and 0.04 ms at TP 8).  Summed per call, not under one roofline of the
    group: a call that waits on its fixed time does not hide another's weight reads."""
    square = model.hidden_size ** 2 / layout.tp
    blocks_s = block_params / square * gemm_call_s(rates, 2.0 * tokens * square)
    compute, kernels = blocks_s, max(block_bytes / rates.hbm_Bps, blocks_s)
    if output_params > 0:
        output_s = gemm_call_s(rates, 2.0 * tokens * output_params)
        compute += output_s
        kernels += max(output_bytes / rates.hbm_Bps, output_s)
    return compute, kernels


def gemm_rooflines_s(dense_kernels_s: float, routed_bytes: float, routed_s: float,
                     hbm_Bps: float) -> float:
    """Time of a pass's dense GEMMs (``dense_kernels_s``, each call on its own roofline,
    :func:`dense_gemm_time_s`) and routed-expert grouped GEMMs, the latter the slower of
    their weight reads and their compute (Williams et al. 2009 apply the roofline per
    kernel; per-layer rooflines summed as in Yuan et al. 2024, arXiv 2402.16363 §3).  The two
    groups are separate kernels that run one after the other (the dense projections, then
    the grouped expert GEMMs), so the compute of one cannot hide the reads of the other."""
    return dense_kernels_s + max(routed_bytes / hbm_Bps, routed_s)
