"""BigScience's BLOOM-176B layout trial on Jean Zay: measured vs predicted, per fabric.

    python benchmarks/bloom_throughput_trial.py [--json]

The rows are the ``BLOOM-TRIAL`` rows of ``src/parsearch/data/independent_runs.csv``
(provenance in ``INDEPENDENT_RUNS.md``): 18 layouts of one 181B GPT (72 layers, hidden
14336, 64 heads) on 384 A100 80GB, measured on 2022-02-25 with Megatron-DeepSpeed.  Each
row is priced three times, changing only the cluster:

* ``jean-zay-a100-80gb``: the cluster file, 4x Omni-Path 100 Gb/s per node, whose
  data-parallel collectives run at the efficiency BigScience measured for an NCCL
  all-reduce on 4 of those nodes a month before (``network_collective_efficiency`` 0.10,
  the file's ``sources``) while sends run at 0.92;
* the same file with its collectives at the sends' 0.92 (the field unset);
* ``dgx-a100``: 8x HDR 200 Gb/s per node, four times the bandwidth per GPU.

Every pricing uses what the trial's script turned on ("Megatron-DeepSpeed 2022" below:
ZeRO-1, FP16 gradients reduced in FP16, full recompute as stated, no FlashAttention, no TP
communication overlap, gradient reduction and parameter all-gather after the last
micro-batch), never a saving the source does not state; ``validate_independent.py``
reads the rows the same way (``runs.source_accounting``), and its figures are printed at
the end for comparison.

Result (2026-12-06): on the cluster file MAPE 7.4%, 117 of 152 pairs and 35 of 45 shapes
in the measured order, fastest (TP4 PP12) and slowest (TP8 PP2) shapes named right; with
its collectives at the sends' efficiency 11.4%, 77 and 29; on dgx-a100 17.2%, 74 and 28.

Order agreement counts concordant pairs (Kendall): all pairs of rows with different
layouts, and the ten (TP, PP) shapes of the trial, each at the micro-batch that measured
fastest.  A pair whose predictions tie counts as not concordant.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from parsearch.cost.analytic import CostOptions, Estimate, estimate
from parsearch.topology.cluster import load_cluster
from parsearch.topology.cluster_spec import ClusterSpec
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.published_runs import (
    PublishedRun,
    read_published_runs,
    training_spec,
)
from parsearch.validation.published.run_conventions import BLOOM_TRIAL
from parsearch.validation.published.runs import best_reading, run_cost_model

DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / "independent_runs.csv"


def trial_runs(path: Path = DATA) -> list[PublishedRun]:
    """The BLOOM layout-trial rows, in file order."""
    return [run for run in read_published_runs(path).runs if run.source_tag == BLOOM_TRIAL]


def clusters() -> dict[str, ClusterSpec]:
    """The three fabrics compared, by label."""
    jean_zay = load_cluster("jean-zay-a100-80gb")
    return {
        "jean-zay (file)": jean_zay,
        "collectives @0.92": replace(jean_zay, network_collective_efficiency=None),
        "dgx-a100": load_cluster("dgx-a100"),
    }


@dataclass(frozen=True)
class Priced:
    """One row on one fabric."""

    run: PublishedRun
    estimate: Estimate

    @property
    def measured(self) -> float:
        return float(self.run.measured_tokens_per_s_per_gpu or 0.0)

    @property
    def predicted(self) -> float:
        return self.estimate.tokens_per_s_per_gpu

    @property
    def measured_step_s(self) -> float:
        return self.run.global_batch * self.run.seq_len / (self.measured * self.run.num_gpus)


def price(runs: list[PublishedRun], cluster: ClusterSpec) -> list[Priced]:
    """Each run as stated on ``cluster``, with its source's accounting
    (``runs.source_accounting``: ZeRO-1, FP16 gradients, no overlaps, no FlashAttention)."""
    fabric = build_fabric(cluster, 384)
    options = replace(CostOptions(), memory_margin=0.0)
    return [Priced(run, estimate(run_cost_model(run, fabric, options, training_spec(run)),
                                 run.layout)) for run in runs]


def price_as_validate(runs: list[PublishedRun], cluster: ClusterSpec) -> list[tuple[float, float]]:
    """(measured, predicted) as ``validate_independent.py`` reads the rows (default
    accounting, the lightest unstated saving added when the stated reading does not fit)."""
    fabric = build_fabric(cluster, 384)
    options = replace(CostOptions(), memory_margin=0.0)
    return [(float(run.measured_tokens_per_s_per_gpu or 0.0),
             best_reading(run, fabric, options).estimate.tokens_per_s_per_gpu) for run in runs]


def shape(run: PublishedRun) -> tuple[int, int]:
    return run.layout.tp, run.layout.pp


def shape_name(run: PublishedRun) -> str:
    return f"TP{run.layout.tp} PP{run.layout.pp}"


def concordance(pairs: list[tuple[float, float]], keys: list[str]) -> tuple[int, int]:
    """(concordant, compared) over pairs of items with different ``keys``."""
    good = total = 0
    for (a, b) in combinations(range(len(pairs)), 2):
        if keys[a] == keys[b]:
            continue
        measured = pairs[a][0] - pairs[b][0]
        predicted = pairs[a][1] - pairs[b][1]
        if measured == 0:
            continue
        total += 1
        good += int(measured * predicted > 0)
    return good, total


def best_per_shape(priced: list[Priced]) -> list[Priced]:
    """The fastest-measured row of each (TP, PP) shape (the trial's own pick)."""
    best: dict[tuple[int, int], Priced] = {}
    for item in priced:
        key = shape(item.run)
        if key not in best or item.measured > best[key].measured:
            best[key] = item
    return list(best.values())


def mape(pairs: list[tuple[float, float]]) -> float:
    return float(np.mean([abs(p - m) / m for m, p in pairs]))


def summary(priced: list[Priced]) -> dict[str, Any]:
    pairs = [(p.measured, p.predicted) for p in priced]
    keys = [p.run.layout.key() for p in priced]
    good, total = concordance(pairs, keys)
    shapes = best_per_shape(priced)
    s_good, s_total = concordance([(p.measured, p.predicted) for p in shapes],
                                  [p.run.layout.key() for p in shapes])
    ranked = sorted(shapes, key=lambda p: -p.predicted)
    return {
        "n": len(priced), "mape": mape(pairs),
        "mean_ratio": float(np.mean([p / m for m, p in pairs])),
        "concordant": good, "pairs": total,
        "shapes": len(shapes), "shape_concordant": s_good, "shape_pairs": s_total,
        "predicted_fastest_shape": shape_name(ranked[0].run),
        "predicted_slowest_shape": shape_name(ranked[-1].run),
        "all_fit": all(p.estimate.fits for p in priced),
    }


def residual_fit(priced: list[Priced], line_efficiency: float) -> dict[str, float]:
    """Measured step time minus predicted, fitted as ``a + b x dp_comm`` (least squares).

    If the data-parallel traffic truly ran at efficiency ``e`` while the prediction used
    ``line_efficiency``, its time is ``dp_comm x line_efficiency / e``, so the residual
    grows as ``dp_comm x (line_efficiency / e - 1)`` and ``e = line_efficiency / (1 + b)``.
    The same fit on ``pp_p2p`` tests the pipeline sends.
    """
    residual = np.array([p.measured_step_s - p.estimate.step_time_s for p in priced])
    out: dict[str, float] = {}
    for term in ("dp_comm", "pp_p2p"):
        x = np.array([p.estimate.time_s.get(term, 0.0) for p in priced])
        design = np.column_stack([np.ones_like(x), x])
        (a, b), *_ = np.linalg.lstsq(design, residual, rcond=None)
        fitted = design @ np.array([a, b])
        ss_res = float(np.sum((residual - fitted) ** 2))
        ss_tot = float(np.sum((residual - residual.mean()) ** 2))
        out[f"{term}_intercept_s"] = float(a)
        out[f"{term}_slope"] = float(b)
        out[f"{term}_r2"] = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
        out[f"{term}_implied_efficiency"] = (line_efficiency / (1.0 + b)
                                             if b > -1.0 else math.nan)
    return out


def build_report(path: Path = DATA) -> dict[str, Any]:
    runs = trial_runs(path)
    fabrics = clusters()
    priced = {label: price(runs, cluster) for label, cluster in fabrics.items()}
    validate = {}
    for label in ("jean-zay (file)", "dgx-a100"):
        pairs = price_as_validate(runs, fabrics[label])
        good, total = concordance(pairs, [r.layout.key() for r in runs])
        validate[label] = {"mape": mape(pairs), "concordant": good, "pairs": total}
    file_label = "collectives @0.92"
    rows = []
    for i, run in enumerate(runs):
        row: dict[str, Any] = {
            "id": run.id, "tp": run.layout.tp, "pp": run.layout.pp, "dp": run.layout.dp,
            "mbs": run.layout.mbs, "gbs": run.global_batch,
            "measured": float(run.measured_tokens_per_s_per_gpu or 0.0),
            "measured_step_s": priced[file_label][i].measured_step_s,
        }
        for label, items in priced.items():
            est = items[i].estimate
            row[label] = {"predicted": est.tokens_per_s_per_gpu, "step_s": est.step_time_s,
                          "fits": est.fits, "memory_gib": est.memory_bytes["total"] / 2**30,
                          "dp_comm_s": est.time_s.get("dp_comm", 0.0),
                          "pp_p2p_s": est.time_s.get("pp_p2p", 0.0),
                          "tp_comm_s": est.time_s.get("tp_comm", 0.0)}
        rows.append(row)
    return {
        "data": str(path),
        "rows": rows,
        "summary": {label: summary(items) for label, items in priced.items()},
        "validate_path": validate,
        "residual_fit": residual_fit(priced[file_label], fabrics[file_label].network_efficiency),
    }


def print_report(report: dict[str, Any]) -> None:
    labels = list(report["summary"])
    print(f"data: {report['data']} (BLOOM-TRIAL rows); accounting: Megatron-DeepSpeed 2022 "
          "as stated (ZeRO-1, FP16 grads, full recompute, no FlashAttention, no overlaps)\n")
    head = " ".join(f"{label:>16}" for label in labels)
    print(f"{'id':6} {'TP':>2} {'PP':>3} {'DP':>3} {'MBS':>3} {'GBS':>5} {'meas s/it':>9} "
          f"{'measured':>8} {head}   DP s")
    for row in report["rows"]:
        cells = " ".join(
            f"{row[label]['predicted']:>9.1f} ({row[label]['predicted'] / row['measured']:.2f})"
            for label in labels)
        print(f"{row['id']:6} {row['tp']:>2} {row['pp']:>3} {row['dp']:>3} {row['mbs']:>3} "
              f"{row['gbs']:>5} {row['measured_step_s']:>9.2f} {row['measured']:>8.1f} {cells}"
              f"   {row[labels[0]]['dp_comm_s']:>4.1f}")
    print("\n(tokens/s per GPU; predicted/measured in brackets)\n")
    for label, s in report["summary"].items():
        print(f"{label:16} MAPE {s['mape']:6.1%}  mean ratio {s['mean_ratio']:.2f}  "
              f"concordant {s['concordant']}/{s['pairs']} pairs of layouts, "
              f"{s['shape_concordant']}/{s['shape_pairs']} of the {s['shapes']} shapes; "
              f"predicted fastest {s['predicted_fastest_shape']}, slowest "
              f"{s['predicted_slowest_shape']}; all fit: {s['all_fit']}")
    print("\nvalidate_independent.py's reading (default accounting, savings added to fit):")
    for label, s in report["validate_path"].items():
        print(f"  {label:16} MAPE {s['mape']:6.1%}  concordant {s['concordant']}/{s['pairs']}")
    fit = report["residual_fit"]
    print("\nmeasured minus predicted step time (collectives at 0.92) against the predicted "
          "terms:")
    for term in ("dp_comm", "pp_p2p"):
        implied = fit[term + "_implied_efficiency"]
        reading = (f"implied network efficiency of that traffic {implied:.2f}"
                   if fit[term + "_slope"] > 0 else "no sign that this traffic ran slower")
        print(f"  {term:8} residual = {fit[term + '_intercept_s']:+.1f} s "
              f"{fit[term + '_slope']:+.2f} x {term}  (R^2 {fit[term + '_r2']:.2f}; {reading})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = build_report()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
