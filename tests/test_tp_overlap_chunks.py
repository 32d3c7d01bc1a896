"""Userbuffers TP overlap runs the overlapped GEMMs as ring exchanges of 1/tp the size.

Decision data: Megatron-Bridge ``skills/nemo-mbridge-perf-memory-tuning/SKILL.md`` at
067f987df0 ("Strategy comparison"), Llama 3 70B on 32 H100, FP8 current scaling, MBS 1,
GBS 32, 4,096 tokens, VPP 5: TP4 PP4 DP2 about 704, TP4 PP8 DP1 668.0 and TP8 PP4 DP1
508.7 model TFLOP/s per GPU (0.949x and 0.723x of the first; one FLOP count for all three).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.compute import unit_compute
from parsearch.cost.options import CostOptions
from parsearch.cost.recompute import recompute_shares
from parsearch.layout import parse_layout_string
from parsearch.presets import get_preset
from parsearch.space import enumerate_layouts
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.workload import TrainingSpec

LLAMA_70B = get_preset("llama3-70b")
TRAINING = TrainingSpec(seq_len=4096, global_batch=32, precision="fp8")


def _tokens(layout: str, *, overlap: bool = True) -> float:
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    cm = build_cost_model(LLAMA_70B, TRAINING, fabric,
                          options=CostOptions(tp_comm_overlap=overlap, fp8_recipe="tensorwise"))
    return estimate(cm, parse_layout_string(layout + ",mbs=1,sp=true,recompute=selective",
                                            32)).tokens_per_s_per_gpu


def test_bridge_strategy_comparison_order_on_32_h100() -> None:
    """TP4 PP4 > TP4 PP8 > TP8 PP4, and doubling TP costs more than doubling PP."""
    base = _tokens("tp=4,pp=4,vpp=5")
    deeper = _tokens("tp=4,pp=8,vpp=5")
    wider = _tokens("tp=8,pp=4,vpp=5")
    assert base > deeper > wider
    assert 1.0 - wider / base > 1.5 * (1.0 - deeper / base)


@settings(max_examples=15, deadline=None)
@given(splits=st.sampled_from([2.0, 4.0, 8.0]), precision=st.sampled_from(["bf16", "fp8"]))
def test_chunked_gemms_are_never_faster_and_lose_more_in_smaller_chunks(
        splits: float, precision: str) -> None:
    training = TrainingSpec(seq_len=4096, global_batch=32, precision=precision)
    table = enumerate_layouts(LLAMA_70B, training, 32)
    cols = table.columns
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    cm = build_cost_model(LLAMA_70B, training, fabric)
    shares = recompute_shares(LLAMA_70B, training, cols["recompute"], pp=cols["pp"],
                              vpp=cols["vpp"], tp=cols["tp"], sp=cols["sp"]).dense

    def gemm(n: float) -> np.ndarray:
        return unit_compute(LLAMA_70B, training, fabric.gpu, cm.profile, cols, "dense",
                            recompute=shares, causal=True, imbalance=1.0, cuda_graphs=False,
                            tp_overlap_splits=n).gemm

    whole, split, finer = gemm(1.0), gemm(splits), gemm(2.0 * splits)
    assert np.all(split >= whole) and np.all(finer >= split)
    # only the ring-exchange calls are cut: at most 1 + 1/2 + 1 (recompute) of 3 + recompute
    assert np.all(finer <= whole * 3.0)


@pytest.mark.parametrize("layout", ["tp=4,pp=4,vpp=5", "tp=8,pp=4,vpp=5"])
def test_overlap_off_pays_the_traffic_overlap_on_pays_the_chunks(layout: str) -> None:
    """Turning TP overlap off never makes a layout faster (issue 8), chunks included."""
    assert _tokens(layout, overlap=True) >= _tokens(layout, overlap=False)
