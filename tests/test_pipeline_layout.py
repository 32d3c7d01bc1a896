"""Megatron pipeline layout strings: parsing and their use as a pipeline split."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsearch.cost.stages import (
    _extra_layer_order,
    effective_split,
    loss_stage_layers,
    stage_contents,
    work_balanced_counts,
)
from parsearch.errors import SpecError
from parsearch.launch.plan import launch_plan, priced_features
from parsearch.layout import Layout
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
    assert effective_split(model, training, 8, 4) == "Et|(tt|)*30mL"
    # 8 virtual stages: not the string's; the work-balanced split instead (below)
    assert effective_split(model, training, 8, 1) == "Et*8|(t*8|)*6t*5mL"
    ranks = stage_contents(model, 8, 4, effective_split(model, training, 8, 4))
    assert sum(c.num_layers for c in ranks) == 61
    assert ranks[0].num_layers == 1 + 2 * 3  # virtual stages 0, 8, 16, 24
    assert ranks[-1].num_layers == 2 * 3 and ranks[-1].has_output  # stage 31 holds m and L


def test_a_bad_layout_in_the_training_spec_is_refused() -> None:
    with pytest.raises(SpecError, match="pipeline layout"):
        TrainingSpec(seq_len=4096, global_batch=8, pipeline_layout="t*4|L")


# Layout strings Megatron-Bridge's recipes write by hand (run_setups.csv, recipe_locator):
# DeepSeek-V3 deepseek_workload_base_configs.py (B200/GB200/GB300 16 stages, B300 8, H100
# 32), Kimi-K2 (16 stages, no MTP) and DeepSeek-V3 without MTP (16 stages).
@pytest.mark.parametrize(("preset", "mtp", "pp", "vpp", "expected"), [
    ("deepseek-v3", 1, 16, 1, "Et*4|(t*4|)*14tmL"),
    ("deepseek-v3", 1, 4, 4, "Et*4|(t*4|)*14tmL"),
    ("deepseek-v3", 1, 8, 1, "Et*8|(t*8|)*6t*5mL"),
    ("deepseek-v3", 1, 8, 4, "Et|(tt|)*30mL"),
    ("deepseek-v3", 0, 4, 4, "Et*3|(t*4|)*14ttL"),
    ("kimi-k2", 0, 4, 4, "Et*4|(t*4|)*14tL"),
])
def test_work_balanced_split_is_the_experts_layout(preset: str, mtp: int, pp: int, vpp: int,
                                                   expected: str) -> None:
    model = replace(get_preset(preset), mtp_layers=mtp)
    training = TrainingSpec(seq_len=4096, global_batch=1024)
    split = effective_split(model, training, pp, vpp)
    assert layout_layer_counts(split) == layout_layer_counts(expected)
    assert split.endswith("m" * mtp + "L")


def test_accounted_and_even_splits_stay_megatrons() -> None:
    # 126 layers on 16 stages: (L + 2) divides, Megatron's account_for_* flags run it.
    llama = get_preset("llama3.1-405b")
    training = TrainingSpec(seq_len=8192, global_batch=1024)
    assert effective_split(llama, training, 16, 1) == "uneven"
    assert effective_split(get_preset("llama3-70b"), training, 4, 5) == "uneven"


@given(st.integers(4, 130), st.data(), st.integers(0, 6))
def test_work_balanced_counts_keep_every_layer_and_lighten_the_heaviest(
        layers: int, data: st.DataObject, k: int) -> None:
    stages = data.draw(st.integers(2, layers + 2), label="stages")
    counts = work_balanced_counts(layers, stages, k)
    if not counts:  # no stage can shed its head's work: the last holds under k layers
        assert all((layers + j) // stages < j for j in range(1, k + 1))
        return
    assert len(counts) == stages and sum(counts) == layers and min(counts) >= 0
    assert min(counts[1:-1], default=1) >= 1  # interior stages hold a layer
    # Work per stage, the last carrying k layers' worth of head: never heavier than the
    # plain uneven rule's heaviest stage.
    plain = [layers // stages] * stages
    for j in _extra_layer_order(stages)[: layers % stages]:
        plain[j] += 1
    assert max(*counts[:-1], counts[-1] + k) <= max(*plain[:-1], plain[-1] + k)


def test_the_launch_runs_the_split_it_priced() -> None:
    model = get_preset("deepseek-v3")
    training = TrainingSpec(seq_len=4096, global_batch=4096)
    plan = launch_plan(model, training, Layout(num_gpus=256, tp=1, pp=16, ep=8, mbs=1))
    assert plan.pipeline_layout == "Et*4|(t*4|)*14tmL"
    assert loss_stage_layers(model, 4096) == 3
    # and explain's "priced with" names it, so a reader sees the split behind the number
    assert "pipeline layout Et*4|(t*4|)*14tmL" in priced_features(plan)
