"""Pipeline-stage split: layer counts, layer indices and stage contents."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.stages import (
    stage_contents,
    stage_layer_counts,
    virtual_stage_layer_counts,
)
from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.model.specs import ModelSpec


@st.composite
def splits(draw: st.DrawFn) -> tuple[int, int, int]:
    """(L, pp, vpp) with pp*vpp <= L."""
    layers = draw(st.integers(1, 130))
    pp = draw(st.integers(1, min(layers, 16)))
    vpp = draw(st.integers(1, max(1, min(8, layers // pp))))
    return layers, pp, vpp


@given(splits())
@settings(max_examples=300, deadline=None)
def test_uneven_split_is_balanced_and_complete(case: tuple[int, int, int]) -> None:
    layers, pp, vpp = case
    counts = virtual_stage_layer_counts(layers, pp, vpp, "uneven")
    assert len(counts) == pp * vpp
    assert sum(counts) == layers
    assert max(counts) - min(counts) <= 1
    assert min(counts) >= 1
    # First and last virtual stages hold no more than any interior one.
    interior = counts[1:-1]
    if interior:
        assert counts[-1] <= min(interior)
        assert counts[0] <= min(interior)
    assert sum(stage_layer_counts(layers, pp, vpp, "uneven")) == layers
    if layers % (pp * vpp) == 0:
        assert set(counts) == {layers // (pp * vpp)}


@given(splits())
@settings(max_examples=200, deadline=None)
def test_even_split_requires_divisibility(case: tuple[int, int, int]) -> None:
    layers, pp, vpp = case
    if layers % (pp * vpp):
        with pytest.raises(SpecError, match="R8"):
            stage_layer_counts(layers, pp, vpp, "even")
    else:
        assert stage_layer_counts(layers, pp, vpp, "even") == (layers // pp,) * pp


def test_examples() -> None:
    assert virtual_stage_layer_counts(30, 4, 1) == (7, 8, 8, 7)
    assert virtual_stage_layer_counts(31, 4, 1) == (8, 8, 8, 7)
    assert stage_layer_counts(80, 4, 5, "even") == (20, 20, 20, 20)
    assert stage_layer_counts(61, 8) == (7, 8, 8, 8, 8, 8, 7, 7)
    assert stage_layer_counts(5, 1) == (5,)
    assert stage_layer_counts(5, 2) == (3, 2)


def test_errors_name_the_values() -> None:
    with pytest.raises(SpecError, match=r"pp\*vpp=13 .*num_layers\+2=12"):
        stage_layer_counts(10, 13, 1)
    with pytest.raises(SpecError, match=r"pp\*vpp=16"):
        stage_layer_counts(10, 4, 4)
    with pytest.raises(SpecError, match="split"):
        stage_layer_counts(10, 2, 1, "weird")
    with pytest.raises(SpecError, match="pp"):
        stage_layer_counts(10, 0, 1)


def test_interleaved_layer_indices_follow_virtual_stage_order() -> None:
    model = get_preset("llama3-8b")  # 32 layers
    contents = stage_contents(model, 4, 2, "even")
    # Virtual stage j = chunk*pp + rank holds layers 4j .. 4j+3.
    assert contents[0].chunk_layer_indices == ((0, 1, 2, 3), (16, 17, 18, 19))
    assert contents[3].chunk_layer_indices == ((12, 13, 14, 15), (28, 29, 30, 31))
    all_layers = sorted(i for c in contents for i in c.layer_indices)
    assert all_layers == list(range(32))
    assert [c.chunk_layer_counts for c in contents] == [(4, 4)] * 4


def test_deepseek_dense_layers_land_on_stage_zero_and_mtp_on_last() -> None:
    model = get_preset("deepseek-v3")  # 61 layers, first 3 dense, 1 MTP layer
    contents = stage_contents(model, 8)
    assert contents[0].num_dense_layers == 3
    assert contents[0].num_moe_layers == contents[0].num_layers - 3
    assert all(c.num_dense_layers == 0 for c in contents[1:])
    assert sum(c.num_moe_layers for c in contents) == model.num_moe_layers
    assert [c.has_embedding for c in contents] == [True] + [False] * 7
    assert [c.has_output for c in contents] == [False] * 7 + [True]
    assert [c.num_mtp_layers for c in contents] == [0] * 7 + [1]
    assert contents[-1].mtp_is_moe


def test_single_stage_holds_everything() -> None:
    model = get_preset("mixtral-8x7b")
    (only,) = stage_contents(model, 1)
    assert only.has_embedding and only.has_output
    assert only.is_first and only.is_last
    assert only.num_layers == model.num_layers
    assert only.num_moe_layers == 32


# --- R8 uneven up to pp*vpp = L + 2: the embedding and the loss take a stage each --------


@st.composite
def wide_splits(draw: st.DrawFn) -> tuple[int, int, int]:
    """(L, pp, vpp) with pp*vpp <= L + 2, biased towards the L+1 / L+2 edge."""
    layers = draw(st.integers(1, 130))
    pp = draw(st.integers(1, min(layers + 2, 16)))
    top = (layers + 2) // pp
    vpp = draw(st.one_of(st.just(top), st.integers(1, max(1, min(top, 8)))))
    return layers, pp, vpp


@given(wide_splits())
@settings(max_examples=400, deadline=None)
def test_every_virtual_stage_holds_a_unit_and_layers_are_conserved(
    case: tuple[int, int, int],
) -> None:
    layers, pp, vpp = case
    stages = pp * vpp
    counts = virtual_stage_layer_counts(layers, pp, vpp, "uneven")
    assert len(counts) == stages and sum(counts) == layers
    # Units per virtual stage: layers, plus the embedding on the first, the loss on the last.
    units = list(counts)
    units[0] += 1
    units[-1] += 1
    assert min(units) >= 1
    # Only the first (embedding-only) and last (loss-only) virtual stage may be empty.
    assert all(c >= 1 for c in counts[1:-1])
    assert (counts[0] == 0) == (stages == layers + 2 and stages > 1)
    assert (counts[-1] == 0) == (stages >= layers + 1 and stages > 1)
    assert max(counts) - min(counts) <= 1
    # Per pipeline rank and per chunk, the same layers in model order.
    model = ModelSpec("toy", layers, 64, 128, 4, 4, 16, 1000)
    contents = stage_contents(model, pp, vpp, "uneven")
    flat = sorted(i for c in contents for i in c.layer_indices)
    assert flat == list(range(layers))
    for c in contents:
        for chunk, indices in enumerate(c.chunk_layer_indices):
            assert len(indices) == counts[chunk * pp + c.rank]
            if not indices:  # an empty chunk is the embedding-only or the loss-only stage
                assert (c.rank, chunk) in {(0, 0), (pp - 1, vpp - 1)}
                assert c.has_embedding if (c.rank, chunk) == (0, 0) else c.has_output
    assert [c.has_embedding for c in contents] == [r == 0 for r in range(pp)]
    assert [c.has_output for c in contents] == [r == pp - 1 for r in range(pp)]


@given(wide_splits())
@settings(max_examples=300, deadline=None)
def test_megatron_accounting_where_it_divides(case: tuple[int, int, int]) -> None:
    """--account-for-embedding/loss-in-pipeline-split: L+2 (or L+1) units split evenly."""
    layers, pp, vpp = case
    stages = pp * vpp
    counts = virtual_stage_layer_counts(layers, pp, vpp, "uneven")
    if stages >= 2 and (layers + 2) % stages == 0:
        per = (layers + 2) // stages
        assert counts == (per - 1,) + (per,) * (stages - 2) + (per - 1,)
    elif stages >= 2 and (layers + 1) % stages == 0:
        per = (layers + 1) // stages
        assert counts == (per,) * (stages - 1) + (per - 1,)


def test_llama_405b_pp16_vpp8_gives_embedding_and_loss_a_stage_each() -> None:
    model = get_preset("llama3.1-405b")  # 126 layers
    counts = virtual_stage_layer_counts(model.num_layers, 16, 8, "uneven")
    assert counts == (0,) + (1,) * 126 + (0,)
    contents = stage_contents(model, 16, 8, "uneven")
    assert contents[0].chunk_layer_indices[0] == ()  # virtual stage 0: embedding only
    assert contents[0].chunk_layer_indices[1] == (15,)  # virtual stage 16
    assert contents[-1].chunk_layer_indices[-1] == ()  # virtual stage 127: loss only
    assert [c.num_layers for c in contents] == [7] + [8] * 14 + [7]
    assert virtual_stage_layer_counts(126, 16, 1) == (7,) + (8,) * 14 + (7,)
    with pytest.raises(SpecError, match="R8"):
        virtual_stage_layer_counts(126, 16, 9)


def test_hidden_interleaved_sends_cost_their_sm_share() -> None:
    """Interleaving hides pipeline sends behind compute, but their NCCL kernels slow that
    compute by the profile's comm_sm_share: with a zero share the p2p part is what stays
    exposed; with the profile's share it grows by share x hidden, never shrinks."""
    from dataclasses import replace as _replace

    from parsearch.cost.analytic import build_cost_model, estimate
    from parsearch.layout import Layout
    from parsearch.model.presets import get_preset
    from parsearch.model.specs import TrainingSpec
    from parsearch.topology.cluster import load_cluster
    from parsearch.topology.fabric import build_fabric

    model, training = get_preset("llama3-70b"), TrainingSpec(seq_len=8192, global_batch=512)
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), 256))
    free = _replace(cm, profile=_replace(cm.profile, comm_sm_share=0.0))
    sends = []
    for vpp in (1, 4, 20):
        layout = Layout(num_gpus=256, tp=8, pp=4, vpp=vpp, sp=True, mbs=1)
        charged, uncharged = estimate(cm, layout), estimate(free, layout)
        if vpp == 1:  # 1F1B waits for its sends: nothing hidden, nothing to charge
            assert charged.time_s["pp_p2p"] == uncharged.time_s["pp_p2p"] > 0
        else:
            assert charged.time_s["pp_p2p"] > uncharged.time_s["pp_p2p"]
            sends.append(charged.time_s["pp_p2p"])
    assert sends[1] > sends[0]  # 2 x vpp sends per micro-batch: deeper costs more
