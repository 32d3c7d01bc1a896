"""Exhaustive search: ranking, memory pre-filter, diversity, launch settings."""

from __future__ import annotations

import numpy as np
import pytest

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.errors import NoValidLayoutError, SpecError
from parsearch.layout import Layout
from parsearch.search import search_layouts
from parsearch.search.exhaustive import (
    fitting_mask,
    rank_feasible,
    scan_table,
    shape_codes,
)
from parsearch.search.launch import launch_settings, nodes_for, pipeline_layout_string
from parsearch.space import enumerate_layouts
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.workload import ModelSpec, MoeSpec, TrainingSpec

# A small model and setup that keep the search fast.
TOY = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
SETUP = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2),
                     recompute_modes=("none", "full"))
CLUSTER = "dgx-h100"


@pytest.fixture(scope="module")
def scored():  # type: ignore[no-untyped-def]
    table = enumerate_layouts(TOY, SETUP, 16)
    cm = build_cost_model(TOY, SETUP, build_fabric(load_cluster(CLUSTER), 16))
    return cm, table, score_columns(cm, table.columns)


def test_memory_prefilter_agrees_with_scorer(scored) -> None:  # type: ignore[no-untyped-def]
    cm, table, scores = scored
    mask = fitting_mask(cm.model, cm.training, cm.options.memory, cm.fabric.gpu.hbm_bytes,
                        table.columns)
    assert np.array_equal(mask, scores["fits"])


def test_scan_matches_full_scoring_and_top_is_argmax(scored) -> None:  # type: ignore[no-untyped-def]
    cm, table, scores = scored
    scan = scan_table(cm, table, chunk_rows=97)  # several chunks
    assert scan.feasible == int(scores["fits"].sum())
    assert np.array_equal(np.sort(scan.feasible_rows), np.nonzero(scores["fits"])[0])
    order = rank_feasible(scan, top=5)
    best = scan.feasible_rows[order[0]]
    assert scores["tokens_per_s"][best] == scores["tokens_per_s"][scores["fits"]].max()
    ranked = scan.tokens_per_s[order]
    assert np.all(np.diff(ranked) <= 0)


def test_search_result_ranked_with_breakdowns() -> None:
    result = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=6)
    assert [e.rank for e in result.entries] == [1, 2, 3, 4, 5, 6]
    tokens = [e.estimate.tokens_per_s for e in result.entries]
    # Ties with the best (within the profile's error band) lead by memory headroom; the
    # rest follow by throughput.
    band = result.entries[0].estimate.tokens_per_s_per_gpu_range
    assert band is not None and band[0] < band[1]
    floor = max(tokens) * (1.0 - (band[1] / band[0] - 1.0) / 2.0)  # ErrorBand half-width
    tied = [e for e in result.entries if e.estimate.tokens_per_s >= floor * (1 - 1e-9)]
    head = [e.headroom_bytes for e in result.entries[:len(tied)]]
    assert head == sorted(head, reverse=True)
    rest = tokens[len(tied):]
    assert rest == sorted(rest, reverse=True)
    doc = result.to_dict()
    assert {"query", "considered", "valid", "feasible", "results"} <= doc.keys()
    first = doc["results"][0]
    for key in ("layout", "num_gpus", "fits", "step_time_s", "tokens_per_s",
                "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "memory_gib_per_gpu",
                "time_s", "bottleneck", "headroom_gib_per_gpu", "launch"):
        assert key in first
    assert first["fits"] and first["headroom_gib_per_gpu"] >= 0
    assert first["launch"]["nodes"] == 2
    assert any(a.startswith("model.tensor_model_parallel_size=")
               for a in first["launch"]["megatron_bridge_overrides"])
    # deterministic: the same query gives the same list
    again = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=6)
    assert [e.layout for e in again.entries] == [e.layout for e in result.entries]


def test_diverse_keeps_one_layout_per_shape() -> None:
    plain = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=8)
    diverse = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=16, top=8,
                             diverse=True)
    shapes = [(e.layout.tp, e.layout.pp, e.layout.cp, e.layout.ep, e.layout.etp)
              for e in diverse.entries]
    assert len(shapes) == len(set(shapes))
    def fastest(entries):  # type: ignore[no-untyped-def]
        return max(entries, key=lambda e: e.estimate.tokens_per_s).layout

    assert fastest(diverse.entries) == fastest(plain.entries)
    cols = {k: np.array([getattr(e.layout, k) for e in diverse.entries])
            for k in ("tp", "pp", "cp", "ep", "etp")}
    assert len(set(shape_codes(cols, np.arange(len(shapes))).tolist())) == len(shapes)


def test_nothing_fits_and_bad_arguments() -> None:
    setup = TrainingSpec(seq_len=65536, global_batch=8, micro_batch_sizes=(8,),
                         recompute_modes=("none",))
    result = search_layouts(model=TOY, training=setup, cluster=CLUSTER, num_gpus=1)
    assert result.entries == () and result.feasible == 0
    assert result.smallest_memory_gib and result.smallest_memory_gib > 80
    with pytest.raises(SpecError, match="top must be a positive integer"):
        search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=8, top=0)
    with pytest.raises(NoValidLayoutError):
        search_layouts(model=TOY, training=TrainingSpec(seq_len=4096, global_batch=3,
                                                           micro_batch_sizes=(2,)),
                       cluster=CLUSTER, num_gpus=8)


def test_launch_settings_megatron_lm_and_bridge() -> None:
    moe = ModelSpec("toy-moe", 30, 1024, 4096, 16, 16, 64, 32000,
                    moe=MoeSpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))
    setup = TrainingSpec(seq_len=4096, global_batch=64, precision="fp8")
    layout = Layout(num_gpus=12, tp=2, pp=2, ep=2, vpp=2, mbs=2, sp=True,
                    recompute="full")
    s = launch_settings(moe, setup, layout, gpus_per_node=8)
    args = list(s.megatron_lm_args)
    assert s.nodes == 2 == nodes_for(12, 8)
    for flag, value in (("--tensor-model-parallel-size", "2"),
                        ("--expert-model-parallel-size", "2"),
                        ("--micro-batch-size", "2"), ("--global-batch-size", "64"),
                        ("--recompute-granularity", "full"), ("--fp8-format", "hybrid")):
        assert args[args.index(flag) + 1] == value
    assert "--sequence-parallel" in args and "--use-distributed-optimizer" in args
    # 30 layers on pp*vpp=4: uneven -> an explicit layout string
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == \
        pipeline_layout_string(moe, 2, 2, "uneven")
    assert "model.expert_model_parallel_size=2" in s.bridge_overrides
    even = launch_settings(TOY, SETUP, Layout(num_gpus=8, pp=2, vpp=2), gpus_per_node=8)
    assert "--num-layers-per-virtual-pipeline-stage" in even.megatron_lm_args
    assert "model.virtual_pipeline_model_parallel_size=2" in even.bridge_overrides
    assert "--expert-model-parallel-size" not in even.megatron_lm_args
