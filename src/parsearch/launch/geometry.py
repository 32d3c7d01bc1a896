"""Where the ranks go: the node count and processes per node for torchrun and Slurm.

Megatron's world size must equal the layout's GPU count exactly
(``tp·pp·cp·dp``, ``megatron/core/parallel_state.py``), so a layout whose
GPU count does not fill its last node gets a partial last node, never a
rounded-up rank count.  torchrun's elastic agent assigns global ranks from
each node's own ``--nproc-per-node`` (``torch.distributed.elastic`` agent,
ranks as a prefix sum over the local world sizes), so the last node simply
runs fewer processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from parsearch.errors import SpecError


@dataclass(frozen=True)
class NodeGeometry:
    """``num_gpus`` ranks packed onto nodes of ``gpus_per_node`` GPUs, one rank per GPU.

    >>> g = NodeGeometry(100, 8)
    >>> g.nodes, g.full_nodes, g.last_node_gpus, g.uniform
    (13, 12, 4, False)
    >>> g.per_node_groups()
    ((12, 8), (1, 4))
    >>> sum(count * nproc for count, nproc in g.per_node_groups())
    100
    """

    num_gpus: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        for name in ("num_gpus", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"launch: {name} must be a positive integer, got {value!r}")

    @property
    def nodes(self) -> int:
        return -(-self.num_gpus // self.gpus_per_node)

    @property
    def full_nodes(self) -> int:
        return self.num_gpus // self.gpus_per_node

    @property
    def last_node_gpus(self) -> int:
        """GPUs used on a partial last node (0 when every node is full)."""
        return self.num_gpus % self.gpus_per_node if self.num_gpus > self.gpus_per_node else 0

    @property
    def uniform(self) -> bool:
        return self.last_node_gpus == 0

    @property
    def procs_per_node(self) -> int:
        """Processes on every full node (all nodes when uniform)."""
        return min(self.num_gpus, self.gpus_per_node)

    def per_node_groups(self) -> tuple[tuple[int, int], ...]:
        """``(node count, processes per node)`` groups, full nodes first."""
        if self.uniform:
            return ((self.nodes, self.procs_per_node),)
        return ((self.full_nodes, self.gpus_per_node), (1, self.last_node_gpus))

    def torchrun_args(self) -> tuple[str, ...]:
        """torchrun geometry; a partial last node reads its count from ``$NPROC_PER_NODE``."""
        nproc = str(self.procs_per_node) if self.uniform else "$NPROC_PER_NODE"
        return ("--nnodes", str(self.nodes), "--nproc-per-node", nproc)

    def slurm_args(self) -> tuple[str, ...]:
        """sbatch/srun request: one launcher task per node, the exact rank count in total."""
        return (f"--nodes={self.nodes}", "--ntasks-per-node=1",
                f"--gpus-per-node={self.gpus_per_node}")

    def nproc_shell(self) -> str:
        """A shell line setting ``NPROC_PER_NODE`` for this node (by ``$SLURM_NODEID``)."""
        if self.uniform:
            return f"NPROC_PER_NODE={self.procs_per_node}"
        return (f'NPROC_PER_NODE=$(( ${{SLURM_NODEID:?run under Slurm or set SLURM_NODEID}} '
                f'< {self.full_nodes} ? {self.gpus_per_node} : {self.last_node_gpus} ))')

    def to_dict(self) -> dict[str, object]:
        return {"num_gpus": self.num_gpus, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node,
                "processes_per_node": [[count, nproc] for count, nproc in self.per_node_groups()],
                "torchrun_args": list(self.torchrun_args()),
                "slurm_args": list(self.slurm_args())}


__all__ = ["NodeGeometry"]
