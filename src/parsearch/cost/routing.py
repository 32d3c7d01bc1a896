"""Expert-load imbalance: how many more routed tokens the busiest EP rank gets than the mean.

An MoE layer waits for its slowest expert-parallel rank: the dispatch and combine
all-to-alls finish when the busiest rank has received and processed its tokens, so
the expert GEMMs and the EP traffic are priced at the busiest rank's load,
``imbalance = max / mean`` routed tokens per EP rank (formulas.md §5.3: "multiply the
k-terms by the per-rank load-imbalance factor").

Three regimes, as the launch runs them:

* ``balanced``: Megatron-Core ``--moe-router-force-load-balancing`` replaces the
  router's choice by a uniform one (a benchmarking switch: the router stops learning;
  NVIDIA's performance tables run with it, Megatron-Bridge ``docs/performance-summary.md``
  footnote).  Every rank gets the mean: imbalance 1.
* a capacity factor ``c`` (``--moe-expert-capacity-factor``): tokens past ``c`` times the
  mean per expert are dropped, so no rank exceeds ``c`` times the mean; with
  ``--moe-pad-expert-input-to-capacity`` every expert runs exactly ``c`` times the mean
  (Megatron-Core ``moe_utils.py`` capacity handling).
* ``trained`` (the default): a trained router's choice, which the balancing loss or
  bias keeps near uniform over a global batch but not within one micro-batch.

The trained regime is a statistical model with one measured constant.  A trained router
balances over the global batch, not within a sequence: a sequence's tokens go to the
experts of its domain (the sequence-level specialisation that micro-batch balancing
losses suppress, Qiu et al. 2025, arXiv 2501.11873 §1-2).  So per-expert load within
one dispatch averages over the ``n_seq`` independent sequences the EP group routes at
once: ``cv_e = cv_seq / sqrt(n_seq)``, with ``n_seq = ep * mbs / (tp * cp)`` (each of the
``ep`` ranks feeds ``mbs / (tp * cp)`` sequences' worth of tokens; at least one).  An EP
rank's load is the sum over its ``g = E / ep`` experts: ``cv_e / sqrt(g)`` (independent
experts); the multinomial sampling of ``n`` routed copies per rank adds ``1 / sqrt(n)``
(Poisson).  The expected maximum over ``ep`` ranks of approximately normal loads is
``mean * (1 + cv_rank * z(ep))`` with ``z(n)`` the expected largest of ``n`` standard
normals (integrated numerically from the order-statistic density; z(1) = 0).  The skew
term is ``cv_seq * sqrt(tp * cp / (mbs * E))``: EP alone widens the imbalance only through
``z(ep)``; more experts and larger micro-batches narrow it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from parsearch.model.specs import ModelSpec, TrainingSpec

#: Routing the cost model prices: a trained router's, or forced uniform (benchmarks).
ROUTING_MODES: tuple[str, ...] = ("trained", "balanced")

#: Coefficient of variation of per-expert load over the tokens of one sequence, under a
#: trained router.  Measured, not assumed: Megatron-Bridge's Qwen3-30B-A3B (E = 128, top-8)
#: on 16 H100 at EP16, mbs 1, ran the same recipe with forced balance (24.71 s per step,
#: the "HybridEP production-shape benchmark" of
#: ``skills/nemo-mbridge-perf-expert-parallel-overlap``) and with its router on real data
#: (30.29 s, ``examples/model_verification_cards/qwen3-30b-a3b/card.yaml``; both
#: @067f987df0; rows i0049 and i0059 of data/independent_runs.csv).  The cost model prices
#: that 1.226x step ratio at a busiest rank 1.54x the mean, i.e. ``cv_seq`` = 3.49 under
#: this module's model (benchmarks/fit_routing_cv.py).  Held out: the same model's GB200
#: EP8 mbs-4 card (i0061) and DeepSeek-V3's EP64 run on 2,048 H800 (i0048).
TRAINED_SEQUENCE_LOAD_CV = 3.49


@lru_cache(maxsize=1)
def _normal_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points, density and CDF of the standard normal on [-9, 9] (step 1e-3)."""
    x = np.linspace(-9.0, 9.0, 18001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    return x, pdf, cdf


@lru_cache(maxsize=4096)
@lru_cache(maxsize=4096)  # a pure function of n, asked for the same EP degrees per layout
def _expected_max(n: float) -> float:
    """E[max of n iid N(0, 1)] = integral of x * n * pdf(x) * cdf(x)^(n-1) (order statistics,
    e.g. David & Nagaraja, *Order Statistics*, eq. 2.1.5); 0 for n <= 1."""
    if n <= 1:
        return 0.0
    x, pdf, cdf = _normal_grid()
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1.0), x))


def expected_max_standard_normal(n: np.ndarray) -> np.ndarray:
    """Expected largest of ``n`` independent standard normals, elementwise (0 for n = 1)."""
    n = np.asarray(n, dtype=np.float64)
    whole = n.astype(np.int64)
    if n.size and np.array_equal(whole, n) and whole.min() >= 0 and whole.max() <= 1 << 20:
        # EP degrees: small integers, looked up in a table without sorting the layouts
        present = np.zeros(int(whole.max()) + 1, dtype=bool)
        present[whole.ravel()] = True
        table = np.zeros(len(present))
        for v in np.flatnonzero(present):
            table[v] = _expected_max(float(v))
        return table[whole]
    values, inverse = np.unique(n, return_inverse=True)
    table = np.array([_expected_max(float(v)) for v in values])
    return table[inverse].reshape(n.shape)


def trained_imbalance(model: ModelSpec, ep: np.ndarray, copies_per_rank: np.ndarray,
                      sequences: np.ndarray,
                      cv_sequence: float = TRAINED_SEQUENCE_LOAD_CV) -> np.ndarray:
    """max / mean routed tokens per EP rank under a trained router (module docstring).

    ``ep``: expert-parallel degree per layout; ``copies_per_rank``: routed token copies
    one EP rank processes on average per micro-batch (tokens x top-k); ``sequences``:
    independent sequences one dispatch over the EP group routes (``n_seq``).
    """
    ep = np.asarray(ep, dtype=np.float64)
    if model.moe is None:
        return np.ones_like(ep)
    experts_per_rank = np.maximum(model.moe.num_experts / np.maximum(ep, 1.0), 1.0)
    cv_expert = cv_sequence / np.sqrt(np.maximum(np.asarray(sequences, dtype=np.float64), 1.0))
    skew = cv_expert / np.sqrt(experts_per_rank)
    sampling = 1.0 / np.sqrt(np.maximum(np.asarray(copies_per_rank, dtype=np.float64), 1.0))
    return 1.0 + np.sqrt(skew * skew + sampling * sampling) * expected_max_standard_normal(ep)


def routing_imbalance(model: ModelSpec, *, routing: str, fixed: float | None,
                      capacity_factor: float | None, pad_to_capacity: bool,
                      ep: np.ndarray, copies_per_rank: np.ndarray,
                      sequences: np.ndarray) -> np.ndarray:
    """The imbalance each layout is priced with (an array over ``ep``'s layouts).

    ``fixed``: a user's ``--moe-imbalance`` (wins over everything); ``balanced``: 1;
    ``trained``: :func:`trained_imbalance`, capped at the capacity factor when tokens are
    dropped, and equal to it when expert inputs are padded to capacity.
    """
    ep = np.asarray(ep, dtype=np.float64)
    if fixed is not None:
        return np.full_like(ep, float(fixed))
    if capacity_factor is not None and pad_to_capacity:
        return np.full_like(ep, float(capacity_factor))
    if routing == "balanced" or model.moe is None:
        base = np.ones_like(ep)
    else:
        base = trained_imbalance(model, ep, copies_per_rank, sequences)
    if capacity_factor is not None:
        base = np.minimum(base, float(capacity_factor))
    return base


class RoutingOptions(Protocol):
    """The routing choices :func:`priced_imbalance` reads (what
    :class:`parsearch.cost.options.CostOptions` holds; that module builds on this one)."""

    @property
    def routing(self) -> str: ...
    @property
    def moe_imbalance(self) -> float | None: ...
    @property
    def moe_capacity_factor(self) -> float | None: ...
    @property
    def moe_pad_to_capacity(self) -> bool: ...


def priced_imbalance(model: ModelSpec, training: TrainingSpec, options: RoutingOptions,
                     cols: dict[str, np.ndarray]) -> np.ndarray:
    """:func:`routing_imbalance` of every layout in ``cols`` under ``options`` (a
    :class:`parsearch.cost.options.CostOptions`): :func:`layout_imbalance` of its degrees."""
    return layout_imbalance(model, training.seq_len, options, fixed=options.moe_imbalance,
                            tp=cols["tp"], cp=cols["cp"], ep=cols["ep"], mbs=cols["mbs"])


def layout_imbalance(model: ModelSpec, seq_len: int, options: RoutingOptions, *,
                     fixed: float | None, tp: Any, cp: Any, ep: Any, mbs: Any) -> Any:
    """:func:`routing_imbalance` of layouts given by their degrees (numbers or arrays), the
    one count the time model and the memory model share.

    Routed copies per EP rank: the ``mbs * s / (tp * cp)`` tokens one rank feeds into the
    MoE (SP layout, formulas.md §5.3), times top-k, which the rank receives back on
    average from its EP group; sequences per dispatch: those tokens' sequences over EP.
    """
    ep = np.asarray(ep, dtype=np.float64)
    if model.moe is None:
        return np.ones_like(ep)
    sequences_per_rank = (np.asarray(mbs, dtype=np.float64)
                          / (np.asarray(tp, dtype=np.float64) * np.asarray(cp, dtype=np.float64)))
    return routing_imbalance(model, routing=options.routing, fixed=fixed,
                             capacity_factor=options.moe_capacity_factor,
                             pad_to_capacity=options.moe_pad_to_capacity, ep=ep,
                             copies_per_rank=sequences_per_rank * seq_len * model.moe.top_k,
                             sequences=ep * sequences_per_rank)


__all__ = [
    "ROUTING_MODES",
    "TRAINED_SEQUENCE_LOAD_CV",
    "RoutingOptions",
    "expected_max_standard_normal",
    "layout_imbalance",
    "priced_imbalance",
    "routing_imbalance",
    "trained_imbalance",
]
