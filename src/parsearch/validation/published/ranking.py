"""Does the search recommend what experts chose?  Rank published layouts in parsearch's list.

For each (model, GPU, GPU count, global batch) group of the published dev runs
(latest release of each layout), the exhaustive search ranks every feasible
layout of that job; the report says where the published layout lands.  When
a group holds several published layouts, the one with the highest measured
throughput is the experts' pick.

Two ranks are given:

* ``shape_rank``: in the diverse list (the best layout of each
  ``(tp, pp, cp, ep, etp)`` shape, as ``parsearch search --diverse`` shows),
  the position of the published shape;
* ``exact_rank``: in the full list, the best position of a layout with the
  published ``(tp, pp, cp, ep, etp, vpp, mbs)`` (recompute and sequence
  parallelism are rarely stated, so any value counts).

Where the published shape is not first, ``behind`` says why in the model's terms: the parts
of the step (``explain``'s breakdown) where the published shape's best layout spends more
than parsearch's best, as shares of the best's step, largest first.

The search uses the run's precision, sequence length and batch, Megatron's
usual sequence parallelism (on whenever tp > 1), every recompute mode, the
micro-batch sizes 1, 2, 4, 8 plus the published one, and the same memory
reading as validation (FSDP where the source states or the run needs it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from parsearch.cost.analytic import CostOptions, estimate
from parsearch.cost.cost_model import CostModel
from parsearch.cost.stacks import DEFAULT_STACK, get_stack, stack_options, stack_training
from parsearch.layout import Layout
from parsearch.layout.space import enumerate_layouts
from parsearch.model.specs import RECOMPUTE_MODES
from parsearch.search.exhaustive import rank_feasible, scan_table, shape_codes
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.published_runs import PublishedRun, dedupe, dev_rows, group_key
from parsearch.validation.published.run_conventions import stack_of_source
from parsearch.validation.published.runs import best_reading, run_cost_model

MATCH_AXES: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs")


@dataclass(frozen=True)
class GroupRank:
    """Where one group's published layout ranks among parsearch's feasible layouts."""

    model: str
    gpu: str
    num_gpus: int
    global_batch: int
    run_id: str
    published: str
    shape_rank: int | None  # 1-based; None: not feasible in parsearch's model
    exact_rank: int | None
    shapes: int
    feasible: int
    best: str
    gap: float | None  # 1 - predicted(published shape's best) / predicted(best); None if absent
    is_moe: bool = False
    #: (part, extra seconds of the published shape's best / the best's step), largest first
    behind: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RankingReport:
    groups: tuple[GroupRank, ...]

    def share_in_top(self, k: int, *, exact: bool = False) -> float:
        """Fraction of groups whose published layout ranks within the top ``k``."""
        if not self.groups:
            return float("nan")
        ranks = [g.exact_rank if exact else g.shape_rank for g in self.groups]
        return sum(1 for r in ranks if r is not None and r <= k) / len(ranks)

    @property
    def median_gap(self) -> float:
        """Median predicted shortfall of the published shape behind parsearch's best."""
        gaps = [g.gap for g in self.groups if g.gap is not None]
        return float(np.median(gaps)) if gaps else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [g.to_dict() for g in self.groups],
            "summary": {
                "groups": len(self.groups),
                "shape_top1": self.share_in_top(1),
                "shape_top5": self.share_in_top(5),
                "shape_top10": self.share_in_top(10),
                "exact_top10": self.share_in_top(10, exact=True),
                "median_gap": self.median_gap,
            },
        }


def _expert_pick(runs: list[PublishedRun]) -> PublishedRun:
    return max(runs, key=lambda r: (r.measured_tokens_per_s_per_gpu or 0.0, r.id))


def rank_group(run: PublishedRun, options: CostOptions, *, by_stack: bool = True) -> GroupRank:
    """Rank ``run``'s layout among all feasible layouts of its job.

    With ``by_stack`` the layouts and searched features are those the run's software
    stack could run (:func:`stack_of_source`), as a user who names ``--stack`` would search.
    """
    assert run.model_spec is not None and run.cluster is not None
    fabric = build_fabric(load_cluster(run.cluster), run.num_gpus)
    stack = get_stack(stack_of_source(run.source) if by_stack else DEFAULT_STACK)
    options = stack_options(stack, options)
    reading = best_reading(run, fabric, options)
    mbs = tuple(sorted({1, 2, 4, 8, run.layout.mbs}))
    training = stack_training(stack, replace(reading.training, micro_batch_sizes=mbs,
                                             recompute_modes=RECOMPUTE_MODES,
                                             sequence_parallel="on"))
    cm = run_cost_model(run, fabric, options, training)
    table = enumerate_layouts(run.model_spec, training, run.num_gpus)
    scan = scan_table(cm, table)
    cols = table.columns
    published = {axis: getattr(run.layout, axis) for axis in MATCH_AXES}
    order = rank_feasible(scan, top=max(scan.feasible, 1))
    rows = scan.feasible_rows[order]
    match = np.ones(len(rows), dtype=bool)
    for axis, value in published.items():
        match &= cols[axis][rows] == value
    exact = int(np.argmax(match)) + 1 if match.any() else None
    diverse = rank_feasible(scan, top=max(scan.feasible, 1), diverse=True)
    diverse_rows = scan.feasible_rows[diverse]
    codes = shape_codes(cols, diverse_rows)
    shape_match = np.ones(len(diverse_rows), dtype=bool)
    for axis in ("tp", "pp", "cp", "ep", "etp"):
        shape_match &= cols[axis][diverse_rows] == published[axis]
    shape = int(np.argmax(shape_match)) + 1 if shape_match.any() else None
    best = table.layout(int(rows[0])).key() if len(rows) else "-"
    gap = None
    behind: tuple[tuple[str, float], ...] = ()
    if shape is not None:
        tokens = scan.tokens_per_s
        gap = float(1.0 - tokens[diverse[shape - 1]] / tokens[diverse[0]])
        if shape > 1:
            behind = _behind(cm, table.layout(int(diverse_rows[0])),
                             table.layout(int(diverse_rows[shape - 1])))
    return GroupRank(
        model=run.model, gpu=run.gpu, num_gpus=run.num_gpus, global_batch=run.global_batch,
        run_id=run.id, published=run.layout.key(), shape_rank=shape, exact_rank=exact,
        shapes=len(np.unique(codes)), feasible=scan.feasible, best=best, gap=gap,
        is_moe=run.is_moe, behind=behind,
    )


def _behind(cm: CostModel, best: Layout, published: Layout,
            parts: int = 3) -> tuple[tuple[str, float], ...]:
    """The parts of the step where ``published`` spends more than ``best`` (each with its
    features chosen, as the search priced them), as shares of ``best``'s step."""
    fast, slow = estimate(cm, best), estimate(cm, published)
    extra = sorted(((k, (slow.time_s[k] - fast.time_s.get(k, 0.0)) / fast.step_time_s)
                    for k in slow.time_s), key=lambda kv: -kv[1])
    return tuple((k, round(v, 4)) for k, v in extra if round(v, 4) > 0.0)[:parts]


def rank_published_layouts(runs: Iterable[PublishedRun], *,
                           options: CostOptions | None = None,
                           by_stack: bool = True) -> RankingReport:
    """One :class:`GroupRank` per (model, GPU, GPU count, batch) group of the dev runs."""
    options = options or CostOptions()
    usable = [r for r in dedupe(dev_rows(runs)) if r.cluster is not None]
    groups: dict[tuple[str, str, int, int], list[PublishedRun]] = defaultdict(list)
    for run in usable:
        groups[group_key(run)].append(run)
    return RankingReport(tuple(rank_group(_expert_pick(members), options, by_stack=by_stack)
                               for _key, members in sorted(groups.items())))
