"""Launch settings generated from what the cost model priced.

:func:`launch_plan` resolves a layout and its :class:`~parsearch.cost.options.CostOptions`
into framework switches; :func:`launch_settings` writes them as Megatron-LM
arguments, Megatron-Bridge overrides and the torchrun / Slurm geometry;
:mod:`parsearch.launch.export` writes launch files for a shortlist.
"""

from parsearch.launch.geometry import NodeGeometry
from parsearch.launch.plan import FP8_RECIPE_CHOICES, LaunchPlan, launch_plan
from parsearch.launch.settings import LaunchSettings, launch_for_cluster, launch_settings

__all__ = ["FP8_RECIPE_CHOICES", "LaunchPlan", "LaunchSettings", "NodeGeometry",
           "launch_for_cluster", "launch_plan", "launch_settings"]
