"""Launch settings of one priced layout: Megatron-LM arguments, Bridge overrides, geometry.

Everything here is generated from one :class:`~parsearch.launch.plan.LaunchPlan`
(what the cost model priced), so the spellings agree with each other and with
the estimate.

>>> from parsearch.layout import Layout
>>> from parsearch.model.specs import ModelSpec, TrainingSpec
>>> m = ModelSpec("toy", 8, 1024, 4096, 16, 16, 64, 32000)
>>> t = TrainingSpec(seq_len=4096, global_batch=64)
>>> s = launch_settings(m, t, Layout(num_gpus=16, tp=2, pp=2, sp=True), gpus_per_node=8)
>>> s.nodes, s.torchrun_args
(2, ('--nnodes', '2', '--nproc-per-node', '8'))
>>> s.bridge_overrides[0]
'++model.tensor_model_parallel_size=2'
>>> s.env[0]
('CUDA_DEVICE_MAX_CONNECTIONS', '1')
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parsearch.cost.options import CostOptions
from parsearch.launch.bridge import bridge_overrides
from parsearch.launch.geometry import NodeGeometry
from parsearch.launch.megatron_lm import megatron_lm_args
from parsearch.launch.names import bridge_groups, check_recipe, provenance
from parsearch.launch.plan import LaunchPlan, launch_plan
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.hardware import GpuProfile, load_gpu_profile

if TYPE_CHECKING:
    from parsearch.topology.cluster import ClusterSpec


@dataclass(frozen=True)
class LaunchSettings:
    """Scheduler geometry, environment and framework settings for one layout."""

    plan: LaunchPlan
    geometry: NodeGeometry
    megatron_lm_args: tuple[str, ...]
    bridge_overrides: tuple[str, ...]
    recipe: str | None = None

    @property
    def num_gpus(self) -> int:
        return self.geometry.num_gpus

    @property
    def nodes(self) -> int:
        return self.geometry.nodes

    @property
    def gpus_per_node(self) -> int:
        return self.geometry.gpus_per_node

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        return self.plan.env

    @property
    def conflicts(self) -> tuple[str, ...]:
        """Why Megatron cannot run exactly what was priced (empty: it can)."""
        return self.plan.conflicts

    @property
    def torchrun_args(self) -> tuple[str, ...]:
        return self.geometry.torchrun_args()

    def command_line(self) -> str:
        """The Megatron-LM arguments as one shell-safe string."""
        return shlex.join(self.megatron_lm_args)

    def bridge_command_line(self) -> str:
        """The Bridge overrides as one shell-safe string."""
        return shlex.join(self.bridge_overrides)

    def shell_snippet(self, *, script: str = "pretrain_gpt.py") -> str:
        """A ready-to-run bash snippet: environment, per-node geometry, both launchers."""
        lines = ["# Slurm: sbatch " + " ".join(self.geometry.slurm_args())
                 + f"  ({self.num_gpus} ranks; one torchrun per node)"]
        lines += [f"# cannot run as priced: {c}" for c in self.conflicts]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in self.env]
        lines.append(self.geometry.nproc_shell())
        launcher = ("torchrun " + shlex.join(self.geometry.torchrun_args()).replace(
            "'$NPROC_PER_NODE'", '"$NPROC_PER_NODE"')
            + ' --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"')
        lines.append("# Megatron-LM")
        lines += [f"# not settable on this command line: {g}" for g in self.plan.megatron_lm_gaps]
        lines.append(f"{launcher} {script} \\\n    " + self.command_line())
        recipe = self.recipe or "RECIPE_FUNCTION_config"
        lines.append(f"# Megatron-Bridge {provenance()['megatron_bridge']}")
        lines.append(f"{launcher} scripts/training/run_recipe.py --recipe {recipe} "
                     "--mode pretrain \\\n    " + self.bridge_command_line())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "num_gpus": self.num_gpus,
            "geometry": self.geometry.to_dict(),
            "env": dict(self.env),
            "megatron_bridge_recipe": self.recipe,
            "megatron_bridge_overrides": list(self.bridge_overrides),
            "megatron_lm_args": list(self.megatron_lm_args),
            "torchrun_args": list(self.torchrun_args),
            "conflicts": list(self.conflicts),
            "megatron_lm_gaps": list(self.plan.megatron_lm_gaps),
            "names_from": provenance(),
        }


def launch_settings(model: ModelSpec, training: TrainingSpec, layout: Layout, *,
                    gpus_per_node: int, options: CostOptions | None = None,
                    compute_capability: float | None = None,
                    nvlink_domain_size: int | None = None, fp8_recipe: str = "auto",
                    recipe: str | None = None) -> LaunchSettings:
    """Launch settings that reproduce ``layout`` as priced with ``options``."""
    plan = launch_plan(model, training, layout, options, compute_capability=compute_capability,
                       nvlink_domain_size=nvlink_domain_size or gpus_per_node,
                       gpus_per_node=gpus_per_node, fp8_recipe=fp8_recipe)
    return LaunchSettings(
        plan=plan, geometry=NodeGeometry(layout.num_gpus, gpus_per_node),
        megatron_lm_args=megatron_lm_args(model, plan),
        bridge_overrides=bridge_overrides(plan, bridge_groups()),
        recipe=None if recipe is None else check_recipe(recipe))


def launch_for_cluster(model: ModelSpec, training: TrainingSpec, layout: Layout,
                       cluster: ClusterSpec, *, options: CostOptions | None = None,
                       fp8_recipe: str = "auto", recipe: str | None = None,
                       gpu: GpuProfile | None = None) -> LaunchSettings:
    """:func:`launch_settings` with the node size, NVLink domain and GPU of ``cluster``.

    ``gpu``: the cluster's GPU profile when the caller has it (a cost model's
    ``fabric.gpu``), so a shortlist does not re-read the hardware file per entry.
    """
    if gpu is None:
        gpu = load_gpu_profile(cluster.gpu)
    return launch_settings(
        model, training, layout, gpus_per_node=cluster.gpus_per_node, options=options,
        compute_capability=gpu.compute_capability,
        nvlink_domain_size=cluster.nvlink_domain_size, fp8_recipe=fp8_recipe, recipe=recipe)


__all__ = ["LaunchSettings", "launch_for_cluster", "launch_settings"]
