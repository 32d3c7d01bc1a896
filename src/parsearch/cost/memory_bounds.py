"""The least memory a layout may reach under the searched memory features: the search's
filter (a layout that does not fit even so is never priced) and its model-state floor.

Built on :mod:`parsearch.cost.memory_features` (the settings) and never imported by it.
"""

from __future__ import annotations

from dataclasses import replace

from parsearch.cost.cost_model import CostModel
from parsearch.cost.memory_features import (
    memory_settings,
    searches_memory_features,
    searches_module_offload,
    searches_offload,
    with_setting,
)
from parsearch.cost.offload import max_offload_layers
from parsearch.model.offload_modules import module_offload_chain, offload_allowed_with


def most_offloaded(cm: CostModel) -> CostModel | None:
    """``cm`` under its least-memory setting with the most layers offloaded Megatron allows
    (``None`` where offload is not searched): the least memory a layout
    :func:`~parsearch.cost.offload.offload_allowed` may reach."""
    if not searches_offload(cm):
        return None
    least = memory_settings(cm)[-1][-1]
    return with_setting(cm, replace(least, offload_layers=max_offload_layers(cm.model)))


def least_memory(cm: CostModel, *, offload: bool = True) -> CostModel:
    """``cm`` under the setting that holds the least memory (every saving on).

    Where offload is searched that includes the most layers offloaded (``offload=False``:
    without them).  The memory model applies it to every row, so for layouts Megatron does
    not offload on (``pp > 1`` or recompute) this is below their least: a filter that keeps
    every layout that may fit, not a price.
    """
    if not searches_memory_features(cm):
        return cm
    offloaded = most_offloaded(cm) if offload else None
    if offloaded is not None:
        return offloaded
    least = memory_settings(cm)[-1][-1]
    if searches_module_offload(cm):  # every module Megatron offloads beside that recompute
        modules = [m for m in module_offload_chain(cm.model.moe is not None)
                   if offload_allowed_with(least.recompute_modules, m)]
        if modules:
            least = replace(least, offload_modules=modules[-1])
    return with_setting(cm, least)


def least_memory_models(cm: CostModel, *, offload: bool = True) -> tuple[CostModel, ...]:
    """:func:`least_memory`, and where it could not offload the expert modules (the ``moe``
    recompute module, which Megatron-Core does not run beside them) the same setting
    without ``moe`` recompute and with every module offloaded: a row fits under some
    setting only if it fits under one of these (a filter; take the smaller per row)."""
    first = least_memory(cm, offload=offload)
    if cm.model.moe is None or not searches_module_offload(cm) or (
            offload and most_offloaded(cm) is not None):
        return (first,)
    least = memory_settings(cm)[-1][-1]
    if "moe" not in least.recompute_modules:
        return (first,)
    other = replace(least, recompute_modules=tuple(m for m in least.recompute_modules
                                                   if m != "moe"),
                    offload_modules=module_offload_chain(True)[-1])
    return first, with_setting(cm, other)


__all__ = ["least_memory", "least_memory_models", "most_offloaded"]
