"""The spine (cross-leaf) factor as the plan models the fit: the fit's rules for it.

``parsearch calibrate`` treats :data:`~parsearch.validation.fit.network_calibration.SPINE_FACTOR`
as a refinement of the leaf (NIC) factor (:mod:`parsearch.validation.fit.spine_tier`): it
ranks right after the leaf factor, never ahead; it is fitted only when at least
``MIN_RUNS_MOVED`` runs each move by ``MIN_UNIQUE_EFFECT`` over its range (one run would
spend it on its own error); and only when what it alone explains, beyond the leaf factor
(kept or not) and the factors kept before it, moves some run by ``MIN_UNIQUE_EFFECT``.
A job inside one leaf group never pays the spine (:func:`spans_leaf_groups`).

The plan's linearised fit (:func:`~parsearch.validation.planning.plan_errors.fit_error_parts`)
applies the same rules through :class:`SpineRule`, so that it no longer counts a spine
pinned by a single run that crosses it, and a set that is to pin the spine must hold two
runs that cross it and tell it from the NICs.  Without the rule the planned five or ten
runs of Llama 3 70B on 128 GPUs in four leaf groups crossed the spine with one run each,
which the plan counted as pinning it and the fit left tied
(``benchmarks/calibration_simulation.py --truth spine0.5``).

The rule is applied only where the spine at its low bound would change which candidate
ranks first (:func:`spine_rule`); elsewhere the plan is what it was.  Not modelled: the
fit's spread test (``spine_tier.SPINE_GAIN``), which depends on the measured values, not
on the choice of runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parsearch.cost.analytic import CostModel, score_columns
from parsearch.cost.efficiency import Prior
from parsearch.validation.fit.network_calibration import (
    NETWORK_FACTOR,
    SPINE_FACTOR,
    with_cluster_factors,
)
from parsearch.validation.fit.spine_tier import unique_effect
from parsearch.validation.user.user_calibration import MIN_RUNS_MOVED, MIN_UNIQUE_EFFECT


@dataclass(frozen=True)
class SpineRule:
    """Columns of the spine and the leaf factor among the plan's factors (``leaf``
    ``None``: the leaf factor is not among them)."""

    spine: int
    leaf: int | None = None

    def informed(self, g_measured: np.ndarray) -> bool:
        """At least ``MIN_RUNS_MOVED`` runs each move by ``MIN_UNIQUE_EFFECT`` over the
        spine's range (user_calibration's ``lonely`` rule)."""
        moved = np.abs(g_measured[:, self.spine]) >= MIN_UNIQUE_EFFECT
        return int(np.sum(moved)) >= MIN_RUNS_MOVED

    def order(self, order: Sequence[int]) -> list[int]:
        """``order`` with the spine moved right after the leaf factor when it is ahead of
        it (:func:`~parsearch.validation.fit.spine_tier.leaf_before_spine`)."""
        out = list(order)
        if self.leaf is not None and self.spine in out and self.leaf in out \
                and out.index(self.spine) < out.index(self.leaf):
            out.remove(self.spine)
            out.insert(out.index(self.leaf) + 1, self.spine)
        return out

    def apart(self, kept: Sequence[int], g_measured: np.ndarray) -> list[int]:
        """``kept`` without the spine unless what only it explains, beyond the leaf factor
        (kept or not) and the factors kept before it, moves some run by more than
        ``MIN_UNIQUE_EFFECT`` (:func:`~parsearch.validation.fit.spine_tier.spine_apart`)."""
        out = list(kept)
        if self.spine not in out:
            return out
        others = out[:out.index(self.spine)]
        if self.leaf is not None and self.leaf not in others:
            others.append(self.leaf)
        # the fit's own measure (a column that moves no run is left out of the least squares)
        columns = {str(j): g_measured[:, j] for j in {*others, self.spine}}
        if unique_effect(columns, [str(j) for j in others], str(self.spine)) \
                <= MIN_UNIQUE_EFFECT:
            out.remove(self.spine)
        return out


def spine_reorders(cm: CostModel, cols: dict[str, np.ndarray], mu: np.ndarray, low: float,
                   top: int) -> int:
    """Pairs among the ``top`` best candidates (log throughput ``mu``, layouts ``cols``) that
    the spine at its ``low`` bound reorders, when it also changes which candidate ranks
    first; else 0 (the spine cannot change the plan's answer, and the plan is left as it
    was)."""
    slow = np.log(np.asarray(score_columns(with_cluster_factors(cm, {SPINE_FACTOR: low}), cols,
                                           with_memory=False)["tokens_per_s_per_gpu"]))
    if int(np.argmax(slow)) == int(np.argmax(mu)):
        return 0
    best = np.argsort(-mu)[:top]
    a, b = np.triu_indices(len(best), k=1)
    before = mu[best[a]] > mu[best[b]]
    after = slow[best[a]] > slow[best[b]]
    return int(np.sum(before != after))


def spine_rule(cm: CostModel, cols: dict[str, np.ndarray], mu: np.ndarray,
               names: Sequence[str], priors: Mapping[str, Prior], top: int,
               network: bool = True) -> tuple[SpineRule | None, int]:
    """The fit's rule for the spine among the plan's factors ``names``, and the top pairs a
    slow spine reorders (:func:`spine_reorders`); ``(None, 0)`` where the spine is not
    among them, the calibration will not fit the network (``network=False``), or the spine
    at its low bound would not change which candidate ranks first: there it cannot change
    the plan's answer, and the plan is left as it was."""
    if not network or SPINE_FACTOR not in names:
        return None, 0
    pairs = spine_reorders(cm, cols, mu, priors[SPINE_FACTOR].low, top)
    if not pairs:
        return None, 0
    leaf = names.index(NETWORK_FACTOR) if NETWORK_FACTOR in names else None
    return SpineRule(names.index(SPINE_FACTOR), leaf), pairs


def spine_summary(rule: SpineRule | None, pairs: int, g_runs: np.ndarray,
                  chosen: Sequence[int], n_factors: int, every: Sequence[int]) -> dict[str, Any]:
    """What the plan says of the spine (``plan-profiling --format json``, ``spine_tier``):
    whether a slow spine would change the fastest candidate (``pairs``: the top pairs it
    reorders), whether the planned runs (gradients ``g_runs``; ``chosen``: the factors the
    fit would take, ``every``: those it would take without the factor limit) let the fit
    identify it, and if not, why."""
    if rule is None:
        return {"changes_the_fastest": False, "identified": None,
                "why": "a slow spine would not change which candidate ranks first (or the "
                       "network is not fitted): planned as before"}
    out: dict[str, Any] = {"changes_the_fastest": True, "reordered_top_pairs": pairs,
                           "identified": rule.spine in chosen}
    if rule.spine in chosen:
        out["why"] = "the runs cross it and tell it from the leaf tier"
        return out
    if not rule.informed(g_runs):
        why = (f"fewer than {MIN_RUNS_MOVED} of the runs cross it enough to move by "
               f"{MIN_UNIQUE_EFFECT} over its range")
    elif rule.spine in every:
        why = "the spine ranks after the factors the runs allow"
    else:
        why = ("the runs cross it as they cross the leaf tier (or the factors before it): "
               "only their product is known")
    out["why"] = (f"{why}; {len(g_runs)} run(s) allow {n_factors} factor(s), one per four "
                  "runs: plan more runs, some across leaf groups")
    return out


def spans_leaf_groups(cm: CostModel) -> bool:
    """Whether ``cm``'s job spans more than one leaf group (only then can a group cross the
    spine; :func:`~parsearch.validation.fit.spine_tier.leaf_groups_spanned` for runs)."""
    leaf = cm.fabric.leaf_group_of
    return bool(len(leaf)) and int(np.max(leaf)) > 0


__all__ = ["SpineRule", "spans_leaf_groups", "spine_reorders", "spine_rule",
           "spine_summary"]
