"""Serving specifications: the workload a deployment must carry and one serving layout.

Frozen dataclasses validated on construction (bad input is a :class:`SpecError`
naming the field, the value and the rule), like :mod:`parsearch.model.specs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from parsearch.errors import SpecError
from parsearch.model.specs import require_choice, require_positive_int

ServingMode = Literal["aggregated", "disaggregated"]
SERVING_MODES: tuple[str, ...] = ("aggregated", "disaggregated")
WEIGHT_PRECISIONS: tuple[str, ...] = ("bf16", "fp8", "fp4")
KV_PRECISIONS: tuple[str, ...] = ("bf16", "fp8", "fp4")
#: Engines whose memory rules are modelled (:mod:`parsearch.serve.memory`).
SERVING_ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm")
#: Speculative decoding methods priced by :mod:`parsearch.serve.speculative`.
SPEC_METHODS: tuple[str, ...] = ("none", "mtp", "eagle", "draft")
#: Most draft tokens per verify step (engines cap their draft length near this: vLLM
#: ``num_speculative_tokens``, TensorRT-LLM ``max_draft_len``, SGLang
#: ``--speculative-num-draft-tokens``).
MAX_SPEC_TOKENS = 16

#: Bytes per stored element.  FP8 (E4M3) is one byte; NVFP4 stores 4-bit values with one
#: FP8 scale per 16 values, 4.5 bits per value (NVIDIA technical blog "Introducing NVFP4
#: for efficient and accurate low-precision inference", 2025).
#: Most request length classes a mix may have (each is priced for every layout).
MAX_LENGTH_CLASSES = 64
ELEMENT_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 4.5 / 8.0}


def _optional_positive(owner: str, name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{owner}: {name} must be a positive number, got {value!r}")
    if value <= 0:
        raise SpecError(f"{owner}: {name} must be a positive number, got {value}")
    return float(value)


@dataclass(frozen=True)
class SlidingWindow:
    """Sliding-window attention: ``windowed_layers`` of the layers attend to the last
    ``window`` tokens only, so their KV cache never holds more than ``window`` tokens
    (Mistral 7B, arXiv 2310.06825 §2 "rolling buffer cache"; GPT-OSS alternates
    windowed and full layers, openai/gpt-oss-120b config.json ``layer_types``)."""

    window: int
    windowed_layers: int

    def __post_init__(self) -> None:
        require_positive_int("sliding_window", "window", self.window)
        require_positive_int("sliding_window", "windowed_layers", self.windowed_layers)


@dataclass(frozen=True)
class LengthClass:
    """Requests of ``isl`` input and ``osl`` output tokens, ``weight`` their share of requests."""

    isl: int
    osl: int
    weight: float = 1.0

    def __post_init__(self) -> None:
        require_positive_int("length class", "isl", self.isl)
        require_positive_int("length class", "osl", self.osl)
        _optional_positive("length class", "weight", self.weight)


@dataclass(frozen=True)
class ServingWorkload:
    """What a serving deployment must carry.

    ``isl``/``osl``: input and output tokens per request (fixed lengths, as the
    framework benchmarks use).  ``mix``: a distribution of request lengths instead, as
    classes with request shares (:meth:`from_mix`); ``isl``/``osl`` then hold the
    request-weighted means.  ``ttft_ms``/``tpot_ms``: latency targets (None: no
    bound).  ``concurrency``: total requests in flight over the whole group (None:
    the space chooses the batch of each replica).  ``request_rate``: requests/s the
    group must carry (None: replicas fill the GPU budget).  ``max_batch``: the most
    requests one instance runs at once (vLLM ``--max-num-seqs``, SGLang
    ``--max-running-requests``).  ``max_num_batched_tokens``: tokens per scheduler
    step (chunked prefill), which sizes the activation workspace.
    ``engine``: the serving engine whose memory rules size the KV pool (``vllm``,
    ``sglang``, ``trtllm``; :func:`parsearch.serve.memory.kv_pool_bytes`).
    ``memory_fraction``: that engine's memory knob (vLLM ``--gpu-memory-utilization``,
    SGLang ``--mem-fraction-static``, TensorRT-LLM ``kv_cache_free_gpu_memory_fraction``;
    None: the engine's default, :func:`parsearch.serve.memory.memory_fraction`).
    ``ep_overlap``: MoE all-to-alls overlapped with the computation of a second
    micro-batch (SGLang ``--enable-two-batch-overlap``).
    ``max_instance_gpus``: the largest serving instance considered (replicas fill the rest
    of the budget; DeepSeek's published decode instances span 144 GPUs, SGLang's 72).
    ``spec_decode``: speculative decoding (``none``, ``mtp``, ``eagle``, ``draft``) with
    ``spec_tokens`` draft tokens per verify step, ``acceptance_rate`` the chance that each
    draft token is accepted (None: the method's cited default) and ``draft_cost`` one draft
    forward's time as a share of a target decode step (None: the method's default;
    required for ``draft``); :mod:`parsearch.serve.speculative`.
    ``eplb``: experts placed by an expert-parallel load balancer (DeepSeek EPLB; vLLM and
    SGLang ``--enable-eplb``, TensorRT-LLM ``moe_config.load_balancer``), which evens the
    routed tokens over the EP ranks; without it the busiest rank sets the MoE layer's time
    (:func:`parsearch.serve.moe.ep_imbalance`).
    ``prefix_cache_hit``: share of each prompt's tokens found in the prefix cache (vLLM
    automatic prefix caching, SGLang RadixAttention, TensorRT-LLM KV cache reuse), which
    prefill does not compute; :mod:`parsearch.serve.prefix_cache`.
    ``recv_interval``: decode steps between the engine's polls for new requests (SGLang
    ``--scheduler-recv-interval``, default 1).  ``balance_wait_iters``: iterations
    TensorRT-LLM's attention-DP balancer holds a context request (``attention_dp_config:
    enable_balance``, ``batching_wait_iters`` default 10; 0: balancer off).
    ``burst_waves``: the client sends ``concurrency * burst_waves`` requests, all at once at
    an idle engine with at most ``concurrency`` in flight (bench_serving ``--request-rate
    inf --max-concurrency``), so the first wave arrives together (None: steady arrivals).
    ``async_scheduling``: the engine forms its next batch while the current one runs, so a
    new request joins one step later (vLLM ``--async-scheduling``, SGLang's overlap
    scheduler, TensorRT-LLM's overlap scheduler; None: the engine's default,
    :func:`parsearch.serve.engines.schedules_ahead`).  ``text_prompts``: prompts arrive as
    text at the engine's OpenAI-compatible server, which tokenizes them one at a time
    (:mod:`parsearch.serve.frontend`; False: token ids, as ``trtllm-bench`` sends).
    All of these shape TTFT only (:mod:`parsearch.serve.ttft`).
    ``tensorrt_engine``: TensorRT-LLM's TensorRT-engine workflow (``trtllm-build``) instead
    of its PyTorch backend; its mapping has no attention DP (space rule S12).
    ``expert_activations``: precision of the activations the routed experts' GEMMs take
    (None: that of the weights); ``fp8`` with FP4 experts runs Blackwell's mixed-operand MMA
    at the FP8 rate (vLLM ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``;
    :func:`parsearch.serve.cost.expert_rate`).
    ``allreduce_fusion``: each TP all-reduce runs fused with the residual add and RMSNorm
    after it (SGLang ``--enable-flashinfer-allreduce-fusion``); ``fused_moe_runner``: the
    MoE's routing and glue kernels run inside one fused MoE (SGLang ``--moe-runner-backend
    flashinfer_trtllm``).  Both cut kernels per layer (:mod:`parsearch.serve.kernels`).
    """

    isl: int
    osl: int
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    precision: str = "bf16"
    kv_precision: str = "bf16"
    mode: str = "aggregated"
    concurrency: int | None = None
    request_rate: float | None = None
    max_batch: int = 1024
    max_num_batched_tokens: int = 8192
    engine: str = "vllm"
    memory_fraction: float | None = None
    mix: tuple[LengthClass, ...] = ()
    ep_overlap: bool = False
    max_instance_gpus: int = 128
    spec_decode: str = "none"
    spec_tokens: int | None = None
    acceptance_rate: float | None = None
    draft_cost: float | None = None
    prefix_cache_hit: float = 0.0
    eplb: bool = False
    recv_interval: int = 1
    balance_wait_iters: int = 0
    burst_waves: float | None = None
    async_scheduling: bool | None = None
    text_prompts: bool = False
    tensorrt_engine: bool = False
    expert_activations: str | None = None
    allreduce_fusion: bool = False
    fused_moe_runner: bool = False
    _classes: tuple[LengthClass, ...] = field(init=False, repr=False, compare=False, default=())

    @classmethod
    def from_mix(cls, mix: tuple[LengthClass, ...] | list[LengthClass],
                 **fields: object) -> ServingWorkload:
        """A workload whose requests follow ``mix``; isl/osl are its request-weighted means."""
        classes = tuple(mix)
        if not classes:
            raise SpecError("serving workload: mix is empty; give at least one length class")
        total = sum(c.weight for c in classes)
        isl = max(1, round(sum(c.weight * c.isl for c in classes) / total))
        osl = max(1, round(sum(c.weight * c.osl for c in classes) / total))
        return cls(isl=isl, osl=osl, mix=classes, **fields)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        owner = "serving workload"
        for item in self.mix:
            if not isinstance(item, LengthClass):
                raise SpecError(f"{owner}: mix entries must be LengthClass, got {item!r}")
        require_positive_int(owner, "isl", self.isl)
        require_positive_int(owner, "osl", self.osl)
        require_positive_int(owner, "max_batch", self.max_batch)
        require_positive_int(owner, "max_num_batched_tokens", self.max_num_batched_tokens)
        require_positive_int(owner, "max_instance_gpus", self.max_instance_gpus)
        require_positive_int(owner, "recv_interval", self.recv_interval)
        wait = self.balance_wait_iters
        if isinstance(wait, bool) or not isinstance(wait, int) or wait < 0:
            raise SpecError(f"{owner}: balance_wait_iters must be a whole number >= 0, got "
                            f"{self.balance_wait_iters!r}")
        _optional_positive(owner, "burst_waves", self.burst_waves)
        if len(self.mix) > MAX_LENGTH_CLASSES:
            raise SpecError(f"{owner}: mix has {len(self.mix)} length classes; at most "
                            f"{MAX_LENGTH_CLASSES} (merge similar lengths)")
        if self.concurrency is not None:
            require_positive_int(owner, "concurrency", self.concurrency)
        _optional_positive(owner, "ttft_ms", self.ttft_ms)
        _optional_positive(owner, "tpot_ms", self.tpot_ms)
        _optional_positive(owner, "request_rate", self.request_rate)
        require_choice(owner, "precision", self.precision, WEIGHT_PRECISIONS)
        require_choice(owner, "kv_precision", self.kv_precision, KV_PRECISIONS)
        require_choice(owner, "mode", self.mode, SERVING_MODES)
        if not isinstance(self.eplb, bool):
            raise SpecError(f"{owner}: eplb must be true or false, got {self.eplb!r}")
        for name in ("text_prompts", "tensorrt_engine", "allreduce_fusion", "fused_moe_runner"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{owner}: {name} must be true or false, got "
                                f"{getattr(self, name)!r}")
        if self.expert_activations is not None:
            require_choice(owner, "expert_activations", self.expert_activations,
                           WEIGHT_PRECISIONS)
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise SpecError(f"{owner}: async_scheduling must be true, false or None, got "
                            f"{self.async_scheduling!r}")
        if not isinstance(self.ep_overlap, bool):
            raise SpecError(f"{owner}: ep_overlap must be true or false, got {self.ep_overlap!r}")
        object.__setattr__(self, "_classes", self.mix or (LengthClass(self.isl, self.osl, 1.0),))
        require_choice(owner, "engine", self.engine, SERVING_ENGINES)
        self._check_speculation(owner)
        hit = self.prefix_cache_hit
        if (isinstance(hit, bool) or not isinstance(hit, int | float) or not math.isfinite(hit)
                or not 0 <= hit < 1):
            raise SpecError(f"{owner}: prefix_cache_hit (--prefix-cache-hit) must be in [0, 1), "
                            f"got {hit!r} (the share of prompt tokens found in the cache)")
        frac = self.memory_fraction
        if frac is not None and (isinstance(frac, bool) or not isinstance(frac, int | float)
                                 or not 0 < frac <= 1):
            raise SpecError(f"{owner}: memory_fraction must be in (0, 1], got {frac!r} "
                            "(the engine's share of GPU memory, e.g. 0.9)")

    def _check_speculation(self, owner: str) -> None:
        require_choice(owner, "spec_decode", self.spec_decode, SPEC_METHODS)
        off = self.spec_decode == "none"
        if off:
            given = [name for name in ("spec_tokens", "acceptance_rate", "draft_cost")
                     if getattr(self, name) is not None]
            if given:
                raise SpecError(f"{owner}: {', '.join(given)} given without spec_decode "
                                "(--spec-decode mtp|eagle|draft)")
            return
        n = self.spec_tokens
        if n is not None:
            require_positive_int(owner, "spec_tokens", n)
            if n > MAX_SPEC_TOKENS:
                raise SpecError(f"{owner}: spec_tokens (--spec-tokens) must be in 1..."
                                f"{MAX_SPEC_TOKENS}, got {n}")
        a = self.acceptance_rate
        if a is not None and (isinstance(a, bool) or not isinstance(a, int | float)
                              or not math.isfinite(a) or not 0 <= a <= 1):
            raise SpecError(f"{owner}: acceptance_rate (--acceptance-rate) must be in [0, 1], "
                            f"got {a!r} (the chance each draft token is accepted)")
        c = self.draft_cost
        if c is not None and (isinstance(c, bool) or not isinstance(c, int | float)
                              or not math.isfinite(c) or not 0 <= c <= 1):
            raise SpecError(f"{owner}: draft_cost (--draft-cost) must be in [0, 1], got {c!r} "
                            "(one draft forward's time over one target decode step)")
        if self.spec_decode == "draft" and (a is None or c is None):
            raise SpecError(f"{owner}: spec_decode draft needs acceptance_rate "
                            "(--acceptance-rate) and draft_cost (--draft-cost): both depend on "
                            "the draft/target pair, so there is no default")

    @property
    def classes(self) -> tuple[LengthClass, ...]:
        """The request length classes (one class of isl/osl without a mix)."""
        return self._classes

    def _slot_mean(self, per_class: list[float]) -> float:
        # A class holds batch slots in proportion to its requests times their decode steps
        # (Little's law: slots = arrival rate x time in the batch).
        slots = [c.weight * c.osl for c in self.classes]
        return sum(s * v for s, v in zip(slots, per_class, strict=True)) / sum(slots)

    @property
    def mean_osl(self) -> float:
        """Output tokens per request, averaged over requests."""
        classes = self.classes
        return sum(c.weight * c.osl for c in classes) / sum(c.weight for c in classes)

    @property
    def context(self) -> float:
        """KV tokens a batch slot must hold: the context a request reaches when it finishes,
        averaged over the slots (a single class: isl + osl)."""
        return self._slot_mean([c.isl + c.osl for c in self.classes])

    @property
    def max_context(self) -> int:
        """The longest request (isl + osl), what the engine's context limit must allow."""
        return max(c.isl + c.osl for c in self.classes)

    @property
    def mean_decode_context(self) -> float:
        """Average tokens attended to per decode step (a request's context grows from isl
        to isl + osl), averaged over the batch slots."""
        return self._slot_mean([c.isl + c.osl / 2.0 for c in self.classes])


@dataclass(frozen=True)
class ServingLayout:
    """One serving instance shape and how many copies of it run.

    Per instance: ``tp`` (attention tensor parallel), ``attention_dp`` (attention
    data-parallel ranks of an MoE model; each holds its own requests and KV cache),
    ``pp`` (pipeline stages), ``ep`` (expert parallel size; the experts of one
    stage are spread over ``tp * attention_dp`` GPUs, ``ep`` ways by expert and
    ``expert_tp`` ways by tensor slicing), ``batch`` (requests in flight per instance).
    """

    tp: int
    pp: int
    ep: int
    attention_dp: int
    batch: int
    replicas: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "attention_dp", "batch", "replicas"):
            require_positive_int("serving layout", name, getattr(self, name))

    @property
    def stage_width(self) -> int:
        """GPUs of one pipeline stage: tp * attention_dp (the expert group)."""
        return self.tp * self.attention_dp

    @property
    def gpus_per_replica(self) -> int:
        return self.stage_width * self.pp

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel slicing of each expert: stage width / ep (1 with full EP)."""
        return max(1, self.stage_width // self.ep)

    def label(self) -> str:
        parts = [f"tp{self.tp}"]
        if self.attention_dp > 1:
            parts.append(f"adp{self.attention_dp}")
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        return "".join(parts) + f" b{self.batch} x{self.replicas}"
