"""What the GPU variants change on torchtitan's 500 W H100 runs (issue 33, item 3).

    python benchmarks/gpu_variants_torchtitan.py [--json]

The 19 torchtitan rows of ``src/parsearch/data/independent_runs.csv`` ran on
"HBM2e based lower TDP SXM H100(95GB)" GPUs at 500 W; the validation scores them on
``grand-teton-h100-94gb-500w`` (since 2026-12-07; before, it skipped them for want of a
profile of the part).  This script predicts each one
on ``dgx-h100`` three ways, the 700 W 80 GB H100 (what issue 33 measured as 1.4-1.5x
too fast), the same at a 500 W power limit, and the ``h100-sxm-94gb-500w`` part
(500 W, 94 GiB, 2.41 TB/s HBM2e); then on ``grand-teton-h100-94gb-500w`` (that GPU on a
Meta-style RoCE fabric, 16 GPUs per ToR).  Each row is read as the validation reads it
(``best_reading``: the lightest unstated memory saving that fits) and prints
predicted tokens/s per GPU, predicted/measured, and whether that reading fits.
Nothing here is fitted: the variant's numbers come from the cited sources in
``cost_models/hardware`` and ``parsearch/topology/power.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings
from pathlib import Path
from typing import Any

from parsearch.cost.analytic import CostOptions
from parsearch.topology.cluster import ClusterSpec, load_cluster
from parsearch.topology.summary import fabric_from_spec
from parsearch.topology.variants import cluster_variant
from parsearch.validation.published.published_runs import PublishedRun, read_published_runs
from parsearch.validation.published.runs import best_reading

DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / "independent_runs.csv"
LABEL = "Grand Teton"


def clusters() -> dict[str, ClusterSpec]:
    base = load_cluster("dgx-h100")
    return {
        "h100-sxm (700 W, 80 GiB)": base,
        "500 W": cluster_variant(base, {"power_limit_W": 500}),
        "h100-sxm-94gb-500w": cluster_variant(
            base, {"power_limit_W": 500, "hbm_capacity_GiB": 94, "hbm_bandwidth_TBps": 2.41}),
        "grand-teton-h100-94gb-500w": load_cluster("grand-teton-h100-94gb-500w"),
    }


def torchtitan_rows() -> list[PublishedRun]:
    runs = read_published_runs(DATA).runs
    return [r for r in runs if LABEL in r.gpu and r.model_spec is not None
            and r.measured_tokens_per_s_per_gpu]


def score(runs: list[PublishedRun]) -> dict[str, Any]:
    rows, ratios = [], {name: [] for name in clusters()}
    for run in runs:
        measured = float(run.measured_tokens_per_s_per_gpu or 0.0)
        row: dict[str, Any] = {"id": run.id, "model": run.model, "gpus": run.num_gpus,
                               "measured": measured}
        for name, cluster in clusters().items():
            reading = best_reading(run, fabric_from_spec(cluster, run.num_gpus), CostOptions())
            predicted = reading.estimate.tokens_per_s_per_gpu
            ratios[name].append(predicted / measured)
            row[name] = {"predicted": predicted, "ratio": predicted / measured,
                         "fits": reading.estimate.fits, "reading": reading.note}
        rows.append(row)
    summary = {name: {"n": len(v), "median_ratio": statistics.median(v),
                      "mean_ratio": statistics.mean(v),
                      "mape_pct": 100 * statistics.mean(abs(1 / x - 1) for x in v),
                      "fits": sum(r[name]["fits"] for r in rows)}
               for name, v in ratios.items() if v}
    return {"rows": rows, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    result = score(torchtitan_rows())
    if args.json:
        print(json.dumps(result, indent=2))
        return
    names = list(clusters())
    print("id     model            gpus  measured  " + "  ".join(f"{n:>26}" for n in names))
    for row in result["rows"]:
        cells = [f"{row[n]['predicted']:9,.0f} {row[n]['ratio']:5.2f}"
                 f"{'' if row[n]['fits'] else ' nofit':6}" for n in names]
        print(f"{row['id']:6} {row['model']:16} {row['gpus']:4} {row['measured']:9,.0f}  "
              + "  ".join(f"{c:>26}" for c in cells))
    for name, s in result["summary"].items():
        print(f"{name}: n {s['n']}, predicted/measured median {s['median_ratio']:.3f}, mean "
              f"{s['mean_ratio']:.3f}, MAPE {s['mape_pct']:.1f}%, fits (as read) "
              f"{s['fits']}/{s['n']}")


if __name__ == "__main__":
    main()
