"""BigScience's BLOOM-176B layout trial (``BLOOM-TRIAL`` rows) and its Jean Zay cluster file.

Golden numbers come from the sources named in ``INDEPENDENT_RUNS.md``: the trial's
table in ``train/tr11-176B-ml/chronicles-prequel.md`` of bigscience-workshop/bigscience
and the BLOOM paper's hardware section (4 Omni-Path 100 Gb/s links per node), not from
the code.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from parsearch.topology.cluster import load_cluster
from parsearch.validation.published.published_runs import PublishedRun, read_published_runs
from parsearch.validation.published.run_conventions import BLOOM_TRIAL, nar21_flops_per_token
from parsearch.validation.published.runs import validate_runs

DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / "independent_runs.csv"
TRIAL_IDS = [f"i{n:04d}" for n in range(224, 242)]


@pytest.fixture(scope="module")
def trial() -> list[PublishedRun]:
    return [run for run in read_published_runs(DATA).runs if run.source_tag == BLOOM_TRIAL]


def test_the_trial_rows_load_on_the_jean_zay_cluster(trial: list[PublishedRun]) -> None:
    assert [run.id for run in trial] == TRIAL_IDS
    for run in trial:
        assert run.skip_reason is None
        assert run.cluster == "jean-zay-a100-80gb"
        assert run.num_gpus == 384  # 48 nodes x 8
        assert run.layout.recompute == "full" and not run.layout.sp
        assert run.precision == "bf16" and run.precision_raw == "FP16"  # 16-bit, A100 peak
        spec = run.model_spec
        assert spec is not None
        # the trial's model: NLAYERS=72 NHIDDEN=14336 NHEADS=64, GPT block (GeLU, tied)
        assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (72, 14336, 64)
        assert spec.mlp_activation == "gelu" and spec.tied_embeddings
    # ten (TP, PP) shapes: TP8 x PP 2/4/6/8/12, TP4 x PP 6/12/24, TP2 x PP 12/24
    shapes = {(run.layout.tp, run.layout.pp) for run in trial}
    assert len(shapes) == 10


def test_the_rows_throughput_agrees_with_the_tables_tflops(trial: list[PublishedRun]) -> None:
    # Table row "DP 8 TP 8 PP 6 MBS 4 GBS 2048 ... 114.11 s/it, 141.27 TFLOPs":
    # 2048 x 2048 / (114.11 x 384) = 95.72 tokens/s per GPU.
    first = trial[0]
    assert first.measured_tokens_per_s_per_gpu == pytest.approx(95.72, abs=0.005)
    # Every row's TFLOPs column is Megatron-DeepSpeed's NAR21 Eq. 3 count (recompute
    # included) of that throughput, V = 250,880: a check that Sec/it and TFLOPs were
    # copied from the same row.
    per_token = nar21_flops_per_token(72, 14336, 2048, 250880)
    for run in trial:
        assert run.measured_tflops_per_gpu is not None
        tflops = (run.measured_tokens_per_s_per_gpu or 0.0) * per_token / 1e12
        assert tflops == pytest.approx(run.measured_tflops_per_gpu, rel=1e-3), run.id


def test_every_trial_row_is_scored(trial: list[PublishedRun]) -> None:
    report = validate_runs(trial, deduplicate=False, include_partial=True)
    assert not report.skipped
    assert [row.id for row in report.rows] == TRIAL_IDS
    for row in report.rows:
        assert row.source == BLOOM_TRIAL
        assert math.isfinite(row.predicted_tokens_per_s_per_gpu)
        assert row.predicted_tokens_per_s_per_gpu > 0


def test_jean_zay_has_a_quarter_of_dgx_a100_inter_node_bandwidth_per_gpu() -> None:
    jean_zay = load_cluster("jean-zay-a100-80gb")
    dgx = load_cluster("dgx-a100")
    # 4 x 100 Gb/s per 8 GPUs = 6.25 GB/s per GPU; 8 x 200 Gb/s per 8 GPUs = 25 GB/s.
    assert jean_zay.nics_per_node * jean_zay.nic_bandwidth_Bps * 8 == pytest.approx(400e9)
    assert jean_zay.nic_bandwidth_per_gpu_Bps == pytest.approx(6.25e9)
    assert jean_zay.nic_bandwidth_per_gpu_Bps == pytest.approx(dgx.nic_bandwidth_per_gpu_Bps / 4)
    # the rest of the node is the same A100 80GB board
    assert jean_zay.gpu == dgx.gpu and jean_zay.gpus_per_node == dgx.gpus_per_node == 8
    assert jean_zay.nvlink_bandwidth_Bps == dgx.nvlink_bandwidth_Bps


def test_data_parallel_collectives_run_at_the_clusters_measured_collective_efficiency(
        trial: list[PublishedRun]) -> None:
    """The file states NCCL's measured all-reduce efficiency (0.10, BigScience's
    all_reduce_bench) apart from the sends' 0.92: the exposed data-parallel time of a
    layout scales by 0.92/0.10 and nothing else of the step moves."""
    from dataclasses import replace

    from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
    from parsearch.topology.fabric import build_fabric
    from parsearch.validation.published.published_runs import training_spec

    shipped = load_cluster("jean-zay-a100-80gb")
    assert shipped.collective_efficiency == pytest.approx(0.10)
    assert shipped.network_efficiency == pytest.approx(0.92)
    same_as_sends = replace(shipped, network_collective_efficiency=None)
    run = trial[0]
    options = CostOptions(overlap_grad_reduce=False, overlap_param_gather=False)
    times = []
    for cluster in (shipped, same_as_sends):
        fabric = build_fabric(cluster, run.num_gpus)
        est = estimate(build_cost_model(run.model_spec, training_spec(run), fabric,
                                        options=options), run.layout)
        times.append(est.time_s)
    slow, fast = times
    assert slow["dp_comm"] > 5.0 * fast["dp_comm"] > 0.0
    for part in ("compute", "tp_comm", "pp_p2p", "pp_bubble"):
        assert slow[part] == pytest.approx(fast[part])


def test_a_collective_efficiency_above_one_is_refused() -> None:
    from dataclasses import replace

    from parsearch.errors import ParsearchError

    with pytest.raises(ParsearchError, match="network_collective_efficiency"):
        replace(load_cluster("dgx-a100"), network_collective_efficiency=1.5)
