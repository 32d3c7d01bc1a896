"""``parsearch clusters``, ``parsearch cluster show`` and ``parsearch placement``."""

from __future__ import annotations

import json

import pytest

import parsearch.cli as cli
from tests.cli_helpers import assert_one_line_error, run_cli


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    # Until (unless) topology_cmds is listed in COMMAND_MODULES, register it for these tests.
    if "topology_cmds" not in cli.COMMAND_MODULES:
        monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "topology_cmds"))


def test_clusters_lists_every_preset_one_line_each():
    result = run_cli("clusters")
    assert result.code == 0, result.err
    lines = result.out.strip().splitlines()
    for name in ("dgx-h100", "gb200-nvl72", "h100-roce", "dgx-h100-oversub", "hgx-h800"):
        assert sum(line.startswith(name + " ") for line in lines) == 1
    document = json.loads(run_cli("clusters", "--format", "json").out)
    assert {row["name"] for row in document["clusters"]} >= {"dgx-a100", "gb300-nvl72"}


def test_cluster_show_json():
    result = run_cli("cluster", "show", "dgx-h100-oversub", "--gpus", "512", "--format", "json")
    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert document["num_gpus"] == 512
    assert document["graph"]["nodes"]["gpu"] == 512
    assert document["fabric"]["nodes"] == 64
    assert document["fabric"]["per_gpu_GBps"]["nic_share"] == pytest.approx(50)
    assert document["fabric"]["per_gpu_GBps"]["leaf_uplink_share"] == pytest.approx(25)
    table = run_cli("cluster", "show", "gb200-nvl72", "--gpus", "1000")
    assert table.code == 0 and "validated" in table.out


def test_cluster_show_errors():
    assert_one_line_error(run_cli("cluster", "show", "dgx-h10", "--gpus", "8"),
                          "unknown cluster 'dgx-h10'", "dgx-h100")


def test_cluster_show_reports_malformed_files(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ngpu: h100-sxm\n")
    assert_one_line_error(run_cli("cluster", "show", str(path), "--gpus", "8"),
                          "missing field 'gpus_per_node'")


def test_placement_json_keys():
    result = run_cli("placement", "--model", "llama3-70b", "--cluster", "dgx-h100",
                     "--gpus", "64", "--layout", "tp=8,pp=2,cp=2", "--format", "json")
    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert set(document) == {"layout", "num_gpus", "groups"}
    groups = {g["kind"]: g for g in document["groups"]}
    assert set(groups) == {"tp", "cp", "dp", "pp"}  # dense model: no expert groups
    assert groups["tp"]["tier"] == "nvlink" and groups["tp"]["nvlink_domains_spanned"] == 1
    assert groups["dp"]["size"] == 4  # dp=2 x cp=2
    text = run_cli("placement", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
                   "--layout", "tp=8,pp=2", "--rank-order", "tp-pp-cp-ep-dp")
    assert text.code == 0 and "tp-pp-cp-ep-dp" in text.out


def test_placement_errors():
    assert_one_line_error(
        run_cli("placement", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
                "--layout", "tp=8,pp=3"),
        "must both divide num_gpus",
    )
    assert_one_line_error(
        run_cli("placement", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
                "--layout", "tp=8,ep=8"),
        "R5",
    )
