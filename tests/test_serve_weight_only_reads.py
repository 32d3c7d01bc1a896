"""Weight-only 4-bit experts on a GPU without FP4 tensor cores stream their weights at the
slower of HBM and the in-register dequantization rate (``weight_only_4bit_TBps`` of the GPU
profile; Triton's Hopper mixed-precision matmul, 2,650 GB/s on H200)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.cost import decode_step, decode_weight_bytes
from parsearch.serve.rates import rates_for
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster
from parsearch.topology.gpu_profile import gpu_profile_from_dict
from parsearch.topology.hardware import load_gpu_profile

_PRECISIONS = st.sampled_from(["bf16", "fp8", "fp4"])
_GPUS = st.sampled_from(["h100-sxm", "h200-sxm", "h800-sxm", "a100-sxm-80gb", "b200"])


@settings(max_examples=40, deadline=None)
@given(gpu_name=_GPUS, precision=_PRECISIONS)
def test_expert_reads_are_never_faster_than_hbm(gpu_name: str, precision: str) -> None:
    gpu = load_gpu_profile(gpu_name)
    profile = efficiency_for_gpu(gpu_name)
    rates = rates_for(gpu, profile, precision, get_preset("gpt-oss-120b"))
    assert 0.0 < rates.expert_read_Bps <= rates.hbm_Bps
    native = precision in gpu.peak_flops
    if native or gpu.weight_only_4bit_Bps is None:
        # tensor cores for the precision (or no measured dequantization rate): HBM's rate
        assert rates.expert_read_Bps == rates.hbm_Bps
    else:
        assert rates.expert_read_Bps == min(rates.hbm_Bps, gpu.weight_only_4bit_Bps)


def test_hopper_mxfp4_experts_stream_at_the_dequantization_rate() -> None:
    """H200: HBM at the profile's efficiency is ~4.1 TB/s, the MXFP4 kernel 2.65 TB/s; B200
    has FP4 tensor cores, so its experts stream at HBM's rate."""
    model = get_preset("gpt-oss-120b")
    h200 = rates_for(load_gpu_profile("h200-sxm"), efficiency_for_gpu("h200-sxm"),
                     "fp4", model)
    assert h200.hbm_Bps > 3.5e12
    assert h200.expert_read_Bps == pytest.approx(2.65e12)
    b200 = rates_for(load_gpu_profile("b200"), efficiency_for_gpu("b200"), "fp4", model)
    assert b200.expert_read_Bps == b200.hbm_Bps


def _step(cluster: str, layout: ServingLayout, cap: bool):
    model = get_preset("gpt-oss-120b")
    workload = ServingWorkload(isl=1000, osl=1000, precision="fp4", kv_precision="fp8",
                               engine="vllm")
    ctx = _context(model, load_cluster(cluster), workload, None, None)
    rates = ctx.rates if cap else replace(ctx.rates, quantized_read_Bps=0.0)
    args = (model, workload, layout, ctx.counts, rates, ctx.links(layout), ctx.window)
    return decode_step(*args), decode_weight_bytes(*args[:4]), rates


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_cap_costs_the_expert_bytes_at_the_slower_rate(tp: int) -> None:
    """The expert kernels take the slower of their reads and their compute, so capping the
    read rate adds at most the experts' bytes over the difference of the two rates, and
    exactly that to the pass's memory time; at TP 1 and batch 4 the reads bind and the step
    gets slower, at TP 8 each GPU reads an eighth of them."""
    layout = ServingLayout(tp=tp, pp=1, ep=1, attention_dp=1, batch=4)
    capped, (_, routed_b), rates = _step("dgx-h200", layout, cap=True)
    free, _, _ = _step("dgx-h200", layout, cap=False)
    assert capped.kernels_s is not None and free.kernels_s is not None
    extra = routed_b / rates.expert_read_Bps - routed_b / rates.hbm_Bps
    assert extra > 0.0
    assert capped.memory_s - free.memory_s == pytest.approx(extra, rel=1e-9)
    assert 0.0 <= capped.kernels_s - free.kernels_s <= extra * (1 + 1e-9)
    if tp == 1:
        assert capped.kernels_s - free.kernels_s > 0.5 * extra


def test_a_bad_dequantization_rate_names_the_field() -> None:
    base = {"name": "x", "peak_tflops": {"bf16": 100}, "hbm_capacity_GiB": 80,
            "hbm_bandwidth_TBps": 3, "source": "test"}
    assert gpu_profile_from_dict({**base, "weight_only_4bit_TBps": 2.0}, "x.yaml") \
        .weight_only_4bit_Bps == pytest.approx(2e12)
    with pytest.raises(SpecError, match="weight_only_4bit_TBps"):
        gpu_profile_from_dict({**base, "weight_only_4bit_TBps": -1}, "x.yaml")


def test_a_power_limit_slows_the_in_register_conversion_with_the_tensor_rates() -> None:
    """The 4-bit conversion rate is an SM instruction rate: a 500 W cap (or a clock lock)
    scales it by the same clock factor as the tensor peaks; HBM does not move."""
    from parsearch.topology.variants import load_variant_profile

    base = load_variant_profile("h100-sxm")
    for spec in ("h100-sxm@power_limit_W=500", "h100-sxm@sm_clock_MHz=1400", "h100-sxm-500w"):
        capped = load_variant_profile(spec)
        speed = capped.peak_flops["bf16"] / base.peak_flops["bf16"]
        assert speed < 1.0
        assert base.weight_only_4bit_Bps is not None
        assert capped.weight_only_4bit_Bps == pytest.approx(base.weight_only_4bit_Bps * speed)
        assert capped.hbm_bandwidth_Bps == base.hbm_bandwidth_Bps
