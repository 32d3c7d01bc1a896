"""The one measured constant of trained-router pricing: per-expert load spread within a sequence.

Megatron-Bridge ran Qwen3-30B-A3B on 16 H100 (EP16) with one recipe twice: forced-balance
routing on mock data (i0049, 24.71 s per step) and its router on real data (i0059,
30.29 s).  This script finds the fixed imbalance ``I`` at which the cost model prices
i0059 1.226x slower than under forced balance, inverts :func:`trained_imbalance` for the
per-sequence coefficient of variation, and then predicts the held-out natural-routing run
(i0061: the same model on 8 GB200, EP8, MXFP8; i0048: DeepSeek-V3 on 2,048 H800, EP64)
with that constant.

    python benchmarks/fit_routing_cv.py
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from parsearch.cost.analytic import CostOptions, estimate
from parsearch.cost.routing import TRAINED_SEQUENCE_LOAD_CV, expected_max_standard_normal
from parsearch.validation.published.published_runs import PublishedRun, read_published_runs
from parsearch.validation.published.runs import fabric_for, memory_saving_candidates, run_cost_model

FIT_RUN, FORCED_RUN, HELD_OUT = "i0059", "i0049", "i0061"
DEFAULT_DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / (
    "independent_runs.csv")


def _runs() -> dict[str, PublishedRun]:
    return {r.id: r for r in read_published_runs(DEFAULT_DATA).runs}


def predicted_step_s(run: PublishedRun, options: CostOptions) -> float:
    """Predicted seconds per step of ``run`` as its recipe reads, under ``options``."""
    assert run.cluster is not None
    training, layout, _ = memory_saving_candidates(run)[0]
    cm = run_cost_model(run, fabric_for({}, run.cluster, run.num_gpus), options, training)
    # the recipe's own routing is overridden only where the caller fixes the imbalance
    if options.moe_imbalance is not None:
        cm = replace(cm, options=replace(cm.options, moe_imbalance=options.moe_imbalance))
    return estimate(cm, layout).step_time_s


def main() -> None:
    runs = _runs()
    fit, forced, held = runs[FIT_RUN], runs[FORCED_RUN], runs[HELD_OUT]
    measured = (1.0 / fit.measured_tokens_per_s_per_gpu) / (
        1.0 / forced.measured_tokens_per_s_per_gpu)
    base = predicted_step_s(fit, CostOptions(moe_imbalance=1.0))
    lo, hi = 1.0, 4.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if predicted_step_s(fit, CostOptions(moe_imbalance=mid)) / base < measured:
            lo = mid
        else:
            hi = mid
    imbalance = 0.5 * (lo + hi)
    layout = fit.layout
    moe = fit.model_spec.moe if fit.model_spec else None
    assert moe is not None
    z = float(expected_max_standard_normal(layout.ep))
    copies = layout.mbs * fit.seq_len / (layout.tp * layout.cp) * moe.top_k
    rank_cv = (imbalance - 1.0) / z
    skew = math.sqrt(max(rank_cv ** 2 - 1.0 / copies, 0.0))
    sequences = max(layout.ep * layout.mbs / (layout.tp * layout.cp), 1.0)
    cv = skew * math.sqrt(moe.num_experts / layout.ep) * math.sqrt(sequences)
    print(f"{FIT_RUN}/{FORCED_RUN} measured step ratio {measured:.3f}: priced at a fixed "
          f"imbalance {imbalance:.3f} (EP{layout.ep}, z = {z:.3f}) -> per-sequence cv {cv:.3f} "
          f"(shipped {TRAINED_SEQUENCE_LOAD_CV})")
    trained = predicted_step_s(fit, CostOptions())
    print(f"  {FIT_RUN} with the shipped constant: predicted {trained / base:.3f}x the "
          f"balanced step (measured {measured:.3f}x)")
    for run in (held, runs["i0048"]):
        step = predicted_step_s(run, CostOptions())
        balanced = predicted_step_s(run, CostOptions(moe_imbalance=1.0))
        tokens = run.global_batch * run.seq_len / run.num_gpus
        measured_tps = run.measured_tokens_per_s_per_gpu
        print(f"  held out {run.id} (EP{run.layout.ep}, {run.num_gpus} {run.gpu}): "
              f"measured/predicted {measured_tps * step / tokens:.3f} "
              f"(under forced balance {measured_tps * balanced / tokens:.3f})")


if __name__ == "__main__":
    main()
