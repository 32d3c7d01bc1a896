"""Achievable rates of one serving GPU: GEMM, attention, HBM, kernels, collectives.

Datasheet peaks times the efficiency profile's factors (:mod:`parsearch.cost.efficiency`);
GEMM efficiency grows with the GEMM's size, ``eta(F) = eta_max * F / (F + F_half)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from parsearch.cost.compute import matmul_scale
from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.cost.softmax import attention_scale
from parsearch.model.specs import ModelSpec
from parsearch.topology.hardware import GpuProfile


@dataclass(frozen=True)
class Rates:
    """Achievable rates of one GPU for one weight precision."""

    peak_flops: float        # tensor-core peak of the GEMM precision
    gemm: float              # large-GEMM fraction of it
    gemm_half_flops: float   # GEMM size reaching half of ``gemm``
    grouped_gemm: float      # an expert grouped GEMM relative to one GEMM of its shape
    bf16_flops: float        # attention runs in BF16
    attention: float
    attention_half_block: float
    hbm_Bps: float           # achievable HBM bytes/s
    kernel_s: float
    memory_bound: float      # counted non-GEMM bytes times this (fusion the count misses)
    collective_latency_s: float
    alltoall: float
    sm_count: int | None = None  # for wave quantization (serve.moe.tile_shape_efficiency)
    #: Rate of an FP4-weight GEMM fed 8-bit activations over the FP4 x FP4 rate: Blackwell's
    #: mixed-operand MMA (``tcgen05.mma`` kind ``f8f6f4``) runs at the FP8 rate, only FP4 x FP4
    #: (kinds ``mxf4``/``mxf4nvf4``) at the FP4 rate (PTX ISA, tcgen05.mma kinds); so the
    #: datasheets' FP8 over FP4 peak.  1 where the GPU has no FP4 tensor cores.
    w4a8_scale: float = 1.0
    #: Bytes/s at which the weight-only GEMMs of ``precision`` stream their quantized
    #: weights: ``hbm_Bps``, or less where the GPU lacks tensor cores for the precision and
    #: its in-register dequantization is slower than HBM (``GpuProfile.weight_only_4bit_Bps``).
    #: 0: ``hbm_Bps``.
    quantized_read_Bps: float = 0.0

    @property
    def expert_read_Bps(self) -> float:
        """Bytes/s of the routed experts' weight reads (:attr:`quantized_read_Bps`)."""
        return self.quantized_read_Bps or self.hbm_Bps


def rates_for(gpu: GpuProfile, profile: EfficiencyProfile, precision: str,
              model: ModelSpec) -> Rates:
    """Rates from the datasheet and the efficiency profile.  A GPU without tensor cores for
    ``precision`` (FP4 on Hopper) runs weight-only quantization: weights are dequantized and
    the GEMM runs in BF16 (vLLM/Marlin weight-only kernels)."""
    compute = precision if precision in gpu.peak_flops else "bf16"
    hbm = gpu.hbm_bandwidth_Bps * profile.hbm_efficiency
    # weight-only 4-bit (no FP4 tensor cores): HBM or the dequantization rate, the slower
    dequant = gpu.weight_only_4bit_Bps if compute != precision and precision == "fp4" else None
    return Rates(
        # GEMMs at this GPU's measured large-matmul ceiling relative to its generation's
        peak_flops=gpu.peak_flops[compute] * matmul_scale(gpu, profile, compute),
        gemm=profile.gemm_efficiency.get(compute, profile.gemm_efficiency["bf16"]),
        # The profile's F_half for every precision (training prices each precision with
        # BF16's fixed time per call, cost.compute.gemm_half_flops).  Dense GEMMs only: the
        # routed experts run as one fused grouped kernel per projection
        # (serve.moe.expert_gemm_time), without a fixed time per expert.
        gemm_half_flops=profile.gemm_half_flops,
        grouped_gemm=profile.grouped_gemm_efficiency,
        bf16_flops=gpu.peak_flops["bf16"],
        # prefill attention at this GPU's softmax exponential rate (cost/softmax.py)
        attention=profile.attention_forward_efficiency
        * attention_scale(gpu, profile, model, backward=False),
        attention_half_block=profile.attention_half_block,
        hbm_Bps=hbm,
        kernel_s=profile.kernel_overhead_s,
        memory_bound=profile.memory_bound_factor,
        collective_latency_s=profile.collective_latency_s,
        alltoall=profile.alltoall_efficiency,
        sm_count=gpu.sm_count,
        w4a8_scale=(gpu.peak_flops["fp8"] / gpu.peak_flops["fp4"]
                    if "fp4" in gpu.peak_flops and "fp8" in gpu.peak_flops else 1.0),
        quantized_read_Bps=min(hbm, dequant) if dequant else 0.0,
    )


def gemm_eff(rates: Rates, flops_per_gemm: float) -> float:
    """``eta(F) = eta_max * F / (F + F_half)`` (parsearch efficiency profiles, MAMF sweeps)."""
    return rates.gemm * flops_per_gemm / (flops_per_gemm + rates.gemm_half_flops)


def gemm_call_s(rates: Rates, flops_per_gemm: float) -> float:
    """Seconds of one GEMM call of ``flops_per_gemm``: ``F / (peak eta(F))`` of
    :func:`gemm_eff`, i.e. ``(F + F_half) / (peak eta_max)``: the main loop plus a fixed
    time ``F_half / (peak eta_max)`` per call."""
    return (flops_per_gemm + rates.gemm_half_flops) / (rates.peak_flops * max(rates.gemm, 1e-6))
