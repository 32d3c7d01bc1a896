"""Cluster files, hardware profiles, topology graphs and the fabric summary."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError, TopologyError
from parsearch.resources import data_dir
from parsearch.topology import build_fabric, build_graph, load_cluster, validate_graph
from parsearch.topology.cluster import list_clusters, preset_names
from parsearch.topology.graph import cut_bandwidth_per_member_Bps
from parsearch.topology.hardware import list_gpu_profiles, load_gpu_profile

PRESETS = (
    "dgx-a100", "dgx-h100", "hgx-h800", "dgx-h200", "dgx-b200", "dgx-b300",
    "gb200-nvl72", "gb300-nvl72", "h100-roce", "dgx-h100-oversub",
)
GPU_PROFILES = ("a100-sxm-80gb", "h100-sxm", "h800-sxm", "h200-sxm", "b200", "b300", "gb200",
                "gb300")
NDR_Bps = 400e9 / 8  # 400 Gb/s NDR = 50 GB/s per direction


@pytest.fixture(scope="module")
def fabrics():
    cache: dict = {}

    def get(name: str, n: int):
        if (name, n) not in cache:
            cache[name, n] = build_fabric(load_cluster(name), n)
        return cache[name, n]

    return get


# -- data files ----------------------------------------------------------------------------
def test_data_dir_finds_presets_and_profiles():
    assert {p.stem for p in data_dir("topologies").glob("*.yaml")} >= set(PRESETS)
    assert set(preset_names()) >= set(PRESETS)
    assert set(list_gpu_profiles()) >= set(GPU_PROFILES)
    assert (data_dir("cost_models") / "hardware" / "h100-sxm.yaml").is_file()


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_builds_and_validates(name):
    cluster = load_cluster(name)
    assert cluster.name == name
    assert cluster.sources, "every preset cites its sources"
    assert cluster.gpu in list_gpu_profiles()
    for n in (64, 1000):
        graph = build_graph(cluster, n)
        validate_graph(graph)
        gpus = [v for v, kind in graph.nodes(data="kind") if kind == "gpu"]
        assert len(gpus) == n
        nodes = {graph.nodes[g]["node"] for g in gpus}
        assert len(nodes) == math.ceil(n / cluster.gpus_per_node)
        for _, _, data in graph.edges(data=True):
            assert data["bandwidth_Bps"] > 0 and data["latency_s"] >= 0


def test_list_clusters_and_preset_by_path():
    names = [c.name for c in list_clusters()]
    assert names == sorted(names) and set(names) >= set(PRESETS)
    path = data_dir("topologies") / "dgx-h100.yaml"
    assert load_cluster(str(path)) == load_cluster("dgx-h100")


def test_cluster_units_are_si():
    h100 = load_cluster("dgx-h100")
    assert h100.nvlink_bandwidth_Bps == 450e9
    assert h100.nic_bandwidth_Bps == NDR_Bps
    assert h100.nvlink_latency_s == pytest.approx(5e-6)
    assert load_cluster("hgx-h800").nvlink_bandwidth_Bps == 200e9  # the 400 GB/s variant
    nvl = load_cluster("gb200-nvl72")
    assert (nvl.gpus_per_node, nvl.nvlink_domain_size) == (4, 72)
    assert load_cluster("h100-roce").fabric == "ethernet"


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_gpu_profiles_load(name):
    profile = load_gpu_profile(name)
    assert profile.name == name and profile.source
    assert profile.peak_flops["bf16"] > 1e14
    assert profile.hbm_bytes > 40 * 2**30 and profile.hbm_bandwidth_Bps > 1e12
    if "fp8" in profile.peak_flops:
        assert profile.peak_flops["fp8"] == pytest.approx(2 * profile.peak_flops["bf16"], rel=0.01)


def test_gpu_profile_precisions():
    assert "fp8" not in load_gpu_profile("a100-sxm-80gb").peak_flops
    assert "fp4" not in load_gpu_profile("h100-sxm").peak_flops
    for blackwell in ("b200", "b300", "gb200", "gb300"):
        assert "fp4" in load_gpu_profile(blackwell).peak_flops
    assert load_gpu_profile("h100-sxm").peak_flops["bf16"] == pytest.approx(989.4e12)
    assert load_gpu_profile("gb300").peak_flops["fp4"] == pytest.approx(15e15)
    with pytest.raises(SpecError, match="unknown GPU model 'h1000'"):
        load_gpu_profile("h1000")


# -- the "done when" list ------------------------------------------------------------------
def test_tp8_on_dgx_h100_is_one_nvlink_domain(fabrics):
    fabric = fabrics("dgx-h100", 64)
    link = fabric.group_link(1, 8)
    assert (link.tier, link.nvlink_domains_spanned, link.nodes_spanned) == ("nvlink", 1, 1)
    assert link.bandwidth_Bps == pytest.approx(450e9 * 0.82)
    assert link.network_bandwidth_Bps == 0.0
    assert fabric.group_link(1, 8) is link  # cached per (stride, size)


def test_tp16_on_dgx_h100_spans_two_nodes_at_network_bandwidth(fabrics):
    link = fabrics("dgx-h100", 64).group_link(1, 16)
    assert (link.tier, link.nvlink_domains_spanned, link.nodes_spanned) == ("network", 2, 2)
    assert link.members_per_domain == 8
    assert link.bandwidth_Bps == pytest.approx(NDR_Bps * 0.92)
    assert link.nvlink_bandwidth_Bps == pytest.approx(450e9 * 0.82)


@pytest.mark.parametrize("num_gpus", [64, 128, 256])
def test_gb200_nvl72_tp16_and_ep64_stay_in_one_domain(fabrics, num_gpus):
    fabric = fabrics("gb200-nvl72", num_gpus)
    for stride, size in ((1, 16), (1, 64), (2, 32)):
        link = fabric.group_link(stride, size)
        assert (link.tier, link.nvlink_domains_spanned) == ("nvlink", 1)
        assert link.nodes_spanned == stride * size // 4  # 4-GPU compute trays
        assert link.bandwidth_Bps == pytest.approx(900e9 * 0.8)


def test_full_rack_use_lets_power_of_two_groups_straddle(tmp_path):
    """With all 72 GPUs of a rack in use, block placement puts ranks 64..79 in two racks."""
    data = yaml.safe_load((data_dir("topologies") / "gb200-nvl72.yaml").read_text())
    data["usable_domain_size"] = 72
    path = tmp_path / "nvl72-full.yaml"
    path.write_text(yaml.safe_dump(data))
    link = build_fabric(load_cluster(str(path)), 144).group_link(1, 16)
    assert (link.tier, link.nvlink_domains_spanned) == ("network", 2)


def test_dp_over_32_nodes_is_limited_by_the_per_gpu_nic(fabrics):
    link = fabrics("dgx-h100", 256).group_link(8, 32)  # tp=8, dp=32: one GPU per node
    assert (link.nodes_spanned, link.members_per_domain, link.tier) == (32, 1, "network")
    assert link.bandwidth_Bps == pytest.approx(NDR_Bps * 0.92)
    # Two GPUs share each 200 GbE NIC on the limited RoCE cluster: 12.5 GB/s each.
    roce = fabrics("h100-roce", 256).group_link(8, 32)
    assert roce.bandwidth_Bps == pytest.approx(200e9 / 8 / 2 * 0.8)


def test_oversubscription_halves_only_groups_that_cross_leaf_switches(fabrics):
    full, half = fabrics("dgx-h100", 512), fabrics("dgx-h100-oversub", 512)
    # 32 nodes on one rail = one scalable unit under one leaf per rail: no spine crossing.
    inside = (8, 32)
    assert half.group_link(*inside).leaf_groups_spanned == 1
    assert half.group_link(*inside).bandwidth_Bps == full.group_link(*inside).bandwidth_Bps
    # 64 nodes span two scalable units: the leaf uplinks are shared 2:1.
    for across in ((8, 64), (256, 2)):
        assert half.group_link(*across).leaf_groups_spanned == 2
        assert half.group_link(*across).bandwidth_Bps == pytest.approx(
            full.group_link(*across).bandwidth_Bps / 2
        )
    # Intra-domain groups never see the network.
    assert half.group_link(1, 8).bandwidth_Bps == full.group_link(1, 8).bandwidth_Bps


@pytest.mark.parametrize(("name", "expected_Bps"), [("dgx-h100", NDR_Bps),
                                                    ("dgx-h100-oversub", NDR_Bps / 2)])
def test_fabric_summary_matches_max_flow_min_cut(fabrics, name, expected_Bps):
    """The fast path against the exact one: min cut between two scalable units."""
    fabric = fabrics(name, 512)
    graph = build_graph(fabric.cluster, 512)
    exact = cut_bandwidth_per_member_Bps(graph, range(256), range(256, 512))
    assert exact == pytest.approx(expected_Bps)
    fast = fabric.group_link(8, 64).network_bandwidth_Bps / fabric.cluster.network_efficiency
    assert fast == pytest.approx(exact)


def test_pods_and_spine_oversubscription(tmp_path):
    data = yaml.safe_load((data_dir("topologies") / "dgx-h100.yaml").read_text())
    data.update(name="pods", gpus_per_pod=512, spine_oversubscription=4.0)
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump(data))
    fabric = build_fabric(load_cluster(str(path)), 1024)
    assert fabric.group_link(8, 64).bandwidth_Bps == pytest.approx(NDR_Bps * 0.92)
    crossing = fabric.group_link(512, 2)
    assert crossing.bandwidth_Bps == pytest.approx(NDR_Bps / 4 * 0.92)
    assert crossing.latency_s > fabric.group_link(8, 64).latency_s


def test_vectorized_group_links_match_scalar(fabrics):
    fabric = fabrics("dgx-h100-oversub", 512)
    strides = np.array([1, 1, 8, 8, 256, 1, 8])
    sizes = np.array([8, 16, 32, 64, 2, 8, 64])
    out = fabric.group_links(strides, sizes)
    for k, (stride, size) in enumerate(zip(strides, sizes, strict=True)):
        link = fabric.group_link(int(stride), int(size))
        assert out["bandwidth_Bps"][k] == link.bandwidth_Bps
        assert out["tier"][k] == link.tier
        assert out["nodes_spanned"][k] == link.nodes_spanned
        assert out["crosses_network"][k] == (link.tier == "network")
    bad = fabric.group_links(np.array([3, 1]), np.array([5, 8]), invalid="nan")
    assert np.isnan(bad["bandwidth_Bps"][0]) and bad["bandwidth_Bps"][1] > 0
    with pytest.raises(TopologyError, match="must divide"):
        fabric.group_links(np.array([3]), np.array([5]))


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(PRESETS),
    stride_exp=st.integers(0, 6),
    data=st.data(),
)
def test_widening_a_group_never_raises_its_bandwidth(fabrics, name, stride_exp, data):
    num_gpus = 1024
    fabric = fabrics(name, num_gpus)
    stride = 2**stride_exp
    sizes = [2**k for k in range(11) if stride * 2**k <= num_gpus]
    small = data.draw(st.sampled_from(sizes))
    bigger = [s for s in sizes if s >= small]
    for size in bigger:
        assert (fabric.group_link(stride, size).bandwidth_Bps
                <= fabric.group_link(stride, small).bandwidth_Bps)
    widths = [fabric.group_link(stride, s).bandwidth_Bps for s in bigger]
    assert widths == sorted(widths, reverse=True)


# -- malformed cluster files ---------------------------------------------------------------
def _write(tmp_path: Path, **changes) -> str:
    data = yaml.safe_load((data_dir("topologies") / "dgx-h100.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"nic_bandwidth_Gbps": None}, ("missing field 'nic_bandwidth_Gbps'",)),
        ({"gpus_per_node": None}, ("missing field 'gpus_per_node'",)),
        ({"nvlink_bandwidth_GBps": -450}, ("'nvlink_bandwidth_GBps'", "positive", "-450")),
        ({"nic_bandwidth_Gbps": 0}, ("'nic_bandwidth_Gbps'", "positive")),
        ({"gpu": "h1000"}, ("field 'gpu'", "unknown GPU model 'h1000'", "h100-sxm")),
        ({"fabric": "token-ring"}, ("field 'fabric'", "infiniband")),
        ({"nvlink_bandwith_GBps": 1}, ("unknown field 'nvlink_bandwith_GBps'",
                                       "did you mean 'nvlink_bandwidth_GBps'")),
        ({"gpus_per_node": "eight"}, ("'gpus_per_node'", "integer")),
        ({"rail_optimized": "yes"}, ("'rail_optimized'", "true or false")),
        ({"leaf_oversubscription": 0.5}, ("leaf_oversubscription", ">= 1")),
        ({"nvlink_domain_size": 12}, ("nvlink_domain_size=12", "gpus_per_node=8")),
        ({"nics_per_node": 3}, ("nics_per_node=3",)),
        ({"network_efficiency": 1.5}, ("network_efficiency", "(0, 1]")),
    ],
)
def test_malformed_cluster_files_name_the_field(tmp_path, changes, fragments):
    path = _write(tmp_path, **changes)
    with pytest.raises(TopologyError) as error:
        load_cluster(path)
    for fragment in fragments:
        assert fragment in str(error.value)
    assert path in str(error.value) or "cluster '" in str(error.value)


def test_disconnected_fabric_is_reported(tmp_path):
    cluster = load_cluster(_write(tmp_path, nics_per_node=0))
    build_fabric(cluster, 8)  # one node: NVLink alone connects it
    message = r"disconnected: gpu/8 cannot reach gpu/0.*nics_per_node"
    with pytest.raises(TopologyError, match=message):
        build_fabric(cluster, 16)


def test_validate_graph_names_the_bad_element():
    graph = build_graph(load_cluster("dgx-h100"), 16)
    graph.edges["nic/1/0", "leaf/0/0"]["bandwidth_Bps"] = -1.0
    with pytest.raises(TopologyError, match="bandwidth_Bps must be positive") as error:
        validate_graph(graph)
    assert "nic/1/0" in str(error.value) and "leaf/0/0" in str(error.value)
    graph = build_graph(load_cluster("dgx-h100"), 16)
    graph.remove_edge("gpu/11", "nvswitch/1")
    graph.remove_edge("gpu/11", "nic/1/3")
    with pytest.raises(TopologyError, match="gpu/11 cannot reach gpu/0"):
        validate_graph(graph)


def test_load_errors_for_names_paths_and_sizes(tmp_path):
    with pytest.raises(TopologyError, match="did you mean 'dgx-h100'"):
        load_cluster("dgx-h10")
    with pytest.raises(TopologyError, match="does not exist"):
        load_cluster(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(TopologyError, match="expected a mapping"):
        load_cluster(str(bad))
    small = load_cluster(_write(tmp_path, max_gpus=256))
    with pytest.raises(TopologyError, match="max_gpus=256"):
        build_graph(small, 512)
    with pytest.raises(TopologyError, match="must divide"):
        build_fabric(load_cluster("dgx-h100"), 24).group_link(1, 16)
