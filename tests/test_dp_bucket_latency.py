"""Latency of the data-parallel reduction: NCCL's ring, one call per gradient bucket (issue 33).

NCCL runs reduce-scatter and all-gather as a ring whose latency grows with the nodes it
spans (its own model, NVIDIA/nccl src/graph/tuning.cc: ``nNodes - 1`` network steps), and
the gradients go in buckets, one call each.  Megatron-Core grows its buckets with the DP
group (``max(40e6, 1e6 x dp)`` parameters) to stay bandwidth-bound; NeMo 1.0 recipes with
Apex's DistributedFusedAdam keep a fixed ``bucket_cap_mb``, so their reduction turns
latency-bound as DP grows.  NVIDIA's DGX Cloud recipes (dgxc-benchmarking@35a9aecc8d5b,
``nemotron/nemotron4-15b-synth.yaml``: ``bucket_cap_mb: 100``, ``grad_sync_dtype: bf16``)
lose 4.4% per GPU from 16 to 2,048 H100 at a fixed batch per GPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cli import main
from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.cost.collectives import LinkArrays, ring_latency, tree_latency
from parsearch.cost.stage_time import bucket_params
from parsearch.errors import SpecError
from parsearch.launch import launch_for_cluster
from parsearch.layout import parse_layout_string
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.published_runs import read_published_runs
from parsearch.validation.published.runs import validate_runs

DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / "independent_runs.csv"
# Apex bucket_cap_mb 100 of BF16 gradient-sync elements (apex distributed_fused_adam.py:
# 1024 * 1024 * bucket_cap_mb / dtype_size)
APEX_100MB = 100 * 1024 * 1024 // 2


def _link(per_domain: int, domains: int, nvl: float, net: float) -> LinkArrays:
    return LinkArrays(per_domain * domains, per_domain, 1e11, 5e10, nvl, net)


@given(per_domain=st.integers(1, 8), domains=st.integers(1, 512),
       nvl=st.floats(1e-7, 2e-5), net=st.floats(1e-7, 5e-5))
@settings(max_examples=200, deadline=None)
def test_ring_latency_grows_by_one_network_step_per_domain(
        per_domain: int, domains: int, nvl: float, net: float) -> None:
    ring = float(ring_latency(_link(per_domain, domains, nvl, net)))
    assert ring == pytest.approx((per_domain * domains - domains) * nvl + (domains - 1) * net)
    more = float(ring_latency(_link(per_domain, domains + 1, nvl, net)))
    assert more - ring == pytest.approx((per_domain - 1) * nvl + net)
    # the all-reduce tree grows with log2 of the domains: never above two rings
    tree = float(tree_latency(_link(per_domain, domains, nvl, net)))
    assert tree <= 2.0 * ring + 1e-15


@given(size=st.integers(1, 100_000), fixed=st.one_of(st.none(), st.integers(1, 10**9)))
@settings(max_examples=100, deadline=None)
def test_bucket_size_megatron_default_or_fixed(size: int, fixed: int | None) -> None:
    link = LinkArrays(np.array([float(size)]), 8.0, 1e11, 5e10, 1e-6, 1e-5)
    got = float(bucket_params(link, fixed)[0])
    # Megatron-Core core/distributed/distributed_data_parallel.py: max(40e6, 1e6 x dp)
    assert got == (fixed if fixed is not None else max(40e6, 1e6 * size))


def _nemotron15b(num_gpus: int, bucket: int | None) -> float:
    """Tokens/s/GPU of Nemotron-4 15B TP4 mbs4 at 4 micro-batches per DP rank (the DGX
    Cloud recipe's weak scaling), BF16 gradient sync."""
    model = get_preset("nemotron4-15b")
    layout = parse_layout_string("tp=4,mbs=4", num_gpus)
    training = TrainingSpec(seq_len=4096, global_batch=16 * layout.dp, precision="bf16",
                            grad_bytes=2.0)
    options = CostOptions(grad_reduce_bytes=2.0, ddp_bucket_params=bucket)
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), num_gpus),
                          options=options)
    return estimate(cm, layout).tokens_per_s_per_gpu


def test_fixed_buckets_turn_the_reduction_latency_bound_at_scale() -> None:
    # two nodes: a few ring steps, the bucket size hardly matters
    small_fixed, small_default = _nemotron15b(16, APEX_100MB), _nemotron15b(16, None)
    assert small_fixed == pytest.approx(small_default, rel=0.005)
    # 256 nodes: 255 network steps per call; 100 MB buckets make ~75 calls a direction,
    # Megatron-Core's 512M-parameter buckets ~8
    big_fixed, big_default = _nemotron15b(2048, APEX_100MB), _nemotron15b(2048, None)
    fixed_drop = 1.0 - big_fixed / small_fixed
    default_drop = 1.0 - big_default / small_default
    assert fixed_drop > 0.02
    assert default_drop < fixed_drop / 2.0


def test_the_dgx_cloud_15b_series_loses_what_it_measured() -> None:
    runs = {run.id: run for run in read_published_runs(DATA).runs}
    # i0270 / i0277: Nemotron-4 15B BF16 on 16 and 2,048 H100 (README_15b.md table)
    rows = {row.id: row for row in validate_runs([runs["i0270"], runs["i0277"]],
                                                  deduplicate=False).rows}
    measured = 1.0 - (rows["i0277"].measured_tokens_per_s_per_gpu
                      / rows["i0270"].measured_tokens_per_s_per_gpu)
    predicted = 1.0 - (rows["i0277"].predicted_tokens_per_s_per_gpu
                       / rows["i0270"].predicted_tokens_per_s_per_gpu)
    assert measured == pytest.approx(0.044, abs=0.002)
    assert measured / 1.5 <= predicted <= measured * 1.5


def test_the_recipe_bucket_reaches_the_options_and_the_launch() -> None:
    with pytest.raises(SpecError, match="ddp_bucket_params"):
        CostOptions(ddp_bucket_params=0)
    assert replace(CostOptions(), ddp_bucket_params=APEX_100MB).ddp_bucket_params == APEX_100MB


def test_the_launch_carries_the_priced_bucket() -> None:
    model, cluster = get_preset("llama3-8b"), load_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=64)
    layout = parse_layout_string("tp=2,mbs=1", 16)
    launch = launch_for_cluster(model, training, layout, cluster,
                                options=CostOptions(ddp_bucket_params=APEX_100MB))
    args = launch.megatron_lm_args
    assert args[args.index("--ddp-bucket-size") + 1] == str(APEX_100MB)
    assert f"ddp.bucket_size={APEX_100MB}" in launch.bridge_overrides
    # the default keeps Megatron-Core's sizing: no flag, and Bridge's field reset to null
    default = launch_for_cluster(model, training, layout, cluster, options=CostOptions())
    assert "--ddp-bucket-size" not in default.megatron_lm_args
    assert "ddp.bucket_size=null" in default.bridge_overrides


def test_a_bad_bucket_size_is_refused_at_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
              "--global-batch", "64", "--seq-len", "4096", "--ddp-bucket-size", "0"])
    assert "--ddp-bucket-size" in capsys.readouterr().err


def _step(name: str, layout_text: str, num_gpus: int, batch: int, apex: bool) -> float:
    layout = parse_layout_string(layout_text, num_gpus)
    training = TrainingSpec(seq_len=4096, global_batch=batch, precision="bf16", grad_bytes=2.0)
    options = CostOptions(grad_reduce_bytes=2.0, ddp_bucket_params=10_000_000,
                          apex_distributed_adam=apex)
    cm = build_cost_model(get_preset(name), training,
                          build_fabric(load_cluster("dgx-h100"), num_gpus), options=options)
    return estimate(cm, layout).step_time_s


def test_megatron_buckets_only_the_first_model_chunk() -> None:
    # one chunk, one stage: Megatron-Core and Apex bucket the same parameters
    assert (_step("nemotron4-15b", "tp=4,mbs=4", 2048, 8192, apex=False)
            == pytest.approx(_step("nemotron4-15b", "tp=4,mbs=4", 2048, 8192, apex=True)))
    # five chunks: Megatron-Core splits only the first into buckets (one call for each
    # other chunk's buffer), Apex all of them, so with small buckets Apex pays more calls
    interleaved = ("llama3-70b", "tp=8,pp=4,vpp=5,mbs=1", 1024, 128)
    assert _step(*interleaved, apex=True) > _step(*interleaved, apex=False)
