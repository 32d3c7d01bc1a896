"""The scale-out tiers a user's runs can tell apart: NVLink, leaf (the NICs), spine.

The cost model prices a process group by where the fabric places it
(:meth:`parsearch.topology.fabric.Fabric.link_for_groups`): inside an NVLink
domain at the NVLink rate; across nodes at the NIC share; and where a group
spans several leaf groups (a rail-optimized scalable unit, or one leaf), at the
smaller of the NIC share and the leaf's uplink share into the spine, which the
cluster file's ``leaf_oversubscription`` sets.  So a slow spine (an
oversubscribed or congested tier above the leaves) and slow NICs are different
factors only for runs some of whose groups cross leaf groups:

* a job inside one leaf group never pays the spine: its runs cannot see it;
* runs whose inter-node traffic all crosses the spine in the same proportion see
  the spine and the NICs move them alike: only their product is known.

:data:`~parsearch.validation.fit.network_calibration.SPINE_FACTOR` is therefore a
refinement of :data:`~parsearch.validation.fit.network_calibration.NETWORK_FACTOR`:
ranked right after it (never ahead), and fitted only where what it alone explains,
beyond the leaf factor and every factor kept before it, moves some run by
``MIN_UNIQUE_EFFECT``, at least two runs move by that much across its range, and
the factor limit leaves room for it.  Otherwise it is tied to the leaf tier (it
stays 1.0: the spine delivers what the leaf tier does, times the file's
oversubscription), and :func:`tier_sentence` says which tiers were fitted, which
were tied or kept, and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.validation.fit.calibration import PreparedRow
from parsearch.validation.fit.cluster_speed import UserFit
from parsearch.validation.fit.joint_fit import fit_factors
from parsearch.validation.fit.network_calibration import (
    NETWORK_FACTOR,
    NVLINK_FACTOR,
    SPINE_FACTOR,
)

#: Run-to-run spread of a measured step time (the 2 % behind MIN_UNIQUE_EFFECT's 5 %).
RUN_SPREAD = 0.02
#: The spine must lower the runs' summed squared log error by more than this to stay
#: fitted: (2.5 x RUN_SPREAD)^2, a 2.5-sigma step for one more parameter (the chi-square
#: test of one degree of freedom at p ~ 0.01), the bar the other factors' effects clear.
#: Without it, 2 % noise on runs that barely cross the spine fitted it at 0.8 in 2 of 10
#: draws of a cluster whose spine is as its file says (benchmarks/calibration_simulation.py
#: --truth nics0.5-su4, "+spine" sets).
SPINE_GAIN = (2.5 * RUN_SPREAD) ** 2

#: The tiers of :func:`tier_sentence`, each with the factor that prices it.
TIERS: tuple[tuple[str, str], ...] = (
    ("NVLink", NVLINK_FACTOR), ("leaf (inter-node NICs)", NETWORK_FACTOR),
    ("spine (across leaf groups)", SPINE_FACTOR),
)


def leaf_before_spine(names: Sequence[str]) -> list[str]:
    """``names`` with the spine factor moved right after the leaf factor when it is ahead of
    it (the spine refines the leaf tier; it never takes the leaf tier's place).

    >>> leaf_before_spine(["a", SPINE_FACTOR, "b", NETWORK_FACTOR, "c"])
    ['a', 'b', 'network_bandwidth_factor', 'spine_bandwidth_factor', 'c']
    >>> leaf_before_spine(["a", SPINE_FACTOR])
    ['a', 'spine_bandwidth_factor']
    """
    out = list(names)
    if SPINE_FACTOR in out and NETWORK_FACTOR in out \
            and out.index(SPINE_FACTOR) < out.index(NETWORK_FACTOR):
        out.remove(SPINE_FACTOR)
        out.insert(out.index(NETWORK_FACTOR) + 1, SPINE_FACTOR)
    return out


#: Change in log throughput below which a factor's effect on the runs counts as none.
NEGLIGIBLE_EFFECT = 1e-12


def unique_effect(effects: Mapping[str, np.ndarray], others: Sequence[str],
                  name: str) -> float:
    """The largest change in any run that ``name`` makes and no least-squares combination
    of ``others`` can (its whole effect when ``others`` is empty)."""
    own = np.asarray(effects[name], dtype=np.float64)
    # A factor that moves no run (below NEGLIGIBLE_EFFECT) explains nothing; kept, its
    # near-zero column would make the least squares divide by it.
    columns = [c for c in (np.asarray(effects[o], dtype=np.float64) for o in others
                           if o != name) if np.max(np.abs(c), initial=0.0) > NEGLIGIBLE_EFFECT]
    if not columns:
        return float(np.max(np.abs(own)))
    matrix = np.column_stack(columns)
    coef, *_ = np.linalg.lstsq(matrix, own, rcond=None)
    return float(np.max(np.abs(own - matrix @ coef)))


def spine_apart(apart: Sequence[str], effects: Mapping[str, np.ndarray],
                threshold: float) -> list[str]:
    """``apart`` (factors in the order they are kept) without the spine factor unless what
    only it explains, beyond the leaf factor (whether kept or not) and the factors kept
    before it, moves some run by more than ``threshold``.

    >>> net = np.array([0.3, 0.3, 0.2, 0.25])
    >>> spine_apart([NETWORK_FACTOR, SPINE_FACTOR], {NETWORK_FACTOR: net,
    ...             SPINE_FACTOR: 0.9 * net}, 0.05)             # every run alike: tied
    ['network_bandwidth_factor']
    >>> spine_apart([NETWORK_FACTOR, SPINE_FACTOR], {NETWORK_FACTOR: net,
    ...             SPINE_FACTOR: np.array([0.3, 0.3, 0.0, 0.0])}, 0.05)
    ['network_bandwidth_factor', 'spine_bandwidth_factor']
    """
    out = list(apart)
    if SPINE_FACTOR not in out:
        return out
    before = out[:out.index(SPINE_FACTOR)]
    others = [*before, *([NETWORK_FACTOR] if NETWORK_FACTOR in effects
                         and NETWORK_FACTOR not in before else [])]
    if unique_effect(effects, others, SPINE_FACTOR) <= threshold:
        out.remove(SPINE_FACTOR)
    return out


def squared_error(fit: UserFit, rows: Sequence[PreparedRow]) -> float:
    """Summed squared log error of ``fit``'s predictions of ``rows``."""
    measured = np.array([r.measured for r in rows])
    return float(np.sum(np.log(fit.predict(rows) / measured) ** 2))


def spine_earns_its_place(rows: Sequence[PreparedRow], start: EfficiencyProfile,
                          fit: UserFit, prior_weight: float) -> tuple[UserFit, str]:
    """``fit``, or ``fit`` refitted without the spine (tied to the leaf tier) when the spine
    lowers the runs' summed squared log error by no more than :data:`SPINE_GAIN`; and why
    it was tied (``""``: kept, or not fitted)."""
    if SPINE_FACTOR not in fit.fitted:
        return fit, ""
    names = [n for n in fit.fitted if n != SPINE_FACTOR]
    profile, cluster, pushed = fit_factors(rows, start, names, fit.cluster_priors,
                                           prior_weight=prior_weight)
    tied = replace(fit, profile=profile, cluster=cluster, fitted=tuple(names), on_bound=pushed)
    gain = squared_error(tied, rows) - squared_error(fit, rows)
    if gain > SPINE_GAIN:
        return fit, ""
    return tied, (f"fitted, it lowers the runs' summed squared log error by {gain:.4f}, no more "
                  f"than {SPINE_GAIN:.4f} (a 2.5-sigma step of {RUN_SPREAD:.0%} run-to-run "
                  "spread): the runs' scatter, not a spine")


def leaf_groups_spanned(rows: Sequence[PreparedRow]) -> int:
    """The most leaf groups one run's GPUs span (1: every job fits under one leaf group)."""
    spans = [int(np.max(r.cost_model.fabric.leaf_group_of)) + 1 for r in rows
             if len(r.cost_model.fabric.leaf_group_of)]
    return max(spans, default=1)


def spine_tied_reason(rows: Sequence[PreparedRow], effects: Mapping[str, np.ndarray],
                      chosen: Sequence[str], informative: Sequence[str],
                      apart: Sequence[str], threshold: float, min_runs: int,
                      sensitivity_floor: float) -> str:
    """Why the spine factor was not fitted (``""``: it was, or the cluster has no spine)."""
    if SPINE_FACTOR in chosen or SPINE_FACTOR not in effects:
        return ""
    if leaf_groups_spanned(rows) <= 1:
        per_group = rows[0].cost_model.fabric.cluster.gpus_per_leaf_group
        return (f"no run spans more than one leaf group ({per_group} GPUs each), so no "
                "group crosses the spine")
    effect = np.abs(np.asarray(effects[SPINE_FACTOR]))
    crossing = int(np.sum(effect >= threshold))
    if SPINE_FACTOR not in informative:
        if crossing < min_runs:
            return (f"{crossing} run(s) cross it enough to move by {threshold} over its range "
                    f"(fewer than {min_runs}: fitted to one run it would absorb that run's "
                    "error)")
        return (f"the runs barely cross it (mean move {float(np.mean(effect)):.3f} < "
                f"{sensitivity_floor})")
    if SPINE_FACTOR not in apart:
        return ("the runs cross it as they cross the leaf tier (what only the spine explains, "
                f"beyond the leaf factor, moves no run by {threshold}): only their product is "
                "known")
    return "the factor limit (one per four runs) left no room for it"


def tier_sentence(fitted: Sequence[str], reasons: Mapping[str, str],
                  present: Sequence[str]) -> str:
    """One sentence: each scale-out tier the cluster has, fitted, tied or kept, and why.

    >>> tier_sentence([NETWORK_FACTOR], {SPINE_FACTOR: "no run spans two leaf groups"},
    ...               [NETWORK_FACTOR, SPINE_FACTOR])
    'scale-out tiers: leaf (inter-node NICs) fitted; spine (across leaf groups) tied to the \
leaf tier (no run spans two leaf groups)'
    """
    parts = []
    for tier, name in TIERS:
        if name not in present:
            continue
        if name in fitted:
            parts.append(f"{tier} fitted")
        elif name == SPINE_FACTOR:
            why = reasons.get(name, "")
            parts.append(f"{tier} tied to the leaf tier" + (f" ({why})" if why else ""))
        else:
            why = reasons.get(name, "")
            parts.append(f"{tier} kept at the cluster file's" + (f" ({why})" if why else ""))
    return "scale-out tiers: " + "; ".join(parts)


__all__ = ["SPINE_GAIN", "TIERS", "leaf_before_spine", "leaf_groups_spanned", "spine_apart",
           "spine_earns_its_place", "spine_tied_reason", "squared_error", "tier_sentence",
           "unique_effect"]
