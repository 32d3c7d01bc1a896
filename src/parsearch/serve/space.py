"""The serving layout space: every rule written once, and an enumerator that generates it.

A serving instance is (tp, attention_dp, pp, ep, batch); ``replicas`` copies fill the
GPU budget.  The rules (ids ``S1``...) are checked by :func:`serving_violations`, the
single place they are written; :func:`enumerate_serving_layouts` generates candidates
from divisors and powers of two and keeps those without violations.  Whether a layout
fits in memory is a cost-model output (``fits``), as on the training side.

Sources of the rules: vLLM ``parallel_state``/``QKVParallelLinear`` (heads split over TP,
KV heads replicated when TP exceeds them), vLLM/SGLang expert-parallel MoE (experts split
over the ``tp * dp`` ranks), and the practice of keeping TP inside one NVLink domain
(vLLM docs "Distributed inference and serving": TP within a node, PP across nodes), and
an instance either inside one node or on whole nodes (multi-node engines are launched
one process group per node, vLLM/SGLang ``--nnodes``).  Attention DP exists only where the
engine offers it: TensorRT-LLM's TensorRT-engine workflow maps a model by ``trtllm-build``
``--tp_size``/``--pp_size`` and the checkpoint converter's ``--moe_tp_size``/
``--moe_ep_size`` (v0.13.0 docs), with no attention-DP mapping; attention DP is its PyTorch
backend's ``enable_attention_dp`` (LLM API), so a ``tensorrt_engine`` workload keeps
``attention_dp`` 1 (rule S12).  vLLM's expert parallelism is all or nothing: with
``--enable-expert-parallel`` the MoE layers flatten TP and DP into one EP group of
``tp * dp`` ranks (vllm-project/vllm ``FusedMoEParallelConfig.make``: ``use_ep`` sets
``ep_size`` to the flattened ``dp_size * tp_size``), so an engine ``vllm`` workload keeps
``ep`` at 1 or the stage width (rule S13); SGLang's ``--ep-size`` and TensorRT-LLM's
``moe_expert_parallel_size`` take any divisor.
"""

from __future__ import annotations

import math

from parsearch.errors import NoValidLayoutError, Violation
from parsearch.model.specs import ModelSpec
from parsearch.serve.spec import ServingLayout, ServingWorkload


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``."""
    return [2**k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


def fill_replicas(layout_gpus: int, num_gpus: int) -> int:
    """Copies of an instance of ``layout_gpus`` GPUs that fit in ``num_gpus``."""
    return num_gpus // layout_gpus


def batch_candidates(workload: ServingWorkload, replicas: int, attention_dp: int = 1) -> list[int]:
    """Batches (requests in flight per instance) the space considers.

    Fixed ``concurrency``: the total is spread over the replicas (ceil).  Otherwise each
    attention-DP rank runs a power of two up to ``max_batch`` requests (``max_batch`` is
    per engine, like vLLM's ``--max-num-seqs`` of each data-parallel engine; CUDA graphs
    are captured at such sizes, TensorRT-LLM perf-overview ``cuda_graph_config``).
    """
    if workload.concurrency is not None:
        return [math.ceil(workload.concurrency / max(replicas, 1))]
    return [attention_dp * b for b in powers_of_two(workload.max_batch)]


def serving_violations(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout,
                       num_gpus: int, domain_size: int, node_size: int = 1) -> list[Violation]:
    """Every broken rule of ``layout`` (empty: valid).  ``node_size``: GPUs per node (1: no
    node rule)."""
    out: list[Violation] = []
    tp, pp, ep, adp, batch = layout.tp, layout.pp, layout.ep, layout.attention_dp, layout.batch
    heads = model.num_attention_heads
    if heads % tp:
        out.append(Violation("S1", "tp-heads", f"tp={tp} must divide the {heads} attention heads"))
    kv = model.num_query_groups
    if model.mla is None and (kv % tp if tp <= kv else tp % kv):
        out.append(Violation("S2", "tp-kv-heads",
                             f"tp={tp} must divide the {kv} KV heads or be a multiple of them"))
    if tp > domain_size:
        out.append(Violation("S3", "tp-domain",
                             f"tp={tp} exceeds the NVLink domain of {domain_size} GPUs; "
                             "use pp or attention dp across domains"))
    if pp > model.num_layers:
        out.append(Violation("S4", "pp-layers", f"pp={pp} exceeds num_layers={model.num_layers}"))
    if model.moe is None:
        if adp != 1 or ep != 1:
            out.append(Violation("S5", "dense-dp-ep",
                                 f"dense model: attention_dp={adp} and ep={ep} must be 1 "
                                 "(data parallelism of a dense model is replicas)"))
    else:
        width = tp * adp
        if width % ep or model.moe.num_experts % ep:
            out.append(Violation("S6", "ep-width",
                                 f"ep={ep} must divide the stage width tp*attention_dp={width} "
                                 f"and the {model.moe.num_experts} experts"))
        if workload.engine == "vllm" and ep not in (1, width):
            out.append(Violation("S13", "vllm-ep-all-or-nothing",
                                 f"ep={ep}: vLLM's --enable-expert-parallel spreads the experts "
                                 f"over every rank of the stage (ep = tp*attention_dp = {width}) "
                                 "or not at all (ep = 1); a partial ep needs --engine sglang "
                                 "or trtllm"))
        if adp != 1 and workload.tensorrt_engine:
            out.append(Violation("S12", "engine-attention-dp",
                                 f"attention_dp={adp}: TensorRT-LLM's TensorRT-engine workflow "
                                 "has no attention DP (use its PyTorch backend)"))
    g = layout.gpus_per_replica
    if g > num_gpus:
        out.append(Violation("S7", "budget",
                             f"an instance needs {g} GPUs, more than the budget of {num_gpus}"))
    if g % node_size and node_size % g:
        out.append(Violation("S11", "whole-nodes",
                             f"an instance of {g} GPUs must fit in one node of {node_size} "
                             "(divide it) or span whole nodes (a multiple of it)"))
    if g > workload.max_instance_gpus:
        out.append(Violation("S10", "instance-size",
                             f"an instance of {g} GPUs exceeds max_instance_gpus="
                             f"{workload.max_instance_gpus}"))
    replicas = fill_replicas(g, num_gpus) if g <= num_gpus else 0
    if batch not in batch_candidates(workload, replicas, adp):
        what = ("ceil(concurrency / replicas)" if workload.concurrency is not None
                else f"attention_dp={adp} times a power of two <= max_batch="
                f"{workload.max_batch}")
        out.append(Violation("S8", "batch", f"batch={batch} must be {what}"))
    if batch < pp or batch < adp:
        out.append(Violation("S9", "batch-split",
                             f"batch={batch} must be >= pp={pp} and >= attention_dp={adp} "
                             "(a request for every micro-batch and every attention-DP rank)"))
    return out


def enumerate_serving_layouts(model: ModelSpec, workload: ServingWorkload, num_gpus: int,
                              domain_size: int, node_size: int = 1) -> list[ServingLayout]:
    """Every valid serving layout on a budget of ``num_gpus`` GPUs, replicas filling it."""
    layouts: list[ServingLayout] = []
    largest = min(num_gpus, workload.max_instance_gpus)
    tps = [t for t in _divisors(model.num_attention_heads) if t <= min(domain_size, largest)]
    for tp in tps:
        adps = (range(1, largest // tp + 1)
                if model.moe is not None and not workload.tensorrt_engine else (1,))
        for adp in adps:
            width = tp * adp
            eps = _divisors(width) if model.moe is not None else [1]
            for pp in range(1, min(model.num_layers, largest // width) + 1):
                g = width * pp
                if g % node_size and node_size % g:
                    continue  # S11, checked again below with the other rules
                replicas = fill_replicas(g, num_gpus)
                for ep in eps:
                    for batch in batch_candidates(workload, replicas, adp):
                        layout = ServingLayout(tp=tp, pp=pp, ep=ep, attention_dp=adp,
                                               batch=batch, replicas=max(replicas, 1))
                        if not serving_violations(model, workload, layout, num_gpus,
                                                  domain_size, node_size):
                            layouts.append(layout)
    return layouts


def require_serving_layouts(model: ModelSpec, workload: ServingWorkload, num_gpus: int,
                            domain_size: int, node_size: int = 1) -> list[ServingLayout]:
    """:func:`enumerate_serving_layouts`, or a :class:`NoValidLayoutError` saying why none."""
    layouts = enumerate_serving_layouts(model, workload, num_gpus, domain_size, node_size)
    if not layouts:
        raise NoValidLayoutError(
            f"no serving layout of {model.name} on {num_gpus} GPUs satisfies the rules "
            f"(S1-S13: tp divides {model.num_attention_heads} heads and fits an NVLink domain "
            f"of {domain_size}; batch >= pp); try more GPUs or a larger --max-batch"
        )
    return layouts
