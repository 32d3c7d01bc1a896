"""How fast a software stack's kernels run, relative to those the profiles were fitted on.

The efficiency profiles (``cost_models/efficiency``) were fitted on Megatron-Core runs,
whose attention is Transformer Engine's cuDNN fused attention.  A stack that runs other
kernels for the same work is priced through a *stack speed* file,
``cost_models/stacks/<stack>.yaml``: for each GPU generation (efficiency profile name),
the rate of its attention kernel as a fraction of the profile's, with its low-high range
and the measurement it comes from.  A stack without a file runs the profiles' kernels.

The rates are cited measurements, never fitted: the runs of that stack stay out of sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from parsearch.cost.efficiency import (
    EfficiencyProfile,
    ErrorBand,
    efficiency_for_gpu,
    parse_bands,
)
from parsearch.errors import SpecError
from parsearch.resources import data_dir


@dataclass(frozen=True)
class KernelRate:
    """One kernel's speed as a fraction of the profile's kernel for the same work."""

    value: float
    low: float
    high: float
    source: str


@dataclass(frozen=True)
class StackSpeed:
    """A stack's kernel rates per GPU generation (keys: efficiency profile names)."""

    name: str
    source: str
    attention_rate: dict[str, KernelRate]
    #: out-of-sample log(predicted/measured) band of this stack's published runs, by kind
    #: (``dense``/``moe``): the range an estimate on this stack carries
    uncertainty: dict[str, ErrorBand] = field(default_factory=dict)

    def attention_for(self, generation: str) -> KernelRate:
        """The attention rate on ``generation``; an unlisted one is an error that names
        the listed ones (a silent 1.0 would price the Megatron-Core kernel)."""
        try:
            return self.attention_rate[generation]
        except KeyError:
            raise SpecError(
                f"--stack {self.name}: no attention rate for GPU generation {generation!r} "
                f"in {stack_speed_path(self.name)} (it lists "
                f"{', '.join(sorted(self.attention_rate))}); add one with its source"
            ) from None


def stack_speed_path(stack_name: str) -> Path:
    return data_dir("cost_models") / "stacks" / f"{stack_name}.yaml"


def _rate(where: str, generation: str, raw: Any) -> KernelRate:
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: attention_rate.{generation} must be a mapping with value, "
                        "low, high and source")
    try:
        value, low, high = (float(raw[k]) for k in ("value", "low", "high"))
    except (KeyError, TypeError, ValueError):
        raise SpecError(f"{where}: attention_rate.{generation} needs numbers value, low and "
                        "high") from None
    if not 0.0 < low <= value <= high <= 1.5:
        raise SpecError(f"{where}: attention_rate.{generation}: need 0 < low <= value <= high "
                        f"<= 1.5, got value {value}, range [{low}, {high}]")
    if not str(raw.get("source", "")).strip():
        raise SpecError(f"{where}: attention_rate.{generation} has no source: every rate "
                        "names the measurement it comes from")
    return KernelRate(value, low, high, str(raw["source"]).strip())


def parse_stack_speed(where: str, data: Any) -> StackSpeed:
    """A stack speed document (``where`` names it in errors)."""
    if not isinstance(data, dict) or not isinstance(data.get("attention_rate"), dict):
        raise SpecError(f"{where}: a stack speed file is a mapping with name, source and "
                        "attention_rate (GPU generation -> value, low, high, source)")
    rates = {str(gen): _rate(where, str(gen), raw)
             for gen, raw in data["attention_rate"].items()}
    return StackSpeed(name=str(data.get("name", "")), source=str(data.get("source", "")),
                      attention_rate=rates,
                      uncertainty=parse_bands(where, data.get("uncertainty") or {}))


@cache
def load_stack_speed(stack_name: str) -> StackSpeed | None:
    """The shipped speed file of ``stack_name``; ``None``: it runs the profiles' kernels."""
    path = stack_speed_path(stack_name)
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML ({error})") from None
    return parse_stack_speed(str(path), data)


def stack_profile(stack_name: str, profile: EfficiencyProfile) -> EfficiencyProfile:
    """``profile`` with the kernels of ``stack_name``: forward and backward attention at
    the stack's rate (FlashAttention-2 through PyTorch SDPA against TE's cuDNN kernels:
    FlashAttention-3 paper arXiv 2407.08608, forward figure; pytorch/pytorch#142132).

    The profile's out-of-sample band was measured on Megatron-Core runs: the stack's own
    band (measured on its published runs) replaces it, and without one the estimate
    carries no range rather than a borrowed one.
    """
    speed = load_stack_speed(stack_name)
    if speed is None:
        return profile
    rate = speed.attention_for(profile.name).value
    return replace(
        profile,
        attention_forward_efficiency=profile.attention_forward_efficiency * rate,
        attention_backward_efficiency=profile.attention_backward_efficiency * rate,
        uncertainty=dict(speed.uncertainty),
        source=f"{profile.source}; attention at {rate:g} of it ({speed.name} kernels, "
               f"{stack_speed_path(stack_name).name})",
    )


def stack_profile_or_default(stack_name: str, profile: EfficiencyProfile | None,
                             gpu_name: str) -> EfficiencyProfile | None:
    """The profile to price ``stack_name`` with: ``profile`` (``None``: the GPU's default,
    left to the cost model) where the stack runs the profiles' kernels, else that profile
    with the stack's kernels (:func:`stack_profile`)."""
    if load_stack_speed(stack_name) is None:
        return profile
    return stack_profile(stack_name, profile or efficiency_for_gpu(gpu_name))
