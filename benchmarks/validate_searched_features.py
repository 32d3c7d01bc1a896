"""Held-out published runs priced as a user would get them: MoE features searched, not read.

``parsearch validate`` prices each published run with the features its public recipe
turned on (dispatcher, overlaps).  A new user gives no recipe: ``search`` and ``explain``
then choose the MoE dispatcher and overlaps per layout.  This script prices the held-out
Megatron-Bridge rows (models no fit touched, ``load_heldout_runs``) both ways and prints
MAPE, median APE and the share within 10%, MoE and dense apart, plus how often the chosen
features match the recipe's.

    python benchmarks/validate_searched_features.py
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.validation.published.published_runs import load_heldout_runs
from parsearch.validation.published.runs import ValidationRow, validate_runs

TARGET_MAPE = 0.12


def _summary(rows: list[ValidationRow]) -> str:
    if not rows:
        return "no rows"
    ape = np.array([r.ape for r in rows])
    return (f"{len(rows):3} rows  MAPE {ape.mean():6.1%}  median {np.median(ape):6.1%}  "
            f"within 10% {np.mean(ape <= 0.10):5.0%}")


def main() -> int:
    warnings.filterwarnings("ignore")
    runs = load_heldout_runs()
    read = validate_runs(runs).rows
    searched = validate_runs(runs, options=CostOptions(search_features=SEARCHABLE_FEATURES)).rows
    moe_models = {r.model for r in runs if r.is_moe}
    print("held-out Megatron-Bridge rows (models no fit touched), recipe-read vs searched:")
    for kind, pick in (("all", lambda r: True), ("MoE", lambda r: r.model in moe_models),
                       ("dense", lambda r: r.model not in moe_models)):
        print(f"  {kind:5} recipe-read  {_summary([r for r in read if pick(r)])}")
        print(f"  {kind:5} searched     {_summary([r for r in searched if pick(r)])}")
    mape = float(np.mean([r.ape for r in searched])) if searched else float("nan")
    status = "PASS" if mape <= TARGET_MAPE else "FAIL"
    print(f"{status}: searched-features MAPE {mape:.1%} (target <= {TARGET_MAPE:.0%})")
    return 0 if mape <= TARGET_MAPE else 1


if __name__ == "__main__":
    sys.exit(main())
