"""The memory-bound factor's prior sits where the cited cast-bandwidth measurements put it.

Transformer Engine's GEMM profiling guide times each layer with and without the FP8 casts
(autocast minus pre-quantized); ``cost_models/references/microbenchmarks.yaml`` records
the casts' effective bandwidth as a share of the HBM peak (kind ``cast_bandwidth``).  Our
memory-bound time moves bytes at the profile's ``hbm_efficiency``, so a cast running at a
share ``b`` of the peak is a factor ``hbm_efficiency / b`` over our rate.  A generation
with such a measurement starts its fit there (the geometric middle of the range the
measurement allows) and keeps the whole measured range inside its cited bounds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from parsearch.cost.efficiency import efficiency_for_gpu

REFERENCES = Path(__file__).resolve().parents[1] / "cost_models" / "references"


def _cast_measurements() -> list[dict]:
    data = yaml.safe_load((REFERENCES / "microbenchmarks.yaml").read_text(encoding="utf-8"))
    entries = [e for e in data["entries"] if e.get("kind") == "cast_bandwidth"]
    assert entries, "microbenchmarks.yaml lost its cast_bandwidth entries"
    return entries


@pytest.mark.parametrize("entry", _cast_measurements(), ids=lambda e: e["gpu"])
def test_memory_bound_prior_is_the_middle_of_the_measured_cast_factor(entry: dict) -> None:
    low_share, high_share = (float(x) for x in str(entry["value"]).split("-"))
    profile = efficiency_for_gpu(entry["gpu"])
    rate = profile.priors["hbm_efficiency"].value
    factor_low, factor_high = rate / high_share, rate / low_share
    prior = profile.priors["memory_bound_factor"]
    assert prior.low <= factor_low < factor_high <= prior.high
    assert prior.value == pytest.approx(math.sqrt(factor_low * factor_high), abs=0.01)
