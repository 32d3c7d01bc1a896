"""The enumerator against two oracles: a brute-force grid filter and the spec text."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.errors import NoValidLayoutError, SpecError
from parsearch.layout import Layout
from parsearch.layout.rules import RULES, check_layout, derive_columns, rule_context
from parsearch.layout.space import enumerate_layouts, require_layouts
from parsearch.layout.spec import parse_layout_string
from parsearch.model.specs import RECOMPUTE_MODES, ModelSpec, MoeSpec, TrainingSpec
from tests.strategies import small_models, small_trainings

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def spec_valid(model: ModelSpec, training: TrainingSpec, lay: Layout) -> bool:
    """The layout-space rules restated literally from the spec, as an independent oracle."""
    n = lay.num_gpus
    sizes = (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.vpp, lay.mbs)
    if any(v < 1 for v in sizes):  # R1
        return False
    if n % (lay.tp * lay.cp * lay.pp):  # R2
        return False
    dp = n // (lay.tp * lay.cp * lay.pp)
    if model.moe is not None and n % (lay.etp * lay.ep * lay.pp):  # R3
        return False
    heads, groups = model.num_attention_heads, model.gqa_query_groups
    if heads % lay.tp or (groups % lay.tp and lay.tp % groups):  # R4
        return False
    if model.has_dense_mlp and model.ffn_hidden_size % lay.tp:  # R4
        return False
    if model.moe is None:  # R5
        if lay.ep != 1 or lay.etp != 1:
            return False
    elif model.moe.num_experts % lay.ep or model.moe.expert_ffn_hidden_size % lay.etp:
        return False
    if lay.cp > 1 and training.seq_len % (2 * lay.cp):  # R6
        return False
    if lay.sp and (lay.tp == 1 or (training.seq_len // lay.cp) % lay.tp):  # R7
        return False
    stages = lay.pp * lay.vpp  # R8
    if training.pipeline_split == "even" and model.num_layers % stages:
        return False
    if stages > model.num_layers + 2:  # uneven: embedding and loss may take a stage each
        return False
    if training.global_batch % (lay.mbs * dp):  # R10
        return False
    m = training.global_batch // (lay.mbs * dp)
    if lay.vpp > 1 and (lay.pp == 1 or m % lay.pp):  # R9
        return False
    if lay.mbs not in training.micro_batch_sizes or lay.recompute not in training.recompute_modes:
        return False  # R11
    if training.sequence_parallel == "on" and lay.sp != (lay.tp > 1):
        return False
    if training.sequence_parallel == "off" and lay.sp:
        return False
    return training.max_vpp is None or lay.vpp <= training.max_vpp


def brute_force_keys(model: ModelSpec, training: TrainingSpec, n: int) -> set[str]:
    """Filter the full product grid (every degree 1..n, vpp 1..L) with all rules at once."""
    axes = {
        "tp": range(1, n + 1),
        "pp": range(1, n + 1),
        "cp": range(1, n + 1),
        "ep": range(1, n + 1),
        "etp": range(1, n + 1),
        "vpp": range(1, model.num_layers + 3),
        "mbs": training.micro_batch_sizes,
        "sp": (0, 1),
        "recompute": range(len(RECOMPUTE_MODES)),
    }
    grids = np.meshgrid(*[np.asarray(list(v)) for v in axes.values()], indexing="ij")
    cols = {name: grid.reshape(-1) for name, grid in zip(axes, grids, strict=True)}
    ctx = rule_context(model, training, n)
    cols.update(derive_columns(ctx, cols))
    ok = np.ones(len(cols["tp"]), dtype=bool)
    for rule in RULES:
        ok &= rule.holds(ctx, cols)
    keys = set()
    for i in np.nonzero(ok)[0]:
        lay = Layout(
            num_gpus=n,
            **{a: int(cols[a][i]) for a in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs")},
            sp=bool(cols["sp"][i]),
            recompute=RECOMPUTE_MODES[int(cols["recompute"][i])],
        )
        keys.add(lay.key())
    return keys


@SETTINGS
@given(model=small_models(), training=small_trainings(), n=st.integers(1, 8))
def test_enumeration_equals_brute_force_grid(
    model: ModelSpec, training: TrainingSpec, n: int
) -> None:
    enumerated = [lay.key() for lay in enumerate_layouts(model, training, n)]
    assert len(enumerated) == len(set(enumerated)), "enumeration repeats a layout"
    assert set(enumerated) == brute_force_keys(model, training, n)


@SETTINGS
@given(model=small_models(), training=small_trainings(), n=st.integers(1, 12))
def test_every_enumerated_layout_passes_every_rule(
    model: ModelSpec, training: TrainingSpec, n: int
) -> None:
    for lay in enumerate_layouts(model, training, n):
        assert check_layout(model, training, lay) == []
        assert spec_valid(model, training, lay)
        assert lay.dp * lay.tp * lay.cp * lay.pp == n
        assert lay.edp * lay.ep * lay.etp * lay.pp == n
        assert n % lay.min_gpus == 0


@SETTINGS
@given(
    model=small_models(),
    training=small_trainings(),
    n=st.integers(1, 12),
    degrees=st.tuples(*[st.integers(1, 12)] * 5, st.integers(1, 8), st.integers(1, 4)),
    sp=st.booleans(),
    recompute=st.sampled_from(RECOMPUTE_MODES),
)
def test_scalar_check_agrees_with_spec_text_and_enumeration(
    model: ModelSpec,
    training: TrainingSpec,
    n: int,
    degrees: tuple[int, ...],
    sp: bool,
    recompute: str,
) -> None:
    tp, pp, cp, ep, etp, vpp, mbs = degrees
    lay = Layout(n, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, sp=sp,
                 recompute=recompute)  # type: ignore[arg-type]
    valid = spec_valid(model, training, lay)
    assert (check_layout(model, training, lay) == []) == valid
    keys = {x.key() for x in enumerate_layouts(model, training, n)}
    assert (lay.key() in keys) == valid


@pytest.mark.parametrize(
    ("pp", "tp", "cp", "ep", "etp", "expected"),
    [
        (1, 2, 1, 8, 1, 8),
        (1, 4, 1, 8, 1, 8),
        (1, 2, 2, 8, 1, 8),
        (1, 2, 4, 8, 1, 8),
        (2, 2, 1, 8, 1, 16),
        (1, 2, 1, 4, 2, 8),
        (1, 4, 1, 3, 2, 12),  # lcm(4, 6) = 12 where max would say 6
    ],
)
def test_min_gpus_examples_of_the_spec(
    pp: int, tp: int, cp: int, ep: int, etp: int, expected: int
) -> None:
    lay = Layout(expected, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
    assert lay.min_gpus == expected
    assert lay.min_gpus == pp * math.lcm(tp * cp, ep * etp)


@pytest.mark.parametrize(("n", "dp", "edp"), [(8, 4, 1), (16, 8, 2), (32, 16, 4)])
def test_dp_and_edp_example_of_the_spec(n: int, dp: int, edp: int) -> None:
    lay = Layout(n, tp=2, cp=1, ep=8, etp=1, pp=1)
    assert (lay.dp, lay.edp) == (dp, edp)


def test_lcm_layout_is_enumerated_on_its_minimum_and_not_on_max() -> None:
    model = ModelSpec("m", 4, 128, 512, 4, 4, 32, 1000,
                      moe=MoeSpec(num_experts=6, top_k=2, expert_ffn_hidden_size=64))
    training = TrainingSpec(seq_len=64, global_batch=12, micro_batch_sizes=(1,),
                            recompute_modes=("none",), sequence_parallel="on")
    want = Layout(12, tp=4, ep=3, etp=2, sp=True).key()
    assert want in {x.key() for x in enumerate_layouts(model, training, 12)}
    assert not any(
        x.tp == 4 and x.ep == 3 and x.etp == 2 for x in enumerate_layouts(model, training, 6)
    )


def test_empty_space_names_the_batch_rule() -> None:
    model = ModelSpec("m", 4, 128, 512, 4, 4, 32, 1000)
    training = TrainingSpec(seq_len=64, global_batch=7, micro_batch_sizes=(2,))
    with pytest.raises(NoValidLayoutError, match=r"R10 \(batch-divisibility\).*global_batch=7"):
        require_layouts(model, training, 8)


def test_even_split_prunes_pipeline_sizes_that_do_not_divide_layers() -> None:
    model = ModelSpec("m", 6, 128, 512, 4, 4, 32, 1000)
    training = TrainingSpec(seq_len=64, global_batch=64, pipeline_split="even")
    pps = {x.pp * x.vpp for x in enumerate_layouts(model, training, 8)}
    assert pps <= {1, 2, 3, 6}
    uneven = TrainingSpec(seq_len=64, global_batch=64, pipeline_split="uneven")
    assert 4 in {x.pp for x in enumerate_layouts(model, uneven, 8)}


def test_products_of_small_grid_are_all_considered() -> None:
    """Sanity: on one GPU the only degrees are 1, so the space is the candidate product."""
    model = ModelSpec("m", 2, 128, 512, 4, 4, 32, 1000)
    training = TrainingSpec(seq_len=64, global_batch=4, micro_batch_sizes=(1, 2, 4),
                            recompute_modes=("none", "full"))
    got = {(x.mbs, x.recompute) for x in enumerate_layouts(model, training, 1)}
    assert got == set(itertools.product((1, 2, 4), ("none", "full")))


def test_uneven_split_admits_embedding_and_loss_stages() -> None:
    """R8 uneven: pp*vpp <= L + 2 (the embedding and the loss may take a stage each)."""
    model = ModelSpec("m", 6, 128, 512, 4, 4, 32, 1000)
    training = TrainingSpec(seq_len=64, global_batch=64, micro_batch_sizes=(1,),
                            recompute_modes=("none",), sequence_parallel="off")
    stages = {x.pp * x.vpp for x in enumerate_layouts(model, training, 8)}
    assert max(stages) == 8  # pp=4 x vpp=2, or pp=8: L + 2
    seven = {x.pp for x in enumerate_layouts(model, training, 7)}
    assert seven == {7}  # pp = L + 1 = 7 (the loss alone on the last stage); dp=7 fails R10
    assert check_layout(model, training, Layout(8, pp=4, vpp=2)) == []
    (violation,) = check_layout(model, training, Layout(8, pp=2, vpp=5))
    assert violation.rule == "R8"
    assert "pp*vpp=2*5=10 exceeds num_layers+2=6+2=8" in violation.message
    assert "at most 4 with pp=2" in violation.message
    even = replace(training, pipeline_split="even")
    assert max(x.pp * x.vpp for x in enumerate_layouts(model, even, 8)) == 6


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 4]),
       vpp=st.sampled_from([1, 3]), ep=st.sampled_from([1, 8, 32]), etp=st.sampled_from([1, 2]),
       mbs=st.sampled_from([1, 2]), sp=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_layout_option_reads_the_key_search_prints(tp: int, cp: int, pp: int, vpp: int, ep: int,
                                                   etp: int, mbs: int, sp: bool,
                                                   recompute: str) -> None:
    """``--layout`` takes the key a search table prints as well as key=value pairs."""
    layout = Layout(tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=etp, mbs=mbs, sp=sp,
                    recompute=recompute, num_gpus=1024)
    assert parse_layout_string(layout.key(), num_gpus=1024) == layout
    assert parse_layout_string(f"  {layout.key().upper()} ", num_gpus=1024) == layout


def test_a_malformed_layout_key_names_both_accepted_forms() -> None:
    with pytest.raises(SpecError, match=r"neither key=value pairs .* nor a layout key"):
        parse_layout_string("tp8-pp4-xyz", num_gpus=64)


@SETTINGS
@given(model=small_models(), training=small_trainings(), n=st.integers(1, 12),
       offload=st.integers(1, 3))
def test_cpu_offload_keeps_only_what_megatron_runs_it_with(
    model: ModelSpec, training: TrainingSpec, n: int, offload: int
) -> None:
    # Megatron-Core TransformerConfig: CPU activation offloading refuses pipeline
    # parallelism and activation recomputation; every other layout is unaffected.
    offloaded = replace(training, activation_offload_layers=offload)
    kept = {lay.key() for lay in enumerate_layouts(model, offloaded, n)}
    plain = enumerate_layouts(model, training, n)
    assert kept == {lay.key() for lay in plain if lay.pp == 1 and lay.recompute == "none"}
    for lay in plain:
        if lay.pp > 1 or lay.recompute != "none":
            assert [v.rule for v in check_layout(model, offloaded, lay)] == ["R11"]
