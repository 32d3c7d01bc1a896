"""GEMM efficiency against problem size, fitted to a measured matmul sweep.

The cost model prices a GEMM of ``F`` FLOPs at ``eta_max * F / (F + F_half)`` of the
dense peak (:func:`parsearch.cost.compute.gemm_efficiency`).  ``eta_max`` is the
large-matmul ceiling; ``F_half`` is where a GEMM reaches half of it.  This module
reads a measured sweep of GEMM shapes (``cost_models/references/``) and fits both
by least squares on the log efficiency, so a profile's ``gemm_half_flops`` comes
from a cited measurement rather than from the training runs.

Bundled sweeps, XLA's default matmul performance tables (375 shapes each: batch 1-4,
M, N, K 256-4096, BF16 in and out):

* ``sm_90``: ``xla/service/gpu/model/matmul_interpolator_data.h`` in
  tensorflow/tensorflow, commits 372d578 and 9bebee8.  The table names no part; its
  best shape reaches 810 TFLOP/s, 0.82 of the 989 TFLOP/s dense BF16 peak of the
  H100/H200 SXM class, so it is read as that.
* ``sm_100``: ``xla/backends/gpu/cost_model/matmul_interpolator_data.h``, commit
  a305421: a B200-class part (best shape 1,670 TFLOP/s, 0.74 of B200's 2,250).  Its
  FP8 (E4M3 x E4M3 -> BF16, per-tensor scaled) rows are copied too (best shape 3,280
  TFLOP/s, 0.73 of B200's 4,500): they fix how the half point moves with the
  precision's rate (:func:`parsearch.cost.compute.gemm_half_flops`).  The same
  file's sm_90 FP8 rows are left out: they exceed the H100's dense FP8 peak (2.6 of
  1.98 PFLOP/s), so they do not time what they say.

``F_half`` does not depend on which peak the rates are divided by; ``eta_max`` does.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from parsearch.errors import SpecError
from parsearch.resources import data_dir
from parsearch.topology.hardware import load_gpu_profile

#: The bundled sweeps (module docstring), relative to the cost-model data directory.
H100_BF16_SWEEP = Path("references") / "xla_matmul_h100_bf16.csv"
SM100_BF16_SWEEP = Path("references") / "xla_matmul_sm100_bf16.csv"
SM100_FP8_SWEEP = Path("references") / "xla_matmul_sm100_fp8.csv"


@dataclass(frozen=True)
class MatmulSweep:
    """Measured GEMMs: FLOPs per call, achieved share of the peak, smallest dimension."""

    flops: np.ndarray
    efficiency: np.ndarray
    smallest_dim: np.ndarray


@dataclass(frozen=True)
class SizeCurve:
    """``eta_max * F / (F + half_flops)`` fitted to a sweep, with its log-RMS misfit."""

    eta_max: float
    half_flops: float
    rms_log_error: float
    n: int

    def efficiency(self, flops: np.ndarray) -> np.ndarray:
        """The curve's share of the peak at ``flops`` per call."""
        f = np.asarray(flops, dtype=np.float64)
        return self.eta_max * f / (f + self.half_flops)


def load_matmul_sweep(path: Path | None = None, gpu: str = "h100-sxm",
                      precision: str = "bf16") -> MatmulSweep:
    """Read a sweep CSV (``b, m, n, k, flops_per_s`` columns) as shares of ``gpu``'s dense
    ``precision`` peak (its hardware profile).

    A relative ``path`` is read from the cost-model data directory (default: the H100 sweep).
    """
    peaks = load_gpu_profile(gpu).peak_flops
    if precision not in peaks:
        raise SpecError(f"GPU {gpu!r} has no {precision} peak; it has {', '.join(peaks)}")
    peak_flops = peaks[precision]
    path = path or H100_BF16_SWEEP
    if not path.is_absolute():
        path = data_dir("cost_models") / path
    flops, achieved, smallest = [], [], []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read the matmul sweep {path}: {exc}") from None
    for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            b, m, n, k = (int(row[key]) for key in ("b", "m", "n", "k"))
            rate = float(row["flops_per_s"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"{path} line {line}: needs integer b, m, n, k and a number "
                            f"flops_per_s ({exc})") from None
        if min(b, m, n, k) <= 0 or rate <= 0:
            raise SpecError(f"{path} line {line}: sizes and flops_per_s must be positive")
        flops.append(2.0 * b * m * n * k)  # one multiply-add = 2 FLOPs
        achieved.append(rate / peak_flops)
        smallest.append(min(m, n, k))
    if not flops:
        raise SpecError(f"{path}: no GEMM rows")
    return MatmulSweep(np.array(flops), np.array(achieved), np.array(smallest))


def fit_size_curve(sweep: MatmulSweep, min_dim: int = 0) -> SizeCurve:
    """Least-squares fit of ``eta_max`` and ``half_flops`` on log efficiency.

    ``min_dim`` keeps only shapes whose smallest of M, N, K is at least that (skinny
    GEMMs lose more than their FLOP count says; the curve has no shape term).
    """
    keep = sweep.smallest_dim >= min_dim
    if keep.sum() < 3:
        raise SpecError(f"fewer than 3 GEMM shapes have every dimension >= {min_dim}")
    flops, eff = sweep.flops[keep], sweep.efficiency[keep]

    def residuals(p: np.ndarray) -> np.ndarray:
        eta_max, half_gflops = p
        return np.log(eta_max * flops / (flops + half_gflops * 1e9)) - np.log(eff)

    fit = least_squares(residuals, x0=[0.8, 2.0], bounds=([0.05, 1e-3], [1.0, 1e3]))
    return SizeCurve(eta_max=float(fit.x[0]), half_flops=float(fit.x[1]) * 1e9,
                     rms_log_error=float(np.sqrt(np.mean(fit.fun**2))), n=int(keep.sum()))


__all__ = [
    "H100_BF16_SWEEP",
    "SM100_BF16_SWEEP",
    "SM100_FP8_SWEEP",
    "MatmulSweep",
    "SizeCurve",
    "fit_size_curve",
    "load_matmul_sweep",
]
