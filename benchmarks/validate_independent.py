"""Out-of-sample check: the shipped cost model on the independent references (issue 8, item 3).

    python benchmarks/validate_independent.py [--data CSV] [--json]

Scores ``src/parsearch/data/independent_runs.csv`` (provenance and results in
``INDEPENDENT_RUNS.md`` next to it) with the shipped hardware and efficiency
profiles.  The profiles are fitted by ``benchmarks/calibrate_efficiency.py`` to
``published_runs.csv`` only (``load_published_runs()`` with no path), so every
row here is out-of-sample.  Prints each scored row (predicted vs measured, the
measurement's conversion, every assumption the loader or the validation made),
per-source MAPE and mean predicted/measured ratio, and the skipped rows by
reason.  Every row is scored (no de-duplication: these sources have no
software releases for "latest wins" to choose between) and partially verified
rows are included, marked in the ``ver`` column.

Where validation had to read an unstated memory saving (recompute, FSDP) to
make the run fit, the prediction of the stated reading is printed too
(``stated``), with whether it fits: the reading is chosen by memory, never by
the measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from parsearch.cost.analytic import CostOptions, estimate
from parsearch.strict_json import strict_json
from parsearch.validation.published.published_runs import PublishedRun, read_published_runs
from parsearch.validation.published.recipes import load_run_setups
from parsearch.validation.published.runs import (
    ValidationRow,
    fabric_for,
    memory_saving_candidates,
    run_cost_model,
    validate_runs,
)

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / (
    "independent_runs.csv")


def stated_reading(run: PublishedRun, cache: dict, options: CostOptions) -> dict[str, Any]:
    """Prediction and memory of the run as stated (no unstated saving added)."""
    assert run.cluster is not None
    training, layout, _ = memory_saving_candidates(run)[0]
    fabric = fabric_for(cache, run.cluster, run.num_gpus)
    est = estimate(run_cost_model(run, fabric, options, training), layout)
    return {"predicted": est.tokens_per_s_per_gpu, "fits": est.fits,
            "memory_gib": est.memory_bytes["total"] / 2**30}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """n, MAPE, median APE and mean predicted/measured ratio of some rows."""
    apes = sorted(r["ape"] for r in rows)
    ratios = [r["ratio"] for r in rows]
    mid = len(apes) // 2
    median = (apes[mid] if len(apes) % 2 else (apes[mid - 1] + apes[mid]) / 2) if apes \
        else math.nan
    return {"n": len(rows), "mape": sum(apes) / len(apes) if apes else math.nan,
            "median_ape": median,
            "mean_ratio": sum(ratios) / len(ratios) if ratios else math.nan}


def build_report(path: Path) -> dict[str, Any]:
    """Every row scored or skipped, the per-source summaries and the skip reasons."""
    read = read_published_runs(path)
    runs = {run.id: run for run in read.runs}
    options = replace(CostOptions(), memory_margin=0.0)  # as validate_runs: these runs ran
    report = validate_runs(read.runs, deduplicate=False, include_partial=True)
    cache: dict = {}
    rows = [_row(r, runs[r.id], cache, options) for r in report.rows]
    by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_source[row["source"]].append(row)
    skipped = list(read.unreadable) + list(report.skipped)
    reasons: dict[str, list[str]] = defaultdict(list)
    for run_id, reason in skipped:
        reasons[reason].append(run_id)
    return {
        "data": str(path),
        "rows": rows,
        "by_source": {tag: summarise(members) for tag, members in sorted(by_source.items())},
        "verified_only": summarise([r for r in rows if r["verified"] == "yes"]),
        "all": summarise(rows),
        "skipped": [{"id": i, "reason": r} for i, r in skipped],
        "skipped_by_reason": {reason: ids for reason, ids in sorted(reasons.items())},
        "total_rows": len(read.runs) + len(read.unreadable),
    }


def _row(row: ValidationRow, run: PublishedRun, cache: dict,
         options: CostOptions) -> dict[str, Any]:
    assumed = list(run.assumptions) + ([row.assumed] if row.assumed else [])
    setup = load_run_setups().get(run.id)
    if setup is not None and setup.recompute is not None:
        # the source's own text states the recompute (run_setups.csv): not an assumption
        modules = f" ({' '.join(setup.recompute_modules)})" if setup.recompute_modules else ""
        assumed = [a for a in assumed if not a.startswith("recompute not stated")]
        assumed.append(f"recompute {setup.recompute}{modules} stated in {setup.locator}")
    out = {
        "id": row.id, "source": row.source, "verified": run.verified, "model": row.model,
        "num_gpus": row.num_gpus, "layout": row.layout_key,
        "precision": run.precision + (f" ({run.fp8_recipe})" if run.fp8_recipe else ""),
        "conversion": run.conversion, "measured": row.measured_tokens_per_s_per_gpu,
        "predicted": row.predicted_tokens_per_s_per_gpu,
        "ratio": row.predicted_tokens_per_s_per_gpu / row.measured_tokens_per_s_per_gpu,
        "ape": row.ape, "fits": row.fits, "memory_gib": row.memory_gib,
        "bottleneck": row.bottleneck, "assumed": assumed, "stated": None,
    }
    if row.assumed:  # validation added a saving the source does not state
        out["stated"] = stated_reading(run, cache, options)
    return out


def print_report(report: dict[str, Any]) -> None:
    print(f"data: {report['data']} ({report['total_rows']} rows); shipped profiles, "
          "out-of-sample (calibration reads published_runs.csv only)\n")
    print(f"{'id':6} {'source':11} {'ver':7} {'model':15} {'gpus':>6} {'layout':43} "
          f"{'prec':15} {'conversion':19} {'measured':>9} {'predicted':>9} {'ratio':>6} "
          f"{'APE':>6}  stated reading / assumed")
    for r in report["rows"]:
        stated = r["stated"]
        extra = "" if stated is None else (
            f"stated reading {stated['predicted']:,.0f} "
            f"({'fits' if stated['fits'] else 'OOM'} {stated['memory_gib']:.0f} GiB); ")
        print(f"{r['id']:6} {r['source']:11} {r['verified']:7} {r['model'][:15]:15} "
              f"{r['num_gpus']:>6} {r['layout']:43} {r['precision'][:15]:15} "
              f"{r['conversion']:19} {r['measured']:>9,.1f} {r['predicted']:>9,.1f} "
              f"{r['ratio']:>6.2f} {r['ape']:>6.1%}  {extra}{'; '.join(r['assumed']) or '-'}")
    print("\nper source (MAPE, median APE, mean predicted/measured):")
    for tag, s in report["by_source"].items():
        print(f"  {tag:12} n={s['n']:<3} MAPE {s['mape']:6.1%}  median {s['median_ape']:6.1%}"
              f"  mean ratio {s['mean_ratio']:.2f}")
    for label in ("verified_only", "all"):
        s = report[label]
        print(f"  {label:12} n={s['n']:<3} MAPE {s['mape']:6.1%}  median {s['median_ape']:6.1%}"
              f"  mean ratio {s['mean_ratio']:.2f}")
    n_skipped = len(report["skipped"])
    print(f"\nscored {len(report['rows'])}, skipped {n_skipped} of {report['total_rows']}:")
    for reason, ids in report["skipped_by_reason"].items():
        print(f"  {len(ids):3} {', '.join(ids)}: {reason}")


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = build_report(args.data)
    if args.json:
        print(json.dumps(strict_json(report), indent=1))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
