"""CUDA graphs hide the host issue time of what they capture, and only of that."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, layout_columns, score_columns
from parsearch.cost.kernels import (
    CUDA_GRAPH_SCOPES,
    KERNELS_DENSE_LAYER,
    KERNELS_FP8_EXTRA,
    KERNELS_MOE_EXTRA,
    graphed_kernels,
)
from parsearch.cost.options import CostOptions
from parsearch.errors import SpecError
from parsearch.layout import parse_layout_string
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.recipes import graph_scope

MOE = get_preset("qwen3-30b-a3b")
TRAINING = TrainingSpec(seq_len=4096, global_batch=512, precision="fp8")
FABRIC = build_fabric(load_cluster("dgx-b200"), 8)
#: Scopes Megatron-Core accepts together (moe_preprocess only with moe_router; moe and
#: moe_router not both).
VALID_SCOPES = [s for n in range(1, 4) for s in itertools.combinations(CUDA_GRAPH_SCOPES, n)
                if ("moe_preprocess" not in s or "moe_router" in s)
                and not ("moe" in s and "moe_router" in s)]


def _step(options: CostOptions, layout: str = "tp=1,pp=1,ep=8,mbs=1") -> float:
    cm = build_cost_model(MOE, TRAINING, FABRIC, options=options)
    out = score_columns(cm, layout_columns([parse_layout_string(layout, 8)]))
    return float(out["step_time_s"][0])


def test_hand_counts_of_captured_kernels() -> None:
    moe_layer = KERNELS_DENSE_LAYER + KERNELS_MOE_EXTRA + 6.0 * 16
    # the attention sublayer: 25 kernels, plus 2 of the 4 GEMMs' FP8 casts
    assert graphed_kernels(("attn",), moe_unit=True, low_precision=True,
                           total=moe_layer) == 25.0 + KERNELS_FP8_EXTRA / 2
    # router and preprocessing leave the permutation, dispatch and expert GEMMs eager
    assert graphed_kernels(("moe_router", "moe_preprocess"), moe_unit=True,
                           low_precision=False, total=moe_layer) == 45.0 + 30.0
    # attn + moe is the whole layer
    assert graphed_kernels(("attn", "moe"), moe_unit=True, low_precision=True,
                           total=moe_layer) == pytest.approx(moe_layer)
    # a dense layer has no MoE part to capture
    assert graphed_kernels(("moe",), moe_unit=False, low_precision=False,
                           total=KERNELS_DENSE_LAYER) == 0.0
    assert graphed_kernels((), moe_unit=False, low_precision=False, total=45.0) == 45.0


@settings(max_examples=20, deadline=None)
@given(scope=st.sampled_from(VALID_SCOPES), moe_unit=st.booleans(), fp8=st.booleans(),
       experts=st.integers(1, 64))
def test_a_scope_captures_between_nothing_and_the_whole_layer(
        scope: tuple[str, ...], moe_unit: bool, fp8: bool, experts: int) -> None:
    total = (KERNELS_DENSE_LAYER + (KERNELS_FP8_EXTRA if fp8 else 0.0)
             + ((KERNELS_MOE_EXTRA + 6.0 * experts) if moe_unit else 0.0))
    captured = graphed_kernels(scope, moe_unit=moe_unit, low_precision=fp8, total=total)
    assert 0.0 <= captured <= total + 1e-9


@pytest.mark.parametrize("scope", VALID_SCOPES)
def test_partial_graphs_price_between_eager_and_whole_layer_graphs(scope: tuple[str, ...]) -> None:
    # a moe graph needs padded expert inputs (Megatron-Core: "moe cuda graph is only
    # supported with drop-padding MoE"): all three priced padded then
    padded = ({"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True} if "moe" in scope
              else {})
    eager = _step(CostOptions(**padded))  # type: ignore[arg-type]
    whole = _step(CostOptions(cuda_graphs=True, **padded))  # type: ignore[arg-type]
    partial = _step(CostOptions(cuda_graphs=True, cuda_graph_scope=scope,
                                **padded))  # type: ignore[arg-type]
    assert whole <= partial * (1 + 1e-12) and partial <= eager * (1 + 1e-12)


def test_a_partial_scope_leaves_the_expert_part_issued_by_the_host() -> None:
    """Router + preprocessing graphs (the 25.11/26.02 Qwen3 recipes) hide less host time than
    graphs of the whole layer: the MoE part's permutation and expert GEMMs stay eager."""
    partial = _step(CostOptions(cuda_graphs=True,
                                cuda_graph_scope=("moe_router", "moe_preprocess")))
    assert partial > _step(CostOptions(cuda_graphs=True))


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"cuda_graphs": True, "cuda_graph_scope": ("expert",)}, "unknown scope 'expert'"),
    ({"cuda_graph_scope": ("attn",)}, "cuda_graphs is off"),
    ({"cuda_graphs": True, "cuda_graph_scope": ("moe_preprocess",)}, "must come with moe_router"),
])
def test_bad_scopes_are_named(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        CostOptions(**kwargs)  # type: ignore[arg-type]


def test_recipe_cells_read_as_scopes() -> None:
    assert graph_scope("['attn', 'moe_router', 'moe_preprocess']") == (
        "attn", "moe_router", "moe_preprocess")
    assert graph_scope("full") == () and graph_scope("") == ()
    assert np.isfinite(_step(CostOptions(cuda_graphs=True, cuda_graph_scope=graph_scope(
        "attn moe_router moe_preprocess"))))
