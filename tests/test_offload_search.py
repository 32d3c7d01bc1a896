"""CPU activation offloading as a searched feature (issue 32): unless pinned, each layout
Megatron offloads on (rule R11: pp=1, no recompute) takes the fewest offloaded layers that
make it fit, and none where it fits without; the choice is named in explain, the search
table and the launch settings."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, score_columns, wide_columns
from parsearch.cost.memory import memory_arrays
from parsearch.cost.memory_features import MEMORY_FEATURES, numerics_penalty, setting_of
from parsearch.cost.offload import (
    fewest_fitting_layers,
    max_offload_layers,
    offload_allowed,
    offload_host_bytes,
    offload_saving,
)
from parsearch.cost.options import CostOptions
from parsearch.errors import TopologyError
from parsearch.layout.space import LayoutTable, enumerate_layouts
from parsearch.model.specs import RECOMPUTE_CODES
from parsearch.topology.cluster import load_cluster, topologies_dir
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import run_cli
from tests.scan_checks import assert_bounded_scan_matches_full
from tests.strategies import NO_OVERHEAD, SLOW, small_models, small_trainings

SEARCHED = ("activation_offload_layers",)


def _memory(cm, cols, k: int = 0):  # type: ignore[no-untyped-def]
    """Peak bytes per GPU with ``k`` layers offloaded (pinned in the training spec)."""
    c = wide_columns(cols)
    training = replace(cm.training, activation_offload_layers=k)
    mem = memory_arrays(cm.model, training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"],
                        c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"],
                        cm.options.memory)
    return np.asarray(mem.total, dtype=np.float64).reshape(-1)


@st.composite
def cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A small job with offload searched and a capacity drawn between what its pp=1,
    recompute-none layouts hold with the most layers offloaded and without offload."""
    model = draw(small_models())
    assume(model.num_layers >= 3)
    training = replace(draw(small_trainings()),
                       recompute_modes=draw(st.sampled_from([("none",), ("full", "none"),
                                                             ("none", "selective")])))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    table = enumerate_layouts(model, training, gpus)
    assume(len(table) > 0)
    fabric = build_fabric(load_cluster("dgx-h100"), gpus)
    features = draw(st.sampled_from([SEARCHED, MEMORY_FEATURES]))
    options = CostOptions(search_features=features, memory=NO_OVERHEAD, memory_margin=0.0)
    cm = build_cost_model(model, training, fabric, options=options)
    rows = np.arange(min(len(table), 40))
    cols = {k: np.asarray(v)[rows] for k, v in table.columns.items()}
    allowed = offload_allowed(cols)
    assume(allowed.any())
    sub = {k: v[allowed] for k, v in cols.items()}
    low = float(_memory(cm, sub, max_offload_layers(model)).min())
    high = float(_memory(cm, sub, 0).max())
    assume(high > low)
    target = low + draw(st.floats(0.0, 1.0)) * (high - low)
    margin = min(max(1.0 - target / fabric.gpu.hbm_bytes, 0.0), 0.999999999)
    cm = replace(cm, options=replace(cm.options, memory_margin=margin))
    return cm, cols


def _chosen_layers(cm, scores) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.array([setting_of(cm, int(i)).offload_layers for i in scores["memory_setting"]])


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_searched_offload_obeys_r11_and_is_the_fewest_layers_that_fit(case) -> None:  # type: ignore[no-untyped-def]
    cm, cols = case
    scores = score_columns(cm, cols)
    layers = _chosen_layers(cm, scores)
    hbm = float(scores["capacity_bytes"][0])
    # R11: offload only where Megatron runs it (pp=1, recompute none), at most L-1 layers
    assert np.all((layers == 0) | offload_allowed(cols))
    assert np.all(layers <= max_offload_layers(cm.model))
    for i in np.nonzero(layers)[0]:
        row = {k: v[i:i + 1] for k, v in cols.items()}
        k = int(layers[i])
        assert bool(scores["fits"][i])
        assert _memory(cm, row, k)[0] <= hbm or cm.options.search_features != SEARCHED
        if cm.options.search_features == SEARCHED:  # no other feature could have made it fit
            assert _memory(cm, row, k - 1)[0] > hbm  # the fewest layers that fit
            assert _memory(cm, row, 0)[0] > hbm  # offloaded only because it did not fit


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_a_layout_that_fits_without_offload_is_never_made_slower(case) -> None:  # type: ignore[no-untyped-def]
    """Against the same search with offload pinned off: every layout that fits there under
    the pinned numerics keeps its number; one that needed a numerics-changing feature
    (BF16 moments, FP8 gather) to fit may take offload instead only where that is faster
    under the same weighing (each numerics feature counts as NUMERICS_MIN_GAIN of the step);
    the only other change is layouts that did not fit now fitting."""
    cm, cols = case
    pinned = replace(cm, options=replace(cm.options, search_features=tuple(
        f for f in cm.options.search_features if f not in SEARCHED)))
    searched, off = score_columns(cm, cols), score_columns(pinned, cols)
    fits_off = np.asarray(off["fits"], dtype=bool)
    numerics_off = (np.array([setting_of(pinned, int(i)).numerics for i in off["memory_setting"]])
                    if "memory_setting" in off else np.zeros(len(fits_off), dtype=int))
    plain = fits_off & (numerics_off == 0)
    np.testing.assert_array_equal(np.asarray(searched["step_time_s"])[plain],
                                  np.asarray(off["step_time_s"])[plain])
    assert np.all(_chosen_layers(cm, searched)[plain] == 0)
    assert np.all(np.asarray(searched["fits"], dtype=bool) >= fits_off)
    weighed = [np.asarray(scores["step_time_s"]) * np.array(
        [numerics_penalty(setting_of(model, int(i)).numerics) for i in scores["memory_setting"]])
        if "memory_setting" in scores else np.asarray(scores["step_time_s"])
        for model, scores in ((cm, searched), (pinned, off))]
    assert np.all(weighed[0][fits_off] <= weighed[1][fits_off] * (1 + 1e-12))


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(cases(), st.integers(1, 8))
def test_pinning_the_layers_prices_as_before(case, k: int) -> None:  # type: ignore[no-untyped-def]
    """A pinned count (the training spec's, as ``--activation-offload-layers K`` sets it) is
    priced exactly as without the searched feature: the search leaves it alone."""
    cm, cols = case
    k = min(k, max_offload_layers(cm.model))
    training = replace(cm.training, activation_offload_layers=k)
    with_search = replace(cm, training=training)
    without = replace(with_search, options=replace(cm.options, search_features=tuple(
        f for f in cm.options.search_features if f not in SEARCHED)))
    a, b = score_columns(with_search, cols), score_columns(without, cols)
    for key in ("step_time_s", "mem_total", "time_offload", "fits"):
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_the_solved_count_is_the_memory_models_own(case) -> None:  # type: ignore[no-untyped-def]
    """The count solved from the layer bytes equals a scan of the memory model over K."""
    cm, cols = case
    allowed = offload_allowed(cols)
    sub = {k: v[allowed] for k, v in cols.items()}
    hbm = float(score_columns(cm, sub)["capacity_bytes"][0])
    excess = _memory(cm, sub, 0) - hbm
    solved = fewest_fitting_layers(cm.model, cm.training, cm.options.memory, sub, excess)
    top = max_offload_layers(cm.model)
    per_k = np.stack([_memory(cm, sub, k) for k in range(top + 1)])  # (K, rows)
    fits = per_k <= hbm
    scanned = np.where(fits.any(axis=0), np.argmax(fits, axis=0), cm.model.num_layers)
    need = excess > 0
    np.testing.assert_array_equal(solved[need], scanned[need])
    # and the saving is what the memory model frees, K by K
    saving = offload_saving(cm.model, cm.training, cm.options.memory, sub)
    np.testing.assert_allclose(per_k[0][None, :] - per_k, saving.T, rtol=1e-9, atol=1.0)


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
@given(cases(), st.integers(1, 5), st.booleans())
def test_bounded_scan_offloads_as_the_full_scan(case, top: int, diverse: bool) -> None:  # type: ignore[no-untyped-def]
    """The bounded search (memory-only check where the pinned setting fits, the rest, those
    that fit only offloaded among them, priced at the block's end) finds the layouts, speeds
    and memory of the full scan."""
    cm, cols = case
    table = LayoutTable(num_gpus=cm.fabric.num_gpus, columns=cols)
    assert_bounded_scan_matches_full(cm, table, top, diverse)


def test_offload_is_refused_with_recompute_and_pipelines() -> None:
    cols = {"pp": np.array([1, 1, 2, 1]),
            "recompute": np.array([RECOMPUTE_CODES["none"], RECOMPUTE_CODES["full"],
                                   RECOMPUTE_CODES["none"], RECOMPUTE_CODES["selective"]])}
    assert offload_allowed(cols).tolist() == [True, False, False, False]


# --- Llama 3 70B on 64 GB200 / GB300 (Megatron-Bridge recipes r0067/r0116, r0064/r0115:
# FSDP optim_grads_params, TP1 PP1 MBS2, FP8, 40 / 20 layers offloaded) ---------------------

LLAMA_70B = ["--model", "llama3-70b", "--gpus", "64", "--global-batch", "256",
             "--seq-len", "8192", "--precision", "fp8", "--fsdp"]
#: the numerics and module offload pinned, so that whole-layer offload is the only memory
#: feature that varies (FSDP leaves BF16 moments out; FP8 gather could otherwise stand in for
#: a few offloaded layers, and module offload for all of them)
ONLY_OFFLOAD = ["--no-fp8-param-gather", "--offload-modules", "none"]
RECIPE_LAYOUT = ["--layout", "tp=1,pp=1,mbs=2"]


def _explain(cluster: str, *extra: str) -> dict:  # type: ignore[type-arg]
    out = run_cli("explain", *LLAMA_70B, "--cluster", cluster, *RECIPE_LAYOUT, *ONLY_OFFLOAD,
                  *extra, "--format", "json")
    assert out.code == 0, out.err
    return json.loads(out.out)


def _offloaded(doc: dict) -> int:  # type: ignore[type-arg]
    text = " ".join(doc["priced_features"])
    if "activation offload (" not in text:
        return 0
    return int(text.split("activation offload (")[1].split(" ")[0])


@pytest.fixture(scope="module")
def recipe_questions() -> dict[str, dict]:  # type: ignore[type-arg]
    return {c: _explain(f"{c}-nvl72") for c in ("gb200", "gb300")}


def test_llama70b_recipe_layout_offloads_just_enough_to_fit(recipe_questions) -> None:  # type: ignore[no-untyped-def]
    """The mechanism behind the recipes' offload: without it TP1 PP1 MBS2 does not fit; the
    search offloads the fewest layers that make it fit (one fewer does not fit), names the
    choice, and the larger GB300 needs fewer layers than GB200 (as the recipes: 20 vs 40)."""
    for cluster, doc in recipe_questions.items():
        k = _offloaded(doc)
        assert k > 0, cluster
        assert doc["fits"]
        fewer = _explain(f"{cluster}-nvl72", "--activation-offload-layers", str(k - 1))
        assert not fewer["fits"]
        none = _explain(f"{cluster}-nvl72", "--activation-offload-layers", "0")
        assert not none["fits"]
        assert doc["time_s"]["offload"] > 0.0
        assert "chosen by the search" in " ".join(doc["priced_features"])
    assert _offloaded(recipe_questions["gb300"]) < _offloaded(recipe_questions["gb200"])


def test_pinned_layers_are_priced_as_given(recipe_questions) -> None:  # type: ignore[no-untyped-def]
    doc = recipe_questions["gb200"]
    k = _offloaded(doc)
    pinned = _explain("gb200-nvl72", "--activation-offload-layers", str(k))
    assert pinned["step_time_s"] == doc["step_time_s"]
    assert pinned["memory_gib_per_gpu"] == doc["memory_gib_per_gpu"]
    assert "chosen by the search" not in " ".join(pinned["priced_features"])


def test_search_names_and_launches_the_chosen_offload() -> None:
    out = run_cli("search", *LLAMA_70B, "--cluster", "gb200-nvl72", "--micro-batch-sizes", "2",
                  "--top", "5", "--launch", "--format", "json")
    assert out.code == 0, out.err
    doc = json.loads(out.out)
    offloaded = [e for e in doc["results"]
                 if any("activation offload" in f for f in e["priced_features"])]
    assert offloaded, "the recipe's TP1 PP1 MBS2 layout fits only with offload"
    for e in offloaded:
        assert e["layout"]["pp"] == 1 and e["layout"]["recompute"] == "none"
        args = " ".join(e["launch"]["megatron_lm_args"])
        k = int(args.split("--cpu-offloading-num-layers ")[1].split()[0])
        assert f"activation offload ({k} layers" in " ".join(e["priced_features"])
        assert "--cuda-graph" not in args  # Megatron refuses CUDA graphs with CPU offloading
        bridge = " ".join(e["launch"]["megatron_bridge_overrides"])
        assert "model.cpu_offloading=true" in bridge
        assert f"model.cpu_offloading_num_layers={k}" in bridge


def test_pinned_zero_never_offloads() -> None:
    out = run_cli("search", *LLAMA_70B, "--cluster", "gb200-nvl72", "--micro-batch-sizes", "2",
                  "--top", "5", "--activation-offload-layers", "0", "--format", "json")
    assert out.code == 0, out.err
    for e in json.loads(out.out)["results"]:
        assert not any("activation offload" in f for f in e["priced_features"])


def test_offload_the_host_memory_cannot_hold_is_not_taken(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The searched count must fit the node's host memory (cluster field host_memory_GB,
    shared by the node's GPUs): with GB200's 960 GB per tray the recipe layout offloads;
    with 40 GB per tray (10 GB per GPU) the layers it needs cannot go to the host, so the
    layout is priced without offload and does not fit."""
    text = (Path(topologies_dir()) / "gb200-nvl72.yaml").read_text(encoding="utf-8")
    assert "host_memory_GB: 960" in text
    small = tmp_path / "small-host.cluster.yaml"
    small.write_text(text.replace("host_memory_GB: 960", "host_memory_GB: 40")
                     .replace("name: gb200-nvl72", "name: small-host"), encoding="utf-8")
    doc = _explain(str(small))
    assert _offloaded(doc) == 0 and not doc["fits"]
    assert _offloaded(_explain("gb200-nvl72")) > 0


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(cases())
def test_host_bytes_are_the_saving_plus_the_layer_in_flight(case) -> None:  # type: ignore[no-untyped-def]
    cm, cols = case
    held = offload_host_bytes(cm.model, cm.training, cm.options.memory, cols)
    saving = offload_saving(cm.model, cm.training, cm.options.memory, cols)
    assert held.shape == saving.shape
    assert np.all(held >= saving) and np.all(held[:, 0] == 0.0)
    assert np.all(np.diff(held, axis=1) >= 0.0)  # more layers offloaded, more host memory


def test_a_cluster_file_with_a_bad_host_memory_says_which_field(tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = (Path(topologies_dir()) / "dgx-h100.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.cluster.yaml"
    bad.write_text(text.replace("host_memory_GB: 2048", "host_memory_GB: -5"), encoding="utf-8")
    with pytest.raises(TopologyError, match="host_memory_GB"):
        load_cluster(str(bad))


def test_pinned_offload_beyond_the_host_memory_does_not_fit_and_says_why(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A pinned count is held to the host memory too: 40 layers of the Llama 3 70B recipe
    layout fit GB200's 960 GB per tray, not 40 GB; explain says what they need."""
    text = (Path(topologies_dir()) / "gb200-nvl72.yaml").read_text(encoding="utf-8")
    small = tmp_path / "small-host.cluster.yaml"
    small.write_text(text.replace("host_memory_GB: 960", "host_memory_GB: 40")
                     .replace("name: gb200-nvl72", "name: small-host"), encoding="utf-8")
    roomy = _explain("gb200-nvl72", "--activation-offload-layers", "40")
    tight = _explain(str(small), "--activation-offload-layers", "40")
    assert roomy["fits"] and not any("host memory" in f for f in roomy["flags"])
    assert not tight["fits"]
    assert any("host memory" in f and "small-host" in f for f in tight["flags"])
    # the time and the HBM are the same: only the host cannot hold the copies
    assert tight["step_time_s"] == roomy["step_time_s"]
    assert tight["memory_gib_per_gpu"]["total"] == roomy["memory_gib_per_gpu"]["total"]
