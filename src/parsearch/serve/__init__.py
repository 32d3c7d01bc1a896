"""Serving layouts: the smallest group that carries the load, and how many replicas.

``serve_layouts`` (in :mod:`parsearch.serve.api`) is the entry point; the space rules are in
:mod:`parsearch.serve.space`, KV-cache sizes in :mod:`parsearch.serve.kv_cache`, memory in
:mod:`parsearch.serve.memory`, step times in :mod:`parsearch.serve.cost`, whole-group scores
in :mod:`parsearch.serve.evaluate`, the Pareto front in :mod:`parsearch.serve.front` and
launch lines in :mod:`parsearch.serve.launch`.
"""

from parsearch.serve.api import ServeEntry, ServeResult, serve_layouts
from parsearch.serve.evaluate import ServingEstimate
from parsearch.serve.spec import ServingLayout, ServingWorkload, SlidingWindow

__all__ = ["ServeEntry", "ServeResult", "ServingEstimate", "ServingLayout", "ServingWorkload",
           "SlidingWindow", "serve_layouts"]
