"""Userbuffers TP overlap runs the GEMMs it overlaps in chunks (TE initialize_ub splits)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.compute import unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.options import CostOptions
from parsearch.cost.recompute import LayerShares
from parsearch.cost.ub_chunks import (
    PIPELINE_SPLITS,
    column_parallel_share,
    userbuffers_gemm_passes,
)
from parsearch.layout import Layout
from parsearch.presets import get_preset
from parsearch.topology import build_fabric, load_cluster
from parsearch.topology.hardware import load_gpu_profile
from parsearch.workload import TrainingSpec

NO_RECOMPUTE = LayerShares(*(np.zeros(()) for _ in range(6)))


def _rate(peak: float, half: float):
    """A GEMM rate with a fixed time per call: peak * F / (F + F_half)."""
    return lambda f: peak * f / (f + half)


@settings(max_examples=200, deadline=None)
@given(flops=st.floats(1e9, 1e14), tp=st.sampled_from([1, 2, 4, 8, 16]),
       share=st.floats(0.0, 1.0), half=st.floats(1e8, 2e10))
def test_chunked_passes_are_never_faster_than_whole_gemms(flops: float, tp: int,
                                                          share: float, half: float) -> None:
    rate = _rate(1e15, half)
    per_call = np.array([flops / 4.0])
    whole = flops / rate(per_call)
    forward, dgrad = userbuffers_gemm_passes(np.array([flops]), per_call, np.array([tp]),
                                             share, rate)
    assert forward[0] >= whole[0] * (1.0 - 1e-12)
    assert dgrad[0] >= whole[0] * (1.0 - 1e-12)
    # At tp = 4 both forward methods split in four; the data gradient keeps the
    # column-parallel share whole (bulk overlap), so it is never the slower pass.
    if tp == PIPELINE_SPLITS:
        assert dgrad[0] <= forward[0] * (1.0 + 1e-12)


def test_a_gemm_rate_without_a_fixed_cost_makes_chunking_free() -> None:
    forward, dgrad = userbuffers_gemm_passes(np.array([8e12]), np.array([2e12]),
                                             np.array([8.0]), 0.6, lambda f: 1e15 + 0.0 * f)
    assert forward[0] == pytest.approx(8e-3)
    assert dgrad[0] == pytest.approx(8e-3)


def test_column_parallel_share_counts_qkv_and_fc1() -> None:
    model = get_preset("llama3-8b")  # h 4096, 32 heads x 128, 8 groups, SwiGLU 14336
    h, f = 4096, 14336
    qkv, proj = h * (4096 + 2 * 1024), 4096 * h
    fc1, fc2 = 2 * h * f, f * h
    assert column_parallel_share(model, f) == pytest.approx((qkv + fc1) / (qkv + proj + fc1 + fc2))
    assert column_parallel_share(model, 0.0) == pytest.approx(qkv / (qkv + proj))


def _layer_gemm(tp: int, userbuffers: bool) -> float:
    model = get_preset("llama3-70b")
    gpu = load_gpu_profile("h100-sxm")
    cols = {k: np.array([v]) for k, v in dict(tp=tp, cp=1, ep=1, etp=1, mbs=1, pp=1, vpp=1,
                                              dp=1, sp=True, recompute=0).items()}
    layer = unit_compute(model, TrainingSpec(seq_len=2048, global_batch=64, precision="bf16"),
                         gpu, efficiency_for_gpu("h100-sxm"), cols, "dense",
                         recompute=NO_RECOMPUTE, causal=True, imbalance=1.0, cuda_graphs=False,
                         userbuffers=np.array([userbuffers]))
    return float(layer.gemm[0])


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_userbuffers_slow_the_overlapped_gemms_more_at_larger_tp(tp: int) -> None:
    assert _layer_gemm(tp, True) > _layer_gemm(tp, False)
    if tp < 8:
        slowdown = _layer_gemm(tp, True) / _layer_gemm(tp, False)
        assert _layer_gemm(2 * tp, True) / _layer_gemm(2 * tp, False) > slowdown


def test_tp1_and_no_sequence_parallelism_leave_gemms_whole() -> None:
    """Userbuffers need TP > 1 with SP: without them the priced step is the same with the
    overlap option on or off."""
    model = get_preset("llama3-8b")
    fabric = build_fabric(load_cluster("dgx-h100"), 8)
    training = TrainingSpec(seq_len=4096, global_batch=64, precision="bf16")
    for tp, sp in ((1, False), (2, False)):
        layout = Layout(num_gpus=8, tp=tp, pp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, sp=sp,
                        recompute="none")
        times = [estimate(build_cost_model(model, training, fabric,
                                           options=replace(CostOptions(), tp_comm_overlap=on)),
                          layout).step_time_s for on in (True, False)]
        assert times[0] == pytest.approx(times[1])
