"""Offloaded activations cost their host copies where they outlast the layer beside them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, layout_columns, score_columns
from parsearch.cost.memory import MemoryOptions
from parsearch.cost.offload import offload_exposed
from parsearch.layout import parse_layout_string
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.topology.hardware import load_gpu_profile

MODEL = get_preset("llama3-70b")


def _cols(layout: str, gpus: int = 64) -> dict[str, np.ndarray]:
    return layout_columns([parse_layout_string(layout, gpus)])


def _exposed(k: int, gpu: str, layer_time: float, layout: str = "tp=1,pp=1,mbs=2") -> float:
    training = TrainingSpec(seq_len=8192, global_batch=256, activation_offload_layers=k)
    return float(offload_exposed(MODEL, training, load_gpu_profile(gpu), MemoryOptions(),
                                 _cols(layout), False, np.array([layer_time]))[0])


def test_no_offload_costs_nothing() -> None:
    assert _exposed(0, "gb200", 0.001) == 0.0


def test_hand_count_of_one_exposed_copy() -> None:
    """A layer whose forward is shorter than its copy waits for the difference, twice
    (forward copy out, backward copy in) once the backward is also shorter."""
    training = TrainingSpec(seq_len=8192, global_batch=256, activation_offload_layers=80)
    gpu = load_gpu_profile("gb200")
    cols = _cols("tp=1,pp=1,mbs=2")
    tiny = 1e-9  # no compute to hide behind: both copies fully exposed
    exposed = float(offload_exposed(MODEL, training, gpu, MemoryOptions(), cols, False,
                                    np.array([tiny]))[0])
    copy = (exposed + tiny / 3 + 2 * tiny / 3) / 2  # exposed = 2 copy - fwd - bwd
    assert copy > 0.0
    # a layer 3 x copy long hides the forward copy... and the backward one (6 x copy / 3 * 2)
    assert _exposed(80, "gb200", 3 * copy) == pytest.approx(0.0, abs=1e-12)
    # a layer of 1.5 x copy: forward (0.5 copy) exposes half a copy, backward hides it
    assert _exposed(80, "gb200", 1.5 * copy) == pytest.approx(0.5 * copy, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(0, 80), layer_time=st.floats(1e-5, 1.0))
def test_more_offloaded_layers_or_a_slower_link_never_cost_less(k: int, layer_time: float) -> None:
    base = _exposed(k, "gb200", layer_time)
    assert base >= 0.0
    assert _exposed(min(k + 10, 80), "gb200", layer_time) >= base - 1e-15
    assert _exposed(k, "h100-sxm", layer_time) >= base - 1e-15  # PCIe Gen5 < NVLink-C2C


def test_offloading_never_makes_a_layout_faster() -> None:
    fabric = build_fabric(load_cluster("gb200-nvl72"), 64)
    cols = _cols("tp=1,pp=4,vpp=5,mbs=1")
    plain = TrainingSpec(seq_len=8192, global_batch=256)
    times = []
    for k in (0, 2, 4):
        cm = build_cost_model(MODEL, replace(plain, activation_offload_layers=k), fabric)
        times.append(float(score_columns(cm, cols, with_memory=False)["step_time_s"][0]))
    assert times[0] <= times[1] <= times[2]
