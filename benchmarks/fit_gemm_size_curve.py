"""Fit the GEMM size curve to the bundled H100 matmul sweep (developer tool).

    python benchmarks/fit_gemm_size_curve.py

Prints ``eta_max`` and ``F_half`` of ``eta_max * F / (F + F_half)`` fitted to XLA's
measured sm_90 and sm_100 BF16 matmul tables (``cost_models/references/xla_matmul_*``,
see :mod:`parsearch.validation.fit.gemm_size_curve`) on all shapes and on shapes whose
smallest dimension is at least 512 and 1024, the measured share of the peak by size
bin, and what the shipped Hopper and Blackwell profiles use.  Each profile's
``gemm_half_flops`` prior is its all-shapes fit rounded; the test suite checks they
stay within 15%.
"""

from __future__ import annotations

import sys
from itertools import pairwise

import numpy as np

from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.validation.fit.gemm_size_curve import (
    H100_BF16_SWEEP,
    SM100_BF16_SWEEP,
    fit_size_curve,
    load_matmul_sweep,
)

SWEEPS = (("h100-sxm", H100_BF16_SWEEP), ("b200", SM100_BF16_SWEEP))

BINS_GFLOP = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0)


def main() -> int:
    for gpu, path in SWEEPS:
        sweep = load_matmul_sweep(path, gpu)
        print(f"{path.name} (shares of the {gpu} dense BF16 peak):")
        for min_dim in (0, 512, 1024):
            curve = fit_size_curve(sweep, min_dim=min_dim)
            print(f"  shapes with min(M,N,K) >= {min_dim:4d}: n={curve.n:4d}  "
                  f"eta_max {curve.eta_max:.3f}  F_half {curve.half_flops / 1e9:.2f} GFLOP  "
                  f"log-RMS {curve.rms_log_error:.3f}")
        gflops = sweep.flops / 1e9
        for low, high in pairwise(BINS_GFLOP):
            inside = (gflops >= low) & (gflops < high)
            print(f"    {low:6.0f}-{high:<6.0f} GFLOP: n={inside.sum():4d}  measured share of "
                  f"peak {np.mean(sweep.efficiency[inside]):.3f}")
        profile = efficiency_for_gpu(gpu)
        print(f"  shipped {profile.name} profile: BF16 ceiling "
              f"{profile.gemm_efficiency['bf16']:.3f}, gemm_half_flops "
              f"{profile.gemm_half_flops / 1e9:.2f} GFLOP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
