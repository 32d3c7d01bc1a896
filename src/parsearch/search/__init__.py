"""Search for the best layouts: exhaustive (exact), optuna (large spaces), Pareto fronts.

The public API is :func:`search_layouts` and :func:`pareto_front`
(:mod:`parsearch.search.api`); :func:`write_plot` draws a front.  Only
:mod:`parsearch.search.optuna_search` imports optuna, and only when the
optuna method runs.
"""

from parsearch.launch import LaunchSettings, launch_settings
from parsearch.search.api import METHODS, pareto_front, search_layouts
from parsearch.search.arguments import gpu_counts_by_cluster, gpu_counts_for
from parsearch.search.pareto import hypervolume, pareto_mask
from parsearch.search.plot import write_plot
from parsearch.search.results import ParetoPoint, ParetoResult, SearchEntry, SearchResult

__all__ = [
    "METHODS",
    "LaunchSettings",
    "ParetoPoint",
    "ParetoResult",
    "SearchEntry",
    "SearchResult",
    "gpu_counts_by_cluster",
    "gpu_counts_for",
    "hypervolume",
    "launch_settings",
    "pareto_front",
    "pareto_mask",
    "search_layouts",
    "write_plot",
]
