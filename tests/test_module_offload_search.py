"""Fine-grained activation offloading as a searched feature (issue 32), on request
(``--offload-modules auto``; pinned off by default, ``DEFAULT_SEARCHED_FEATURES``): a layout
whose memory forced a slower setting (no fit, a longer recompute-module set, whole layers
offloaded) may take a module set of ``module_offload_chain`` instead, where that fits and is
faster; the rules Megatron-Core enforces hold, the search's memory filter never drops a
layout the choice fits, and the choice is named in explain, the search table and the launch
settings."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.cost.memory_bounds import least_memory_models
from parsearch.cost.memory_features import (
    MEMORY_FEATURES,
    memory_settings,
    numerics_penalty,
    searches_module_offload,
    setting_index,
    setting_of,
    with_setting,
)
from parsearch.cost.options import CostOptions
from parsearch.cost.stacks import get_stack, stack_options
from parsearch.layout.space import LayoutTable, enumerate_layouts
from parsearch.model.offload_modules import (
    EXPERT_OFFLOAD_MODULES,
    module_offload_chain,
    offload_allowed_with,
)
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.scan_checks import assert_bounded_scan_matches_full, peak_memory_total
from tests.strategies import NO_OVERHEAD, SLOW

FULL = RECOMPUTE_CODES["full"]
WITHOUT = tuple(f for f in MEMORY_FEATURES if f != "offload_modules")


@st.composite
def cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A job large enough for module inputs to pass Megatron's 1M-element floor, the memory
    features searched, and a capacity drawn between the least memory any setting reaches
    (every module offloaded) and the most (no feature on), so that the choice matters."""
    model = get_preset(draw(st.sampled_from(["llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b"])))
    gpus = draw(st.sampled_from([8, 16]))
    training = TrainingSpec(
        seq_len=draw(st.sampled_from([4096, 8192])), global_batch=gpus * 4,
        micro_batch_sizes=(1, 2), precision=draw(st.sampled_from(["bf16", "fp8"])),
        recompute_modes=draw(st.sampled_from([("none", "selective"), ("none", "full"),
                                              ("full", "none", "selective")])),
        max_vpp=2)
    table = enumerate_layouts(model, training, gpus)
    assume(len(table) > 0)
    fabric = build_fabric(load_cluster("dgx-h100"), gpus)
    features = draw(st.sampled_from([MEMORY_FEATURES, ("recompute_modules", "offload_modules"),
                                     ("offload_modules",)]))
    options = CostOptions(search_features=features, memory=NO_OVERHEAD, memory_margin=0.0)
    cm = build_cost_model(model, training, fabric, options=options)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    rows = np.sort(rng.choice(len(table), size=min(len(table), 48), replace=False))
    cols = {k: np.asarray(v)[rows] for k, v in table.columns.items()}
    least = np.min([peak_memory_total(m, cols) for m in least_memory_models(cm)], axis=0)
    most = peak_memory_total(cm, cols)
    assume(float(most.max()) > float(least.min()))
    target = float(least.min()) + draw(st.floats(0.0, 1.0)) * float(most.max() - least.min())
    margin = min(max(1.0 - target / fabric.gpu.hbm_bytes, 0.0), 0.999999999)
    return replace(cm, options=replace(cm.options, memory_margin=margin)), cols


def _settings(cm, scores):  # type: ignore[no-untyped-def]
    return [setting_of(cm, int(i)) for i in scores["memory_setting"]]


def _without(cm):  # type: ignore[no-untyped-def]
    return replace(cm, options=replace(cm.options, search_features=tuple(
        f for f in cm.options.search_features if f != "offload_modules")))


def _weighed(cm, scores) -> np.ndarray:  # type: ignore[no-untyped-def]
    step = np.asarray(scores["step_time_s"], dtype=np.float64)
    if "memory_setting" not in scores:
        return step
    return step * np.array([numerics_penalty(s.numerics) for s in _settings(cm, scores)])


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_chosen_modules_obey_megatrons_rules_and_fit(case) -> None:  # type: ignore[no-untyped-def]
    cm, cols = case
    scores = score_columns(cm, cols)
    chain = module_offload_chain(cm.model.moe is not None)
    hbm = float(scores["capacity_bytes"][0])
    for i, setting in enumerate(_settings(cm, scores)):
        if not setting.offload_modules:
            continue
        assert setting.offload_modules in chain
        assert setting.offload_layers == 0  # never beside --cpu-offloading
        assert cols["recompute"][i] != FULL  # full recompute saves no module input
        assert offload_allowed_with(setting.recompute_modules, setting.offload_modules)
        assert not (EXPERT_OFFLOAD_MODULES & set(setting.offload_modules)
                    and "moe" in setting.recompute_modules)
        assert bool(scores["fits"][i])
        row = {k: v[i:i + 1] for k, v in cols.items()}
        assert peak_memory_total(with_setting(cm, setting), row)[0] <= hbm


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_module_offload_only_ever_helps(case) -> None:  # type: ignore[no-untyped-def]
    """Against the same search with module offload not searched: every layout that fitted
    still fits, none is slower under the numerics weighing, and where modules were chosen
    the layout did not fit without them or is now faster."""
    cm, cols = case
    searched, off = score_columns(cm, cols), score_columns(_without(cm), cols)
    fits, fits_off = (np.asarray(s["fits"], dtype=bool) for s in (searched, off))
    assert np.all(fits >= fits_off)
    weighed, weighed_off = _weighed(cm, searched), _weighed(_without(cm), off)
    assert np.all(weighed[fits_off] <= weighed_off[fits_off] * (1 + 1e-12))
    chose = np.array([bool(s.offload_modules) for s in _settings(cm, searched)])
    assert np.all(~fits_off[chose] | (weighed[chose] < weighed_off[chose]))
    # where nothing forced a slower setting, the number is the one without module offload
    plain = fits_off & ~chose
    np.testing.assert_array_equal(np.asarray(searched["step_time_s"])[plain],
                                  np.asarray(off["step_time_s"])[plain])


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_memory_shrinks_and_time_grows_along_the_module_chain(case) -> None:  # type: ignore[no-untyped-def]
    """For a fixed recompute setting, each longer module set holds no more memory and costs
    no less time (the monotonicity the choice relies on)."""
    cm, cols = case
    cols = {k: v[cols["recompute"] != FULL] for k, v in cols.items()}
    assume(len(cols["tp"]) > 0)
    base = memory_settings(cm)[0][0]
    previous_memory = peak_memory_total(with_setting(cm, base), cols)
    previous_time = np.asarray(score_columns(with_setting(cm, base), cols,
                                             with_memory=False)["step_time_s"])
    for modules in module_offload_chain(cm.model.moe is not None):
        priced = with_setting(cm, replace(base, offload_modules=modules))
        memory = peak_memory_total(priced, cols)
        time = np.asarray(score_columns(priced, cols, with_memory=False)["step_time_s"])
        assert np.all(memory <= previous_memory + 1e-6)
        assert np.all(time >= previous_time * (1 - 1e-12))
        previous_memory, previous_time = memory, time


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_the_search_filter_keeps_every_layout_the_choice_fits(case) -> None:  # type: ignore[no-untyped-def]
    cm, cols = case
    scores = score_columns(cm, cols)
    fits = np.asarray(scores["fits"], dtype=bool)
    least = np.min([peak_memory_total(m, cols) for m in least_memory_models(cm)], axis=0)
    assert np.all(least[fits] <= np.asarray(scores["mem_total"])[fits] * (1 + 1e-9) + 1.0)


@settings(max_examples=15, deadline=None, suppress_health_check=SLOW)
@given(cases(), st.integers(1, 5), st.booleans())
def test_bounded_scan_offloads_modules_as_the_full_scan(case, top: int, diverse: bool) -> None:  # type: ignore[no-untyped-def]
    cm, cols = case
    assert_bounded_scan_matches_full(cm, LayoutTable(num_gpus=cm.fabric.num_gpus, columns=cols),
                                     top, diverse)


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
@given(cases(), st.data())
def test_memory_setting_index_names_its_setting(case, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    cm, _ = case
    flat = [s for combo in memory_settings(cm) for s in combo]
    setting = data.draw(st.sampled_from(flat))
    modules = data.draw(st.sampled_from(((), *module_offload_chain(cm.model.moe is not None))))
    layers = 0 if modules else data.draw(st.integers(0, cm.model.num_layers - 1))
    setting = replace(setting, offload_modules=modules, offload_layers=layers)
    assert setting_of(cm, setting_index(cm, setting)) == setting


def test_chain_per_model() -> None:
    assert module_offload_chain(moe=False) == (("core_attn", "attn_proj"),
                                               ("core_attn", "attn_proj", "qkv_linear"))
    chain = module_offload_chain(moe=True)
    assert chain[0] == ("expert_fc1", "moe_act")
    assert all(set(a) < set(b) for a, b in pairwise(chain))
    assert not offload_allowed_with(("core_attn", "moe"), chain[0])
    assert offload_allowed_with(("core_attn", "moe"), ("core_attn", "attn_proj"))


def test_only_stacks_with_fine_grained_offloading_search_it() -> None:
    model, training = get_preset("mixtral-8x7b"), TrainingSpec(seq_len=4096, global_batch=64)
    fabric = build_fabric(load_cluster("dgx-h100"), 8)
    for name, searched in (("mcore-current", True), ("mcore-0.14", False)):
        options = stack_options(get_stack(name), CostOptions(search_features=MEMORY_FEATURES))
        cm = build_cost_model(model, training, fabric, options=options)
        assert searches_module_offload(cm) is searched
    pinned = build_cost_model(model, replace(training, offload_modules=("core_attn",)), fabric,
                              options=CostOptions(search_features=MEMORY_FEATURES))
    assert not searches_module_offload(pinned)


QUESTION = ("--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "256",
            "--global-batch", "2048", "--seq-len", "4096", "--precision", "fp8")


@pytest.fixture(scope="module")
def dsv3_search() -> str:
    result = run_cli("search", *QUESTION, "--top", "3", "--offload-modules", "auto")
    assert result.code == 0, result.err
    return result.out


def test_search_names_the_chosen_modules(dsv3_search: str) -> None:
    """DeepSeek-V3 on 256 H100s: without module offload every layout needs long recompute
    sets; the best now offloads modules instead, and says so."""
    rows = [line for line in dsv3_search.splitlines() if line[:1].isdigit()]
    assert rows and "offload:" in rows[0]


@pytest.mark.parametrize("pin", [(), ("--offload-modules", "none")])
def test_default_and_none_never_offload_modules(dsv3_search: str, pin: tuple[str, ...]) -> None:
    result = run_cli("search", *QUESTION, "--top", "3", *pin)
    assert result.code == 0, result.err
    rows = [line for line in result.out.splitlines() if line[:1].isdigit()]
    assert rows and not any("offload:" in line for line in rows)
    searched = next(r for r in dsv3_search.splitlines() if r[:1].isdigit())
    pinned_best, searched_best = (float(line.split()[11].replace(",", ""))
                                  for line in (rows[0], searched))
    assert searched_best > pinned_best  # the searched modules beat the best without them


def test_explain_and_launch_name_the_chosen_modules() -> None:
    layout = "tp=2,pp=8,vpp=2,ep=16,mbs=2,recompute=selective,sp=true"
    result = run_cli("explain", *QUESTION, "--layout", layout, "--offload-modules", "auto")
    assert result.code == 0, result.err
    assert "fine-grained activation offload (" in result.out
    assert "--offload-modules LIST or none" in result.out


def test_bad_module_list_names_the_choices() -> None:
    result = run_cli("search", *QUESTION, "--offload-modules", "bogus")
    assert result.code == 2
    assert "'bogus'" in result.err and "core_attn" in result.err
    assert "none" in result.err and "auto" in result.err


def test_auto_on_a_stack_without_it_is_refused() -> None:
    result = run_cli("search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "8",
                     "--global-batch", "64", "--seq-len", "4096", "--stack", "mcore-0.15",
                     "--offload-modules", "auto")
    assert_one_line_error(result, "--offload-modules auto", "mcore-0.15", "mcore-current")
