"""GPU hardware and cluster descriptions, their topology graphs and the scoring fabric.

* :mod:`.hardware`: ``GpuProfile``, the GPU datasheet profiles (``load_gpu_profile``);
* :mod:`.power` and :mod:`.variants`: a GPU under a power limit or clock lock, or with other
  memory (``h100-sxm@power_limit_W=500``, ``cluster_variant``);
* :mod:`.cluster`: ``ClusterSpec`` and the YAML cluster files (``load_cluster``);
* :mod:`.graph`: ``build_graph`` / ``validate_graph`` (``networkx``);
* :mod:`.fabric`: ``build_fabric`` -> ``Fabric`` with ``group_link(stride, size)``.
"""

from parsearch.topology.cluster import ClusterSpec, list_clusters, load_cluster, preset_names
from parsearch.topology.fabric import Fabric, GroupLink, build_fabric
from parsearch.topology.graph import build_graph, validate_graph

__all__ = [
    "ClusterSpec",
    "Fabric",
    "GroupLink",
    "build_fabric",
    "build_graph",
    "list_clusters",
    "load_cluster",
    "preset_names",
    "validate_graph",
]
