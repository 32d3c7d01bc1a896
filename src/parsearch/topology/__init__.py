"""GPU hardware and cluster descriptions, their topology graphs and the scoring fabric.

* :mod:`.gpu_profile`: ``GpuProfile`` and reading one datasheet profile file;
* :mod:`.cluster_spec`: ``ClusterSpec``, a cluster in SI units, checked on construction;
* :mod:`.power` and :mod:`.variants` (above those two): a GPU under a power limit or clock
  lock, or with other memory (``h100-sxm@power_limit_W=500``, ``cluster_variant``);
* :mod:`.hardware` (above the variants): ``load_gpu_profile``, any GPU by name, datasheet
  part or variant (``GpuProfile`` and the file reading re-exported);
* :mod:`.cluster` (above the variants): the YAML cluster files (``load_cluster``), whose
  ``gpu_*`` fields name a variant (``ClusterSpec`` re-exported);
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
