"""Published runs against predictions: validation, calibration and cross-validation.

* :mod:`~parsearch.validation.runs`: score each published run and compare;
* :mod:`~parsearch.validation.calibration`: fit an efficiency profile's residual
  factors to measured runs, regularised toward cited priors, inside cited ranges;
* :mod:`~parsearch.validation.crossval`: out-of-sample accuracy (leave one model
  family or one source out), pairwise order accuracy and error bands.
"""

from parsearch.validation.runs import (
    GroupCorrelation,
    Reading,
    ValidationReport,
    ValidationRow,
    best_reading,
    fabric_for,
    memory_saving_candidates,
    run_cost_model,
    source_accounting,
    validate_runs,
)

__all__ = [
    "GroupCorrelation",
    "Reading",
    "ValidationReport",
    "ValidationRow",
    "best_reading",
    "fabric_for",
    "memory_saving_candidates",
    "run_cost_model",
    "source_accounting",
    "validate_runs",
]
