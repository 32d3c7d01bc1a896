"""What the expert-parallel overlaps hide: Megatron's all-to-all overlap
(``--overlap-moe-expert-parallel-comm``, the merged 1F1B step) and the shared-expert overlap
(``--moe-shared-expert-overlap``), and where Megatron runs them.

Used by :func:`parsearch.cost.communication.unit_comm` for the EP traffic it prices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parsearch.cost.compute import UnitCompute, is_moe_unit
from parsearch.cost.fused_mlp import fused_mlp_pinned_flags
from parsearch.cost.options import CostOptions
from parsearch.layout import Layout
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec


def shared_expert_overlap_on(model: ModelSpec, options: CostOptions, unit: str) -> bool:
    """Whether ``--moe-shared-expert-overlap`` is priced for ``unit``: an MoE unit with
    shared experts (CostOptions refuses it beside the all-to-all overlap, as Megatron-Core
    does)."""
    return bool(options.moe_shared_expert_overlap and is_moe_unit(model, unit)
                and model.moe is not None and model.moe.shared_expert_ffn_hidden_size)


def a2a_schedulable(cols: dict[str, np.ndarray], dualpipe: bool = False) -> np.ndarray:
    """Which layouts Megatron runs ``--overlap-moe-expert-parallel-comm`` with: expert
    parallelism, no full recompute, and no pipeline or an interleaved one (Megatron-LM
    ``validate_args``; :mod:`parsearch.cost.feature_search`).  Elsewhere the overlap is
    neither priced nor launched, even when the user asks for it.  ``dualpipe``: DeepSeek's
    bidirectional schedule overlaps it under any pipeline (``CostOptions.dualpipe``)."""
    pipeline_ok = ((np.asarray(cols["pp"]) == 1) | (np.asarray(cols["vpp"]) > 1)
                   | dualpipe)
    return ((np.asarray(cols["ep"]) > 1)
            & (np.asarray(cols["recompute"]) != RECOMPUTE_CODES["full"]) & pipeline_ok)


def layout_a2a_schedulable(layout: Layout, dualpipe: bool = False) -> bool:
    """:func:`a2a_schedulable` for one layout."""
    cols = {"ep": np.array([layout.ep]), "pp": np.array([layout.pp]),
            "vpp": np.array([layout.vpp]),
            "recompute": np.array([RECOMPUTE_CODES[layout.recompute]])}
    return bool(a2a_schedulable(cols, dualpipe)[0])


def a2a_overlap_pinned(options: CostOptions) -> bool:
    """Whether the user pinned ``--moe-a2a-overlap`` on (set, not a searched feature)."""
    return bool(options.moe_a2a_overlap and "moe_a2a_overlap" not in options.search_features)


def stands_in_for_pinned_overlap(variants: tuple[CostOptions, ...]) -> np.ndarray:
    """Per feature set, whether it stands in for the all-to-all overlap the user pinned.

    Where Megatron cannot run a pinned overlap (:func:`a2a_schedulable` is false) the
    launch leaves it out (``launch/plan.py``) and the rest of the setup is still the
    search's to choose: the sets that keep the pinned features but turn the overlap off
    price those layouts, and only those (a layout that can run the pinned overlap runs it).
    A set stands in when the user pinned the overlap on and the set has it off."""
    pinned = any(a2a_overlap_pinned(v) for v in variants)  # the sets share search_features
    return np.array([pinned and not v.moe_a2a_overlap for v in variants], dtype=bool)


def pinned_feature_flags(model: ModelSpec, options: CostOptions, layout: Layout) -> list[str]:
    """Notes for the features the user pinned that ``layout`` runs without, and why: the
    all-to-all overlap where Megatron-LM ``validate_args`` refuses
    ``--overlap-moe-expert-parallel-comm`` (:func:`a2a_schedulable`: without expert
    parallelism, with full recompute, or with a pipeline that is not interleaved), and the
    fused expert MLP with expert TP (:func:`~parsearch.cost.fused_mlp.fused_mlp_pinned_flags`)."""
    fused = fused_mlp_pinned_flags(options, layout) if model.moe is not None else []
    if (model.moe is None or not a2a_overlap_pinned(options)
            or layout_a2a_schedulable(layout, options.dualpipe)):
        return fused
    why = ("it has no expert parallelism (ep = 1)" if layout.ep <= 1
           else "it recomputes whole layers (recompute=full)" if layout.recompute == "full"
           else f"its pipeline is not interleaved (pp = {layout.pp}, vpp = 1)")
    return ["--moe-a2a-overlap is not run here: Megatron runs the EP all-to-all overlap "
            "only with ep > 1, without full recompute and with pp = 1 or vpp > 1, and "
            f"{why}; priced and launched without it (the other features as chosen)", *fused]


def a2a_overlap_hidden(ep_time: np.ndarray, compute: UnitCompute, budget: np.ndarray,
                       pp: np.ndarray, num_microbatches: np.ndarray | None) -> np.ndarray:
    """EP seconds per micro-batch that ``--overlap-moe-expert-parallel-comm`` hides.

    The merged 1F1B step runs the forward of one micro-batch beside the backward of
    another, layer by layer, in four slots (DeepSeek-V3 technical report, arXiv
    2412.19437 §3.2.1 and Figure 4; Megatron-Core ``combined_1f1b`` schedule):

    =========================  ====================================
    communication (one)        compute (the other micro-batch)
    =========================  ====================================
    combine gradient           attention-side forward (1/3 of it)
    dispatch forward           expert backward (2/3 of the experts)
    dispatch gradient          expert forward (1/3)
    combine forward            attention-side backward (2/3)
    =========================  ====================================

    so a slot hides at most the compute beside it: hidden = sum over slots of
    ``min(ep_time / 4, compute in the slot)`` (backward = 2x forward, NAR21 Appendix;
    the attention side is everything but the routed experts; the compute TP and CP
    overlap already used is taken out in proportion).  Recompute's extra calls are
    spread over the same four slots.  Only steady-state 1F1B pairs micro-batches: the
    pipeline's warm-up forwards and cool-down backwards run alone (``pp - 1`` of the
    ``m`` on the first stage, NAR21 §2.2.1; one of each without PP), so a share
    ``max(1, pp - 1) / m`` stays exposed.  Interleaving's extra warm-up chunks
    (``2(p-1) + (v-1)p`` chunks of ``1/v`` of a pass, Megatron-Core
    ``get_pp_rank_microbatches``) are about ``p / m`` passes, close to ``(p-1)/m``.

    >>> from types import SimpleNamespace
    >>> unit = SimpleNamespace(routed=np.array([6.0]), total=np.array([9.0]))
    >>> float(a2a_overlap_hidden(np.array([4.0]), unit, np.array([9.0]), np.array([1]),
    ...                          np.array([1000]))[0])   # slots hide 1 + 1 + 1 + 1 (x 0.999)
    3.996
    >>> float(a2a_overlap_hidden(np.array([40.0]), unit, np.array([9.0]), np.array([1]),
    ...                          np.array([1000]))[0])   # at most the compute: 1+2+2+4
    8.991
    """
    slot = np.asarray(ep_time, dtype=np.float64) / 4.0
    total = np.asarray(compute.total, dtype=np.float64)
    left = np.where(total > 0, np.minimum(budget, total) / np.where(total > 0, total, 1.0),
                    0.0)
    experts = np.asarray(compute.routed, dtype=np.float64) * left
    rest = np.maximum(total * left - experts, 0.0)
    hidden = (np.minimum(slot, rest / 3.0) + np.minimum(slot, 2.0 * rest / 3.0)
              + np.minimum(slot, experts / 3.0) + np.minimum(slot, 2.0 * experts / 3.0))
    if num_microbatches is None:
        return hidden
    m = np.maximum(np.asarray(num_microbatches, dtype=np.float64), 1.0)
    alone = np.minimum(1.0, np.maximum(1.0, np.asarray(pp, dtype=np.float64) - 1.0) / m)
    return hidden * (1.0 - alone)


def shared_expert_overlap_hidden(ep_time: np.ndarray, calls: Any, shared_gemm: np.ndarray,
                                 fc1_share: float, recomputed: Any,
                                 budget: np.ndarray) -> np.ndarray:
    """EP seconds per micro-batch that ``--moe-shared-expert-overlap`` hides.

    With the option the shared experts run on a side stream beside the token dispatcher
    of the same micro-batch (Megatron-Core ``transformer/moe/shared_experts.py``, called
    from ``token_dispatcher.py``): forward, FC1 and its activation beside the dispatch
    all-to-all and FC2 beside the combine; backward, the gradient sequence numbers
    launch each all-to-all's gradient first and the matching shared-expert backward
    beside it (FC2's beside the combine gradient, FC1's beside the dispatch gradient;
    backward = 2x forward, NAR21 Appendix).  So each call hides at most its partner:
    hidden = sum over the calls of ``min(call, partner GEMM)``, the recomputed forward
    (share ``recomputed``) pairing again, and never more than the compute ``budget``
    the TP and CP overlaps left.  Only the all-to-alls (``ep_time``) hide: each shared
    GEMM is issued right after its all-to-all, and with expert TP the reduce-scatter that
    precedes the combine and the all-gather that follows the dispatch wait on the main
    stream in launch order (``token_dispatcher.py`` on the launch order under
    ``CUDA_DEVICE_MAX_CONNECTIONS=1``, which the authors' recipes set).

    ``shared_gemm`` is the unit's shared-expert GEMM time (forward, backward and
    recompute), ``fc1_share`` FC1's share of it (2/3 with a gated MLP).

    >>> one = lambda e, s: float(shared_expert_overlap_hidden(
    ...     np.array([e]), 4.0, np.array([s]), 2.0 / 3.0, 0.0, np.array([100.0]))[0])
    >>> one(4.0, 30.0)   # every call shorter than its partner: all hidden
    4.0
    >>> round(one(40.0, 3.0), 6)   # at most the shared experts' GEMMs
    3.0
    """
    ep_time = np.asarray(ep_time, dtype=np.float64)
    recomputed = np.asarray(recomputed, dtype=np.float64)
    call = ep_time / np.maximum(np.asarray(calls, dtype=np.float64), 1.0)
    forward = np.asarray(shared_gemm, dtype=np.float64) / (3.0 + recomputed)
    fc1, fc2 = fc1_share * forward, (1.0 - fc1_share) * forward
    hidden = ((1.0 + recomputed) * (np.minimum(call, fc1) + np.minimum(call, fc2))
              + np.minimum(call, 2.0 * fc2) + np.minimum(call, 2.0 * fc1))
    return np.minimum(np.minimum(hidden, ep_time), np.maximum(budget, 0.0))
