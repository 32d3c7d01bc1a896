"""Pipeline splits of Megatron-Core <= 0.12 (``--pipeline-split first-last``) and the older
stacks' pipeline rules: what the search may propose and how the launch spells it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.stacks import get_stack, stack_training
from parsearch.cost.stages import effective_split, loss_stage_layers, virtual_stage_layer_counts
from parsearch.errors import SpecError
from parsearch.launch.bridge import _pipeline_overrides
from parsearch.launch.megatron_lm import _parallel_args
from parsearch.launch.plan import launch_plan
from parsearch.layout import parse_layout_string
from parsearch.layout.pipeline import layout_layer_counts
from parsearch.layout.rank_split import rank_split
from parsearch.layout.rules import check_layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric


def _megatron_builds(counts: tuple[int, ...], pp: int, vpp: int) -> bool:
    """Megatron-Core 0.11's conditions, read off per-virtual-stage counts: every chunk of a
    rank equal (but an accounted first/last chunk one fewer) and the middle ranks equal."""
    per_rank = [[counts[c * pp + r] for c in range(vpp)] for r in range(pp)]
    first_chunk_short = per_rank[0][0] == per_rank[0][-1] - 1 if vpp > 1 else False
    last_chunk_short = per_rank[-1][-1] == per_rank[-1][0] - 1 if vpp > 1 else False
    for r, chunks in enumerate(per_rank):
        rest = list(chunks)
        if r == 0 and first_chunk_short:
            rest = rest[1:]
        if r == pp - 1 and last_chunk_short:
            rest = rest[:-1]
        if len(set(rest)) > 1:
            return False
    middle = {sum(chunks) for chunks in per_rank[1:-1]}
    return len(middle) <= 1


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 96), pp=st.integers(1, 16), vpp=st.integers(1, 8),
       loss=st.integers(0, 4))
def test_every_split_found_is_one_megatron_012_builds(layers: int, pp: int, vpp: int,
                                                      loss: int) -> None:
    found = rank_split(layers, pp, vpp, loss)
    if found is None:
        # nothing divides: in particular not the plain split
        assert (pp == 1 and vpp > 1) or layers % (pp * vpp) != 0
        return
    counts = found.virtual_stage_counts(pp, vpp)
    assert len(counts) == pp * vpp and sum(counts) == layers and min(counts) >= 0
    assert _megatron_builds(counts, pp, vpp)
    if not found.accounted:  # --decoder-first/last-pipeline-num-layers divide by vpp
        assert found.first % vpp == 0 and found.last % vpp == 0 and found.middle % vpp == 0


@settings(max_examples=100, deadline=None)
@given(layers=st.integers(1, 96), pp=st.integers(2, 16), vpp=st.integers(1, 8))
def test_the_plain_split_wins_where_it_divides_and_nothing_weighs_the_last_rank(
        layers: int, pp: int, vpp: int) -> None:
    found = rank_split(layers, pp, vpp, 0)
    if layers % (pp * vpp) == 0:
        assert found is not None
        assert (found.first, found.middle, found.last) == (layers // pp,) * 3
        assert not found.accounted


def test_interleaving_that_no_rank_count_divides_is_refused() -> None:
    """Qwen2-57B's 28 layers on pp 2 with vpp 9: 14 a rank, and no first/last pair of
    multiples of 9 makes 28; the layout rules refuse it under first-last, not uneven."""
    model = get_preset("qwen2-57b-a14b")
    layout = parse_layout_string("tp=2,pp=2,vpp=9,ep=8,sp=true", 512)
    legacy = TrainingSpec(seq_len=4096, global_batch=1024, pipeline_split="first-last")
    rules = [v.rule for v in check_layout(model, legacy, layout)]
    assert "R8" in rules
    current = TrainingSpec(seq_len=4096, global_batch=1024)
    assert "R8" not in [v.rule for v in check_layout(model, current, layout)]
    with pytest.raises(SpecError, match=r"Megatron-Core <= 0\.12"):
        virtual_stage_layer_counts(28, 2, 9, "first-last")


def test_the_priced_split_is_the_launched_one() -> None:
    """Mixtral 8x22B (56 layers) on pp 4 with vpp 8: 14 a rank does not divide by 8, so
    Megatron-Core 0.11 runs 8 + 16 + 16 + 16 (the first rank lighter: the last one runs
    the head); the cost model prices those counts and the launch names them with
    Megatron-Core 0.11's flags, not a layout string it does not have."""
    model = get_preset("mixtral-8x22b")
    training = TrainingSpec(seq_len=32768, global_batch=512, pipeline_split="first-last")
    layout = parse_layout_string("tp=4,cp=4,pp=4,vpp=8,ep=8,sp=true", 256)
    priced = layout_layer_counts(effective_split(model, training, 4, 8))
    found = rank_split(56, 4, 8, loss_stage_layers(model, training.seq_len))
    assert found is not None and priced == found.virtual_stage_counts(4, 8)
    assert [sum(priced[c * 4 + r] for c in range(8)) for r in range(4)] == [8, 16, 16, 16]
    plan = launch_plan(model, training, layout)
    args = _parallel_args(plan)
    assert "--pipeline-model-parallel-layout" not in args
    for flag, value in (("--decoder-first-pipeline-num-layers", "8"),
                        ("--decoder-last-pipeline-num-layers", "16"),
                        ("--num-virtual-stages-per-pipeline-rank", "8")):
        assert args[args.index(flag) + 1] == value
    bridge = _pipeline_overrides(plan)
    assert bridge["model.num_layers_in_first_pipeline_stage"] == 8
    assert bridge["model.num_layers_in_last_pipeline_stage"] == 16
    assert bridge["model.pipeline_model_parallel_layout"] is None


def test_accounting_the_loss_is_launched_as_its_flag() -> None:
    """31 layers on pp 4: (31 + 1) / 4 = 8 with the loss counted as a layer."""
    found = rank_split(31, 4, 1)
    assert found is not None and found.account_loss and not found.account_embedding
    assert found.virtual_stage_counts(4, 1) == (8, 8, 8, 7)


def test_the_stacks_bound_the_split_and_the_interleaving() -> None:
    base = TrainingSpec(seq_len=4096, global_batch=512)
    assert stack_training(get_stack("mcore-0.11"), base).pipeline_split == "first-last"
    assert stack_training(get_stack("mcore-current"), base).pipeline_split == "uneven"
    old = stack_training(get_stack("megatron-lm-2021"), base)
    assert old.pipeline_split == "even" and old.min_interleaved_pp == 3
    # a stricter split the user asked for is kept; a looser one is refused by name
    even = TrainingSpec(seq_len=4096, global_batch=512, pipeline_split="even")
    assert stack_training(get_stack("mcore-0.11"), even).pipeline_split == "even"
    with pytest.raises(SpecError, match="--pipeline-split first-last"):
        stack_training(get_stack("mcore-0.11"), base,
                       explicit=frozenset({"pipeline_split"}))
    layout_string = TrainingSpec(seq_len=4096, global_batch=512,
                                 pipeline_layout="Et*8|(t*8|)*2t*8L")
    with pytest.raises(SpecError, match="pipeline layout strings"):
        stack_training(get_stack("mcore-0.12"), layout_string)


def test_interleaving_at_pp_2_is_refused_on_the_2021_stack() -> None:
    model = get_preset("gpt3-175b")
    training = stack_training(get_stack("megatron-lm-2021"),
                              TrainingSpec(seq_len=2048, global_batch=64))
    violations = check_layout(model, training, parse_layout_string("tp=8,pp=2,vpp=2", 64))
    assert any(v.rule == "R9" and "pp >= 3" in str(v) for v in violations)
    assert not [v for v in check_layout(model, training,
                                        parse_layout_string("tp=8,pp=4,vpp=2", 64))
                if v.rule == "R9"]


def test_before_folding_the_expert_ranks_are_data_parallel_ranks() -> None:
    """Megatron-Core 0.9 builds EP groups from DP ranks, ``tp * cp`` ranks apart: Grok-1's
    tp2 cp4 ep4 keeps its all-to-all inside a node with folding and spreads it over four
    nodes without; and an ep that does not divide dp is refused (R12)."""
    model = get_preset("grok-1")
    layout = parse_layout_string("tp=2,cp=4,pp=8,vpp=8,ep=4,etp=2,sp=true", 512)
    times = {}
    for follow in (False, True):
        training = TrainingSpec(seq_len=8192, global_batch=1024, experts_follow_tp=follow)
        cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), 512))
        times[follow] = estimate(cm, layout).time_s["ep_comm"]
    assert times[True] > 2.0 * times[False] > 0.0
    pre_folding = TrainingSpec(seq_len=8192, global_batch=1024, experts_follow_tp=True)
    bad = parse_layout_string("tp=4,cp=2,pp=8,ep=8,etp=4,sp=true", 256)  # dp 4, ep 8
    assert any(v.rule == "R12" and "does not divide dp" in str(v)
               for v in check_layout(model, pre_folding, bad))


@pytest.mark.parametrize("preset", ["qwen2-57b-a14b", "mixtral-8x22b", "llama3-70b"])
def test_every_layout_a_first_last_search_offers_is_one_it_can_price(preset: str) -> None:
    """The layout space under ``first-last`` holds only ``(pp, vpp)`` pairs whose split
    Megatron-Core 0.11 builds, and the priced split of each has every layer once."""
    from parsearch.layout.space import enumerate_layouts

    model = get_preset(preset)
    training = stack_training(get_stack("mcore-0.11"),
                              TrainingSpec(seq_len=4096, global_batch=1024))
    table = enumerate_layouts(model, training, 256)
    pairs = {(int(p), int(v)) for p, v in zip(table.columns["pp"], table.columns["vpp"],
                                              strict=True)}
    assert any(v > 1 for _, v in pairs)
    for pp, vpp in pairs:
        assert rank_split(model.num_layers, pp, vpp) is not None, (pp, vpp)
        split = effective_split(model, training, pp, vpp)
        counts = (virtual_stage_layer_counts(model.num_layers, pp, vpp, split)
                  if split in ("even", "first-last") else layout_layer_counts(split))
        assert len(counts) == pp * vpp and sum(counts) == model.num_layers
