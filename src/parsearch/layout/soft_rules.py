"""The layout-space spec's soft rules: legal layouts that are likely slow, as flags.

``shared/spec/layout-space.md`` ("Soft rules") lists choices that are valid
but costly; the cost model prices them, and reports name them so a user sees
*why* a layout ranks low:

* TP (or ETP) spanning more than one NVLink domain;
* fewer micro-batches than pipeline stages (``m < pp``: more bubble than
  work), and no interleaving on a deep pipeline;
* EP groups that cross the network.

One more, not in the spec's list: tensor parallelism without sequence parallelism.
It is legal, but the norms' and dropouts' activations stay whole on every TP rank
(Korthikanti et al. 2022, arXiv 2205.05198 §4.2.2: sequence parallelism divides them by
t), and Megatron-LM accepts TP communication overlap only with it (``arguments.py``:
"Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is
enabled"); Megatron-Bridge's recipes turn it on whenever TP > 1.  A layout string that
leaves ``sp`` out gets ``sp=false``, so the flag also tells a user who meant the
recipes' default how to ask for it.
"""

from __future__ import annotations

from parsearch.layout import Layout
from parsearch.model.specs import TrainingSpec
from parsearch.topology.fabric import Fabric
from parsearch.topology.placement import group_strides

#: Pipelines at least this deep without interleaving are flagged.
DEEP_PIPELINE = 8


def soft_rule_flags(layout: Layout, fabric: Fabric, global_batch: int,
                    training: TrainingSpec | None = None) -> list[str]:
    """One sentence per soft rule ``layout`` breaks on ``fabric`` (empty: none).

    ``training`` (bounded to the software stack, :func:`parsearch.cost.stacks.stack_training`)
    drops the advice a user cannot take there: no flag for missing interleaving where the
    stack or ``--max-vpp 1`` rules it out, none for missing sequence parallelism where it
    is off, and EP groups placed as the stack places them (before MoE parallel folding too).

    >>> from parsearch.topology.cluster import load_cluster
    >>> from parsearch.topology.fabric import build_fabric
    >>> fabric = build_fabric(load_cluster("dgx-h100"), 64)
    >>> soft_rule_flags(Layout(64, tp=16, pp=4, sp=True), fabric, global_batch=4)
    ['tp=16 spans 2 NVLink domains: its collectives run over the network', \
'm=4 micro-batches for pp=4 stages: the pipeline bubble is as large as the work']
    """
    flags: list[str] = []
    interleaving = training is None or training.max_vpp is None or training.max_vpp > 1
    sequence_parallel = training is None or training.sequence_parallel != "off"
    strides = group_strides(layout.tp, layout.cp, layout.pp, layout.ep, layout.etp,
                            layout.num_gpus,
                            experts_fold=training is None or not training.experts_follow_tp)
    for kind in ("tp", "etp"):
        stride, size = strides[kind]
        if size > 1:
            link = fabric.group_link(int(stride), int(size))
            if link.nvlink_domains_spanned > 1:
                flags.append(f"{kind}={size} spans {link.nvlink_domains_spanned} NVLink "
                             "domains: its collectives run over the network")
    dp = layout.dp
    m = global_batch // (layout.mbs * dp) if dp else 0
    if layout.pp > 1 and 0 < m <= layout.pp:
        flags.append(f"m={m} micro-batches for pp={layout.pp} stages: the pipeline bubble is "
                     "as large as the work")
    if layout.pp >= DEEP_PIPELINE and layout.vpp == 1 and interleaving:
        flags.append(f"pp={layout.pp} without interleaving (vpp=1): a deep pipeline pays its "
                     "full bubble")
    stride, size = strides["ep"]
    if size > 1 and fabric.group_link(int(stride), int(size)).tier == "network":
        flags.append(f"ep={size} crosses the network: token all-to-all leaves the NVLink domain")
    if layout.tp > 1 and not layout.sp and sequence_parallel:
        flags.append(f"tp={layout.tp} without sequence parallelism: norm and dropout "
                     "activations stay whole on every TP rank and TP comm overlap is "
                     "unavailable; Megatron-Bridge recipes run sp=true whenever tp > 1 "
                     "(add sp=true to the layout)")
    return flags
