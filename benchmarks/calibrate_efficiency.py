"""Fit one efficiency profile per GPU generation to the published runs (developer tool).

    python benchmarks/calibrate_efficiency.py [--generation hopper] [--write]

Minimises the mean |log(predicted / measured)| of tokens/s/GPU over the
verified dev rows of each generation (the latest release of each layout)
with Nelder-Mead over a handful of profile fields (never per row).  Memory
readings (unstated recompute/FSDP) are fixed once, with the current profile,
before fitting.  ``--write`` updates ``cost_models/efficiency/<generation>.yaml``
in place (numbers only; comments are kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from parsearch.cost.analytic import CostOptions, layout_columns, score_columns
from parsearch.cost.efficiency import EfficiencyProfile, efficiency_dir, efficiency_for_gpu
from parsearch.published_runs import load_published_runs
from parsearch.validation import (
    fabric_for,
    memory_saving_candidates,
    run_cost_model,
    validate_runs,
)

# Fields fitted (in log space) and their bounds.
FIELDS: dict[str, tuple[float, float]] = {
    "gemm_max_efficiency.bf16": (0.3, 0.95),
    "gemm_max_efficiency.fp8": (0.2, 0.95),
    "gemm_max_efficiency.fp4": (0.15, 0.95),
    "gemm_half_flops": (1e8, 3e10),
    "attention_efficiency": (0.15, 0.9),
    "attention_half_block": (16.0, 8192.0),
    "elementwise_bytes_per_hidden": (5.0, 400.0),
    "moe_bytes_per_hidden": (2.0, 400.0),
    "quantize_bytes_per_hidden": (1.0, 600.0),
    "grouped_gemm_factor": (0.3, 1.0),
    "layer_overhead_s": (1e-6, 3e-4),
    "ep_overlap": (0.0, 0.9),
    "tp_overlap": (0.0, 0.9),
}


def get(profile: EfficiencyProfile, name: str) -> float:
    if "." in name:
        outer, key = name.split(".")
        return float(getattr(profile, outer).get(key, math.nan))
    return float(getattr(profile, name))


def with_values(profile: EfficiencyProfile, values: dict[str, float]) -> EfficiencyProfile:
    changes: dict[str, object] = {}
    gemm = dict(profile.gemm_max_efficiency)
    for name, value in values.items():
        if name.startswith("gemm_max_efficiency."):
            gemm[name.split(".")[1]] = value
        else:
            changes[name] = value
    return dataclasses.replace(profile, gemm_max_efficiency=gemm, **changes)


def prepared_rows(generation: str):  # type: ignore[no-untyped-def]
    """(cost model, columns, measured) per usable dev row of the generation."""
    report = validate_runs(load_published_runs(), deduplicate=True)
    by_id = {r.id: r for r in report.rows}
    runs = {r.id: r for r in load_published_runs()}
    fabrics: dict = {}
    rows = []
    for row_id, row in by_id.items():
        run = runs[row_id]
        fabric = fabric_for(fabrics, run.cluster, run.num_gpus)
        if efficiency_for_gpu(fabric.gpu.name).name != generation:
            continue
        for training, layout, note in memory_saving_candidates(run):
            if note == row.assumed:
                cm = run_cost_model(run, fabric, CostOptions(), training)
                rows.append((cm, layout_columns([layout]), row.measured_tokens_per_s_per_gpu,
                             run.precision))
                break
    return rows


def objective(rows, profile: EfficiencyProfile) -> float:  # type: ignore[no-untyped-def]
    errors = []
    for cm, cols, measured, _precision in rows:
        cm = dataclasses.replace(cm, profile=profile,
                                 options=dataclasses.replace(cm.options, ep_overlap=None,
                                                             tp_overlap=None).resolved(profile))
        predicted = float(score_columns(cm, cols, with_memory=False)["tokens_per_s_per_gpu"][0])
        errors.append(abs(math.log(predicted / measured)))
    return float(np.mean(errors))


def fit(generation: str, iterations: int) -> tuple[EfficiencyProfile, float, float]:
    rows = prepared_rows(generation)
    start = next(p for p in (efficiency_for_gpu(cm.fabric.gpu.name) for cm, *_ in rows))
    precisions = {p for *_, p in rows}
    names = [n for n in FIELDS
             if not (n.endswith(".fp8") and "fp8" not in precisions)
             and not (n.endswith(".fp4") and "fp4" not in precisions)
             and not (n == "quantize_bytes_per_hidden" and precisions == {"bf16"})
             and not (n in ("moe_bytes_per_hidden", "grouped_gemm_factor", "ep_overlap")
                      and not any(cm.model.is_moe for cm, *_ in rows))]
    lo = np.log([FIELDS[n][0] + 1e-3 for n in names])
    hi = np.log([FIELDS[n][1] + 1e-3 for n in names])

    def profile_at(x: np.ndarray) -> EfficiencyProfile:
        x = np.clip(x, lo, hi)
        values = {n: float(np.exp(v) - 1e-3) for n, v in zip(names, x, strict=True)}
        return with_values(start, values)

    # Start fractions that sit at 0 inside the range, so the simplex can move them.
    x0 = np.log([max(get(start, n), FIELDS[n][0], 0.25 if n.endswith("overlap") else 0) + 1e-3
                 for n in names])
    before = objective(rows, start)
    result = minimize(lambda x: objective(rows, profile_at(x)), x0, method="Nelder-Mead",
                      options={"maxfev": iterations, "xatol": 1e-3, "fatol": 1e-4})
    best = profile_at(result.x)
    print(f"{generation}: {len(rows)} rows, mean |log error| {before:.3f} -> {result.fun:.3f}")
    for n in names:
        print(f"  {n}: {get(start, n):.4g} -> {get(best, n):.4g}")
    return best, before, float(result.fun)


def write(profile: EfficiencyProfile) -> None:
    path = efficiency_dir() / f"{profile.name}.yaml"
    text = path.read_text()
    for key, value in profile.gemm_max_efficiency.items():
        text = re.sub(rf"(\n  {key}: )[0-9.eE+-]+", rf"\g<1>{value:.3g}", text)
    for name in FIELDS:
        if "." in name:
            continue
        text = re.sub(rf"(\n{name}: )[0-9.eE+-]+", rf"\g<1>{get(profile, name):.3g}", text)
    Path(path).write_text(text)
    print(f"wrote {path}")


def main() -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", action="append",
                        choices=("ampere", "hopper", "blackwell"))
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    for generation in args.generation or ("ampere", "hopper", "blackwell"):
        best, _before, _after = fit(generation, args.iterations)
        if args.write:
            write(best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
