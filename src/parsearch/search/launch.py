"""What a user needs to launch a layout: Megatron settings and the node count.

Two spellings of the same settings:

* Megatron-Bridge recipe overrides (Hydra/OmegaConf ``group.field=value``,
  e.g. ``model.tensor_model_parallel_size=2``), the ``ConfigContainer``
  fields that mirror Megatron-LM's arguments;
* Megatron-LM ``pretrain_gpt.py`` arguments (``--tensor-model-parallel-size 2``).

Pipeline split: an even split with interleaving is
``--num-layers-per-virtual-pipeline-stage``; an uneven split is written out
stage by stage with ``--pipeline-model-parallel-layout`` (``E`` embedding,
``t`` transformer layer, ``m`` MTP layer, ``L`` loss; stages separated by
``|`` in virtual-stage order), which is the split the cost model priced
(:mod:`parsearch.cost.stages`).  Precision is only given as Megatron-LM
flags: Bridge recipes choose it through their mixed-precision recipe name.

>>> from parsearch.layout import Layout
>>> from parsearch.workload import ModelSpec, TrainingSpec
>>> m = ModelSpec("toy", 8, 1024, 4096, 16, 16, 64, 32000)
>>> t = TrainingSpec(seq_len=4096, global_batch=64)
>>> s = launch_settings(m, t, Layout(num_gpus=16, tp=2, pp=2, sp=True), gpus_per_node=8)
>>> s.nodes, s.megatron_lm_args[:4]
(2, ('--tensor-model-parallel-size', '2', '--pipeline-model-parallel-size', '2'))
>>> s.torchrun_args
('--nnodes', '2', '--nproc-per-node', '8')
>>> s.bridge_overrides[0]
'model.tensor_model_parallel_size=2'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from parsearch.cost.stages import virtual_stage_layer_counts
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.workload import ModelSpec, TrainingSpec

_PRECISION_ARGS: dict[str, tuple[str, ...]] = {
    "bf16": ("--bf16",),
    "fp8": ("--bf16", "--fp8-format", "hybrid"),
    "fp4": ("--bf16", "--fp4-format", "e2m1"),
}


@dataclass(frozen=True)
class LaunchSettings:
    """Scheduler request and framework settings for one layout."""

    num_gpus: int
    nodes: int
    gpus_per_node: int
    bridge_overrides: tuple[str, ...]
    megatron_lm_args: tuple[str, ...]

    @property
    def torchrun_args(self) -> tuple[str, ...]:
        """``torchrun`` arguments for the launcher (processes per node, nodes)."""
        per_node = min(self.num_gpus, self.gpus_per_node)
        return ("--nnodes", str(self.nodes), "--nproc-per-node", str(per_node))

    def command_line(self) -> str:
        """The Megatron-LM arguments as one shell-ready string."""
        return " ".join(_quote(a) for a in self.megatron_lm_args)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "num_gpus": self.num_gpus,
            "megatron_bridge_overrides": list(self.bridge_overrides),
            "megatron_lm_args": list(self.megatron_lm_args),
            "torchrun_args": list(self.torchrun_args),
        }


def _quote(arg: str) -> str:
    return f'"{arg}"' if any(ch in arg for ch in "|*() ") else arg


def nodes_for(num_gpus: int, gpus_per_node: int) -> int:
    """Nodes to ask the scheduler for: ``ceil(num_gpus / gpus_per_node)``.

    >>> nodes_for(12, 8)
    2
    """
    if gpus_per_node < 1:
        raise SpecError(f"launch: gpus_per_node must be >= 1, got {gpus_per_node}")
    return math.ceil(num_gpus / gpus_per_node)


def pipeline_layout_string(model: ModelSpec, pp: int, vpp: int, split: str) -> str | None:
    """Megatron's ``--pipeline-model-parallel-layout`` for an uneven split, else ``None``.

    >>> m = ModelSpec("toy", 30, 1024, 4096, 16, 16, 64, 32000)
    >>> pipeline_layout_string(m, 4, 1, "uneven")
    'Et*7|(t*8|)*2t*7L'
    >>> pipeline_layout_string(m, 4, 2, "uneven")
    'Et*3|(t*4|)*6t*3L'
    >>> pipeline_layout_string(m, 3, 1, "uneven") is None
    True
    """
    counts = virtual_stage_layer_counts(model.num_layers, pp, vpp, split)
    if len(set(counts)) == 1:
        return None
    def layers(count: int) -> str:
        return f"t*{count}" if count > 1 else "t" * count

    first = "E" + layers(counts[0])
    last = layers(counts[-1]) + "m" * model.mtp_layers + "L"
    if len(counts) == 1:
        return first + last[len(layers(counts[-1])):]
    middle = ""
    j = 1
    while j < len(counts) - 1:  # runs of equal stages as "(t*k|)*n"
        run = 1
        while j + run < len(counts) - 1 and counts[j + run] == counts[j]:
            run += 1
        stage = layers(counts[j]) + "|"
        middle += f"({stage})*{run}" if run > 1 else stage
        j += run
    return f"{first}|{middle}{last}"


def launch_settings(model: ModelSpec, training: TrainingSpec, layout: Layout, *,
                    gpus_per_node: int) -> LaunchSettings:
    """Megatron-Bridge overrides, Megatron-LM arguments and the node count for ``layout``."""
    lay = layout
    bridge: list[str] = [
        f"model.tensor_model_parallel_size={lay.tp}",
        f"model.pipeline_model_parallel_size={lay.pp}",
        f"model.context_parallel_size={lay.cp}",
    ]
    args: list[str] = [
        "--tensor-model-parallel-size", str(lay.tp),
        "--pipeline-model-parallel-size", str(lay.pp),
        "--context-parallel-size", str(lay.cp),
    ]
    if model.is_moe:
        bridge += [f"model.expert_model_parallel_size={lay.ep}",
                   f"model.expert_tensor_parallel_size={lay.etp}"]
        args += ["--expert-model-parallel-size", str(lay.ep),
                 "--expert-tensor-parallel-size", str(lay.etp)]
    if lay.pp > 1:
        custom = pipeline_layout_string(model, lay.pp, lay.vpp, training.pipeline_split)
        if custom is not None:
            bridge.append(f"model.pipeline_model_parallel_layout='{custom}'")
            args += ["--pipeline-model-parallel-layout", custom]
        elif lay.vpp > 1:
            per_stage = model.num_layers // (lay.pp * lay.vpp)
            bridge.append(f"model.virtual_pipeline_model_parallel_size={lay.vpp}")
            args += ["--num-layers-per-virtual-pipeline-stage", str(per_stage)]
    bridge.append(f"model.sequence_parallel={'true' if lay.sp else 'false'}")
    if lay.sp:
        args.append("--sequence-parallel")
    bridge += [f"train.micro_batch_size={lay.mbs}",
               f"train.global_batch_size={training.global_batch}",
               f"model.seq_length={training.seq_len}",
               f"dataset.sequence_length={training.seq_len}"]
    args += ["--micro-batch-size", str(lay.mbs),
             "--global-batch-size", str(training.global_batch),
             "--seq-length", str(training.seq_len)]
    if lay.recompute == "selective":
        bridge.append("model.recompute_granularity=selective")
        args += ["--recompute-granularity", "selective"]
    elif lay.recompute == "full":
        bridge += ["model.recompute_granularity=full", "model.recompute_method=uniform",
                   "model.recompute_num_layers=1"]
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    distributed = "true" if training.distributed_optimizer else "false"
    bridge += [f"ddp.use_distributed_optimizer={distributed}",
               f"optimizer.use_distributed_optimizer={distributed}"]
    if training.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    args += list(_PRECISION_ARGS.get(training.precision, ()))
    return LaunchSettings(
        num_gpus=lay.num_gpus,
        nodes=nodes_for(lay.num_gpus, gpus_per_node),
        gpus_per_node=gpus_per_node,
        bridge_overrides=tuple(bridge),
        megatron_lm_args=tuple(args),
    )


__all__ = ["LaunchSettings", "launch_settings", "nodes_for", "pipeline_layout_string"]
