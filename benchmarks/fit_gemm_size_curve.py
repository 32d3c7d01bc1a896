"""Fit the GEMM size curve to the bundled H100 matmul sweep (developer tool).

    python benchmarks/fit_gemm_size_curve.py

Prints ``eta_max`` and ``F_half`` of ``eta_max * F / (F + F_half)`` fitted to XLA's
measured sm_90 BF16 matmul table (``cost_models/references/xla_matmul_h100_bf16.csv``,
see :mod:`parsearch.validation.gemm_size_curve`) on all shapes and on shapes whose
smallest dimension is at least 512 and 1024, the measured share of the peak by size
bin, and what the shipped Hopper profile uses.  The Hopper ``gemm_half_flops`` prior
is the all-shapes fit rounded; the test suite checks they stay within 15%.
"""

from __future__ import annotations

import sys
from itertools import pairwise

import numpy as np

from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.validation.gemm_size_curve import fit_size_curve, load_matmul_sweep

BINS_GFLOP = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0)


def main() -> int:
    sweep = load_matmul_sweep()
    for min_dim in (0, 512, 1024):
        curve = fit_size_curve(sweep, min_dim=min_dim)
        print(f"shapes with min(M,N,K) >= {min_dim:4d}: n={curve.n:3d}  "
              f"eta_max {curve.eta_max:.3f}  F_half {curve.half_flops / 1e9:.2f} GFLOP  "
              f"log-RMS {curve.rms_log_error:.3f}")
    gflops = sweep.flops / 1e9
    for low, high in pairwise(BINS_GFLOP):
        inside = (gflops >= low) & (gflops < high)
        print(f"  {low:6.0f}-{high:<6.0f} GFLOP: n={inside.sum():3d}  measured share of peak "
              f"{np.mean(sweep.efficiency[inside]):.3f}")
    profile = efficiency_for_gpu("h100-sxm")
    print(f"shipped Hopper profile: BF16 ceiling {profile.gemm_efficiency['bf16']:.3f}, "
          f"gemm_half_flops {profile.gemm_half_flops / 1e9:.2f} GFLOP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
