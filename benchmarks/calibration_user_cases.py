"""Calibration as users meet it (issue 33, items 4 and 5): a cluster slower than the
shipped profile allows, and a few runs of a published group.

    python benchmarks/calibration_user_cases.py [--seeds 5] [--draws 8] [--models M ...]
        [--skip-slow-cluster] [--skip-subsets]

1. A slow cluster (issue 33 item 4; ``--skip-slow-cluster`` skips it).  The true
   cluster runs 1.3x slower than the shipped Hopper profile allows: either every step
   (what ``cluster_speed`` models: a power cap, an older stack) or only the GPUs'
   compute (GEMM and attention efficiencies / 1.3; NVLink and NICs at their file's
   rates), which the whole-step factor only approximates.  K layouts drawn at random
   from the top 30 shapes, 2 % log-normal noise, calibrated; MAPE and Spearman's rho
   on the 48-50 others, and the rank of the true best among the 90-shape region
   (2026-12-06 ~07:17 UTC, ``--seeds 5``, mean of 5 draws; the shared working tree's
   cost model of that time):

    truth    K  MAPE shipped -> calibrated  rho shipped -> calibrated  true best  cluster_speed
    llama3-70b, 128 GPUs
    uniform  3        30.0 % -> 1.1 %            1.00 -> 1.00         1 -> 1.0   5/5, 0.771
    uniform  5        30.0 % -> 1.7 %            1.00 -> 1.00         1 -> 1.0   5/5, 0.764
    compute  3        20.1 % -> 6.5 %            0.96 -> 0.96         1 -> 1.0   5/5, 0.789
    compute  5        20.1 % -> 5.9 %            0.96 -> 0.96         1 -> 1.0   5/5, 0.822
    mixtral-8x22b, 128 GPUs
    uniform  3        30.0 % -> 1.1 %            1.00 -> 1.00         1 -> 1.0   5/5, 0.771
    uniform  5        30.0 % -> 0.8 %            1.00 -> 0.98         1 -> 1.0   5/5, 0.779
    compute  3        20.1 % -> 2.8 %            0.47 -> 0.67         1 -> 1.0   3/5, 0.821
    compute  5        20.1 % -> 2.0 %            0.47 -> 0.77         1 -> 1.0   3/5, 0.935

   The speed factor counts against the factor limit (one per four runs, rounded up):
   it takes the last physical factor's place.  Fitted beside all of them instead
   (~06:33 UTC, same draws), K = 3 kept more error and lost the order on Mixtral
   (uniform 2.4 %, rho 0.83, true best at rank 6.0 on average; compute 3.7 %, rank
   6.0).  When the runs push a factor past its bound, any in-sample gain takes it;
   requiring 2 points there (~07:10 UTC) left Mixtral compute-only K = 3 at 4.2 %
   with the true best at rank 6.0.

   Before ``cluster_speed`` such a cluster was refused (exit 3, the GEMM factor on its
   bound: issue 33), or, at K = 3 with layouts that all cross nodes, read as a slow
   network (llama3-70b uniform, third draw, with the speed factor off: network factor
   0.29, 16 % in-sample error against 1 % with it).  Error falls to 1-7 % at every K
   and the true best stays first or second; a compute-only slowdown keeps 2-7 %
   (the whole-step factor slows communication too).

2. A few runs of a published group (``--draws``).  For each (model, GPU) group of the
   bundled runs with at least 6 runs: K = 2, 3, 5 of them drawn at random, calibrate on
   them from the shipped profile, predict the others; held-out MAPE and ranking quality
   (measured fastest predicted first, Spearman within jobs: same model, GPU count, batch
   and sequence) before and after, and in how many draws calibration made the held-out
   MAPE worse (by more than 0.1 point).  The shipped profile was fitted to these runs,
   so it is hard to beat here; the question is whether a few runs make it worse.
   2026-12-06 ~07:20 UTC, 8 draws, with this tool's rules and, on the same draws and
   cost model, the rules before them (old: any factor one run moves may be fitted, no
   cluster_speed):

    group                 K   MAPE shipped -> calibrated (old)   worse draws (old), max
    Mixtral-8x22B H100   2        1.66 % -> 1.83 % (1.83 %)      3/8 (3/8), +1.08 %
    (19 runs)            3        1.58 % -> 1.58 % (1.58 %)      1/8 (1/8), +0.25 %
                         5        1.59 % -> 1.53 % (1.53 %)      3/8 (3/8), +0.18 %
    Qwen2-57B H100       2        1.84 % -> 1.96 % (1.90 %)      3/8 (3/8), +1.07 %
    (13 runs)            3        1.81 % -> 1.79 % (1.79 %)      2/8 (2/8), +0.24 %
                         5        1.74 % -> 1.50 % (1.50 %)      3/8 (3/8), +0.59 %

   No draw makes the held-out runs worse by more than 1.08 points, inside the 2 %
   run-to-run spread of a measured step; the new rules leave these groups, which the
   shipped profile already fits to 1.6-1.8 %, as they were (Qwen2 at K = 2: 1.96 %
   against 1.90 %, from the two-runs rule; cluster_speed is never fitted here).
   Ranking of the held-out runs within jobs, over all 232 (draw, job) pairs of two or
   more held-out runs: the measured fastest is predicted fastest in 232 before and 232
   after, Spearman 1.00 before and after.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections import defaultdict
from dataclasses import replace

import numpy as np
from calibration_simulation import (
    NOISE,
    NOMINAL_CLUSTER,
    POOL_SHAPES,
    REGION_SHAPES,
    SCENARIOS,
    tokens,
)

from parsearch.cost.analytic import build_cost_model
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.layout.space import require_layouts
from parsearch.model.files import resolve_model
from parsearch.model.specs import TrainingSpec
from parsearch.search.exhaustive import rank_feasible, scan_table
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.fit.calibration import PreparedRow, predict, prepare_rows
from parsearch.validation.fit.network_calibration import with_cluster_factors
from parsearch.validation.published.published_runs import load_published_runs
from parsearch.validation.user.measurements import Measurement
from parsearch.validation.user.user_calibration import fit_user_profile, prepare_measurements
from parsearch.validation.user.user_report import RowReport, ranking

#: The slow cluster's truths: every step 1.3x the shipped prediction (what cluster_speed
#: models), or only the GPUs' compute 1.3x slower (a power cap lowers SM clocks; NVLink and
#: the NICs keep their rates), which the whole-step factor only approximates.
SLOWDOWN = 1.3
SLOW_KS = (3, 5)


def slow_cluster(name: str, gpus: int, batch: int, seq: int, seeds: int) -> None:
    """Calibrate on K random layouts of the top region of a cluster slower than the shipped
    profile allows; MAPE and ranking (Spearman, rank of the true best) of 50 others, before
    and after, and how often cluster_speed was fitted."""
    model = resolve_model(name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    shipped = efficiency_for_gpu("h100-sxm")
    fabric = build_fabric(load_cluster(NOMINAL_CLUSTER), gpus)
    nominal = build_cost_model(model, training, fabric, profile=shipped)
    table = require_layouts(model, training, gpus)
    scan = scan_table(nominal, table)
    region = scan.feasible_rows[rank_feasible(scan, top=REGION_SHAPES, diverse=True)]
    layouts = [table.layout(int(r)) for r in region]
    cols = {k: v[region] for k, v in table.columns.items()}
    evaluation = np.arange(POOL_SHAPES, len(region))[:50]
    compute = {n: shipped.get(n) / SLOWDOWN for n in
               ("gemm_efficiency.bf16", "gemm_efficiency.fp8", "attention_forward_efficiency",
                "attention_backward_efficiency")}
    truths = {"uniform": replace(shipped, cluster_speed=1.0 / SLOWDOWN),
              "compute": shipped.with_values(compute)}
    print(f"\n{name} on {gpus} GPUs, a cluster {SLOWDOWN}x slower than the shipped profile; "
          f"K random layouts of the top {POOL_SHAPES} shapes, error on {len(evaluation)} others")
    print(f"  {'truth':<8} {'K':>2} {'MAPE before':>11} {'after':>6} {'rho before':>10} "
          f"{'after':>6} {'best rank':>9} {'after':>6}  cluster_speed fitted")
    for kind, profile in truths.items():
        true_tokens = tokens(replace(nominal, profile=profile), cols)
        best = int(np.argmax(true_tokens))

        def quality(pred: np.ndarray, tt: np.ndarray = true_tokens,
                    top: int = best) -> tuple[float, float, int]:
            ev = evaluation
            mape = float(np.mean(np.abs(pred[ev] / tt[ev] - 1.0)))
            rho = float(np.corrcoef(np.argsort(np.argsort(pred[ev])),
                                    np.argsort(np.argsort(tt[ev])))[0, 1])
            return mape, rho, int(np.nonzero(np.argsort(-pred) == top)[0][0]) + 1

        before = quality(tokens(nominal, cols))
        for k in SLOW_KS:
            results, speeds = [], []
            for seed in range(seeds):
                rng = np.random.default_rng(2000 + seed)
                pick = sorted(rng.choice(POOL_SHAPES, size=k, replace=False).tolist())
                runs = [Measurement(f"sim {layouts[i].key()}", name, NOMINAL_CLUSTER,
                                    layouts[i], batch, seq, training.precision,
                                    float(true_tokens[i] * math.exp(rng.normal(0.0, NOISE))))
                        for i in pick]
                rows, problems = prepare_measurements(runs, shipped)
                assert not problems, problems
                fit = fit_user_profile(rows, shipped)
                results.append(quality(tokens(with_cluster_factors(
                    replace(nominal, profile=fit.profile), fit.cluster), cols)))
                if fit.speed is not None:
                    speeds.append(fit.speed.value)
            m, r, b = (float(np.mean([x[i] for x in results])) for i in range(3))
            print(f"  {kind:<8} {k:>2} {before[0]:>11.1%} {m:>6.1%} {before[1]:>10.2f} "
                  f"{r:>6.2f} {before[2]:>9d} {b:>6.1f}  {len(speeds)}/{seeds}"
                  + (f" (mean {np.mean(speeds):.3f})" if speeds else ""))
            sys.stdout.flush()


SUBSET_KS = (2, 3, 5)


def _job(row: PreparedRow) -> str:
    run = row.run
    return f"{run.base_model} {run.gpu} {run.num_gpus} {run.global_batch} {run.seq_len}"


def published_subsets(draws: int, min_runs: int = 6) -> None:
    """Calibrate on K runs of each published group, predict the rest (see the docstring)."""
    groups: dict[tuple[str, str], list[PreparedRow]] = defaultdict(list)
    for row in prepare_rows(load_published_runs()):
        groups[(row.run.base_model, row.run.gpu)].append(row)
    print(f"\nPublished groups of >= {min_runs} runs: calibrate on K, predict the rest "
          f"({draws} draws each)")
    before_reports: list[RowReport] = []
    after_reports: list[RowReport] = []
    for (model, gpu), members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        if len(members) < min_runs:
            continue
        base = members[0].cost_model.profile
        for k in SUBSET_KS:
            rng = np.random.default_rng(7)
            before, after = [], []
            for draw in range(draws):
                picked = set(rng.choice(len(members), size=k, replace=False).tolist())
                train = [m for i, m in enumerate(members) if i in picked]
                test = [m for i, m in enumerate(members) if i not in picked]
                measured = np.array([r.measured for r in test])
                shipped = predict(test, base)
                fitted = fit_user_profile(train, base).predict(test)
                before.append(float(np.mean(np.abs(shipped / measured - 1.0))))
                after.append(float(np.mean(np.abs(fitted / measured - 1.0))))
                tag = f"K={k} draw {draw}: "
                before_reports += [RowReport(r.id, "", r.run.num_gpus, r.measured, float(s),
                                             math.nan, math.nan, tag + _job(r))
                                   for r, s in zip(test, shipped, strict=True)]
                after_reports += [RowReport(r.id, "", r.run.num_gpus, r.measured, float(f),
                                            math.nan, math.nan, tag + _job(r))
                                  for r, f in zip(test, fitted, strict=True)]
            worse = np.array(after) - np.array(before)
            print(f"  {model:<16} {gpu:<22} runs {len(members):>2} K={k}: held-out MAPE "
                  f"{np.mean(before):.2%} -> {np.mean(after):.2%}; worse in "
                  f"{int(np.sum(worse > 0.001))}/{draws} draws (max "
                  f"+{max(0.0, float(worse.max())):.2%})")
            sys.stdout.flush()
    shipped_rank = ranking(before_reports, [r.shipped for r in before_reports])
    fitted_rank = ranking(after_reports, [r.shipped for r in after_reports])
    print(f"  ranking of the held-out runs within jobs: shipped {shipped_rank.text()} -> "
          f"calibrated {fitted_rank.text()}")


def main() -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="slow-cluster noise draws")
    parser.add_argument("--draws", type=int, default=8, help="published-group draws per K")
    parser.add_argument("--models", nargs="+", default=None, metavar="M",
                        help="slow-cluster scenarios (default: all)")
    parser.add_argument("--skip-slow-cluster", action="store_true")
    parser.add_argument("--skip-subsets", action="store_true")
    args = parser.parse_args()
    if not args.skip_slow_cluster:
        for scenario in SCENARIOS:
            if not args.models or scenario[0] in args.models:
                slow_cluster(*scenario, args.seeds)
    if not args.skip_subsets:
        published_subsets(args.draws)
    return 0


if __name__ == "__main__":
    sys.exit(main())
