"""Fit each engine's fused-MoE grouped-GEMM factor on its published serving rows, and say how
well it predicts rows it was not fitted on.

:data:`parsearch.serve.engines.MOE_KERNEL_EFFICIENCY` scales the rate of the routed-expert
grouped GEMMs (the module gives the cited physical range).  For the engine's MoE
throughput rows of ``data/serving_runs.csv`` not held out (``held_out`` column; held-out
rows never enter a fit, ``validate_serving.py`` reports them apart) this script scores
every factor on a grid inside that range and reports:

* in sample: the factor with the lowest MAPE on all rows, and that MAPE;
* out of sample, leave one group out: for each group (a model, or a GPU generation) the
  factor is fitted on the other groups' rows and the held-out rows are predicted with it;
  the MAPE over all rows so predicted.

Usage: ``python benchmarks/fit_serving_moe.py [--engine trtllm] [--step 0.05]
[--unstated-kv checkpoint|fp8]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import validate_serving as vs

from parsearch.model.presets import get_preset
from parsearch.serve import engines

GENERATION = {"h100-sxm": "hopper", "h200-sxm": "hopper", "b200": "blackwell",
              "gb200": "blackwell"}


def moe_rows(engine: str) -> list[dict[str, str]]:
    """The engine's MoE throughput rows a fit may use: held-out rows never are
    (:func:`validate_serving.fit_rows`)."""
    return [r for r in vs.fit_rows() if not r["phase"] and r["output_tokens_per_s"]
            and vs.ENGINE_OF[r["framework"]] == engine
            and get_preset(r["model"]).moe is not None]


def ape_table(rows: list[dict[str, str]], engine: str,
              grid: list[float]) -> dict[float, dict[str, float]]:
    """APE of every row at every factor of the grid."""
    saved = engines.MOE_KERNEL_EFFICIENCY[engine]
    table: dict[float, dict[str, float]] = {}
    try:
        for g in grid:
            engines.MOE_KERNEL_EFFICIENCY[engine] = g
            table[g] = {r["id"]: vs.evaluate_row(r)["ape"] for r in rows}
    finally:
        engines.MOE_KERNEL_EFFICIENCY[engine] = saved
    return table


def best(table: dict[float, dict[str, float]], ids: list[str]) -> tuple[float, float]:
    """(factor, MAPE) with the lowest MAPE over ``ids``."""
    scored = [(statistics.fmean(table[g][i] for i in ids), g) for g in table]
    mape, g = min(scored)
    return g, mape


def leave_one_out(table: dict[float, dict[str, float]], rows: list[dict[str, str]],
                  group: Callable[[dict[str, str]], str]) -> tuple[float, dict[str, float]]:
    """MAPE of each row predicted with the factor fitted on the other groups; the factors."""
    groups = sorted({group(r) for r in rows})
    errors, factors = [], {}
    for held in groups:
        train = [r["id"] for r in rows if group(r) != held]
        test = [r["id"] for r in rows if group(r) == held]
        if not train:
            continue
        g, _ = best(table, train)
        factors[held] = g
        errors += [table[g][i] for i in test]
    return statistics.fmean(errors), factors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="trtllm", choices=sorted(engines.MOE_KERNEL_EFFICIENCY))
    parser.add_argument("--step", type=float, default=0.05)
    parser.add_argument("--unstated-kv", choices=("checkpoint", "fp8"), default="checkpoint",
                        help="KV dtype of rows that do not state it (validate_serving.py)")
    args = parser.parse_args(argv)
    vs.UNSTATED_KV["mode"] = args.unstated_kv
    rows = moe_rows(args.engine)
    if not rows:
        print(f"no MoE throughput rows for {args.engine}")
        return 1
    lo = engines.MIN_MOE_KERNEL_EFFICIENCY
    n = round((1.0 - lo) / args.step)
    grid = [round(lo + i * args.step, 4) for i in range(n + 1)]
    table = ape_table(rows, args.engine, grid)
    ids = [r["id"] for r in rows]
    g, mape = best(table, ids)
    current = engines.MOE_KERNEL_EFFICIENCY[args.engine]
    print(f"{args.engine}: {len(rows)} MoE throughput rows; grid {grid[0]}..{grid[-1]}")
    print(f"in sample: factor {g}, MAPE {mape:.3f} (factor 1.0: "
          f"{statistics.fmean(table[1.0].values()):.3f}; shipped {current})")
    for name, group in (("model", lambda r: r["model"]),
                        ("GPU generation", lambda r: GENERATION[r["gpu"]])):
        oos, factors = leave_one_out(table, rows, group)
        print(f"out of sample, leave one {name} out: MAPE {oos:.3f}, factors {factors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
