"""How sure is a serving ranking?  Measured order agreement by predicted gap.

For every pair of held-out serving rows measured on the same question (source, engine,
model, GPU, precision, input/output lengths, concurrency) on different layouts, compare
the predicted order of their tokens/s per GPU with the measured one, and bin the pairs by
the predicted gap |log(pred_a / pred_b)|.  The held-out rows (``held_out`` = yes,
SERVING_RUNS.md) were kept out of every fit, so this is out of sample; the in-sample rows
publish one layout per question and give no pairs.  The tie band is the smallest bin edge
from which every bin kept the measured order in at least 95% of its pairs: ``parsearch
serve`` marks the layouts closer than that to its best as ties.

    python benchmarks/serving_order_confidence.py            # print the table
    python benchmarks/serving_order_confidence.py --write    # and update the shipped file

Result (2026-12-07, 508 pairs from the 553 held-out rows, first-wave stall rows left out):
under a predicted gap of 0.10 the measured order matched in 78.8% of 80 pairs (57% of 14
under 0.02), from 0.10 up in 99.5% of 428; tie band 0.10.  Nearly all close pairs are
TensorRT-LLM v0.13 sweep points (TP/PP of one model on the same GPUs); the vLLM and SGLang
sweeps compare TP sizes whose predicted per-GPU throughputs differ by more than 10%, so the
band is pooled over engines.  The band is measured on the rows whose top-5 share
``validate_serving.py`` reports "or tied with the best" beside: it labels the uncertainty
of those rankings, it does not improve them.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import sys
from collections import defaultdict
from typing import Any

import yaml
from serving_rows import is_held_out, load_rows
from validate_serving import evaluate_row, question

from parsearch.serve.confidence import GapBin, band_from_bins, confidence_path

#: Lower edges of the predicted-gap bins (|log ratio|).
EDGES = (0.0, 0.02, 0.04, 0.06, 0.08, 0.10, 0.12, 0.15, 0.20, 0.40)
MIN_RIGHT = 0.95


def pairs_of(results: list[dict[str, Any]]) -> list[tuple[float, bool, str]]:
    """(predicted gap, measured order matched, engine) of every same-question pair."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r["ape"] is not None and not r["stall"]:
            groups[question(r)].append(r)
    out = []
    for rows in groups.values():
        for a, b in itertools.combinations(rows, 2):
            predicted = math.log((a["predicted"] / a["gpus"]) / (b["predicted"] / b["gpus"]))
            measured = math.log((a["measured"] / a["gpus"]) / (b["measured"] / b["gpus"]))
            out.append((abs(predicted), (predicted > 0) == (measured > 0), a["engine"]))
    return out


def binned(pairs: list[tuple[float, bool, str]]) -> list[GapBin]:
    bins = []
    for lo, hi in zip(EDGES, (*EDGES[1:], math.inf), strict=True):
        inside = [ok for gap, ok, _ in pairs if lo <= gap < hi]
        bins.append(GapBin(lo, len(inside), sum(inside)))
    return bins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="write the table to cost_models/serving/order_confidence.yaml")
    args = parser.parse_args(argv)
    # the tie marks of these rows are not used here (tie_band 0): the band is measured
    results = [evaluate_row(row, tie_band=0.0) for row in load_rows()
               if is_held_out(row) and not row["phase"]]
    pairs = pairs_of(results)
    bins = binned(pairs)
    band = band_from_bins(bins, MIN_RIGHT)
    print(f"{len(pairs)} same-question pairs from {len(results)} held-out rows")
    for b, hi in zip(bins, (*EDGES[1:], math.inf), strict=True):
        engines = sorted({e for gap, _, e in pairs if b.gap <= gap < hi})
        print(f"  predicted gap {b.gap:.2f}-{hi:.2f}: {b.pairs:4d} pairs, measured order "
              f"kept {b.right:6.1%}  ({', '.join(engines) or '-'})")
    close = [ok for gap, ok, _ in pairs if gap < band]
    far = [ok for gap, ok, _ in pairs if gap >= band]
    print(f"tie band {band:.2f}: under it {sum(close) / max(len(close), 1):.1%} of "
          f"{len(close)} pairs kept their order, from it {sum(far) / max(len(far), 1):.1%} "
          f"of {len(far)}")
    if args.write:
        doc = {
            "measured": datetime.date.today().isoformat(),
            "source": ("benchmarks/serving_order_confidence.py: same-question pairs of the "
                       "held-out rows of src/parsearch/data/serving_runs.csv (SERVING_RUNS.md), "
                       "kept out of every fit"),
            "min_right": MIN_RIGHT,
            "tie_band": band,
            "bins": [{"gap": b.gap, "pairs": b.pairs, "kept": b.kept} for b in bins],
        }
        path = confidence_path()
        path.write_text("# Serving order confidence: measured order agreement of pairs of "
                        "layouts by predicted gap\n# |log(pred_a / pred_b)| (parsearch.serve."
                        "confidence).  Written by the benchmark named below.\n"
                        + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
