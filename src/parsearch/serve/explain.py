"""Price one given serving layout and say where its time and memory go (``serve --layout``).

The layout is written like training's ``explain --layout``: ``"tp=4,pp=1,adp=1,ep=1"``
(``adp``: attention data parallel ranks; missing keys are 1; ``replicas`` defaults to as many
instances as the budget holds).  The batch is the requests in flight per instance: given, or
from ``concurrency`` over the replicas, or else the most the KV pool and the engine's batch
limit run at once.

>>> parse_serving_layout("tp=4, pp=2")
{'tp': 4, 'pp': 2}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from parsearch.errors import NoValidLayoutError, SpecError
from parsearch.model.specs import ModelSpec
from parsearch.serve.api import _context, require_context_fits
from parsearch.serve.context import context_window
from parsearch.serve.cost import STEP_OVERHEAD_S, decode_bytes
from parsearch.serve.evaluate import (
    ServingEstimate,
    evaluate_aggregated,
    instance_times,
    ttft_inputs,
)
from parsearch.serve.gemm_rooflines import dense_gemm_fixed_s
from parsearch.serve.memory import GIB, gpu_memory, stage_weights
from parsearch.serve.space import serving_violations
from parsearch.serve.spec import ELEMENT_BYTES, ServingLayout, ServingWorkload, SlidingWindow
from parsearch.serve.ttft import ttft_parts
from parsearch.topology.cluster import ClusterSpec, load_cluster

_KEYS = {"tp": "tp", "pp": "pp", "ep": "ep", "adp": "attention_dp", "dp": "attention_dp",
         "attention_dp": "attention_dp", "replicas": "replicas", "batch": "batch"}


def parse_serving_layout(text: str) -> dict[str, int]:
    """``"tp=4,pp=2"`` -> ``{"tp": 4, "pp": 2}`` (keys as :class:`ServingLayout` names them)."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        name = _KEYS.get(key.strip().lower())
        if not sep or name is None:
            raise SpecError(f"--layout: {part!r} is not key=value with a key of tp, pp, ep, "
                            "adp, replicas or batch (e.g. \"tp=4,pp=2\")")
        try:
            number = int(value.strip())
        except ValueError:
            raise SpecError(f"--layout: {key.strip()}={value.strip()!r} must be a positive "
                            "integer") from None
        if number < 1:
            raise SpecError(f"--layout: {key.strip()}={number} must be a positive integer")
        if name in out:
            raise SpecError(f"--layout: {key.strip()} is given twice")
        out[name] = number
    if not out:
        raise SpecError('--layout is empty; give e.g. "tp=4,pp=1"')
    return out


@dataclass(frozen=True)
class ServingExplanation:
    """One priced layout with the parts of its memory (GiB per GPU) and times (ms)."""

    estimate: ServingEstimate
    memory: dict[str, float]
    decode: dict[str, float]
    prefill: dict[str, float]
    queue: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        def rounded(d: dict[str, float]) -> dict[str, float | None]:
            return {k: (round(v, 4) if math.isfinite(v) else None) for k, v in d.items()}

        return {**self.estimate.to_dict(), "memory_gib": rounded(self.memory),
                "decode_ms": rounded(self.decode), "prefill_ms": rounded(self.prefill),
                "queue": rounded(self.queue)}


def _layout_for(fields: dict[str, int], workload: ServingWorkload, num_gpus: int,
                max_fit: int | None) -> ServingLayout:
    base = ServingLayout(tp=fields.get("tp", 1), pp=fields.get("pp", 1), ep=fields.get("ep", 1),
                         attention_dp=fields.get("attention_dp", 1), batch=1)
    replicas = fields.get("replicas", max(1, num_gpus // base.gpus_per_replica))
    if "batch" in fields:
        batch = fields["batch"]
    elif workload.concurrency is not None:
        batch = math.ceil(workload.concurrency / replicas)
    else:
        cap = workload.max_batch * base.attention_dp
        batch = max(1, min(cap, max_fit if max_fit is not None else cap))
    return replace(base, batch=batch, replicas=replicas)


def _check(model: ModelSpec, workload: ServingWorkload, layout: ServingLayout, num_gpus: int,
           cluster: ClusterSpec) -> None:
    if layout.gpus > num_gpus:
        raise SpecError(f"--layout needs {layout.gpus} GPUs ({layout.replicas} x "
                        f"{layout.gpus_per_replica}), more than --gpus {num_gpus}")
    broken = [v for v in serving_violations(model, workload, layout, num_gpus,
                                            cluster.job_domain_size, cluster.gpus_per_node)
              if v.rule not in ("S8", "S10")]  # a given batch and instance size are allowed
    if broken:
        shape = layout.label().split(" ")[0]  # the instance shape; the batch is probed
        raise SpecError(f"--layout {shape} x{layout.replicas} breaks rule {broken[0].rule}: "
                        f"{broken[0].message}")


def explain_serving(*, model: ModelSpec, cluster: ClusterSpec | str, num_gpus: int,
                    workload: ServingWorkload, layout: dict[str, int] | str,
                    window: SlidingWindow | None = None) -> ServingExplanation:
    """Price ``layout`` (aggregated serving) and break its memory and times down."""
    spec = load_cluster(cluster) if isinstance(cluster, str) else cluster
    fields = parse_serving_layout(layout) if isinstance(layout, str) else dict(layout)
    require_context_fits(model, workload)
    ctx = _context(model, spec, workload, window, None)
    least = max(fields.get("pp", 1), fields.get("attention_dp", 1))
    probe = _layout_for({**fields, "batch": least}, workload, num_gpus, None)
    _check(model, workload, probe, num_gpus, spec)
    mem = gpu_memory(model, probe, workload, ctx.gpu, ctx.counts)
    max_fit = evaluate_aggregated(ctx, probe, num_gpus).max_batch_fit
    lay = _layout_for(fields, workload, num_gpus, max_fit)
    _check(model, workload, lay, num_gpus, spec)
    if "batch" in fields and workload.concurrency is None:
        # a given batch is the requests in flight: above the cap they queue, as a
        # concurrency does (without one the search would run the cap instead)
        ctx = _context(model, spec, replace(workload, concurrency=lay.batch * lay.replicas),
                       window, None)
    est = evaluate_aggregated(ctx, lay, num_gpus)
    if not est.fits:
        raise NoValidLayoutError(
            f"nothing fits: {lay.label()} leaves {max(mem.kv_capacity, 0) / GIB:.1f} GiB per "
            f"GPU for the KV cache after {mem.weights / GIB:.1f} GiB of weights, which holds "
            f"{max_fit} requests of {workload.context:g} tokens; it needs at least "
            f"{max(lay.pp, lay.attention_dp)}: try more tp/pp, fp8 weights or KV, or shorter "
            "requests")
    if not est.serves:
        raise NoValidLayoutError(f"nothing fits: {lay.label()} carries no tokens")
    running = replace(lay, batch=est.running_batch or lay.batch)
    times = instance_times(ctx, running)
    weights_read, kv_read = decode_bytes(model, workload, running, ctx.counts, ctx.window)
    w = stage_weights(model, running, ctx.counts)
    prec = ELEMENT_BYTES[workload.precision]
    kv_used = est.memory_gib_per_gpu - (mem.weights + mem.workspace + mem.reserve
                                        + mem.graphs) / GIB
    memory = {"weights": mem.weights / GIB,
              "weights_quantized": (w.linear + w.routed) * prec / GIB,
              "weights_bf16": w.bf16 * ELEMENT_BYTES["bf16"] / GIB,
              "activation_workspace": mem.workspace / GIB, "context_nccl": mem.reserve / GIB,
              "cuda_graphs": mem.graphs / GIB, "kv_pool": max(mem.kv_capacity, 0.0) / GIB,
              "kv_used": kv_used, "total_hbm": mem.usable / GIB,
              "memory_fraction": mem.fraction}
    d = times.decode
    cycle_tpot = est.tpot_ms
    decode = {"weights_read_gb": weights_read / 1e9, "kv_read_gb": kv_read / 1e9,
              "memory": d.memory_s * 1e3, "compute": d.compute_s * 1e3,
              "gemm_and_attention_rooflines": d.roofline_s * 1e3,
              # of which: the dense GEMM calls' fixed times, serial with their weight reads
              "dense_gemm_fixed_times": dense_gemm_fixed_s(
                  model, running, ctx.rates, w.output > 0) * 1e3,
              "communication": d.comm_s * 1e3, "overlapped_communication":
              d.overlapped_comm_s * 1e3, "kernels_and_non_gemm": d.overhead_s * 1e3,
              "stage_pass": d.total_s * 1e3, "pipeline_hop": d.hop_s * 1e3,
              "host_step": STEP_OVERHEAD_S * 1e3, "tpot_decode_only": times.tpot_decode_s * 1e3,
              "prefill_stalls_per_token": cycle_tpot - times.tpot_decode_s * 1e3,
              "tpot": cycle_tpot}
    if ctx.speculation is not None and times.plain_tpot_s is not None:
        # the decode parts above are the verify pass (k + 1 tokens per sequence)
        decode.update(spec_tokens_per_step=ctx.speculation.tokens_per_step,
                      spec_draft_tokens=float(ctx.speculation.draft_tokens),
                      spec_draft_cost=ctx.speculation.draft_cost,
                      tpot_decode_without_speculation=times.plain_tpot_s * 1e3)
    p = times.prefill
    parts = ttft_parts(ttft_inputs(ctx, lay, running, times,
                                   est.tpot_ms / 1e3 * workload.mean_osl, est.queue_ms / 1e3))
    prefill = {"memory": p.memory_s * 1e3, "compute": p.compute_s * 1e3,
               "communication": p.comm_s * 1e3, "kernels_and_non_gemm": p.overhead_s * 1e3,
               "stage_pass": p.total_s * 1e3, "ttft_alone": times.ttft_s * 1e3,
               "busy_per_request_under_load": times.prefill_busy_s * 1e3,
               "tokenize_prompt": parts.tokenize_s * 1e3,
               "wait_for_running_step": parts.pickup_s * 1e3,
               "attention_dp_balance_wait": parts.balance_wait_s * 1e3,
               "prefills_queued_ahead": parts.prefill_queue_s * 1e3,
               "first_wave_burst": parts.burst_s * 1e3,
               "decodes_riding_prefill_chunks": parts.ride_along_s * 1e3,
               "queue": est.queue_ms, "ttft": est.ttft_ms}
    queue = {"in_flight_per_instance": float(lay.batch),
             "running_per_instance": float(running.batch),
             "kv_holds": float(max_fit),
             "engine_batch_limit": float(workload.max_batch * lay.attention_dp),
             "wait_ms": est.queue_ms}
    window = context_window(model)
    if window is not None:
        queue["context_window"] = float(window)
    return ServingExplanation(estimate=est, memory=memory, decode=decode, prefill=prefill,
                              queue=queue)
