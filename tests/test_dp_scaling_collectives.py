"""Data-parallel collectives on DGX A100 at the share of line rate measured in training.

Issue 33: series where only data parallelism grows.  The dgx-a100 cluster file prices the
data-parallel reduce-scatter / all-gather (or all-reduce) across nodes at 0.34 of line
rate, the share NAR21 (arXiv 2104.04473) §5.9 measured on Selene; pipeline sends keep the
0.92 of point-to-point traffic.  Golden numbers come from the papers, worked by hand in the
comments: NAR21 §5.9 (12.9 TB/s), KOR22 (arXiv 2205.05198) §6.3 (37.83 -> 39.15 s) and
MegaScale (arXiv 2402.15627) Table 2 (iteration times of its Megatron-LM baseline).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.topology.cluster import load_cluster
from parsearch.topology.cluster_spec import ClusterSpec
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.published_runs import (
    PublishedRun,
    load_published_runs,
    read_published_runs,
    training_spec,
)
from parsearch.validation.published.runs import ValidationRow, validate_runs

DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / "independent_runs.csv"
# MegaScale's Megatron-LM baseline, GPT-175B TP8 PP8 VPP6 (Table 2): B = 768 on 256-1,024
# GPUs, B = 6,144 on 3,072-12,288 GPUs.
SMALL_BATCH = ("i0004", "i0005", "i0006", "i0007")
LARGE_BATCH = ("i0012", "i0013", "i0014", "i0015")
# KOR22's 530B (TP8 PP35 VPP3, SP + selective recompute) without and with 8-way DP.
KOR22_PAIR = ("r0333", "r0337")


@pytest.fixture(scope="module")
def runs() -> dict[str, PublishedRun]:
    return {run.id: run for run in [*load_published_runs(), *read_published_runs(DATA).runs]}


@pytest.fixture(scope="module")
def scored(runs: dict[str, PublishedRun]) -> dict[str, ValidationRow]:
    wanted = [runs[i] for i in (*SMALL_BATCH, *LARGE_BATCH, *KOR22_PAIR)]
    report = validate_runs(wanted, deduplicate=False)
    return {row.id: row for row in report.rows}


def _dp_seconds(cluster: ClusterSpec, run: PublishedRun, num_gpus: int) -> float:
    """Exposed data-parallel seconds per step of ``run``'s layout on ``num_gpus`` GPUs."""
    assert run.model_spec is not None
    layout = replace(run.layout, num_gpus=num_gpus)
    training = replace(training_spec(run), global_batch=layout.dp * 64)
    options = CostOptions(overlap_grad_reduce=False, overlap_param_gather=False,
                          tp_comm_overlap=False)
    model = build_cost_model(run.model_spec, training, build_fabric(cluster, num_gpus),
                             options=options)
    return estimate(model, layout).time_s.get("dp_comm", 0.0)


def test_the_dgx_a100_collective_share_is_nar21s_measurement() -> None:
    cluster = load_cluster("dgx-a100")
    # NAR21 §5.9: 12.9 TB/s effective all-reduce bandwidth among the data-parallel replicas
    # of its 3,072-GPU run; one-direction bisection of 3,072 x 25 GB/s HDR rails = 38.4 TB/s.
    bisection = 3072 * cluster.nic_bandwidth_per_gpu_Bps / 2.0
    assert bisection == pytest.approx(38.4e12)
    assert cluster.collective_efficiency == pytest.approx(12.9e12 / bisection, abs=0.005)
    # point-to-point sends (pipeline stages) keep the InfiniBand share
    assert cluster.network_efficiency == pytest.approx(0.92)


def test_only_the_data_parallel_time_moves(runs: dict[str, PublishedRun]) -> None:
    """At 0.34 instead of 0.92 the exposed DP time grows by 0.92 / 0.34 and nothing else."""
    run = runs["i0015"]
    assert run.model_spec is not None
    shipped = load_cluster("dgx-a100")
    options = CostOptions(overlap_grad_reduce=False, overlap_param_gather=False,
                          tp_comm_overlap=False)
    times = []
    for cluster in (shipped, replace(shipped, network_collective_efficiency=None)):
        model = build_cost_model(run.model_spec, training_spec(run),
                                 build_fabric(cluster, run.num_gpus), options=options)
        times.append(estimate(model, run.layout).time_s)
    slow, fast = times
    # the bandwidth term dominates at 192 ranks; the latency does not move with the share
    # (NCCL's ring: 191 network steps per call, a call per model chunk, about 2% of the
    # slow time here), so the ratio sits just under 0.92 / 0.34
    ratio = slow["dp_comm"] / fast["dp_comm"]
    assert 0.97 * 0.92 / 0.34 <= ratio < 0.92 / 0.34
    for part in ("compute", "tp_comm", "pp_p2p", "pp_bubble", "optimizer"):
        assert slow[part] == pytest.approx(fast[part])


def test_the_cost_is_per_step_and_saturates_with_data_parallel_size(
        runs: dict[str, PublishedRun]) -> None:
    """Ring reduce-scatter + all-gather move (n-1)/n of the buffer: the exposed time grows
    with the DP size but saturates, as MegaScale's per-step residual does (0.3-2.1 s at
    every size, no trend beyond its scatter)."""
    cluster = load_cluster("dgx-a100")
    run = runs["i0004"]
    sizes = (256, 512, 1024, 3072, 12288)  # DP 4, 8, 16, 48, 192
    seconds = [_dp_seconds(cluster, run, n) for n in sizes]
    assert seconds == sorted(seconds)
    dp = [n // 64 for n in sizes]
    for n_dp, value in zip(dp, seconds, strict=True):
        # normalised by (n-1)/n the per-step cost is one constant
        assert value / ((n_dp - 1) / n_dp) == pytest.approx(seconds[-1] / (191 / 192), rel=0.02)
    # magnitude: 175B over TP8 x PP8, the largest stage about 2.78e9 parameters (12 layers
    # of 12 h^2, h = 12288, plus the 64,000 x 12288 / 8 embedding); a 4-byte reduce-scatter
    # and a 2-byte all-gather at 0.34 x 25 GB/s: 6 x 2.78e9 / 8.5e9 = 1.96 s.
    assert seconds[-1] == pytest.approx(6 * 2.78e9 / (0.34 * 25e9) * 191 / 192, rel=0.05)


def test_it_vanishes_without_data_parallel_peers_across_nodes(
        runs: dict[str, PublishedRun]) -> None:
    cluster = load_cluster("dgx-a100")
    run = runs["i0004"]
    # DP 1: no data-parallel collective (and a dense model no expert-data-parallel one)
    assert _dp_seconds(cluster, run, 64) == 0.0
    # a DP group inside one node rides NVLink: the network share does not reach it
    small = load_published_runs()
    row = next(r for r in small if r.id == "r0313")  # GPT-1.7B TP1 on 32 GPUs
    assert row.model_spec is not None
    layout = replace(row.layout, num_gpus=8)
    training = replace(training_spec(row), global_batch=8 * row.layout.mbs * 4)
    options = CostOptions(overlap_grad_reduce=False, overlap_param_gather=False)
    times = []
    for spec in (cluster, replace(cluster, network_collective_efficiency=None)):
        model = build_cost_model(row.model_spec, training, build_fabric(spec, 8),
                                 options=options)
        times.append(estimate(model, layout).time_s["dp_comm"])
    assert times[0] == pytest.approx(times[1]) and times[0] > 0.0


def _spread(rows: list[ValidationRow], measured: bool) -> float:
    first, last = rows[0], rows[-1]
    if measured:
        return 1.0 - last.measured_tokens_per_s_per_gpu / first.measured_tokens_per_s_per_gpu
    return 1.0 - last.predicted_tokens_per_s_per_gpu / first.predicted_tokens_per_s_per_gpu


@pytest.mark.parametrize("series", [SMALL_BATCH, LARGE_BATCH, KOR22_PAIR],
                         ids=["megascale-B768", "megascale-B6144", "kor22-530B"])
def test_published_dp_scaling_series_within_a_factor_1_5(
        scored: dict[str, ValidationRow], series: tuple[str, ...]) -> None:
    """MegaScale Table 2: per-GPU tokens/s falls 15.7% (B 768, 256 -> 1,024 GPUs:
    40.0 s x 256 against 11.9 s x 1,024 per step, 1 - 40.0 / (4 x 11.9) = 16%) and 15.4%
    (B 6,144, 3,072 -> 12,288 GPUs); KOR22 §6.3: 3.4% (37.83 -> 39.15 s at the same batch
    per replica).  Before the measured collective share: predicted 7.1%, 10.2% and 0.8%."""
    rows = [scored[i] for i in series]
    measured, predicted = _spread(rows, True), _spread(rows, False)
    assert measured > 0.03
    assert 1.0 / 1.5 <= predicted / measured <= 1.5


def test_kor22_data_parallel_step_growth_in_seconds(scored: dict[str, ValidationRow],
                                                     runs: dict[str, PublishedRun]) -> None:
    """KOR22 §6.3: 37.83 -> 39.15 s, +1.32 s for 8-way DP with un-overlapped gradient
    reduction; priced within 35% of it (0.31 s before the measured collective share)."""
    steps = []
    for run_id in KOR22_PAIR:
        run, row = runs[run_id], scored[run_id]
        steps.append(run.global_batch * run.seq_len
                     / (row.predicted_tokens_per_s_per_gpu * run.num_gpus))
    assert steps[1] - steps[0] == pytest.approx(1.32, rel=0.35)

