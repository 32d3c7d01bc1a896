"""Rank order, process groups and their placement on the fabric."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.topology import build_fabric, load_cluster
from parsearch.topology.placement import (
    DEFAULT_ORDER,
    GROUP_KINDS,
    RANK_ORDERS,
    group_rank_array,
    group_ranks,
    group_strides,
    place,
)

SIZE_OF = {
    "tp": lambda lay: lay.tp,
    "cp": lambda lay: lay.cp,
    "dp": lambda lay: lay.dp * lay.cp,  # dp including cp (gradient-reduction group)
    "dp_only": lambda lay: lay.dp,
    "pp": lambda lay: lay.pp,
    "ep": lambda lay: lay.ep,
    "etp": lambda lay: lay.etp,
    "edp": lambda lay: lay.edp,
}


@pytest.fixture(scope="module")
def fabrics():
    cache: dict = {}

    def get(name: str, n: int):
        if (name, n) not in cache:
            cache[name, n] = build_fabric(load_cluster(name), n)
        return cache[name, n]

    return get


def _brute_force(layout: Layout) -> dict[str, list[list[int]]]:
    """Groups from the layout-space formulas, by enumerating coordinates."""
    tp, cp, dp, pp = layout.tp, layout.cp, layout.dp, layout.pp
    etp, ep, edp = layout.etp, layout.ep, layout.edp
    dense: dict[str, dict] = {k: {} for k in ("tp", "cp", "dp", "pp")}
    for t, c, d, p in itertools.product(range(tp), range(cp), range(dp), range(pp)):
        rank = t + tp * (c + cp * (d + dp * p))
        dense["tp"].setdefault((c, d, p), []).append(rank)
        dense["cp"].setdefault((t, d, p), []).append(rank)
        dense["dp"].setdefault((t, p), []).append(rank)
        dense["pp"].setdefault((t, c, d), []).append(rank)
    expert: dict[str, dict] = {k: {} for k in ("etp", "ep", "edp")}
    for t, e, d, p in itertools.product(range(etp), range(ep), range(edp), range(pp)):
        rank = t + etp * (e + ep * (d + edp * p))
        expert["etp"].setdefault((e, d, p), []).append(rank)
        expert["ep"].setdefault((t, d, p), []).append(rank)
        expert["edp"].setdefault((t, e, p), []).append(rank)
    return {k: sorted(sorted(g) for g in v.values()) for k, v in (dense | expert).items()}


@pytest.mark.parametrize(
    "layout",
    [
        Layout(num_gpus=16, tp=2, cp=2, pp=2),
        Layout(num_gpus=32, tp=2, cp=1, pp=2, ep=8, etp=1),
        Layout(num_gpus=64, tp=4, cp=2, pp=2, ep=4, etp=2),
        Layout(num_gpus=24, tp=2, cp=1, pp=3, ep=4, etp=1),
    ],
    ids=lambda lay: lay.key(),
)
def test_default_order_matches_layout_space_formulas(layout):
    expected = _brute_force(layout)
    for kind, groups in expected.items():
        assert sorted(sorted(g) for g in group_ranks(layout, kind)) == groups, kind


def test_megatron_group_order_for_dp_cp():
    layout = Layout(num_gpus=16, tp=2, cp=2, pp=2)
    assert group_ranks(layout, "dp") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14],
                                         [9, 11, 13, 15]]
    assert group_ranks(layout, "dp_only") == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13],
                                              [10, 14], [11, 15]]


layouts = st.builds(
    lambda tp, cp, pp, ep, etp, extra: (tp, cp, pp, ep, etp, extra),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 3, 4]),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 2, 4]),
)


def _layout(draw_tuple) -> Layout:
    tp, cp, pp, ep, etp, extra = draw_tuple
    n = pp * max(tp * cp, ep * etp) * extra
    return Layout(num_gpus=n, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)


@settings(max_examples=60, deadline=None)
@given(params=layouts, order=st.sampled_from(RANK_ORDERS))
def test_groups_of_each_kind_partition_the_ranks(params, order):
    layout = _layout(params)
    assume(layout.dp > 0 and layout.edp > 0)
    for kind, size_of in SIZE_OF.items():
        groups = group_rank_array(layout, kind, order)
        assert groups.shape == (layout.num_gpus // size_of(layout), size_of(layout)), kind
        assert np.array_equal(np.sort(groups.ravel()), np.arange(layout.num_gpus)), kind


@settings(max_examples=60, deadline=None)
@given(params=layouts)
def test_group_strides_describe_the_default_order(params):
    layout = _layout(params)
    strides = group_strides(layout.tp, layout.cp, layout.pp, layout.ep, layout.etp,
                            layout.num_gpus)
    for kind in GROUP_KINDS:
        stride, size = strides[kind]
        groups = group_rank_array(layout, kind)
        expected = (np.arange(layout.num_gpus).reshape(-1, size, stride)
                    .transpose(0, 2, 1).reshape(-1, size))
        assert sorted(map(tuple, groups)) == sorted(map(tuple, expected)), kind


def test_group_strides_work_on_numpy_arrays(fabrics):
    fabric = fabrics("dgx-h100", 256)
    tp, cp, pp = np.array([8, 16, 4, 2]), np.array([1, 1, 2, 4]), np.array([4, 2, 1, 8])
    ep, etp = np.array([8, 1, 16, 4]), np.array([1, 1, 1, 2])
    strides = group_strides(tp, cp, pp, ep, etp, 256)
    for kind in GROUP_KINDS:
        out = fabric.group_links(*strides[kind])
        for k in range(4):
            layout = Layout(num_gpus=256, tp=int(tp[k]), cp=int(cp[k]), pp=int(pp[k]),
                            ep=int(ep[k]), etp=int(etp[k]))
            placed = place(layout, fabric, expert=True).group(kind)
            assert out["bandwidth_Bps"][k] == placed.bandwidth_Bps, (kind, k)
            assert out["nodes_spanned"][k] == placed.nodes_spanned, (kind, k)


# -- placement on clusters -----------------------------------------------------------------
def test_tp8_on_dgx_h100_placement(fabrics):
    placement = place(Layout(num_gpus=64, tp=8, pp=2), fabrics("dgx-h100", 64))
    tp = placement.group("tp")
    assert (tp.size, tp.count, tp.nvlink_domains_spanned, tp.tier) == (8, 8, 1, "nvlink")
    assert tp.bandwidth_GBps == pytest.approx(450 * 0.82)
    dp, pp = placement.group("dp"), placement.group("pp")
    assert (dp.size, dp.nodes_spanned, dp.tier) == (4, 4, "network")
    assert (pp.size, pp.stride, pp.nodes_spanned) == (2, 32, 2)
    assert dp.bandwidth_GBps == pytest.approx(50 * 0.92)
    assert [g.kind for g in placement.groups] == ["tp", "cp", "dp", "pp"]  # dense: no expert kinds


def test_tp16_on_dgx_h100_placement(fabrics):
    tp = place(Layout(num_gpus=64, tp=16), fabrics("dgx-h100", 64)).group("tp")
    assert (tp.nodes_spanned, tp.nvlink_domains_spanned, tp.tier) == (2, 2, "network")
    assert tp.bandwidth_GBps == pytest.approx(50 * 0.92)


def test_gb200_nvl72_tp16_ep64_in_one_domain(fabrics):
    layout = Layout(num_gpus=128, tp=16, ep=64, etp=1)
    placement = place(layout, fabrics("gb200-nvl72", 128))
    for kind in ("tp", "ep"):
        group = placement.group(kind)
        assert (group.nvlink_domains_spanned, group.tier) == (1, "nvlink"), kind
        assert group.bandwidth_GBps == pytest.approx(900 * 0.8)
    assert placement.group("tp").nodes_spanned == 4
    assert placement.group("ep").nodes_spanned == 16
    assert placement.group("edp").tier == "network"  # edp=2 spans the two racks


def test_placement_json_matches_cli_contract(fabrics):
    layout = Layout(num_gpus=64, tp=2, cp=2, pp=2, ep=8)
    document = place(layout, fabrics("dgx-h100", 64)).to_dict()
    assert set(document) == {"layout", "num_gpus", "groups"}
    assert document["num_gpus"] == 64
    assert set(document["layout"]) == {"tp", "pp", "cp", "ep", "etp", "vpp", "dp", "edp", "mbs",
                                       "sp", "recompute", "min_gpus"}
    assert [g["kind"] for g in document["groups"]] == list(GROUP_KINDS)
    for group in document["groups"]:
        assert set(group) == {"kind", "size", "count", "nvlink_domains_spanned",
                              "nodes_spanned", "bandwidth_GBps", "tier"}
        assert group["size"] * group["count"] == 64
        assert group["tier"] in ("nvlink", "network")
        assert isinstance(group["bandwidth_GBps"], float)


def test_non_strided_orders_are_placed_exactly(fabrics):
    fabric = fabrics("dgx-h100", 128)
    layout = Layout(num_gpus=128, tp=2, cp=2, pp=4)
    placement = place(layout, fabric, "tp-cp-ep-pp-dp")
    dp = placement.group("dp")
    assert dp.stride == 0  # cp and dp are not adjacent: a lattice, not a strided set
    assert dp.link == fabric.link_for_groups(group_rank_array(layout, "dp", "tp-cp-ep-pp-dp"))
    assert placement.group("pp").stride == 4
    # PP next to TP keeps pipeline neighbours inside a node.
    assert place(layout, fabric, "tp-pp-cp-ep-dp").group("pp").tier == "nvlink"
    assert place(layout, fabric, DEFAULT_ORDER).group("pp").tier == "network"


def test_placement_errors(fabrics):
    fabric = fabrics("dgx-h100", 64)
    with pytest.raises(SpecError, match="layout is for 32 GPUs"):
        place(Layout(num_gpus=32, tp=8), fabric)
    with pytest.raises(SpecError, match="must both divide num_gpus"):
        place(Layout(num_gpus=64, tp=8, pp=3), fabric)
    with pytest.raises(SpecError, match="rank order 'tp-dp-pp'"):
        place(Layout(num_gpus=64, tp=8), fabric, "tp-dp-pp")
    with pytest.raises(SpecError, match="pipeline groups differ"):
        place(Layout(num_gpus=64, tp=4, pp=2, ep=8), fabric, "tp-pp-cp-ep-dp")
    with pytest.raises(SpecError, match="unknown group kind"):
        group_ranks(Layout(num_gpus=8, tp=8), "xp")


_PREFOLD = st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]),
                     st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]),
                     st.sampled_from([1, 2, 4, 8]))


@settings(max_examples=60, deadline=None)
@given(shape=_PREFOLD)
def test_before_folding_expert_groups_partition_the_dp_groups(shape) -> None:
    """Megatron-Core 0.9 (no MoE parallel folding) carves EP out of DP: every EP group and
    every expert-DP group lies inside one dense DP x CP group, the two together tile it, and
    the group strides the cost model prices are those of the explicit ranks where a group is
    a strided set."""
    tp, cp, pp, ep, dp_over_ep = shape
    dp = ep * dp_over_ep
    n = tp * cp * pp * dp
    lay = Layout(num_gpus=n, tp=tp, cp=cp, pp=pp, ep=ep, etp=tp)
    dense_dp = {tuple(sorted(g)) for g in group_ranks(lay, "dp")}
    owner = {r: g for g in dense_dp for r in g}
    ep_groups = group_rank_array(lay, "ep", experts_fold=False)
    edp_groups = group_rank_array(lay, "edp", experts_fold=False)
    assert ep_groups.shape[1] == ep and edp_groups.shape[1] == cp * dp_over_ep
    for groups in (ep_groups, edp_groups):
        for g in groups.tolist():
            assert len({owner[r] for r in g}) == 1
    # one EP group and one expert-DP group meet in exactly one rank
    assert all(len(set(a) & set(b)) <= 1 for a in ep_groups.tolist()[:4]
               for b in edp_groups.tolist())
    strides = group_strides(tp, cp, pp, ep, tp, n, experts_fold=False)
    assert strides["ep"] == (tp * cp, ep)
    for kind, (stride, size) in strides.items():  # each a partition the fabric can price
        assert n % (stride * size) == 0, kind
    for etp in (1, 2, 4, 8):  # any expert TP the enumeration offers, a dense model's too
        if n % (pp * ep * etp) == 0:
            for kind, (stride, size) in group_strides(tp, cp, pp, ep, etp, n,
                                                      experts_fold=False).items():
                assert n % (stride * size) == 0, (kind, etp)
    if cp == 1 and dp_over_ep > 1:
        assert strides["edp"][0] == tp * ep
        assert np.all(np.diff(edp_groups, axis=1) == tp * ep)
    if ep > 1:
        assert np.all(np.diff(ep_groups, axis=1) == tp * cp)
    if dp_over_ep == 1 and cp > 1:
        assert strides["edp"][0] == tp
        assert np.all(np.diff(edp_groups, axis=1) == tp)


def test_before_folding_placement_refuses_what_megatron_core_0_9_refuses(fabrics) -> None:
    fabric = build_fabric(load_cluster("dgx-h100"), 512)
    lay = Layout(num_gpus=512, tp=4, cp=2, pp=8, ep=8, etp=1)
    with pytest.raises(SpecError, match="experts take the model's TP"):
        place(lay, fabric, experts_fold=False)
    lay = Layout(num_gpus=512, tp=4, cp=2, pp=8, ep=8, etp=4)
    with pytest.raises(SpecError, match="adjacent"):
        place(lay, fabric, "tp-cp-ep-pp-dp", experts_fold=False)
    odd = Layout(num_gpus=384, tp=4, cp=2, pp=8, ep=4, etp=4)  # dp = 6
    with pytest.raises(SpecError, match="R12"):
        place(odd, build_fabric(load_cluster("dgx-h100"), 384), experts_fold=False)
    # the DGX Cloud Grok-1 recipe: its EP members sit on 8 nodes, not 4
    folded = place(lay, fabric).group("ep")
    unfolded = place(lay, fabric, experts_fold=False).group("ep")
    assert (folded.nodes_spanned, unfolded.nodes_spanned) == (4, 8)


def test_placement_cli_places_the_stack_it_is_told() -> None:
    import json

    from tests.cli_helpers import run_cli
    common = ("placement", "--model", "grok-1", "--cluster", "dgx-h100", "--gpus", "512",
              "--layout", "tp=4,cp=2,pp=8,ep=8,etp=4", "--format", "json")
    nodes = {}
    for stack in ("mcore-current", "mcore-0.9"):
        out = run_cli(*common, "--stack", stack)
        assert out.code == 0, out.err
        groups = {g["kind"]: g for g in json.loads(out.out)["groups"]}
        nodes[stack] = groups["ep"]["nodes_spanned"]
    assert nodes == {"mcore-current": 4, "mcore-0.9": 8}
    bad = run_cli(*common[:-2], "--stack", "mcore-0.9", "--layout", "tp=4,cp=2,pp=8,ep=8,etp=1")
    assert bad.code != 0 and "etp=4" in bad.err


@pytest.mark.parametrize(("model", "gpus", "batch"), [("llama3.1-405b", 576, 252),
                                                      ("grok-1", 512, 1024)])
def test_a_search_before_folding_prices_every_layout_it_offers(model: str, gpus: int,
                                                               batch: int) -> None:
    """Every layout a pre-folding search enumerates (dense ones, with ep = etp = 1, too) has
    expert groups the fabric can place (a stride the GPUs tile)."""
    from tests.cli_helpers import run_cli
    out = run_cli("search", "--model", model, "--cluster", "dgx-h100", "--gpus", str(gpus),
                  "--global-batch", str(batch), "--seq-len", "8192", "--stack", "mcore-0.9",
                  "--top", "3", "--format", "json")
    assert out.code == 0, out.err
