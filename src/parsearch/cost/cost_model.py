"""The inputs of a scoring: :class:`CostModel`, everything the scorer needs besides the
layouts.

:func:`parsearch.cost.analytic.build_cost_model` builds one (and
:mod:`parsearch.cost.analytic` re-exports the type); the modules that price parts of a
layout for the scorer (:mod:`parsearch.cost.unit_prices`,
:mod:`parsearch.cost.feature_search`) take one, so the type sits below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.cost.options import CostOptions
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.fabric import Fabric


@dataclass(frozen=True)
class CostModel:
    """Everything the scorer needs besides the layouts: workload, fabric, profile, options."""

    model: ModelSpec
    training: TrainingSpec
    fabric: Fabric
    profile: EfficiencyProfile
    options: CostOptions
    #: feature sets each layout is also priced with (:mod:`parsearch.cost.feature_search`)
    variants: tuple[CostOptions, ...] = ()
    #: cost models derived from this one (e.g. under a memory setting), built once per
    #: instance; not part of its value (``replace`` starts an empty one)
    derived: dict[Any, CostModel] = field(default_factory=dict, init=False, repr=False,
                                          compare=False, hash=False)


__all__ = ["CostModel"]
