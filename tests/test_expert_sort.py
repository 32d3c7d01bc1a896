"""Megatron-Core's all-to-all dispatcher sorts received tokens by local expert (and back)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.compute import EXPERT_SORT_BYTES_PER_HIDDEN, unit_compute
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.recompute import LayerShares
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.hardware import load_gpu_profile

MODEL = get_preset("qwen3-30b-a3b")  # 128 experts, top-8, hidden 2048
TRAINING = TrainingSpec(seq_len=4096, global_batch=512, precision="bf16")
GPU = load_gpu_profile("h100-sxm")
PROFILE = efficiency_for_gpu("h100-sxm")
NO_RECOMPUTE = LayerShares(**{f.name: np.zeros(1) for f in fields(LayerShares)})


def _memory_bound(ep: int, dispatcher: str, mbs: int = 1, tp: int = 1, etp: int = 1) -> float:
    cols = {k: np.array([v]) for k, v in
            {"tp": tp, "cp": 1, "ep": ep, "etp": etp, "mbs": mbs, "sp": int(tp > 1),
             "recompute": 0}.items()}
    layer = unit_compute(MODEL, TRAINING, GPU, PROFILE, cols, "moe", recompute=NO_RECOMPUTE,
                         causal=True, imbalance=1.0, cuda_graphs=False,
                         moe_dispatcher=dispatcher)
    return float(layer.memory_bound[0])


def test_hand_count_of_the_second_sort() -> None:
    # EP8: 16 local experts; the rank's 4096 tokens x top-8 copies, 16 h bytes each
    extra_bytes = 4096 * 8 * EXPERT_SORT_BYTES_PER_HIDDEN * 2048
    hbm = GPU.hbm_bandwidth_Bps * PROFILE.hbm_efficiency
    expected = PROFILE.memory_bound_factor * extra_bytes / hbm
    extra = _memory_bound(8, "alltoall") - _memory_bound(8, "flex")
    assert extra == pytest.approx(expected, rel=1e-9)


def test_one_expert_per_rank_needs_no_sort() -> None:
    # EP128: one expert per rank; the received tokens are already in expert order
    assert _memory_bound(128, "alltoall") == pytest.approx(_memory_bound(128, "flex"))
    assert _memory_bound(128, "allgather") == pytest.approx(_memory_bound(128, "flex"))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(1, 4))
def test_the_all_to_all_dispatcher_never_moves_fewer_bytes(ep: int, mbs: int) -> None:
    alltoall = _memory_bound(ep, "alltoall", mbs)
    assert alltoall >= _memory_bound(ep, "flex", mbs)
    assert alltoall >= _memory_bound(ep, "allgather", mbs)


def test_expert_tp_gathers_the_copies_before_the_sort_by_hand() -> None:
    """With expert TP the dispatcher all-gathers the received copies over the ETP group
    before the second sort and the experts: a rank sorts etp times the copies it sent,
    while its expert activation bytes stay the same (etp x the copies, f_e / etp wide)."""
    # TP2 + SP: 2048 tokens per rank x top-8 = 16,384 copies sent; ETP2 sorts 32,768.
    extra_bytes = 2048 * 8 * EXPERT_SORT_BYTES_PER_HIDDEN * 2048
    hbm = GPU.hbm_bandwidth_Bps * PROFILE.hbm_efficiency
    expected = PROFILE.memory_bound_factor * extra_bytes / hbm
    extra = _memory_bound(8, "alltoall", tp=2, etp=2) - _memory_bound(8, "alltoall", tp=2)
    assert extra == pytest.approx(expected, rel=1e-9)
    # the flex dispatcher does not sort: ETP leaves its memory-bound bytes unchanged
    assert _memory_bound(8, "flex", tp=2, etp=2) == pytest.approx(
        _memory_bound(8, "flex", tp=2), rel=1e-12)
