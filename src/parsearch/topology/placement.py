"""Process groups of a layout and where they land on the cluster.

Rank order follows Megatron-Core's ``RankGenerator``
(``megatron/core/parallel_state.py``): an order string such as
``tp-cp-ep-dp-pp`` lists the dimensions from fastest- to slowest-varying.
Two generators share the order (``shared/spec/layout-space.md``, "Rank order
and placement"):

* dense (attention) path, sizes ``tp, cp, dp, pp`` (``ep`` = 1):
  ``rank = tp_r + tp*(cp_r + cp*(dp_r + dp*pp_r))`` for the default order;
* expert path, sizes ``etp, ep, edp, pp`` (``cp`` = 1, the ``tp`` token is
  ``etp`` and the ``dp`` token is ``edp``):
  ``rank = etp_r + etp*(ep_r + ep*(edp_r + edp*pp_r))``.

Rank ``r`` runs on GPU ``r`` (block placement).  Group kinds:

========= ================================================================
``tp``    tensor parallel (dense path)
``cp``    context parallel
``dp``    data parallel *including* CP: the ``dp-cp`` group that reduces
          dense gradients (Megatron ``get_data_parallel_group(with_context_parallel=True)``);
          its size is ``dp * cp``
``dp_only`` data parallel without CP (the ``dp`` token alone; not a hot collective)
``ep``    expert parallel (expert path)
``etp``   expert tensor parallel
``edp``   expert data parallel (reduces expert gradients)
``pp``    pipeline: the ranks of one pipeline; neighbours exchange activations
========= ================================================================

A layout is anything with the degrees of :class:`ParallelDegrees` (a
:class:`parsearch.layout.Layout` has them); this module imports nothing above
``topology``, so ``layout`` can use it.

>>> from parsearch.layout import Layout
>>> group_ranks(Layout(num_gpus=16, tp=2, cp=2, pp=2), "dp")   # dp=2 x cp=2
[[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
>>> group_ranks(Layout(num_gpus=16, tp=2, cp=2, pp=2), "pp")[:2]
[[0, 8], [1, 9]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from parsearch.errors import SpecError
from parsearch.topology.fabric import Fabric, GroupLink

DEFAULT_ORDER = "tp-cp-ep-dp-pp"


class ParallelDegrees(Protocol):
    """What placement reads of a layout (:class:`parsearch.layout.Layout` has it all)."""

    @property
    def num_gpus(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def etp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def edp(self) -> int: ...
    @property
    def min_gpus(self) -> int: ...
    def key(self) -> str: ...
    def to_dict(self, *, moe: bool = True) -> dict[str, Any]: ...


#: Orders offered by the CLI.  With ``tp-cp-ep-dp-pp`` and ``tp-pp-cp-ep-dp`` every
#: group kind is a strided set; with ``tp-cp-ep-pp-dp`` and ``tp-cp-dp-ep-pp`` some
#: combined groups (``dp`` = dp-cp when pp > 1, resp. ``edp`` ... ) are lattices of two
#: strides -- :func:`place` handles those exactly from the explicit ranks.
RANK_ORDERS: tuple[str, ...] = (
    "tp-cp-ep-dp-pp",  # Megatron-Core default
    "tp-cp-ep-pp-dp",  # pipeline inside data parallel (PP neighbours closer)
    "tp-pp-cp-ep-dp",  # pipeline next to TP (PP inside a node when tp*pp <= node)
    "tp-cp-dp-ep-pp",  # expert path: EDP inside EP
)

#: Kinds reported by :func:`place`, in the order of ``shared/spec/cli.md``.
GROUP_KINDS: tuple[str, ...] = ("tp", "cp", "dp", "ep", "etp", "edp", "pp")
DENSE_KINDS: tuple[str, ...] = ("tp", "cp", "dp", "pp")
EXPERT_KINDS: tuple[str, ...] = ("ep", "etp", "edp")

_TOKENS = ("tp", "cp", "ep", "dp", "pp")
# kind -> (path, order tokens whose ranks form the group)
_KIND_TOKENS: dict[str, tuple[str, frozenset[str]]] = {
    "tp": ("dense", frozenset({"tp"})),
    "cp": ("dense", frozenset({"cp"})),
    "dp": ("dense", frozenset({"dp", "cp"})),
    "dp_only": ("dense", frozenset({"dp"})),
    "pp": ("dense", frozenset({"pp"})),
    "ep": ("expert", frozenset({"ep"})),
    "etp": ("expert", frozenset({"tp"})),
    "edp": ("expert", frozenset({"dp"})),
}


def parse_order(order: str) -> tuple[str, ...]:
    """Check an order string: each of tp, cp, ep, dp, pp exactly once."""
    tokens = tuple(t.strip().lower() for t in order.split("-"))
    if sorted(tokens) != sorted(_TOKENS):
        raise SpecError(
            f"rank order {order!r} must name each of tp, cp, ep, dp, pp once; "
            f"e.g. one of {', '.join(RANK_ORDERS)}"
        )
    return tokens


def _sizes(layout: ParallelDegrees, path: str) -> dict[str, int]:
    if layout.dp == 0 or layout.edp == 0:
        raise SpecError(
            f"layout {layout.key()} does not tile {layout.num_gpus} GPUs: tp*cp*pp="
            f"{layout.tp * layout.cp * layout.pp} and pp*ep*etp="
            f"{layout.pp * layout.ep * layout.etp} "
            f"must both divide num_gpus (R2, R3); the smallest GPU count is {layout.min_gpus}"
        )
    if path == "dense":
        return {"tp": layout.tp, "cp": layout.cp, "ep": 1, "dp": layout.dp, "pp": layout.pp}
    if path == "expert_prefold":
        # before MoE parallel folding the EP ranks are carved out of the DP ranks
        # (core_v0.9.0 RankGenerator with independent_ep: the mesh tp, cp, ep, dp/ep, pp)
        return {"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "dp": layout.dp // layout.ep,
                "pp": layout.pp}
    return {"tp": layout.etp, "cp": 1, "ep": layout.ep, "dp": layout.edp, "pp": layout.pp}


def group_rank_array(layout: ParallelDegrees, kind: str, order: str = DEFAULT_ORDER,
                     experts_fold: bool = True) -> np.ndarray:
    """The groups of ``kind`` as a ``(count, size)`` array (Megatron group order).

    ``experts_fold=False``: the expert groups as Megatron-Core placed them before MoE
    parallel folding (:func:`group_strides`): EP inside the data-parallel ranks, the experts
    on the model's TP group, and the expert data parallelism over what is left of DP x CP.

    >>> from parsearch.layout import parse_layout_string
    >>> lay = parse_layout_string("tp=4,cp=2,pp=8,ep=8,etp=4", 512)
    >>> group_rank_array(lay, "ep", experts_fold=False)[0].tolist()
    [0, 8, 16, 24, 32, 40, 48, 56]
    """
    if kind not in _KIND_TOKENS:
        raise SpecError(f"unknown group kind {kind!r}; use one of {', '.join(_KIND_TOKENS)}")
    path, masked = _KIND_TOKENS[kind]
    if path == "expert" and not experts_fold:
        _require_prefold(layout, order)
        masked = frozenset({"cp", "dp"}) if kind == "edp" else masked
        return _groups(layout, "expert_prefold", masked, order)
    return _groups(layout, path, masked, order)


def _require_prefold(layout: ParallelDegrees, order: str) -> None:
    """A layout Megatron-Core before MoE parallel folding builds: the experts on the model's
    TP (``etp == tp``), EP dividing DP (rule R12) and next to it in the rank order
    (core_v0.9.0 ``RankGenerator``: "The ep and dp must be adjacent in order")."""
    if "ep-dp" not in order and "dp-ep" not in order:
        raise SpecError(f"rank order {order!r}: before MoE parallel folding ep and dp must be "
                        f"adjacent in the order; use {DEFAULT_ORDER}")
    if layout.etp != layout.tp:
        raise SpecError(f"etp={layout.etp} with tp={layout.tp}: before MoE parallel folding "
                        f"the experts take the model's TP; use etp={layout.tp} or a stack "
                        "with a separate expert TP (mcore-0.11 or later)")
    if layout.dp % layout.ep:
        raise SpecError(f"R12: ep={layout.ep} does not divide dp={layout.dp}; before MoE "
                        "parallel folding the EP ranks are data-parallel ranks: choose ep "
                        f"dividing {layout.dp} or a stack with MoE parallel folding "
                        "(mcore-0.11 or later)")


def _groups(layout: ParallelDegrees, path: str, masked: frozenset[str], order: str) -> np.ndarray:
    tokens = parse_order(order)
    sizes = _sizes(layout, path)
    # C-order array whose last axis is the fastest token: A[..., i_1, i_0] = rank.
    reversed_tokens = list(reversed(tokens))
    axes_sizes = [sizes[t] for t in reversed_tokens]
    ranks = np.arange(layout.num_gpus, dtype=np.int64).reshape(axes_sizes)
    outer = [a for a, t in enumerate(reversed_tokens) if t not in masked]
    inner = [a for a, t in enumerate(reversed_tokens) if t in masked]
    group_size = int(np.prod([axes_sizes[a] for a in inner]))
    # Megatron's generate_masked_orthogonal_rank_groups: the group index runs over the
    # unmasked tokens and the rank-in-group over the masked ones, first token fastest.
    return ranks.transpose(outer + inner).reshape(-1, group_size)


def group_ranks(layout: ParallelDegrees, kind: str, order: str = DEFAULT_ORDER) -> list[list[int]]:
    """The process groups of ``kind`` as lists of ranks (pure; Megatron ``RankGenerator``)."""
    return group_rank_array(layout, kind, order).tolist()


def group_strides(tp: Any, cp: Any, pp: Any, ep: Any, etp: Any, num_gpus: Any,
                  experts_fold: bool = True) -> dict[str, tuple]:
    """``(stride, size)`` of each group kind for the default order ``tp-cp-ep-dp-pp``.

    Works on ints or numpy arrays (elementwise), so a vectorized cost model can
    pass the results straight to :meth:`Fabric.group_links`.

    >>> group_strides(tp=8, cp=2, pp=4, ep=16, etp=1, num_gpus=256)["dp"]
    (8, 8)
    >>> group_strides(tp=8, cp=2, pp=4, ep=16, etp=1, num_gpus=256)["edp"]
    (16, 4)

    ``experts_fold=False``: Megatron-Core before MoE parallel folding (Megatron-LM
    7f22e210cd, 2024-11-23; ``TrainingSpec.experts_follow_tp``) carves the expert-parallel
    ranks out of the data-parallel ones (core_v0.9.0 ``parallel_state.py``: "data_parallel_size
    is not divisible by expert_model_parallel_size"; its ``RankGenerator`` orders them
    ``tp-cp-ep-dp/ep-pp``), so an EP group's members sit ``tp * cp`` ranks apart:

    >>> group_strides(tp=4, cp=2, pp=8, ep=8, etp=4, num_gpus=512, experts_fold=False)["ep"]
    (8, 8)
    >>> group_strides(tp=4, cp=2, pp=8, ep=8, etp=4, num_gpus=512, experts_fold=False)["edp"]
    (4, 2)
    """
    dp = num_gpus // (tp * cp * pp)
    edp = num_gpus // (etp * ep * pp)
    # Before folding the expert DP group is the dp-cp ranks modulo EP (core_v0.9.0
    # ``_DATA_MODULO_EXPERT_PARALLEL_GROUP_WITH_CP``), on experts that take the model's TP:
    # the CP ranks alone (stride tp) where DP holds one EP group; with CP = 1 the DP ranks
    # modulo EP (stride tp * ep, as folded); with both, a lattice of two strides, priced at
    # the folded stride, which tiles the GPUs.  A dense model's (ep = etp = 1) stays folded.
    cp_only = (dp == ep) & (etp == tp) & (ep > 1)
    prefold_edp_stride = np.where(cp_only, tp, etp * ep) if isinstance(cp_only, np.ndarray) \
        else (tp if cp_only else etp * ep)
    return {
        "tp": (tp * 0 + 1, tp),
        "cp": (tp, cp),
        "dp": (tp, cp * dp),  # dp-cp: cp and dp are adjacent in the order
        "ep": (etp, ep) if experts_fold else (tp * cp, ep),
        "etp": (etp * 0 + 1, etp),
        "edp": (etp * ep, edp) if experts_fold else (prefold_edp_stride, edp),
        "pp": (num_gpus // pp, pp),
    }


def _stride_of(groups: np.ndarray, num_gpus: int) -> int:
    """The stride if ``groups`` is the strided partition ``{r0 + stride*i}``, else 0."""
    size = groups.shape[1]
    if size == 1:
        return 1
    steps = np.diff(groups, axis=1)
    stride = int(steps[0, 0])
    if stride < 1 or np.any(steps != stride) or num_gpus % (stride * size):
        return 0
    starts = groups[:, 0]
    return stride if np.all((starts // stride) % size == 0) else 0


@dataclass(frozen=True)
class GroupPlacement:
    """One kind of process group: its shape and where it sits (worst group)."""

    kind: str
    size: int
    count: int
    stride: int  # 0 when the groups are not a strided set (see RANK_ORDERS)
    link: GroupLink

    @property
    def nvlink_domains_spanned(self) -> int:
        return self.link.nvlink_domains_spanned

    @property
    def nodes_spanned(self) -> int:
        return self.link.nodes_spanned

    @property
    def tier(self) -> str:
        return self.link.tier

    @property
    def bandwidth_Bps(self) -> float:
        return self.link.bandwidth_Bps

    @property
    def bandwidth_GBps(self) -> float:
        """Per member per direction, GB/s (1e9 bytes), as in ``shared/spec/cli.md``."""
        return self.link.bandwidth_Bps / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "size": self.size,
            "count": self.count,
            "nvlink_domains_spanned": self.nvlink_domains_spanned,
            "nodes_spanned": self.nodes_spanned,
            "bandwidth_GBps": round(self.bandwidth_GBps, 3),
            "tier": self.tier,
        }


@dataclass(frozen=True)
class Placement:
    """Every process group of a layout on one fabric."""

    layout: ParallelDegrees
    num_gpus: int
    groups: tuple[GroupPlacement, ...]

    def group(self, kind: str) -> GroupPlacement:
        for placed in self.groups:
            if placed.kind == kind:
                return placed
        kinds = ", ".join(g.kind for g in self.groups)
        raise KeyError(f"no {kind!r} group in this placement (has {kinds})")

    def to_dict(self) -> dict[str, Any]:
        """The ``placement`` JSON document of ``shared/spec/cli.md``."""
        moe = any(g.kind in EXPERT_KINDS for g in self.groups)
        return {
            "layout": self.layout.to_dict(moe=moe),
            "num_gpus": self.num_gpus,
            "groups": [g.to_dict() for g in self.groups],
        }


def place(
    layout: ParallelDegrees,
    fabric: Fabric,
    order: str = DEFAULT_ORDER,
    *,
    expert: bool | None = None,
    experts_fold: bool = True,
) -> Placement:
    """Place every process group of ``layout`` on ``fabric``.

    ``expert`` selects whether the expert-path kinds (ep, etp, edp) are
    reported; by default they are when ``ep * etp > 1``.  Orders under which
    the dense and expert meshes would not share pipeline groups (a Megatron-Core
    assertion) raise :class:`SpecError`.  ``experts_fold=False`` places the expert groups
    as Megatron-Core did before MoE parallel folding (:func:`group_rank_array`).
    """
    if layout.num_gpus != fabric.num_gpus:
        raise SpecError(
            f"layout is for {layout.num_gpus} GPUs but the fabric has {fabric.num_gpus}"
        )
    if expert is None:
        expert = layout.ep * layout.etp > 1
    if expert and experts_fold:
        dense_pp = group_rank_array(layout, "pp", order)
        expert_pp = _groups(layout, "expert", frozenset({"pp"}), order)
        if not np.array_equal(dense_pp, expert_pp):
            raise SpecError(
                f"rank order {order!r}: dense and expert pipeline groups differ for "
                f"{layout.key()} (Megatron-Core requires them equal); use {DEFAULT_ORDER}"
            )
    kinds = GROUP_KINDS if expert else tuple(k for k in GROUP_KINDS if k not in EXPERT_KINDS)
    placed = []
    for kind in kinds:
        groups = group_rank_array(layout, kind, order, experts_fold=experts_fold)
        stride = _stride_of(groups, layout.num_gpus)
        if stride:
            link = fabric.group_link(stride, groups.shape[1])
        else:
            link = fabric.link_for_groups(groups)
        placed.append(
            GroupPlacement(kind=kind, size=groups.shape[1], count=groups.shape[0],
                           stride=stride, link=link)
        )
    return Placement(layout=layout, num_gpus=layout.num_gpus, groups=tuple(placed))
