"""The GEMM size curve: the fit recovers known curves, and the Hopper profile's
``gemm_half_flops`` and BF16 ceiling agree with the bundled H100 matmul sweep."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.compute import gemm_efficiency, gemm_half_flops
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.errors import SpecError
from parsearch.validation.fit.gemm_size_curve import (
    SM100_BF16_SWEEP,
    SM100_FP8_SWEEP,
    MatmulSweep,
    fit_size_curve,
    load_matmul_sweep,
)

SIZES = (256, 512, 1024, 2048, 4096)


def _synthetic(eta_max: float, half_flops: float) -> MatmulSweep:
    flops = np.array([2.0 * m * n * k for m in SIZES for n in SIZES for k in SIZES])
    eff = eta_max * flops / (flops + half_flops)
    smallest = np.array([min(m, n, k) for m in SIZES for n in SIZES for k in SIZES])
    return MatmulSweep(flops, eff, smallest)


@settings(max_examples=25, deadline=None)
@given(eta_max=st.floats(0.3, 0.95), half_gflops=st.floats(0.5, 20.0))
def test_fit_recovers_a_curve_it_was_given(eta_max: float, half_gflops: float) -> None:
    curve = fit_size_curve(_synthetic(eta_max, half_gflops * 1e9))
    assert curve.eta_max == pytest.approx(eta_max, rel=0.02)
    assert curve.half_flops == pytest.approx(half_gflops * 1e9, rel=0.02)
    assert curve.rms_log_error < 1e-3


def test_hopper_half_flops_is_the_one_the_h100_sweep_measures() -> None:
    sweep = load_matmul_sweep()
    assert len(sweep.flops) == 1125  # 375 shapes from each of three XLA commits
    curve = fit_size_curve(sweep)
    profile = efficiency_for_gpu("h100-sxm")
    assert profile.gemm_half_flops == pytest.approx(curve.half_flops, rel=0.15)
    # Square-ish GEMMs follow the curve closely; the large-GEMM ceiling the sweep
    # implies sits inside the profile's cited BF16 range.
    square = fit_size_curve(sweep, min_dim=1024)
    assert square.rms_log_error < 0.06
    prior = profile.priors["gemm_efficiency.bf16"]
    assert prior.low <= square.eta_max <= prior.high + 0.01


def test_blackwell_half_flops_is_the_one_the_sm100_sweep_measures() -> None:
    sweep = load_matmul_sweep(SM100_BF16_SWEEP, "b200")
    curve = fit_size_curve(sweep)
    assert efficiency_for_gpu("b200").gemm_half_flops == pytest.approx(curve.half_flops,
                                                                        rel=0.15)
    # A faster GPU needs a larger GEMM to fill: B200's half point lies above H100's.
    assert curve.half_flops > 1.5 * fit_size_curve(load_matmul_sweep()).half_flops


def test_the_fp8_half_point_is_the_bf16_one_scaled_by_the_rate() -> None:
    """XLA's sm_100 FP8 sweep: the same ceiling share as BF16 and the half point moved by
    the FP8/BF16 rate ratio (one fixed time per call), as the cost model prices it."""
    bf16 = fit_size_curve(load_matmul_sweep(SM100_BF16_SWEEP, "b200"))
    fp8_sweep = load_matmul_sweep(SM100_FP8_SWEEP, "b200", precision="fp8")
    assert len(fp8_sweep.flops) == 375
    fp8 = fit_size_curve(fp8_sweep)
    assert fp8.eta_max == pytest.approx(bf16.eta_max, abs=0.03)
    # Same fixed time per call: the half point moves with the large-GEMM rate.
    measured_rate_ratio = fp8.eta_max * 4.5e15 / (bf16.eta_max * 2.25e15)
    assert fp8.half_flops / bf16.half_flops == pytest.approx(measured_rate_ratio, rel=0.1)
    profile = efficiency_for_gpu("b200")
    measured_t0 = bf16.half_flops / (bf16.eta_max * 2.25e15)
    assert fp8.half_flops / (fp8.eta_max * 4.5e15) == pytest.approx(measured_t0, rel=0.1)
    # The model's fixed time per call is the same in both precisions and is the sweep's.
    t0 = {p: gemm_half_flops(profile, p, peak, 2.25e15) / (profile.gemm_efficiency[p] * peak)
          for p, peak in (("bf16", 2.25e15), ("fp8", 4.5e15))}
    assert t0["fp8"] == pytest.approx(t0["bf16"])
    assert t0["bf16"] == pytest.approx(measured_t0, rel=0.05)
    # The FP8 sweep's ceiling lies inside the profile's cited FP8 range.
    prior = profile.priors["gemm_efficiency.fp8"]
    assert prior.low <= fp8.eta_max <= prior.high


@pytest.mark.parametrize(("sweep", "gpu"), [(None, "h100-sxm"), (SM100_BF16_SWEEP, "b200")])
def test_the_half_point_ceiling_is_the_sweeps(sweep, gpu: str) -> None:
    """``gemm_half_flops_ceiling`` is the large-GEMM share the sweep behind
    ``gemm_half_flops`` reached, so the fixed time per call is measured, not fitted."""
    curve = fit_size_curve(load_matmul_sweep(sweep, gpu))
    profile = efficiency_for_gpu(gpu)
    assert profile.gemm_half_flops_ceiling == pytest.approx(curve.eta_max, abs=0.02)


#: Transformer Engine's GEMM profiling guide (docs/examples/gemm_profiling, @8f2e63578e10):
#: the 12 BF16 GEMMs of a 5B-model layer on an H200 NVL (a 600 W card) at 0.606 of the
#: H100/H200 SXM dense peak (references/microbenchmarks.yaml).
TE_GUIDE_H200_NVL_BF16_OF_SXM_PEAK = 0.606


def test_the_model_curve_tracks_the_sweep() -> None:
    """The shipped curve has the sweep's shape: within 12% log-RMS once its level is set
    apart.  Its level, the BF16 efficiency fitted to training runs, lies between the two
    cited measurements of LLM-shaped Hopper GEMMs: the TE guide's layer GEMMs on a
    power-capped H200 NVL and the isolated-GEMM sweep's ceiling on an H100 SXM."""
    sweep = load_matmul_sweep()
    profile = efficiency_for_gpu("h100-sxm")
    keep = sweep.smallest_dim >= 512
    half = gemm_half_flops(profile, "bf16", 989.4e12, 989.4e12)  # the peaks cancel for BF16
    model = gemm_efficiency(profile, "bf16", sweep.flops[keep], half)
    log_ratio = np.log(model / sweep.efficiency[keep])
    assert float(np.std(log_ratio)) < 0.12
    level = profile.gemm_efficiency["bf16"]
    assert TE_GUIDE_H200_NVL_BF16_OF_SXM_PEAK <= level <= fit_size_curve(sweep).eta_max


def test_a_bad_sweep_row_is_named(tmp_path) -> None:
    bad = tmp_path / "sweep.csv"
    bad.write_text("b,m,n,k,flops_per_s\n1,256,256,x,1e12\n", encoding="utf-8")
    with pytest.raises(SpecError, match="line 2"):
        load_matmul_sweep(bad)
    with pytest.raises(SpecError, match="cannot read the matmul sweep"):
        load_matmul_sweep(tmp_path / "missing.csv")
    with pytest.raises(SpecError, match="has no fp4 peak"):
        load_matmul_sweep(precision="fp4")
    with pytest.raises(SpecError, match="fewer than 3"):
        fit_size_curve(_synthetic(0.8, 2e9), min_dim=8192)
