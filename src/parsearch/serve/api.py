"""Public serving API beside :func:`parsearch.search.api.search_layouts`.

>>> from parsearch.query import Query
>>> from parsearch.serve.spec import ServingWorkload
>>> w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8", tpot_ms=50)
>>> r = serve_layouts(Query("llama3-70b", clusters="dgx-h100"), num_gpus=8, workload=w, top=3)
>>> len(r.entries) <= 3, r.best.estimate.tpot_ms <= 50, r.best.estimate.gpus <= 8
(True, True, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from parsearch.cost.efficiency import EfficiencyProfile, efficiency_for_gpu, load_efficiency_profile
from parsearch.errors import NoValidLayoutError, SpecError
from parsearch.model.specs import ModelSpec
from parsearch.query import Query
from parsearch.serve.confidence import (
    OrderConfidence,
    gap_of,
    load_order_confidence,
    serving_tie_note,
)
from parsearch.serve.context import context_window
from parsearch.serve.cost import rates_for
from parsearch.serve.evaluate import (
    ServingContext,
    ServingEstimate,
    evaluate_aggregated,
    evaluate_disaggregated,
)
from parsearch.serve.front import best_per_shape, pareto_points, rank_estimates
from parsearch.serve.kv_cache import sliding_window_for
from parsearch.serve.launch import ServingLaunch, launch_settings
from parsearch.serve.space import require_serving_layouts
from parsearch.serve.spec import ServingLayout, ServingWorkload, SlidingWindow
from parsearch.topology.cluster import ClusterSpec, load_cluster
from parsearch.topology.hardware import load_gpu_profile

#: Prefill instance shapes tried per query in disaggregated mode (the best by requests/s per GPU).
PREFILL_SHAPES = 6


@dataclass(frozen=True)
class ServeEntry:
    rank: int
    estimate: ServingEstimate
    launch: ServingLaunch
    #: within the tie band of the best (:mod:`parsearch.serve.confidence`)
    tied: bool = False
    #: share of held-out pairs at this entry's predicted gap to the best whose measured
    #: order matched the predicted one (None for the best and when ranking by GPUs)
    order_confidence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, **self.estimate.to_dict(), "tied_with_best": self.tied,
                "order_confidence_vs_best": self.order_confidence,
                "launch": self.launch.to_dict()}


@dataclass(frozen=True)
class ServeResult:
    """Ranked layouts meeting the targets, the Pareto front, and what was considered."""

    query: dict[str, Any]
    considered: int
    fitting: int
    entries: tuple[ServeEntry, ...]
    front: tuple[ServingEstimate, ...]
    elapsed_s: float
    #: the note under a table with ties ("" without ties)
    tie_note: str = ""

    @property
    def best(self) -> ServeEntry | None:
        return self.entries[0] if self.entries else None

    def to_dict(self) -> dict[str, Any]:
        return {"query": dict(self.query), "considered": self.considered,
                "fitting": self.fitting, "results": [e.to_dict() for e in self.entries],
                "front": [e.to_dict() for e in self.front],
                "tie_note": self.tie_note, "elapsed_s": round(self.elapsed_s, 3)}


def model_id_for(model: ModelSpec) -> str:
    """A Hugging Face id for launch lines: the one the preset's source names, else its name."""
    first = model.source.split()[0] if model.source else ""
    return first if first.count("/") == 1 else model.name


def _context(model: ModelSpec, cluster: ClusterSpec, workload: ServingWorkload,
             window: SlidingWindow | None,
             efficiency: EfficiencyProfile | str | None) -> ServingContext:
    gpu = load_gpu_profile(cluster.gpu)
    if workload.kv_precision == "fp4" and "fp4" not in gpu.peak_flops:
        raise SpecError(f"kv_precision fp4 needs FP4 tensor cores (Blackwell); {gpu.name} has "
                        "none: use bf16 or fp8")
    if isinstance(efficiency, str):
        profile = load_efficiency_profile(efficiency)
    else:
        profile = efficiency or efficiency_for_gpu(gpu.name)
    return ServingContext(model=model, workload=workload, cluster=cluster, gpu=gpu,
                          profile=profile, rates=rates_for(gpu, profile, workload.precision, model),
                          window=sliding_window_for(model, window))


def _distinct(estimates: list[ServingEstimate]) -> list[ServingEstimate]:
    """One estimate per scored layout: batches above the KV cap all score at the cap when the
    space chooses the load, so they repeat the same layout."""
    seen: set[ServingLayout] = set()
    out = []
    for est in estimates:
        if est.layout not in seen:
            seen.add(est.layout)
            out.append(est)
    return out


def score_layouts(ctx: ServingContext, num_gpus: int,
                  layouts: list[ServingLayout]) -> list[ServingEstimate]:
    """Every layout scored in the workload's mode."""
    aggregated = _distinct([evaluate_aggregated(ctx, layout, num_gpus) for layout in layouts])
    if ctx.workload.mode == "aggregated":
        return aggregated
    shapes: dict[tuple[int, int, int, int], ServingEstimate] = {}
    for est in aggregated:  # one (smallest-batch) entry per instance shape
        lay = est.layout
        key = (lay.tp, lay.attention_dp, lay.pp, lay.ep)
        if est.fits and (key not in shapes or lay.batch < shapes[key].layout.batch):
            shapes[key] = est
    prefill = sorted(shapes.values(), key=lambda e: e.ttft_ms * e.layout.gpus_per_replica)
    out = []
    for p in prefill[:PREFILL_SHAPES]:
        for d in aggregated:
            if d.fits and p.layout.gpus_per_replica + d.layout.gpus_per_replica <= num_gpus:
                est = evaluate_disaggregated(ctx, p.layout, d.layout, num_gpus)
                if est is not None:
                    out.append(est)
    return out


def _no_result_message(model: ModelSpec, workload: ServingWorkload, num_gpus: int,
                       estimates: list[ServingEstimate]) -> str:
    fitting = [e for e in estimates if e.fits]
    serving = [e for e in fitting if e.serves]
    if fitting and not serving:
        return (f"no serving layout of {model.name} on {num_gpus} GPUs carries any tokens: "
                "every layout that fits computes zero or undefined throughput; try shorter "
                "requests or more GPUs")
    if not fitting:
        load = ""
        if workload.concurrency is not None:
            load = f" at concurrency {workload.concurrency}"
        if workload.request_rate is not None:
            load += f" carrying {workload.request_rate:g} requests/s"
        return (f"no serving layout of {model.name} fits on {num_gpus} GPUs{load} with "
                f"{workload.precision} weights and isl+osl={workload.context:g} tokens of KV "
                "cache per request; try more GPUs, --precision fp8/fp4, --kv-precision fp8, "
                "shorter requests or less load")
    targets = [f"{name} <= {value:g} ms" for name, value in
               (("ttft", workload.ttft_ms), ("tpot", workload.tpot_ms)) if value is not None]
    best_ttft = min(e.ttft_ms for e in serving)
    best_tpot = min(e.tpot_ms for e in serving)
    return (f"no layout meets the latency targets ({', '.join(targets)}); the best reachable "
            f"on {num_gpus} GPUs are ttft {best_ttft:.1f} ms and tpot {best_tpot:.2f} ms "
            "(not necessarily together)")


def require_context_fits(model: ModelSpec, workload: ServingWorkload) -> None:
    """A :class:`NoValidLayoutError` when the longest request exceeds the model's context
    window (:mod:`parsearch.serve.context`): no engine serves it on any layout."""
    window = context_window(model)
    if window is not None and workload.max_context > window:
        raise NoValidLayoutError(
            f"nothing fits: a request of {workload.max_context:,} tokens (isl + osl) exceeds "
            f"{model.name}'s context window of {window:,} tokens (config.json "
            "max_position_embeddings), which serving engines refuse to exceed; give requests "
            f"of at most {window:,} tokens")


def _model_spec(model: ModelSpec | str) -> ModelSpec:
    """A model spec, or a preset name / model file resolved to one."""
    if isinstance(model, ModelSpec):
        return model
    from parsearch.model.files import resolve_model

    return resolve_model(model)


def serve_layouts(query: Query | None = None, /, *, num_gpus: int,
                  workload: ServingWorkload, window: SlidingWindow | None = None, top: int = 10,
                  model_id: str | None = None, diverse: bool = True,
                  **legacy: Any) -> ServeResult:
    """The best serving layouts of ``query.model`` on up to ``num_gpus`` GPUs of its cluster.

    ``query``: the model, one cluster and the efficiency profile (``query.training`` and
    ``query.options`` are not used: the workload says what is served).  The keywords
    ``model=, cluster=, efficiency=`` of earlier versions still build it
    (:meth:`Query.of <parsearch.query.Query.of>`).  ``diverse`` (default): one entry per
    instance shape (:func:`parsearch.serve.front.instance_shape`) at its best-ranked batch;
    False lists every batch of every shape.  The Pareto front keeps every batch either way.
    Raises :class:`NoValidLayoutError`
    (one line, saying why) when no layout fits or none meets the latency targets.
    """
    start = time.perf_counter()
    query = Query.of(query, legacy, "serve_layouts")
    model, cluster, efficiency = _model_spec(query.model), query.cluster, query.profile
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise SpecError(f"num_gpus must be a positive integer, got {num_gpus!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise SpecError(f"top must be a positive integer, got {top!r}")
    spec = load_cluster(cluster) if isinstance(cluster, str) else cluster
    if spec.max_gpus is not None and num_gpus > spec.max_gpus:
        raise SpecError(f"--gpus {num_gpus} exceeds cluster {spec.name}'s max_gpus={spec.max_gpus}")
    require_context_fits(model, workload)
    ctx = _context(model, spec, workload, window, efficiency)
    layouts = require_serving_layouts(model, workload, num_gpus, spec.job_domain_size,
                                      spec.gpus_per_node)
    estimates = score_layouts(ctx, num_gpus, layouts)
    by_gpus = workload.request_rate is not None
    ranked = rank_estimates(estimates, by_gpus=by_gpus)
    if diverse:
        ranked = best_per_shape(ranked)
    if not ranked:
        raise NoValidLayoutError(_no_result_message(model, workload, num_gpus, estimates))
    name = model_id or model_id_for(model)
    # ties: within the measured band of the best throughput (parsearch.serve.confidence);
    # the order stays the point estimate's, so the first K are the same whatever ``top``
    # is.  Ranking by the fewest GPUs for a request rate has no throughput tie to mark.
    conf = load_order_confidence()
    tied, sure = (ties_with_best(ranked, conf) if not by_gpus
                  else ([False] * len(ranked), [None] * len(ranked)))
    entries = tuple(
        ServeEntry(rank=i + 1, estimate=e,
                   launch=launch_settings(name, e.layout, workload, e.prefill_layout),
                   tied=tied[i], order_confidence=sure[i])
        for i, e in enumerate(ranked[:top])
    )
    query = {"model": model.name, "cluster": spec.name, "gpu": ctx.gpu.name,
             "num_gpus": num_gpus, "isl": workload.isl, "osl": workload.osl,
             "mix": [{"isl": c.isl, "osl": c.osl, "weight": c.weight} for c in workload.mix],
             "precision": workload.precision, "kv_precision": workload.kv_precision,
             "mode": workload.mode, "ep_overlap": workload.ep_overlap, "diverse": diverse,
             "engine": workload.engine, "memory_fraction": workload.memory_fraction,
             "ttft_ms": workload.ttft_ms, "tpot_ms": workload.tpot_ms,
             "concurrency": workload.concurrency, "request_rate": workload.request_rate,
             "spec_decode": workload.spec_decode, "spec_tokens": workload.spec_tokens,
             "acceptance_rate": workload.acceptance_rate, "draft_cost": workload.draft_cost,
             "prefix_cache_hit": workload.prefix_cache_hit, "eplb": workload.eplb,
             "sliding_window": None if ctx.window is None else
             {"window": ctx.window.window, "windowed_layers": ctx.window.windowed_layers}}
    return ServeResult(query=query, considered=len(layouts),
                       fitting=sum(e.fits for e in estimates), entries=entries,
                       front=tuple(pareto_points(estimates)),
                       elapsed_s=time.perf_counter() - start,
                       tie_note=serving_tie_note(conf) if any(tied[:top]) else "")


def ties_with_best(ranked: list[ServingEstimate], conf: OrderConfidence
                   ) -> tuple[list[bool], list[float | None]]:
    """Per ranked estimate (best first, by whole-group tokens/s): is it within the tie band
    of the best, and the measured share of held-out pairs at its predicted gap to the best
    that kept their order (None for the best).  The best is tied only when another is."""
    best = ranked[0].tokens_per_s if ranked else 0.0
    gaps = [gap_of(best, e.tokens_per_s) for e in ranked]
    inside = [g < conf.tie_band for g in gaps]
    tied = inside if sum(inside) > 1 else [False] * len(ranked)
    sure = [None if i == 0 else conf.right_share(g) for i, g in enumerate(gaps)]
    return tied, sure
