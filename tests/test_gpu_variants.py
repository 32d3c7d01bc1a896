"""GPU variants: power limits and clock locks, memory and NVLink overrides, their presets,
their errors, the CLI options, and the power law against published figures."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.errors import SpecError, TopologyError
from parsearch.layout.space import enumerate_layouts
from parsearch.model.specs import ModelSpec, MoeSpec, TrainingSpec
from parsearch.resources import data_dir
from parsearch.topology.cluster import ClusterSpec, cluster_from_dict, load_cluster
from parsearch.topology.hardware import list_gpu_profiles, load_gpu_profile
from parsearch.topology.power import POWER_CLOCK_EXPONENT, compute_speed
from parsearch.topology.summary import fabric_from_spec
from parsearch.topology.variants import (
    VARIANT_FIELDS,
    apply_variant,
    cluster_variant,
    load_variant_profile,
    parse_variant_spec,
    variant_name,
)
from tests.cli_helpers import assert_one_line_error, run_cli

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DENSE = ModelSpec("dense-toy", 8, 1024, 4096, 16, 4, 64, 32000)
MOE = ModelSpec("moe-toy", 8, 1024, 4096, 16, 4, 64, 32000,
                moe=MoeSpec(num_experts=16, top_k=2, expert_ffn_hidden_size=1024,
                            shared_expert_ffn_hidden_size=1024, first_k_dense=1))
TRAINING = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2))
H100 = load_cluster("dgx-h100")
GPUS = 16
TABLES = {m.name: enumerate_layouts(m, TRAINING, GPUS) for m in (DENSE, MOE)}


def _scores(model: ModelSpec, cluster: ClusterSpec) -> dict[str, np.ndarray]:
    cm = build_cost_model(model, TRAINING, fabric_from_spec(cluster, GPUS))
    return score_columns(cm, TABLES[model.name].columns)


def _varied(**fields: float) -> ClusterSpec:
    return cluster_variant(H100, fields)


# -- the power law -------------------------------------------------------------------------
def test_h100_at_500_w_keeps_0_904_of_its_compute() -> None:
    h100 = load_gpu_profile("h100-sxm")
    assert compute_speed(h100, power_limit_W=500) == pytest.approx((5 / 7) ** 0.30, rel=1e-12)
    assert compute_speed(h100, power_limit_W=500) == pytest.approx(0.904, abs=5e-4)
    assert compute_speed(h100, power_limit_W=700) == 1.0
    assert compute_speed(h100) == 1.0


def test_golden_a100_pcie_300_w_matmul_from_the_sxm_400_w_one() -> None:
    """Out-of-sample check of the law (fitted on H100 datasheet ratings): measured maximum
    achievable BF16 matmul, stas00/ml-engineering compute/accelerator README, A100 SXM
    (400 W) 271.2 and A100 PCIe (300 W) 252.9 TFLOP/s, same GA100 die and boost clock."""
    a100 = load_gpu_profile("a100-sxm-80gb")
    predicted = 271.2 * compute_speed(a100, power_limit_W=300)
    assert predicted == pytest.approx(248.8, abs=0.1)
    assert abs(predicted / 252.9 - 1) < 0.03


def test_golden_h100_nvl_dense_bf16_matches_the_datasheet() -> None:
    """H100 NVL: 1,671 sparse BF16 TFLOP/s (NVIDIA H100 product page, NVL column), 835.5
    dense, at 400 W; the preset prices the SXM die at 400 W (the law's fit point)."""
    nvl = load_gpu_profile("h100-nvl")
    assert nvl.peak_flops["bf16"] / 1e12 == pytest.approx(835.5, rel=0.005)
    assert nvl.hbm_bytes == pytest.approx(93.6 * 2**30)
    assert nvl.hbm_bandwidth_Bps == pytest.approx(3.938e12)
    assert nvl.name == "h100-sxm"  # the Hopper efficiency profile prices it


def test_h800_nvlink_is_400_gb_s_bidirectional_and_a_dgx_h100_override_matches_it() -> None:
    h800 = load_cluster("hgx-h800")
    assert h800.nvlink_bandwidth_Bps == 200e9  # 400 GB/s bidirectional, per direction
    assert load_gpu_profile(h800.gpu).peak_flops == load_gpu_profile("h100-sxm").peak_flops
    like = cluster_variant(H100, nvlink_GBps=200)
    assert like.nvlink_bandwidth_Bps == h800.nvlink_bandwidth_Bps
    assert like.name == "dgx-h100+nvlink200GBps"


@given(low=st.floats(200, 700), high=st.floats(200, 700))
def test_power_law_is_monotone_and_never_above_rated(low: float, high: float) -> None:
    low, high = sorted((low, high))
    h100 = load_gpu_profile("h100-sxm")
    assert compute_speed(h100, power_limit_W=low) <= compute_speed(h100, power_limit_W=high)
    assert compute_speed(h100, power_limit_W=high) <= 1.0


# -- the time model ------------------------------------------------------------------------
def _plain(model: ModelSpec) -> np.ndarray:
    """Layouts with no TP or CP traffic (tp = cp = 1)."""
    cols = TABLES[model.name].columns
    plain = (cols["tp"] == 1) & (cols["cp"] == 1)
    assert plain.sum() > 10
    return plain


def _work(scores: dict[str, np.ndarray]) -> np.ndarray:
    return scores["time_compute"] + scores["time_memory_bound"] + scores["time_overhead"]


@SETTINGS
@given(low=st.floats(200, 700), high=st.floats(200, 700), moe=st.booleans())
def test_lower_power_limit_never_makes_a_step_faster(low: float, high: float,
                                                     moe: bool) -> None:
    """Every layout's GPU work (compute, memory-bound, host-paced overhead) and step are
    never faster at a lower limit."""
    low, high = sorted((low, high))
    model = MOE if moe else DENSE
    slow = _scores(model, _varied(power_limit_W=low))
    fast = _scores(model, _varied(power_limit_W=high))
    assert np.all(_work(slow) >= _work(fast) * (1 - 1e-12))
    assert np.all(slow["step_time_s"] >= fast["step_time_s"] * (1 - 1e-12))


def test_lower_power_limit_never_makes_any_step_faster() -> None:
    """The case that found a cost-model bug: in a host-paced unit a slower GEMM used to hide
    more TP/CP traffic than it added (tp4 cp4 full recompute, 16 H100: 200 W 5% faster
    than 700 W) until the host's wait counted as room for that traffic."""
    slow = _scores(DENSE, _varied(power_limit_W=200))
    fast = _scores(DENSE, H100)
    assert np.all(slow["step_time_s"] >= fast["step_time_s"] * (1 - 1e-12))


def test_power_limit_slows_compute_not_memory_bound_work() -> None:
    """Tensor work slows with the clock; HBM-bound work keeps its speed (a cap throttles
    the SM clock, not the memory clock)."""
    base, capped = _scores(DENSE, H100), _scores(DENSE, _varied(power_limit_W=500))
    assert np.allclose(capped["time_memory_bound"], base["time_memory_bound"])
    speed = compute_speed(load_gpu_profile("h100-sxm"), power_limit_W=500)
    plain = _plain(DENSE)  # no TP/CP traffic whose SM share adds to compute
    assert np.allclose(capped["time_compute"][plain], base["time_compute"][plain] / speed)
    assert np.all(capped["time_compute"] > base["time_compute"])
    assert np.array_equal(capped["fits"], base["fits"])


def test_clock_lock_above_the_sustained_clock_changes_nothing() -> None:
    base = _scores(DENSE, H100)
    assert np.allclose(_scores(DENSE, _varied(sm_clock_MHz=1980))["step_time_s"],
                       base["step_time_s"])
    locked = _scores(DENSE, _varied(sm_clock_MHz=1200))
    plain = _plain(DENSE)
    assert np.all(locked["step_time_s"][plain] > base["step_time_s"][plain])
    assert np.all(locked["time_compute"] > base["time_compute"])


@SETTINGS
@given(small=st.floats(8, 200), big=st.floats(8, 200), moe=st.booleans())
def test_more_memory_never_unfits_a_layout_nor_changes_its_time(small: float, big: float,
                                                                 moe: bool) -> None:
    small, big = sorted((small, big))
    model = MOE if moe else DENSE
    less = _scores(model, _varied(hbm_capacity_GiB=small))
    more = _scores(model, _varied(hbm_capacity_GiB=big))
    assert np.all(more["fits"] >= less["fits"])  # fits(small) implies fits(big)
    assert np.allclose(more["step_time_s"], less["step_time_s"])


def test_memory_override_changes_fit_decisions() -> None:
    fits = {g: int(_scores(MOE, _varied(hbm_capacity_GiB=g))["fits"].sum()) for g in (4, 80)}
    assert fits[4] < fits[80]


@SETTINGS
@given(low=st.floats(0.5, 8.0), high=st.floats(0.5, 8.0))
def test_less_hbm_bandwidth_is_never_faster(low: float, high: float) -> None:
    low, high = sorted((low, high))
    slow = _scores(DENSE, _varied(hbm_bandwidth_TBps=low))
    fast = _scores(DENSE, _varied(hbm_bandwidth_TBps=high))
    assert np.all(slow["step_time_s"] >= fast["step_time_s"] * (1 - 1e-12))


# -- presets, names and files ------------------------------------------------------------
def test_presets_equal_the_fields_they_name() -> None:
    preset = load_cluster("dgx-h100-500w")
    assert preset.gpu == "h100-sxm-500w" and preset.sources
    assert np.allclose(_scores(DENSE, preset)["step_time_s"],
                       _scores(DENSE, _varied(power_limit_W=500))["step_time_s"])
    torchtitan = load_gpu_profile("h100-sxm-94gb-500w")
    assert torchtitan.hbm_bandwidth_Bps == pytest.approx(2.41e12)
    assert torchtitan.hbm_bytes == 94 * 2**30
    assert torchtitan.peak_flops["bf16"] == load_gpu_profile("h100-sxm-500w").peak_flops["bf16"]
    pairs = load_cluster("h100-nvl-pairs")
    assert pairs.nvlink_bandwidth_Bps == 300e9 and pairs.nvlink_domain_size == 2
    teton = load_cluster("grand-teton-h100-94gb-500w")
    assert teton.gpu == "h100-sxm-94gb-500w" and teton.gpus_per_leaf == 16
    assert teton.gpus_per_pod == 3072 and teton.spine_oversubscription == 7.0


def test_variant_names_compose_and_later_fields_win() -> None:
    name = variant_name("h100-nvl", {"power_limit_W": 350.0})
    assert name == "h100-nvl@power_limit_W=350"
    nvl350 = load_variant_profile(name)
    assert nvl350.peak_flops["bf16"] / 1e12 == pytest.approx(
        989.4 * (350 / 700) ** POWER_CLOCK_EXPONENT, rel=1e-6)
    assert nvl350.hbm_bytes == pytest.approx(93.6 * 2**30)  # kept from the file
    # a derived part states the power and clock its peaks are at: the law composes
    again = apply_variant(load_gpu_profile("h100-nvl"), {"power_limit_W": 350.0})
    assert again.peak_flops["bf16"] == pytest.approx(nvl350.peak_flops["bf16"], rel=1e-12)
    assert load_gpu_profile("h100-nvl").tdp_W == 400
    assert parse_variant_spec("power_limit_W=500, hbm_capacity_GiB=94") == {
        "power_limit_W": 500.0, "hbm_capacity_GiB": 94.0}
    assert variant_name("h100-sxm@power_limit_W=500", {"power_limit_W": 600.0}) == (
        "h100-sxm@power_limit_W=600")


def test_cluster_file_fields_vary_the_gpu() -> None:
    data = yaml.safe_load((data_dir("topologies") / "dgx-h100.yaml").read_text())
    spec = cluster_from_dict({**data, "gpu_power_limit_W": 500, "gpu_memory_GiB": 94}, "x.yaml")
    assert spec.gpu == "h100-sxm@power_limit_W=500,hbm_capacity_GiB=94"
    gpu = load_gpu_profile(spec.gpu)
    assert gpu.hbm_bytes == 94 * 2**30 and "500 W" in gpu.variant
    with pytest.raises(TopologyError, match=r"x\.yaml: gpu_power_limit_W = 800 is outside "
                                            r"the allowed range 200 \.\. 700 W"):
        cluster_from_dict({**data, "gpu_power_limit_W": 800}, "x.yaml")
    with pytest.raises(TopologyError, match="gpu_memory_GiB"):
        cluster_from_dict({**data, "gpu_memory_GiB": "lots"}, "x.yaml")


# -- errors --------------------------------------------------------------------------------
@given(field=st.sampled_from(sorted(VARIANT_FIELDS)), sign=st.sampled_from([-1, 1]),
       scale=st.floats(1.5, 1e6))
def test_out_of_range_values_name_field_value_and_range(field: str, sign: int,
                                                        scale: float) -> None:
    low, high = VARIANT_FIELDS[field]
    value = high * scale if sign > 0 else low / scale
    with pytest.raises(SpecError) as error:
        load_variant_profile(variant_name("h100-sxm", {field: value}))
    message = str(error.value)
    assert field in message and "allowed range" in message and f"{value:g}" in message


@pytest.mark.parametrize(("spec", "fragment"), [
    ("power_limit_W=100", "allowed range 200 .. 700 W"),
    ("power_limit_W=701", "allowed range 200 .. 700 W"),
    ("sm_clock_MHz=2000", "allowed range 100 .. 1980 MHz"),
    ("hbm_capacity_GiB=0", "allowed range 1 .. 4096 GiB"),
    ("watts=500", "FIELD=NUMBER"),
    ("power_limit_W=lots", "must be a number"),
])
def test_bad_variant_specs(spec: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment.replace(".", r"\.")):
        load_gpu_profile(f"h100-sxm@{spec}")


def test_a_gpu_without_a_rated_power_refuses_a_power_limit() -> None:
    with pytest.raises(SpecError, match="states no rated power"):
        load_gpu_profile("b200@power_limit_W=700")
    with pytest.raises(SpecError, match=r"allowed range 200 \.\. 400 W"):
        load_gpu_profile("h100-nvl@power_limit_W=500")  # the NVL board's own maximum


def test_variant_file_with_an_unknown_field(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nvariant_of: h100-sxm\nwatts: 500\nsource: me\n")
    with pytest.raises(SpecError, match="unknown field 'watts'"):
        load_gpu_profile(str(path))
    path.write_text("name: mine\nvariant_of: h100-sxm\npower_limit_W: 450\nsource: me\n")
    assert load_gpu_profile(str(path)).peak_flops["bf16"] < load_gpu_profile(
        "h100-sxm-500w").peak_flops["bf16"]


# -- CLI -----------------------------------------------------------------------------------
CLI = ("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
       "--global-batch", "64", "--seq-len", "4096", "--micro-batch-sizes", "1",
       "--recompute", "selective", "--format", "json", "--top", "1")


def _best_tokens_per_s(*extra: str) -> float:
    result = run_cli(*CLI, *extra)
    assert result.code == 0, result.err
    return max(e["tokens_per_s"] for e in json.loads(result.out)["results"])


def test_cli_power_limit_slows_the_search_result() -> None:
    base = _best_tokens_per_s()
    capped = _best_tokens_per_s("--gpu-power-limit", "500")
    assert capped < base * 0.97


@pytest.mark.parametrize(("option", "value", "fragment"), [
    ("--gpu-power-limit", "800", "--gpu-power-limit = 800 is outside the allowed range 200 .. "
                                 "700 W"),
    ("--gpu-memory-gib", "0.5", "--gpu-memory-gib = 0.5 is outside the allowed range 1 .. "
                                "4096 GiB"),
    ("--gpu-sm-clock", "2500", "--gpu-sm-clock = 2500 is outside the allowed range"),
    ("--nvlink-bandwidth", "0", "--nvlink-bandwidth = 0 is outside the allowed range"),
])
def test_cli_out_of_range_options_are_one_line_errors(option: str, value: str,
                                                      fragment: str) -> None:
    assert_one_line_error(run_cli(*CLI, option, value), fragment)


# -- packaging -----------------------------------------------------------------------------
def test_new_data_files_ship_in_the_wheel() -> None:
    """The wheel force-includes the whole cost_models/ and topologies/ folders, so the new
    presets ship with a plain ``pip install .`` (resources.data_dir finds them there)."""
    root = Path(__file__).resolve().parents[1]
    build = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    include = build["targets"]["wheel"]["force-include"]
    assert include["cost_models"] == "parsearch/_data/cost_models"
    assert include["topologies"] == "parsearch/_data/topologies"
    assert {"h100-sxm-500w", "h100-nvl", "h100-sxm-94gb-500w"} <= set(list_gpu_profiles())
    for name in ("dgx-h100-500w", "h100-nvl-pairs", "grand-teton-h100-94gb-500w"):
        assert (data_dir("topologies") / f"{name}.yaml").is_file()


def test_replace_keeps_variant_out_of_the_base_cluster() -> None:
    varied = _varied(power_limit_W=500)
    assert varied.name == "dgx-h100+500W" and H100.gpu == "h100-sxm"
    assert replace(varied, name="x").gpu == "h100-sxm@power_limit_W=500"
