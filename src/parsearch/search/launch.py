"""Compatibility import: launch settings moved to :mod:`parsearch.launch`."""

from parsearch.launch import LaunchSettings, launch_for_cluster, launch_settings
from parsearch.launch.geometry import NodeGeometry
from parsearch.launch.plan import pipeline_layout_string


def nodes_for(num_gpus: int, gpus_per_node: int) -> int:
    """Nodes to ask the scheduler for (the last one may be partial)."""
    return NodeGeometry(num_gpus, gpus_per_node).nodes


__all__ = ["LaunchSettings", "NodeGeometry", "launch_for_cluster", "launch_settings", "nodes_for",
           "pipeline_layout_string"]
