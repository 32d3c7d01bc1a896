"""Score serving layouts: throughput of the whole group, per GPU and per user, TTFT, TPOT, memory.

Aggregated serving (continuous batching with chunked prefill, vLLM/SGLang/TensorRT-LLM
default): prefills of new requests share the GPUs with the running decodes.  Over the time
the ``batch`` requests of an instance take to emit ``osl`` tokens each, ``batch`` new
requests are prefilled, so one cycle lasts ``osl * TPOT_decode + batch * prefill_busy`` and
the user sees that cycle divided by ``osl`` as TPOT (work conservation; the mixed-batch
view of Sarathi-Serve, Agrawal et al. 2024, arXiv 2403.02310 §3).

Disaggregated serving (DistServe, Zhong et al. 2024, arXiv 2401.09670): prefill and decode
run on separate instances; the group carries ``min(prefill rate, decode rate)`` requests/s,
decode TPOT has no prefill stalls, TTFT adds the KV transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.model.params import ParameterCounts, parameter_counts
from parsearch.model.specs import ModelSpec
from parsearch.serve.cost import (
    InstanceLinks,
    Rates,
    StepTime,
    decode_kv_bytes,
    decode_step,
    decode_tpot_s,
    instance_links,
    prefill_latency_s,
    prefill_packed_tokens,
    prefill_step,
)
from parsearch.serve.engines import schedules_ahead
from parsearch.serve.frontend import tokenize_s
from parsearch.serve.kv_cache import kv_bytes_per_sequence, kv_bytes_per_token
from parsearch.serve.memory import GIB, gpu_memory, max_sequences
from parsearch.serve.prefix_cache import computed_prompt_tokens
from parsearch.serve.spec import ServingLayout, ServingWorkload, SlidingWindow
from parsearch.serve.speculative import Speculation, speculation_for, speculative_tpot_s
from parsearch.serve.ttft import (
    MIXED_PREFILL,
    TtftInputs,
    closed_loop_share,
    separate_prefill_occupancy_s,
    ttft_parts,
)
from parsearch.topology.cluster import ClusterSpec
from parsearch.topology.fabric import Fabric, build_fabric
from parsearch.topology.hardware import GpuProfile


@dataclass
class ServingContext:
    """Everything fixed during one query; caches fabrics and links per instance shape."""

    model: ModelSpec
    workload: ServingWorkload
    cluster: ClusterSpec
    gpu: GpuProfile
    profile: EfficiencyProfile
    rates: Rates
    window: SlidingWindow | None
    counts: ParameterCounts = field(init=False)
    speculation: Speculation | None = field(init=False, default=None)
    _fabrics: dict[int, Fabric] = field(default_factory=dict, init=False)
    _links: dict[tuple[int, int, int, int], InstanceLinks] = field(default_factory=dict,
                                                                   init=False)
    _prefill: dict[tuple[int, int, int, int, int, float], StepTime] = field(
        default_factory=dict, init=False)
    _class_workloads: list[tuple[float, ServingWorkload]] = field(default_factory=list,
                                                                  init=False)

    def __post_init__(self) -> None:
        self.counts = parameter_counts(self.model)
        self.speculation = speculation_for(self.model, self.workload, self.counts)
        self._class_workloads = [
            (c.weight, replace(self.workload, isl=c.isl, osl=c.osl, mix=()))
            for c in self.workload.classes
        ]

    def links(self, layout: ServingLayout) -> InstanceLinks:
        key = (layout.tp, layout.attention_dp, layout.pp, layout.ep)
        if key not in self._links:
            g = layout.gpus_per_replica
            if g not in self._fabrics:
                self._fabrics[g] = build_fabric(self.cluster, g)
            self._links[key] = instance_links(self._fabrics[g], layout)
        return self._links[key]

    def prefill(self, layout: ServingLayout) -> list[tuple[float, StepTime]]:
        """Prefill of ``layout`` for each request length class, with the class's request
        share.  It depends on the batch only through the packed prompt tokens, so batches
        that pack the same share one computation."""
        out = []
        for weight, work in self._class_workloads:
            key = (layout.tp, layout.attention_dp, layout.pp, layout.ep, work.isl,
                   prefill_packed_tokens(work, layout))
            if key not in self._prefill:
                self._prefill[key] = prefill_step(self.model, work, layout, self.counts,
                                                  self.rates, self.links(layout), self.window)
            out.append((weight, self._prefill[key]))
        return out


@dataclass(frozen=True)
class ServingEstimate:
    """One scored layout.  ``layout.replicas`` instances (decode instances when
    disaggregated, with ``prefill_layout.replicas`` prefill instances beside them)."""

    layout: ServingLayout
    gpus: int
    tokens_per_s: float
    tokens_per_s_per_user: float
    ttft_ms: float
    tpot_ms: float
    kv_cache_gib_per_gpu: float
    memory_gib_per_gpu: float
    fits: bool
    max_batch_fit: int
    bottleneck: str
    prefill_layout: ServingLayout | None = None
    meets_targets: bool = True
    running_batch: int | None = None  # requests running at once (None: layout.batch)
    queue_ms: float = 0.0             # mean wait for a running slot, inside ttft_ms

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus if self.gpus else 0.0

    @property
    def serves(self) -> bool:
        """Whether the layout carries any tokens: finite, positive throughput per GPU and
        per user (a zero or undefined one is "nothing fits", never a result)."""
        rates = (self.tokens_per_s_per_gpu, self.tokens_per_s_per_user)
        return all(math.isfinite(r) and r > 0 for r in rates)

    def to_dict(self) -> dict[str, Any]:
        def shape(layout: ServingLayout) -> dict[str, int]:
            return {"tp": layout.tp, "pp": layout.pp, "ep": layout.ep,
                    "attention_dp": layout.attention_dp, "replicas": layout.replicas,
                    "gpus_per_replica": layout.gpus_per_replica}

        out: dict[str, Any] = {
            "layout": shape(self.layout),
            "batch": self.layout.batch,
            "gpus": self.gpus,
            "tokens_per_s": _finite(self.tokens_per_s),
            "tokens_per_s_per_gpu": _finite(self.tokens_per_s_per_gpu),
            "tokens_per_s_per_user": _finite(self.tokens_per_s_per_user),
            "ttft_ms": _finite(self.ttft_ms),
            "tpot_ms": _finite(self.tpot_ms),
            "kv_cache_gib_per_gpu": _finite(self.kv_cache_gib_per_gpu),
            "memory_gib_per_gpu": _finite(self.memory_gib_per_gpu),
            "fits": self.fits,
            "max_batch_fit": self.max_batch_fit,
            "running_batch": (self.layout.batch if self.running_batch is None
                              else self.running_batch),
            "queue_ms": _finite(self.queue_ms),
            "meets_targets": self.meets_targets,
            "bottleneck": self.bottleneck,
        }
        if self.prefill_layout is not None:
            out["prefill_layout"] = shape(self.prefill_layout)
        return out


def _finite(value: float, digits: int = 4) -> float | None:
    """Rounded to ``digits`` decimals, below 1 to ``digits`` significant digits (a tiny
    positive rate is not printed as 0); None for a value that is not finite (JSON has no
    NaN/Infinity)."""
    if not math.isfinite(value):
        return None
    if abs(value) >= 1.0:
        return round(float(value), digits)
    return float(f"{value:.{digits}g}")


def _bottleneck(step: StepTime) -> str:
    parts = {"memory": step.memory_s, "compute": step.compute_s, "communication": step.comm_s,
             "overhead": step.overhead_s}
    return max(parts, key=lambda k: parts[k])


def _memory(ctx: ServingContext, layout: ServingLayout) -> tuple[float, float, float, int, bool]:
    """(KV capacity GiB, memory used GiB, KV used bytes, max batch that fits, fits) per GPU."""
    w = ctx.workload
    mem = gpu_memory(ctx.model, layout, w, ctx.gpu, ctx.counts)
    per_seq = kv_bytes_per_sequence(ctx.model, w.kv_precision, w.context, tp=layout.tp,
                                    pp=layout.pp, window=ctx.window)
    per_rank = max_sequences(mem.kv_capacity, per_seq)
    kv_used = math.ceil(layout.batch / layout.attention_dp) * per_seq
    fits = mem.kv_capacity > 0 and kv_used <= mem.kv_capacity
    used = mem.weights + mem.workspace + mem.reserve + mem.graphs + kv_used
    return (max(mem.kv_capacity, 0.0) / GIB, used / GIB, kv_used,
            per_rank * layout.attention_dp, fits)


@dataclass(frozen=True)
class InstanceTimes:
    decode: StepTime
    tpot_decode_s: float
    prefill: StepTime       # of the first length class
    ttft_s: float           # request-weighted mean over the length classes
    prefill_busy_s: float   # instance time one request's prefill occupies (pipelined), mean
    plain_tpot_s: float | None = None  # decode without speculation (None: no speculation)


def instance_times(ctx: ServingContext, layout: ServingLayout) -> InstanceTimes:
    links = ctx.links(layout)
    args = (ctx.model, ctx.workload, layout, ctx.counts, ctx.rates, links, ctx.window)
    dec = decode_step(*args)
    tpot = plain = decode_tpot_s(dec, layout.pp)
    spec = ctx.speculation
    if spec is not None:  # a verify pass of k + 1 tokens per sequence, plus k drafts
        dec = decode_step(*args, query_tokens=spec.query_tokens)
        tpot = speculative_tpot_s(spec, decode_tpot_s(dec, layout.pp), plain)
    classes = ctx.prefill(layout)
    total = sum(weight for weight, _ in classes)
    ttft = sum(w * prefill_latency_s(p, layout.pp) for w, p in classes) / total
    busy = sum(w * (p.busy_s if p.busy_s is not None else p.total_s) for w, p in classes) / total
    return InstanceTimes(decode=dec, tpot_decode_s=tpot, prefill=classes[0][1], ttft_s=ttft,
                         prefill_busy_s=busy, plain_tpot_s=None if spec is None else plain)


def _meets(ctx: ServingContext, ttft_ms: float, tpot_ms: float) -> bool:
    w = ctx.workload
    return ((w.ttft_ms is None or ttft_ms <= w.ttft_ms)
            and (w.tpot_ms is None or tpot_ms <= w.tpot_ms))


def _replicas_for(ctx: ServingContext, layout: ServingLayout, requests_per_s: float,
                  num_gpus: int) -> int:
    """Replicas: enough for ``request_rate`` when given (the smallest group that carries
    the load), else as many as fill the budget."""
    rate = ctx.workload.request_rate
    if rate is None:
        return layout.replicas
    return max(1, math.ceil(rate / requests_per_s)) if requests_per_s > 0 else num_gpus + 1


def occupied_share(concurrency: int | None, replicas: int, batch: int) -> float:
    """Share of the group's request slots (``replicas * batch``, each replica's batch the
    ceiling of its share of ``concurrency``) that hold a request: a fixed concurrency ``C``
    keeps only ``C`` requests in flight, so with ``C`` not a multiple of the replicas some
    run one fewer and with fewer requests than replicas some idle (4 requests over 8
    single-GPU replicas: half of them).  1 without a fixed concurrency.

    >>> occupied_share(4, 8, 1), occupied_share(16, 8, 2), occupied_share(None, 8, 1)
    (0.5, 1.0, 1.0)
    """
    if concurrency is None or replicas * batch <= 0:
        return 1.0
    return min(1.0, concurrency / (replicas * batch))


def running_batch(ctx: ServingContext, layout: ServingLayout, max_fit: int) -> int:
    """Requests one instance runs at once: those in flight, capped by what its KV pool holds
    (``max_fit``, each request at its final context, TensorRT-LLM's GUARANTEED_NO_EVICT
    admission) and by the engine's batch limit per attention-DP rank (vLLM
    ``--max-num-seqs``, SGLang ``--max-running-requests``, TensorRT-LLM
    ``max_batch_size``); the rest wait in the engine's queue."""
    limit = ctx.workload.max_batch * layout.attention_dp
    return max(0, min(layout.batch, max_fit, limit))


def queue_delay_s(in_flight: int, running: int, completions_per_s: float) -> float:
    """Mean wait of a request for a running slot, first come first served.

    With ``in_flight`` requests in the instance and ``running`` of them in the batch, the
    queue holds ``in_flight - running`` requests on average; slots free at the completion
    rate, so by Little's law (L = lambda W, Little 1961, applied to the queue alone) a
    request waits ``(in_flight - running) / completions_per_s`` before its prefill starts.
    """
    waiting = max(0, in_flight - running)
    if waiting == 0:
        return 0.0
    return waiting / completions_per_s if completions_per_s > 0 else math.inf


def step_residual_s(running: int, step_s: float) -> float:
    """Mean wait of an arriving request for the decode step under way to end.

    Steps of fixed length ``T`` follow one another while other requests run; a request
    arriving at a random time lands in one and waits its residual life, on average
    ``E[T^2] / (2 E[T]) = T / 2`` (residual life of a renewal process, Kleinrock, Queueing
    Systems Vol. 1, §5.2).  Alone (``running`` 1) it finds the engine idle and waits nothing
    (``trtllm-bench latency`` sends one request at a time).
    """
    return 0.0 if running <= 1 else step_s / 2.0


def prompts_per_prefill(workload: ServingWorkload, layout: ServingLayout) -> int:
    """Whole prompts one prefill step packs on the instance: the token budget's worth on
    each attention-DP rank (at least one)."""
    prompt = max(1.0, computed_prompt_tokens(workload.isl, workload.prefix_cache_hit))
    return layout.attention_dp * max(1, int(workload.max_num_batched_tokens // prompt))


def prefill_occupancy_s(ctx: ServingContext, layout: ServingLayout, t: InstanceTimes) -> float:
    """Instance time one prompt's prefill takes in steady state.  Engines that put prefill
    chunks beside the decodes share each step's weight reads and fixed costs: the packed
    share (``t.prefill_busy_s``).  An engine that runs prefill batches apart
    (:data:`parsearch.serve.ttft.MIXED_PREFILL`) pays a batch's fixed costs for the prompts
    that queued together (:func:`parsearch.serve.ttft.separate_prefill_occupancy_s`), with
    arrivals at the completion rate, which depends on that time: three fixed-point steps."""
    w = ctx.workload
    if MIXED_PREFILL.get(w.engine, True):
        return t.prefill_busy_s
    k, occupancy = prompts_per_prefill(w, layout), t.prefill_busy_s
    window = t.ttft_s + w.recv_interval * t.tpot_decode_s / 2.0
    for _ in range(3):
        rate = layout.batch / (w.mean_osl * t.tpot_decode_s + layout.batch * occupancy)
        occupancy = separate_prefill_occupancy_s(t.ttft_s, t.prefill_busy_s, k, rate, window)
    return occupancy


def ttft_inputs(ctx: ServingContext, layout: ServingLayout, run_layout: ServingLayout,
                t: InstanceTimes, cycle_s: float, queue_s: float,
                occupancy_s: float | None = None) -> TtftInputs:
    """What :func:`parsearch.serve.ttft.ttft_parts` needs of one aggregated instance: a decode
    step (verify + drafts with speculation), the KV reads the running decodes add to a step
    beside a prefill chunk (their weights are read by the chunk anyway, Sarathi-Serve §4),
    and the workload's engine and client knobs."""
    w = ctx.workload
    per_step = ctx.speculation.tokens_per_step if ctx.speculation is not None else 1.0
    step_s = t.tpot_decode_s * per_step  # a decode step (verify + drafts) emits per_step
    kv = decode_kv_bytes(ctx.model, w, run_layout, ctx.window)
    return TtftInputs(
        engine=w.engine, prompt_tokens=computed_prompt_tokens(w.isl, w.prefix_cache_hit),
        budget=w.max_num_batched_tokens, running=run_layout.batch,
        step_decodes=math.ceil(run_layout.batch / run_layout.attention_dp),
        in_flight=layout.batch, prefill_alone_s=t.ttft_s, busy_s=t.prefill_busy_s,
        step_s=step_s, ride_s=run_layout.pp * kv / ctx.rates.hbm_Bps, cycle_s=cycle_s,
        slot_queue_s=queue_s, recv_interval=w.recv_interval,
        balance_wait_iters=w.balance_wait_iters if run_layout.attention_dp > 1 else 0,
        burst_waves=w.burst_waves if w.concurrency is not None else None,
        lookahead=schedules_ahead(w.engine, w.async_scheduling, w.tensorrt_engine),
        # the server tokenizes the whole text prompt, cached prefix included
        tokenize_s=tokenize_s(w.isl) if w.text_prompts else 0.0,
        prompts_per_prefill=prompts_per_prefill(w, run_layout), occupancy_s=occupancy_s)


def evaluate_aggregated(ctx: ServingContext, layout: ServingLayout,
                        num_gpus: int) -> ServingEstimate:
    """Score one aggregated (continuous batching) layout.

    The running batch is capped by the KV pool and the engine's batch limit
    (:func:`running_batch`).  With a fixed ``concurrency`` the excess requests queue:
    throughput and TPOT are those of the running batch, TTFT adds the queueing delay
    (:func:`queue_delay_s`).  Without one the space chooses the load, so a batch above the
    cap is scored at the cap (the most the engine runs) with no queue.
    """
    w = ctx.workload
    kv_gib, used_gib, _kv_used, max_fit, _fits = _memory(ctx, layout)
    running = running_batch(ctx, layout, max_fit)
    fits = running >= max(layout.pp, layout.attention_dp)
    if w.concurrency is None and fits and running < layout.batch:
        layout = replace(layout, batch=running)
    run_layout = replace(layout, batch=running) if fits else layout
    if fits:
        kv_gib, used_gib = _memory(ctx, run_layout)[:2]
    t = instance_times(ctx, run_layout)
    osl = w.mean_osl
    occupancy = prefill_occupancy_s(ctx, run_layout, t)
    cycle = osl * t.tpot_decode_s + run_layout.batch * occupancy
    tpot = cycle / osl
    # a fixed-count closed-loop client measures the steady rate less its final drain
    waves = w.burst_waves if w.concurrency is not None else None
    per_instance = (run_layout.batch * osl / cycle
                    * closed_loop_share(waves, w.concurrency or 1))
    completions = run_layout.batch / cycle  # requests/s one instance finishes
    queue_s = queue_delay_s(layout.batch, run_layout.batch, completions)
    replicas = _replicas_for(ctx, layout, completions, num_gpus)
    placed = layout if replicas == layout.replicas else replace(layout, replicas=replicas)
    # waits for a slot, for the scheduler, for the prefills ahead, then prefills
    ttft_ms = ttft_parts(ttft_inputs(ctx, layout, run_layout, t, cycle, queue_s,
                                     occupancy)).total_s * 1e3
    carries = placed.gpus <= num_gpus
    occupied = occupied_share(w.concurrency, replicas, layout.batch)
    return ServingEstimate(
        layout=placed, gpus=placed.gpus, tokens_per_s=per_instance * replicas * occupied,
        tokens_per_s_per_user=1.0 / tpot, ttft_ms=ttft_ms, tpot_ms=tpot * 1e3,
        kv_cache_gib_per_gpu=kv_gib, memory_gib_per_gpu=used_gib, fits=fits and carries,
        max_batch_fit=max_fit, bottleneck=_bottleneck(t.decode),
        meets_targets=_meets(ctx, ttft_ms, tpot * 1e3),
        running_batch=run_layout.batch, queue_ms=queue_s * 1e3)


def kv_transfer_s(ctx: ServingContext, prefill: ServingLayout, decode: ServingLayout) -> float:
    """Moving one request's KV cache (all layers, isl tokens) from a prefill to a decode
    instance over the scale-out network, every GPU of the smaller instance sending in
    parallel (NIXL/Mooncake transfer engines move per-GPU shards in parallel)."""
    c = ctx.cluster
    mean_isl = sum(c.weight * c.isl for c in ctx.workload.classes) / sum(
        c.weight for c in ctx.workload.classes)
    nbytes = kv_bytes_per_token(ctx.model, ctx.workload.kv_precision) * mean_isl
    if c.nics_per_node == 0:
        bandwidth = c.nvlink_bandwidth_Bps * c.nvlink_efficiency
    else:
        bandwidth = c.nic_bandwidth_per_gpu_Bps * c.network_efficiency
    lanes = min(prefill.gpus_per_replica, decode.gpus_per_replica)
    return nbytes / (bandwidth * lanes) + c.network_latency_s


def evaluate_disaggregated(ctx: ServingContext, prefill: ServingLayout, decode: ServingLayout,
                           num_gpus: int) -> ServingEstimate | None:
    """Best split of the budget between ``prefill`` and ``decode`` instances (None: no split)."""
    w = ctx.workload
    kv_gib, used_gib, _kv, max_fit, _fits = _memory(ctx, decode)
    running = running_batch(ctx, decode, max_fit)  # the rest of the decode batch queues
    fits = running >= max(decode.pp, decode.attention_dp)
    run_decode = replace(decode, batch=running) if fits else decode
    if fits:
        kv_gib, used_gib = _memory(ctx, run_decode)[:2]
    # a prefill instance holds the KV of the prompts it is prefilling, not the batch
    pre_fit = _memory(ctx, prefill)[3] >= max(prefill.pp, prefill.attention_dp)
    td = instance_times(ctx, run_decode)
    tp_ = instance_times(ctx, prefill)
    prefill_rate = 1.0 / tp_.prefill_busy_s      # requests/s of one prefill instance
    decode_rate = run_decode.batch / (w.mean_osl * td.tpot_decode_s)
    queue_s = queue_delay_s(decode.batch, run_decode.batch, decode_rate)
    gp, gd = prefill.gpus_per_replica, decode.gpus_per_replica
    best: tuple[float, int, int] | None = None
    if w.request_rate is not None:
        x = math.ceil(w.request_rate / prefill_rate)
        y = math.ceil(w.request_rate / decode_rate)
        if x * gp + y * gd <= num_gpus:
            best = (min(x * prefill_rate, y * decode_rate), x, y)
    else:
        for x in range(1, (num_gpus - gd) // gp + 1):
            y = (num_gpus - x * gp) // gd
            carried = min(x * prefill_rate, y * decode_rate)
            if best is None or carried > best[0] + 1e-12:
                best = (carried, x, y)
    if best is None:
        return None
    carried, x, y = best
    pre = ServingLayout(prefill.tp, prefill.pp, prefill.ep, prefill.attention_dp, prefill.batch, x)
    dec = ServingLayout(decode.tp, decode.pp, decode.ep, decode.attention_dp, decode.batch, y)
    ttft_ms = (queue_s + tp_.ttft_s + kv_transfer_s(ctx, prefill, decode)) * 1e3
    tpot_ms = td.tpot_decode_s * 1e3
    return ServingEstimate(
        layout=dec, gpus=x * gp + y * gd, tokens_per_s=carried * w.mean_osl,
        tokens_per_s_per_user=1.0 / td.tpot_decode_s, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
        kv_cache_gib_per_gpu=kv_gib, memory_gib_per_gpu=used_gib, fits=fits and pre_fit,
        max_batch_fit=max_fit, bottleneck=_bottleneck(td.decode), prefill_layout=pre,
        meets_targets=_meets(ctx, ttft_ms, tpot_ms), running_batch=run_decode.batch,
        queue_ms=queue_s * 1e3)
