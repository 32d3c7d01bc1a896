"""Time to first token of a request under continuous batching at a fixed concurrency.

A request that arrives at a busy aggregated instance waits, in order, for

0. the server's tokenization of its prompt, when it arrives as text
   (:mod:`parsearch.serve.frontend`);
1. a running slot, when the KV pool or the batch limit is full (Little's law,
   :func:`parsearch.serve.evaluate.queue_delay_s`);
2. the scheduler to pick it up: the residual of the step under way (half a step,
   Kleinrock, Queueing Systems Vol. 1, §5.2), or, when the engine polls its request socket
   only every ``recv_interval`` decode steps, half of that interval (SGLang
   ``--scheduler-recv-interval``: python/sglang/srt/managers/scheduler_recv_skipper.py adds 1
   per decode step and receives once the count reaches the interval); plus one whole step
   when the engine schedules one step ahead (``lookahead``): the batch that runs next was
   formed while the current one ran, so a new request joins the one after it (vLLM
   ``--async-scheduling``: the engine core keeps two batches in flight,
   ``max_concurrent_batches = 2``, and its authors note in vllm-project/vllm PR #19970 that
   a new request waits one more scheduling step; SGLang's overlap scheduler,
   ``event_loop_overlap``, launches batch N+1 before it processes batch N's result;
   TensorRT-LLM's overlap scheduler, ``_executor_loop_overlap``, likewise);
3. TensorRT-LLM's attention-DP balancer, when on: context requests are held up to
   ``batching_wait_iters`` iterations (default 10) so that every attention-DP rank gets one
   (tensorrt_llm/llmapi/llm_args.py ``AttentionDpConfig``);
4. the prefills queued ahead of it (:func:`prefill_queue_wait_s`, M/D/1);
5. under a benchmark client that starts a burst of ``concurrency`` requests at an idle engine
   (bench_serving with ``--request-rate inf --max-concurrency C``: every request task is
   created at once, a semaphore lets C through; the warm-up requests finish before the run,
   InferenceX utils/bench_serving/benchmark_serving.py), the first wave's prefills queue
   behind one another: the server tokenizes them one at a time and the engine prefills
   whatever has been tokenized whenever it is free, packing up to its token budget, so a
   batch's prompts all wait for its end (:func:`burst_batches_wait_s`; with one prompt per
   batch it is :func:`burst_wait_s`, each at the pace of the slower of the tokenizer and the
   engine, :func:`parsearch.serve.frontend.burst_stage_s`);
6. its own prefill, split into chunks of the token budget left after the running decodes
   (:func:`chunk_iterations`); where the engine mixes decodes into prefill steps (vLLM V1,
   TensorRT-LLM in-flight batching) each chunk's step also carries the running decodes
   (Sarathi-Serve, Agrawal et al. 2024, arXiv 2403.02310 §3-4: a hybrid batch costs the
   chunk plus the piggybacked decodes' attention and KV reads; the weights are read once).

The first token is streamed as soon as it is sampled on all three engines: SGLang's
``stream_interval`` sends output ``len(output_ids) % interval == 1``, i.e. the first token
(scheduler_output_processor_mixin.py ``stream_output_generation``); TensorRT-LLM's PyExecutor
creates a response at ``py_decoding_iter == 1`` whatever ``stream_interval``
(tensorrt_llm/_torch/pyexecutor/py_executor.py ``_handle_responses``).  So the streaming
interval adds nothing to TTFT (it shows in the inter-token latency only).

Provenance: the InferenceX scripts and bench_serving are read at InferenceX commit
``1fc5d73cdd31c7fbdd657f3c7e5ec2180f4b0598`` (TensorRT-LLM script at ``1825e7f0``); the
SGLang, TensorRT-LLM and vLLM files named above were read from the public sources in the
project's code index, whose copies do not record their commit, so they are not pinned to
the exact releases the measured runs used (SGLang 0.5.6, TensorRT-LLM 1.2.0rc2, vLLM 0.13).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Engines whose scheduler puts running decodes and prefill chunks in one step.  vLLM V1
#: schedules the running requests first and fills the rest of ``max_num_batched_tokens``
#: with waiting prompts (vllm/v1/core/sched/scheduler.py ``schedule``: "First, schedule the
#: RUNNING requests", then the WAITING ones from the remaining ``token_budget``);
#: TensorRT-LLM's in-flight batching counts generation tokens in ``max_num_tokens``
#: (docs "Tuning Max Batch Size and Max Num Tokens").  SGLang runs a prefill batch apart
#: from the decodes unless ``--enable-mixed-chunk`` (server_args ``enable_mixed_chunk``
#: default False).
MIXED_PREFILL: dict[str, bool] = {"vllm": True, "trtllm": True, "sglang": False}
#: Largest prefill share of instance time the M/D/1 wait is evaluated at (the formula
#: diverges at 1; a saturated instance is throttled by the closed loop instead).
MAX_PREFILL_SHARE = 0.95


def chunk_iterations(prompt_tokens: float, budget: int, running: int, mixed: bool) -> int:
    """Scheduler steps one prompt's prefill spans: the token budget per step less one token
    for each running decode when decodes share the step (vLLM V1 / TensorRT-LLM, above), at
    least one token per step."""
    room = budget - running if mixed else budget
    return max(1, math.ceil(prompt_tokens / max(1, room)))


def pickup_wait_s(running: int, step_s: float, recv_interval: int = 1,
                  lookahead: bool = False) -> float:
    """Mean wait between a request's arrival and the scheduler step that admits it.

    A request arriving at a random time during back-to-back steps of length ``T`` waits the
    residual ``T / 2`` (Kleinrock §5.2); an engine that receives only every ``R`` steps
    admits it at the next of those, ``R T / 2`` on average.  An engine that schedules one
    step ahead (``lookahead``, module docstring item 2) has already formed the next batch,
    so the request waits one step more: ``R T / 2 + T``.  Alone (``running`` 1) it finds
    the engine idle and waits nothing (``trtllm-bench latency`` sends one at a time)."""
    if running <= 1:
        return 0.0
    return max(1, recv_interval) * step_s / 2.0 + (step_s if lookahead else 0.0)


def prefill_queue_wait_s(prefill_share: float, busy_s: float) -> float:
    """Mean wait for the prefills queued ahead: Pollaczek-Khinchine for deterministic service
    (M/D/1, Kleinrock §5.5), ``W = rho S / (2 (1 - rho))`` with ``S`` the instance time one
    prompt's prefill occupies and ``rho`` the share of instance time spent prefilling."""
    rho = min(max(prefill_share, 0.0), MAX_PREFILL_SHARE)
    return rho * busy_s / (2.0 * (1.0 - rho))


def burst_wait_s(in_flight: int, waves: float | None, busy_s: float) -> float:
    """Mean extra wait of a burst: ``in_flight`` requests arrive together at an idle instance
    and are prefilled one after another, the k-th after ``k - 1`` others, mean
    ``(C - 1) / 2`` prefills; the burst is the first of ``waves`` requests per slot (the
    client sends ``C * waves``), so the mean over all requests carries ``1 / waves`` of it.
    None: no burst (steady arrivals)."""
    if waves is None or in_flight <= 1:
        return 0.0
    return (in_flight - 1) / 2.0 * busy_s / max(1.0, waves)


def burst_batches_wait_s(in_flight: int, waves: float | None, alone_s: float, busy_s: float,
                         per_batch: int, tokenize_s: float = 0.0) -> float:
    """Mean extra wait of a burst whose prompts the engine prefills in batches.

    ``in_flight`` requests are sent at once; the server tokenizes them one after another
    (``tokenize_s`` each, :mod:`parsearch.serve.frontend`), and whenever the engine is free it
    prefills every tokenized prompt waiting, up to ``per_batch`` of them (the prompts that fit
    its token budget: vLLM ``max_num_batched_tokens``, SGLang ``--max-prefill-tokens`` and
    ``--chunked-prefill-size``, TensorRT-LLM ``max_num_tokens``; first come first served).
    A batch's prompts all get their first token when the batch ends, so packing prompts
    together delays the earlier ones by the later ones' prefill (bulk service, Bailey 1954,
    J. R. Stat. Soc. B 16; the engines' schedulers: vLLM V1 ``Scheduler.schedule``, SGLang
    ``PrefillAdder``, TensorRT-LLM's capacity scheduler).  A batch of ``n`` takes ``alone_s`` for
    one prompt and ``k busy_s`` for a full one of ``k = per_batch`` (``busy_s``: instance time
    per prompt when packed, :func:`parsearch.serve.cost.prefill_step`), in between linearly.
    The mean over the burst, less what a lone request takes (``tokenize_s + alone_s``),
    carries ``1 / waves`` of the requests, as in :func:`burst_wait_s`, which this reduces to
    for ``per_batch`` 1 and ``alone_s == busy_s``.  None: no burst (steady arrivals)."""
    if waves is None or in_flight <= 1:
        return 0.0
    free, done, total = 0.0, 0, 0.0
    while done < in_flight:
        start = max(free, (done + 1) * tokenize_s)  # the next prompt is tokenized by then
        ready = (in_flight if start >= in_flight * tokenize_s
                 else min(in_flight, int(start / tokenize_s)))
        n = max(1, min(max(1, per_batch), ready - done))
        free = start + batch_prefill_s(n, alone_s, busy_s, per_batch)
        total += n * free
        done += n
    return max(0.0, total / in_flight - tokenize_s - alone_s) / max(1.0, waves)


def batch_prefill_s(n: float, alone_s: float, busy_s: float, per_batch: int) -> float:
    """Time of one prefill batch of ``n`` prompts: ``alone_s`` for one, ``k busy_s`` for a
    full batch of ``k = per_batch`` (:func:`burst_batches_wait_s`), linear in between."""
    k = max(1, per_batch)
    slope = (k * busy_s - alone_s) / (k - 1) if k > 1 else busy_s
    return alone_s + (max(1.0, n) - 1.0) * max(slope, 0.0)


def separate_prefill_occupancy_s(alone_s: float, busy_s: float, per_batch: int,
                                 arrivals_per_s: float, window_s: float) -> float:
    """Instance time one prompt's prefill takes in steady state on an engine that runs
    prefill batches apart from the decodes (SGLang without ``--enable-mixed-chunk``,
    :data:`MIXED_PREFILL`): the running decodes wait for the whole prefill batch, which
    carries the prompts that queued while the previous one ran or while the scheduler was
    not polling.  With arrivals at ``arrivals_per_s``, a batch holds the prompt that opened
    it plus those arriving within ``window_s`` (the batch's own prefill and half the polling
    interval, ``recv_interval`` decode steps), ``n = 1 + rate window`` up to ``per_batch``
    (the mean of a Poisson count over the window), and each prompt occupies
    ``T(n) / n`` (:func:`batch_prefill_s`).  Never below ``busy_s``, the fully packed share,
    which the mixed engines' chunks approach (their steps' weight reads are the decodes')."""
    n = min(float(max(1, per_batch)), 1.0 + max(0.0, arrivals_per_s) * max(0.0, window_s))
    return max(busy_s, batch_prefill_s(n, alone_s, busy_s, per_batch) / n)


def closed_loop_share(waves: float | None, concurrency: int) -> float:
    """Share of the steady rate a fixed-count closed-loop run measures: a client that sends
    ``waves * C`` requests through ``C`` slots (bench_serving ``--max-concurrency C``) divides
    all output tokens by the whole run, whose end drains.  When the last request is handed
    out, each of the other ``C - 1`` slots is on average halfway through its request
    (residual life, Kleinrock Vol. 1 §5.2) and idles for the other half while the last one
    runs (Graham's list-scheduling bound, 1969: the makespan exceeds the mean load by at
    most one job), so the run measures ``waves / (waves + (C - 1) / (2 C))`` of the steady
    rate.  None: an open-ended steady load (1)."""
    if waves is None or concurrency <= 1:
        return 1.0
    return waves / (waves + (concurrency - 1) / (2.0 * concurrency))


@dataclass(frozen=True)
class TtftParts:
    """Time to first token and its parts, seconds (module docstring, items 0-6)."""

    slot_queue_s: float
    tokenize_s: float
    pickup_s: float
    balance_wait_s: float
    prefill_queue_s: float
    burst_s: float
    prefill_s: float
    ride_along_s: float

    @property
    def total_s(self) -> float:
        return (self.slot_queue_s + self.tokenize_s + self.pickup_s + self.balance_wait_s
                + self.prefill_queue_s + self.burst_s + self.prefill_s + self.ride_along_s)


@dataclass(frozen=True)
class TtftInputs:
    """What one instance's TTFT depends on (times in seconds)."""

    engine: str
    prompt_tokens: float   # computed prompt tokens of one request
    budget: int            # max_num_batched_tokens / chunked_prefill_size / max_num_tokens
    running: int           # requests in the running batch
    step_decodes: int      # running decodes in the step of the rank that prefills the prompt
    in_flight: int         # requests in the instance (running + queued)
    prefill_alone_s: float  # the prompt prefilled alone (all chunks, all stages)
    busy_s: float          # instance time one prompt's prefill occupies under load
    step_s: float          # one decode step of the running batch
    ride_s: float          # what the running decodes add to a step beside a prefill chunk
    cycle_s: float         # time for the running batch to turn over once (osl steps + prefills)
    slot_queue_s: float = 0.0
    recv_interval: int = 1
    balance_wait_iters: int = 0
    burst_waves: float | None = None
    lookahead: bool = False    # the engine forms the next batch while one runs (item 2)
    tokenize_s: float = 0.0    # host time to tokenize the prompt (0: sent as token ids)
    #: prompts one prefill batch packs (burst_batches_wait_s); None: as many whole prompts
    #: as the token budget holds
    prompts_per_prefill: int | None = None
    #: instance time per prompt's prefill in steady state (None: busy_s); the prefill queue
    #: uses it (separate_prefill_occupancy_s)
    occupancy_s: float | None = None


def ttft_parts(x: TtftInputs) -> TtftParts:
    """TTFT of a request in steady state, plus the burst share (module docstring)."""
    mixed = MIXED_PREFILL.get(x.engine, True)
    chunks = chunk_iterations(x.prompt_tokens, x.budget, x.step_decodes, mixed)
    per_batch = (x.prompts_per_prefill if x.prompts_per_prefill is not None
                 else max(1, int(x.budget // max(1.0, x.prompt_tokens))))
    occupancy = x.busy_s if x.occupancy_s is None else x.occupancy_s
    busy_share = x.running * occupancy / x.cycle_s if x.cycle_s > 0 else 0.0
    alone = x.running <= 1
    return TtftParts(
        slot_queue_s=x.slot_queue_s,
        tokenize_s=x.tokenize_s,
        pickup_s=pickup_wait_s(x.running, x.step_s, x.recv_interval, x.lookahead),
        balance_wait_s=0.0 if alone else x.balance_wait_iters * x.step_s,
        prefill_queue_s=0.0 if alone else prefill_queue_wait_s(busy_share, occupancy),
        burst_s=burst_batches_wait_s(x.in_flight, x.burst_waves, x.prefill_alone_s, x.busy_s,
                                     per_batch, x.tokenize_s),
        prefill_s=x.prefill_alone_s,
        ride_along_s=chunks * x.ride_s if mixed and not alone else 0.0,
    )
