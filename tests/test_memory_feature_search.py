"""Memory-saving features as searched axes (issue 32): recompute module sets along a nested
chain, BF16 Adam moments and FP8 parameter gather, chosen per layout as the fastest runnable
setting that fits; preconditions as Megatron enforces them; pinned flags honoured; the
numerics-changing ones named where chosen."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.cost.memory_features import (
    MEMORY_FEATURES,
    NUMERICS_MIN_GAIN,
    effective_training,
    memory_settings,
    optimizer_step_bytes,
    recompute_chain,
    setting_of,
    with_setting,
)
from parsearch.cost.options import CostOptions
from parsearch.launch.megatron_lm import megatron_lm_args
from parsearch.launch.plan import launch_plan, priced_features
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import run_cli
from tests.scan_checks import assert_bounded_scan_matches_full, peak_memory_total
from tests.strategies import NO_OVERHEAD, SLOW, small_models, small_trainings


def _columns(table, rows):  # type: ignore[no-untyped-def]
    return {k: np.asarray(v)[rows] for k, v in table.columns.items()}


@st.composite
def cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A small job with the memory features searched and a capacity drawn between what its
    layouts hold under the least- and the most-memory settings (so the choice matters)."""
    model = draw(small_models())
    training = draw(small_trainings())
    training = replace(training, precision=draw(st.sampled_from(["bf16", "fp8"])),
                       distributed_optimizer=draw(st.booleans()))
    cluster = load_cluster("dgx-h100")
    gpus = draw(st.sampled_from([2, 4, 8]))
    table = enumerate_layouts(model, training, gpus)
    assume(len(table) > 0)
    fabric = build_fabric(cluster, gpus)
    options = CostOptions(search_features=MEMORY_FEATURES, memory=NO_OVERHEAD,
                          memory_margin=0.0)
    cm = build_cost_model(model, training, fabric, options=options)
    rows = np.arange(min(len(table), 40))
    cols = _columns(table, rows)
    flat = [s for combo in memory_settings(cm) for s in combo]
    per_setting = np.stack([peak_memory_total(with_setting(cm, s), cols) for s in flat])
    low, high = float(per_setting.min()), float(per_setting.max())
    target = low + draw(st.floats(0.0, 1.0)) * (high - low)
    hbm = fabric.gpu.hbm_bytes
    margin = min(max(1.0 - target / hbm, 0.0), 0.999999999)
    cm = replace(cm, options=replace(cm.options, memory_margin=margin))
    return cm, cols, table


def _priced(cm, setting, cols):  # type: ignore[no-untyped-def]
    return score_columns(with_setting(cm, setting), cols)


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_memory_never_grows_and_time_never_shrinks_along_the_chain(case) -> None:  # type: ignore[no-untyped-def]
    """Each set of the chain holds the previous one: its selective layouts hold at most the
    activations and re-run at least the work, so the first set that fits is the fastest."""
    cm, cols, _ = case
    selective = np.asarray(cols["recompute"]) == RECOMPUTE_CODES["selective"]
    assume(selective.any())
    cols = {k: v[selective] for k, v in cols.items()}
    for combo in memory_settings(cm):
        memory = [peak_memory_total(with_setting(cm, s), cols) for s in combo]
        steps = [np.asarray(_priced(cm, s, cols)["step_time_s"]) for s in combo]
        for a, b in pairwise(memory):
            assert np.all(b <= a * (1 + 1e-12) + 1e-6)
        for a, b in pairwise(steps):
            assert np.all(b >= a * (1 - 1e-12))


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_the_chosen_setting_is_never_beaten_by_a_fitting_one(case) -> None:  # type: ignore[no-untyped-def]
    """Against every setting Megatron runs (each numerics combination at every chain set):
    the choice fits where any fits, and no fitting setting is faster (a setting with more
    numerics-changing features only by less than NUMERICS_MIN_GAIN)."""
    cm, cols, _ = case
    chosen = score_columns(cm, cols)
    picked = [setting_of(cm, int(i)) for i in chosen["memory_setting"]]
    for combo in memory_settings(cm):
        for setting in combo:
            other = _priced(cm, setting, cols)
            fits = np.asarray(other["fits"], dtype=bool)
            assert np.all(~fits | np.asarray(chosen["fits"], dtype=bool))
            for i in np.nonzero(fits)[0]:
                slack = (1.0 / (1.0 - NUMERICS_MIN_GAIN)
                         if setting.numerics > picked[i].numerics else 1.0)
                assert chosen["step_time_s"][i] <= other["step_time_s"][i] * slack * (1 + 1e-9)


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_preconditions_are_never_violated(case) -> None:  # type: ignore[no-untyped-def]
    """BF16 moments only with Adam and the distributed optimizer (Megatron-Core
    optimizer/__init__.py at d98e8a64); FP8 gather only in FP8/FP4 with the distributed
    optimizer (arguments.py); recompute modules only where the model has them."""
    cm, cols, _ = case
    chosen = score_columns(cm, cols)
    model, training = cm.model, cm.training
    for i in np.asarray(chosen["memory_setting"]):
        setting = setting_of(cm, int(i))
        if setting.bf16_moments:
            assert training.distributed_optimizer and training.optimizer == "adam"
            assert not training.fsdp
        if setting.fp8_param_gather:
            assert training.precision != "bf16" and training.distributed_optimizer
        mods = set(setting.recompute_modules)
        if model.mla is None:
            assert "mla_up_proj" not in mods
        if model.moe is None:
            assert not mods & {"moe_act", "moe", "shared_experts"}


@settings(max_examples=20, deadline=None, suppress_health_check=SLOW)
@given(cases(), st.sets(st.sampled_from(MEMORY_FEATURES)))
def test_pinned_features_stay_as_given(case, pinned) -> None:  # type: ignore[no-untyped-def]
    """A feature left out of the search keeps its given value in every chosen setting."""
    cm, cols, _ = case
    options = replace(cm.options, search_features=tuple(f for f in MEMORY_FEATURES
                                                        if f not in pinned))
    cm = replace(cm, options=options)
    scores = score_columns(cm, cols)
    if not set(options.search_features):
        assert "memory_setting" not in scores
        return
    for i in np.asarray(scores["memory_setting"]):
        setting = setting_of(cm, int(i))
        if "bf16_moments" in pinned:
            assert not setting.bf16_moments
        if "fp8_param_gather" in pinned:
            assert not setting.fp8_param_gather
        if "recompute_modules" in pinned:
            assert setting.recompute_modules == cm.training.recompute_modules


def test_chain_per_model() -> None:
    """Links the model lacks are left out; MLA and shared experts add theirs."""
    t = TrainingSpec(seq_len=4096, global_batch=64)
    dsv3 = recompute_chain(get_preset("deepseek-v3"), t, CostOptions())
    assert dsv3[0] == ("core_attn",)
    assert dsv3[-1] == ("core_attn", "moe_act", "layernorm", "mla_up_proj", "shared_experts",
                        "mlp", "moe")
    llama = recompute_chain(get_preset("llama3-8b"), t, CostOptions())
    assert all(not set(s) & {"moe_act", "mla_up_proj", "shared_experts", "moe"} for s in llama)
    # Megatron refuses moe_act and layernorm recompute under FP8 delayed scaling
    delayed = recompute_chain(get_preset("deepseek-v3"), replace(t, precision="fp8"),
                              CostOptions(fp8_recipe="delayed"))
    assert all(not set(s) & {"moe_act", "layernorm"} for s in delayed)


def test_bf16_moments_save_a_third_of_the_optimizer_state_and_step_bytes() -> None:
    t = TrainingSpec(seq_len=4096, global_batch=64)
    bf16 = effective_training(t, CostOptions(bf16_moments=True))
    assert bf16.optimizer_bytes == 8.0
    assert optimizer_step_bytes(t) == 30.0 and optimizer_step_bytes(bf16) == 22.0


@pytest.fixture(scope="module")
def tight_fp8_search() -> str:
    result = run_cli("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus",
                     "16", "--global-batch", "512", "--seq-len", "8192", "--precision", "fp8",
                     "--top", "2", "--format", "json")
    assert result.code == 0, result.err
    return result.out


def test_numerics_features_named_where_chosen(tight_fp8_search: str) -> None:
    """Llama 3 70B on 16 H100 in FP8 fits only with BF16 moments and FP8 gather: the JSON
    names them, and the launch carries Megatron's own arguments."""
    import json

    doc = json.loads(tight_fp8_search)
    first = doc["entries"][0] if "entries" in doc else doc["results"][0]
    features = " ".join(first["priced_features"])
    assert "BF16 Adam moments" in features and "FP8 parameter gather" in features
    # each said to be chosen, not given
    assert "BF16 Adam moments (precision-aware optimizer) (chosen by the search" in features
    assert "FP8 parameter gather (chosen by the search" in features
    args = " ".join(first["launch"]["megatron_lm_args"]) if isinstance(
        first["launch"]["megatron_lm_args"], list) else first["launch"]["megatron_lm_args"]
    for flag in ("--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                 "--exp-avg-sq-dtype bf16", "--fp8-param-gather"):
        assert flag in args


def test_pinned_off_numerics_are_never_chosen() -> None:
    result = run_cli("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus",
                     "32", "--global-batch", "512", "--seq-len", "8192", "--precision", "fp8",
                     "--top", "3", "--no-bf16-moments", "--no-fp8-param-gather")
    assert result.code in (0, 1), result.err
    assert "bf16-moments" not in result.out.split("features:")[0]
    assert "fp8-gather" not in result.out.split("features:")[0]


def test_launch_plan_applies_the_chosen_setting() -> None:
    model = get_preset("deepseek-v3")
    training = TrainingSpec(seq_len=4096, global_batch=1024, precision="fp8")
    from parsearch.layout import parse_layout_string

    layout = parse_layout_string("tp=2,pp=8,ep=32,recompute=selective", num_gpus=256)
    options = CostOptions(bf16_moments=True, recompute_modules=("core_attn", "moe_act"))
    options = replace(options, param_gather_bytes=1.0,
                      memory=replace(options.memory, fp8_param_gather=True))
    plan = launch_plan(model, training, layout, options)
    assert plan.moment_dtype == "bf16" and plan.fp8_param_gather
    assert plan.recompute_modules == ("core_attn", "moe_act")
    args = megatron_lm_args(model, plan)
    text = " ".join(args)
    assert "--recompute-modules core_attn moe_act" in text
    assert any("BF16 Adam moments" in f for f in priced_features(plan))


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
@given(cases(), st.integers(1, 5), st.booleans())
def test_bounded_scan_chooses_as_the_full_scan(case, top: int, diverse: bool) -> None:  # type: ignore[no-untyped-def]
    """The bounded search (memory-only check where the pinned setting fits, the rest priced
    at the block's end) finds the layouts, speeds and memory of the full scan."""
    cm, _, table = case
    assert_bounded_scan_matches_full(cm, table, top, diverse)


def test_a_setting_is_priced_once_per_cost_model_and_never_leaks_into_another() -> None:
    model = get_preset("deepseek-v3")
    training = TrainingSpec(seq_len=4096, global_batch=1024)
    fabric = build_fabric(load_cluster("dgx-h100"), 256)
    cm = build_cost_model(model, training, fabric,
                          options=CostOptions(search_features=MEMORY_FEATURES))
    setting = memory_settings(cm)[-1][-1]
    priced = with_setting(cm, setting)
    assert with_setting(cm, setting) is priced  # kept on cm, not rebuilt
    assert priced.options.recompute_modules == setting.recompute_modules
    # A cost model derived by replace() (other options) starts with nothing priced: what
    # was priced for cm is not answered for it, as an id()-keyed cache could after reuse.
    other = replace(cm, options=replace(cm.options, moe_a2a_overlap=True))
    assert other.derived == {} and other == replace(other)
    again = with_setting(other, setting)
    assert again is not priced and again.options.moe_a2a_overlap
