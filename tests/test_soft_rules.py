"""Soft rules of the layout spec are flagged where they apply, and only there."""

from __future__ import annotations

import json

import pytest

from parsearch.layout import Layout
from parsearch.layout.soft_rules import soft_rule_flags
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import run_cli


@pytest.fixture(scope="module")
def h100():
    return build_fabric(load_cluster("dgx-h100"), 128)


@pytest.fixture(scope="module")
def nvl72():
    return build_fabric(load_cluster("gb200-nvl72"), 128)


def test_tp_across_domains_is_flagged_only_off_nvlink(h100, nvl72) -> None:
    wide = Layout(128, tp=16, pp=2, sp=True)
    assert any(f.startswith("tp=16 spans 2 NVLink domains") for f in soft_rule_flags(
        wide, h100, global_batch=1024))
    assert not any(f.startswith("tp=") for f in soft_rule_flags(wide, nvl72, 1024))
    assert soft_rule_flags(Layout(128, tp=8, pp=2, sp=True), h100, 1024) == []


def test_bubble_and_deep_pipeline_flags(h100) -> None:
    starved = Layout(128, tp=8, pp=8)  # dp=2, m = 16 / 2 = 8 <= pp
    flags = soft_rule_flags(starved, h100, global_batch=16)
    assert any(f.startswith("m=8 micro-batches for pp=8") for f in flags)
    assert any(f.startswith("pp=8 without interleaving") for f in flags)
    interleaved = Layout(128, tp=8, pp=8, vpp=2)
    assert not any("without interleaving" in f for f in soft_rule_flags(interleaved, h100, 1024))


def test_ep_crossing_the_network_is_flagged(h100, nvl72) -> None:
    layout = Layout(128, ep=16)
    assert any(f.startswith("ep=16 crosses the network") for f in soft_rule_flags(
        layout, h100, 1024))
    assert not any(f.startswith("ep=") for f in soft_rule_flags(layout, nvl72, 1024))
    assert not any(f.startswith("ep=") for f in soft_rule_flags(Layout(128, ep=8), h100, 1024))


# sp=true needs tp > 1 (layout rule), so (1, True) is not a layout.
@pytest.mark.parametrize(("tp", "sp"), [(1, False), *((tp, sp) for tp in (2, 4, 8)
                                                     for sp in (False, True))])
def test_tensor_parallelism_without_sequence_parallelism_is_flagged(h100, tp: int,
                                                                    sp: bool) -> None:
    flags = soft_rule_flags(Layout(128, tp=tp, pp=2, sp=sp), h100, 1024)
    flagged = [f for f in flags if "without sequence parallelism" in f]
    assert bool(flagged) == (tp > 1 and not sp)
    assert all("add sp=true" in f for f in flagged)


def test_explain_names_the_missing_sp_of_a_layout_string() -> None:
    """A layout string without sp gets sp=false (Megatron-LM's default); explain says how
    to ask for what Megatron-Bridge's recipes run with tp > 1."""
    query = ("--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
             "--global-batch", "64", "--seq-len", "8192")
    bare = json.loads(run_cli("explain", *query, "--layout", "tp=8,pp=4",
                              "--format", "json").out)
    assert bare["layout"]["sp"] is False
    assert any("without sequence parallelism" in f for f in bare["flags"])
    with_sp = json.loads(run_cli("explain", *query, "--layout", "tp=8,pp=4,sp=true",
                                 "--format", "json").out)
    assert not any("without sequence parallelism" in f for f in with_sp["flags"])
    assert (with_sp["memory_gib_per_gpu"]["activations"]
            < bare["memory_gib_per_gpu"]["activations"])


def test_explain_and_search_report_the_flags() -> None:
    query = ("--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
             "--global-batch", "64", "--seq-len", "8192")
    explain = json.loads(run_cli("explain", *query, "--layout", "tp=16,pp=4,sp=true",
                                 "--format", "json").out)
    assert any(f.startswith("tp=16 spans") for f in explain["flags"])
    search = json.loads(run_cli("search", *query, "--top", "3", "--format", "json").out)
    assert all(isinstance(r["flags"], list) for r in search["results"])
