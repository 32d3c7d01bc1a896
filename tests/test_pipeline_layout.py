"""Megatron pipeline layout strings: parsing and their use as a pipeline split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsearch.cost.stages import effective_split, stage_contents
from parsearch.errors import SpecError
from parsearch.model.pipeline_layout import layout_layer_counts, parse_pipeline_layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec


def test_deepseek_recipe_layout_hand_count() -> None:
    # Megatron-Bridge DeepSeek-V3 H100 recipe: embedding + 1 layer, 30 stages of 2 layers,
    # then MTP + loss alone: 32 virtual stages, 61 layers.
    counts = layout_layer_counts("Et|(tt|)*30mL")
    assert len(counts) == 32 and sum(counts) == 61
    assert counts[0] == 1 and counts[-1] == 0 and set(counts[1:-1]) == {2}


@pytest.mark.parametrize("text", ["t*4L", "Et*4", "Et|(t|*2L", "Et|x|L", "Et||tL", "EEt|L"])
def test_malformed_layouts_are_clear_errors(text: str) -> None:
    with pytest.raises(SpecError, match="pipeline layout"):
        parse_pipeline_layout(text)


@given(st.integers(0, 6), st.lists(st.integers(1, 6), max_size=10), st.integers(0, 6))
def test_layer_counts_round_trip(first: int, middle: list[int], last: int) -> None:
    counts = [first, *middle, last]  # interior stages hold at least one layer
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    assert layout_layer_counts("|".join(stages)) == tuple(counts)


def test_layout_is_used_only_for_its_own_stage_count() -> None:
    model = get_preset("deepseek-v3")
    training = TrainingSpec(seq_len=4096, global_batch=1024, pipeline_layout="Et|(tt|)*30mL")
    assert effective_split(training, 8, 4) == "Et|(tt|)*30mL"
    assert effective_split(training, 8, 1) == "uneven"
    ranks = stage_contents(model, 8, 4, effective_split(training, 8, 4))
    assert sum(c.num_layers for c in ranks) == 61
    assert ranks[0].num_layers == 1 + 2 * 3  # virtual stages 0, 8, 16, 24
    assert ranks[-1].num_layers == 2 * 3 and ranks[-1].has_output  # stage 31 holds m and L


def test_a_bad_layout_in_the_training_spec_is_refused() -> None:
    with pytest.raises(SpecError, match="pipeline layout"):
        TrainingSpec(seq_len=4096, global_batch=8, pipeline_layout="t*4|L")
