"""Calibrating to the user's own cluster: measurements in, a profile out, a plan for more.

Measurements are synthesised from a "true" profile that differs from the
shipped one (its values inside the cited ranges), so the tests can check that
calibration moves toward the truth and that predictions of runs it has not
seen improve.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate, layout_columns
from parsearch.cost.efficiency import efficiency_for_gpu, load_efficiency_profile
from parsearch.cost.options import CostOptions
from parsearch.layout import parse_layout_string
from parsearch.layout.space import require_layouts
from parsearch.model.files import resolve_model
from parsearch.model.specs import TrainingSpec
from parsearch.search.exhaustive import rank_feasible, scan_table
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.fit.calibration import predict
from parsearch.validation.fit.joint_fit import FactorFit
from parsearch.validation.fit.network_calibration import (
    MIN_NETWORK_SENSITIVITY,
    NETWORK_FACTOR,
    NVLINK_FACTOR,
    SPINE_FACTOR,
    corrected_cluster,
    corrected_cluster_yaml,
    network_priors,
)
from parsearch.validation.planning.plan_profiling import (
    TARGET_SHAPES,
    fit_error,
    gradients,
    plan_profiling,
)
from parsearch.validation.user.measurements import Defaults, Measurement, load_measurements
from parsearch.validation.user.user_calibration import (
    calibrate_user,
    factor_limit,
    prepare_measurements,
    threshold,
)
from tests.cli_helpers import run_cli

LOGS = Path(__file__).parent / "fixtures" / "megatron_logs"
MODEL, CLUSTER, GPUS, BATCH, SEQ = "llama3-8b", "dgx-h100", 16, 128, 8192
LAYOUTS = ("tp=1,pp=1,mbs=1,recompute=selective", "tp=2,pp=1,sp=true,mbs=1",
           "tp=1,pp=2,mbs=1", "tp=4,pp=1,sp=true,mbs=1")
TRUE_GEMM = 0.78  # well away from the shipped Hopper value (0.65); cited range 0.60..0.81


def _truth():
    return efficiency_for_gpu("h100-sxm").with_values({"gemm_efficiency.bf16": TRUE_GEMM})


def _measured(layout_text: str, profile, gpus: int = GPUS, cluster=None,
              options: dict | None = None) -> Measurement:
    """A run "measured" on ``cluster`` (default: the cluster file itself) under ``profile``
    with the cost ``options`` it states; it names the nominal cluster file, as a user's run
    would."""
    layout = parse_layout_string(layout_text, num_gpus=gpus)
    training = TrainingSpec(seq_len=SEQ, global_batch=BATCH, micro_batch_sizes=(layout.mbs,),
                            recompute_modes=(layout.recompute,),
                            sequence_parallel="on" if layout.sp or layout.tp == 1 else "off")
    cm = build_cost_model(resolve_model(MODEL), training,
                          build_fabric(cluster or load_cluster(CLUSTER), gpus), profile=profile,
                          options=CostOptions(**(options or {})))
    return Measurement(layout_text, MODEL, CLUSTER, layout, BATCH, SEQ, "bf16",
                       estimate(cm, layout).tokens_per_s_per_gpu, options=dict(options or {}))


@pytest.fixture(scope="module")
def measurements() -> list[Measurement]:
    truth = _truth()
    return [_measured(text, truth) for text in LAYOUTS]


@pytest.fixture(scope="module")
def result(measurements):
    rows, problems = prepare_measurements(measurements)
    assert problems == []
    return calibrate_user(rows)


def test_calibration_recovers_the_true_factor_and_beats_the_shipped_profile(result) -> None:
    assert "gemm_efficiency.bf16" in result.fitted
    shipped = result.base.get("gemm_efficiency.bf16")
    fitted = result.profile.get("gemm_efficiency.bf16")
    assert abs(fitted - TRUE_GEMM) < abs(shipped - TRUE_GEMM) / 3
    assert result.mape_after < result.mape_before / 2
    assert all(math.isfinite(r.leave_one_out) for r in result.rows)


def test_fp8_gemms_move_with_the_fitted_bf16_factor(result) -> None:
    """As in the published-run calibration (parsearch.validation.fit.factor_ties): BF16 runs
    that move the GEMM factor move FP8's efficiency by the measured large-matmul ratio,
    so an FP8 prediction of the calibrated cluster does not keep the shipped value."""
    from parsearch.validation.fit.factor_ties import factor_ties

    _, ratio = factor_ties(result.base)["gemm_efficiency.fp8"]
    gemm = result.profile.gemm_efficiency
    assert gemm["fp8"] == pytest.approx(ratio * gemm["bf16"])
    assert gemm["fp8"] != pytest.approx(result.base.gemm_efficiency["fp8"])


def test_written_profile_keeps_the_cited_priors_and_stays_in_range(result) -> None:
    assert result.profile.priors == result.base.priors
    assert result.profile.out_of_range() == []
    assert set(result.profile.uncertainty) == set(result.base.uncertainty)


def test_few_runs_fit_fewer_factors_and_say_so(measurements) -> None:
    rows, _ = prepare_measurements(measurements[:1])
    one = calibrate_user(rows)
    # A single run would spend a factor on its own error: nothing is fitted, and said so.
    assert one.fitted == () and "fewer than 2 runs move it" in one.why
    gemm = "gemm_efficiency.bf16"
    assert one.profile.get(gemm) == pytest.approx(one.base.get(gemm))
    assert math.isnan(one.mape_after)  # one run: no leave-one-out prediction
    rows, _ = prepare_measurements(measurements[:2])
    two = calibrate_user(rows, leave_one_out=False)
    assert len(two.fitted) == factor_limit(2) == 1
    # Two runs move every factor nearly along one direction: the others are mimicked.
    assert "cannot tell them apart" in two.why
    assert factor_limit(12) > factor_limit(4)


@pytest.mark.parametrize("runs_moved", [1, 2])
def test_a_factor_only_one_run_moves_is_never_fitted(monkeypatch, runs_moved: int) -> None:
    """Issue 33: with few runs the one factor fitted often moved a single run.  A factor
    is fitted only when two runs or more each move by MIN_UNIQUE_EFFECT over its range."""
    import parsearch.validation.user.user_calibration as uc

    gemm = np.array([0.30, 0.20, 0.25, 0.10, 0.30, 0.20, 0.25, 0.10])
    lonely = np.zeros(8)
    lonely[:runs_moved] = 0.4
    effects = {"gemm_efficiency.bf16": gemm, "host_time_per_layer_s": lonely}
    monkeypatch.setattr(uc, "range_effects", _effects_stub(effects))
    chosen, _, why = uc.choose_factors([object()] * 8, efficiency_for_gpu("h100-sxm"))
    if runs_moved == 1:
        assert chosen == ["gemm_efficiency.bf16"]
        assert "host_time_per_layer_s (1 run(s))" in why
    else:
        assert set(chosen) == {"host_time_per_layer_s", "gemm_efficiency.bf16"}


def _effects_stub(effects: dict[str, np.ndarray]):
    def stub(rows, profile, names=None, cluster_priors=None):
        return dict(effects)
    return stub


def test_factors_the_runs_cannot_tell_apart_are_not_both_fitted(monkeypatch) -> None:
    """Two factors whose effects move the runs together: one is fitted (the better
    determined), the other keeps its shipped value and the sentence says why; a factor
    that moves other runs is fitted beside it."""
    import parsearch.validation.user.user_calibration as uc

    gemm = np.array([0.30, 0.20, 0.25, 0.10, 0.30, 0.20, 0.25, 0.10])
    effects = {"gemm_efficiency.bf16": gemm, "memory_bound_factor": 0.5 * gemm,
               "host_time_per_layer_s": np.array([0, 0, 0, 0, 0.2, 0.3, 0.1, 0.2])}
    monkeypatch.setattr(uc, "range_effects", _effects_stub(effects))
    chosen, _, why = uc.choose_factors([object()] * 8, efficiency_for_gpu("h100-sxm"))
    assert chosen == ["gemm_efficiency.bf16", "host_time_per_layer_s"]
    assert "cannot tell them apart" in why and "memory_bound_factor" in why.split("apart")[1]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.02, 0.5), min_size=6, max_size=6),
       st.floats(0.2, 3.0))
def test_a_scaled_copy_of_a_fitted_factor_is_never_fitted_beside_it(base, scale) -> None:
    import parsearch.validation.user.user_calibration as uc

    first = np.array(base)
    effects = {"gemm_efficiency.bf16": first, "memory_bound_factor": scale * first}
    original = uc.range_effects
    uc.range_effects = _effects_stub(effects)
    try:
        chosen, _, _ = uc.choose_factors([object()] * 12, efficiency_for_gpu("h100-sxm"))
    finally:
        uc.range_effects = original
    assert len(chosen) <= 1
    # One of them is fitted whenever two runs or more move by the bar.
    moving = max(int(np.sum(np.abs(e) >= uc.MIN_UNIQUE_EFFECT)) for e in effects.values())
    assert len(chosen) == (1 if moving >= uc.MIN_RUNS_MOVED else 0)


def test_table_rows_with_bad_cells_give_one_line_each(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(
        "model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu,"
        "step_time_s,tp_comm_overlap\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2,sp=true\",9000,,\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2,sp=true\",,7.0,false\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf17,\"tp=2\",9000,,\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=two\",9000,,\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2\",9000,7.0,\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2\",9000,,maybe\n", encoding="utf-8")
    loaded = load_measurements([path])
    assert len(loaded.measurements) == 2
    step = loaded.measurements[1]
    assert step.options == {"tp_comm_overlap": False}
    assert abs(step.tokens_per_s_per_gpu - 128 * 8192 / (7.0 * 16)) < 1e-9
    assert len(loaded.problems) == 4
    assert all("\n" not in p for p in loaded.problems)
    for fragment, problem in zip(("precision='bf17'", "tp='two'", "exactly one of",
                                  "tp_comm_overlap='maybe'"), loaded.problems, strict=True):
        assert fragment in problem


def test_cuda_graph_scope_cells_are_read_or_named(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(
        "model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu,"
        "cuda_graphs,cuda_graph_scope\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2,sp=true\",9000,true,attn mlp\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2,sp=true\",9000,true,experts\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2,sp=true\",9000,,attn\n", encoding="utf-8")
    loaded = load_measurements([path])
    (good,) = loaded.measurements
    assert good.options == {"cuda_graphs": True, "cuda_graph_scope": ("attn", "mlp")}
    unknown, without_graphs = loaded.problems
    assert "unknown scope(s) experts" in unknown
    assert "cuda_graphs is not true" in without_graphs


def test_fp8_recipe_cells_are_read_or_named(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(
        "model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu,"
        "fp8_recipe\n"
        f"{MODEL},{CLUSTER},16,128,8192,fp8,\"tp=2,sp=true\",9000,Delayed\n"
        f"{MODEL},{CLUSTER},16,128,8192,fp8,\"tp=2,sp=true\",9000,e5m2\n", encoding="utf-8")
    loaded = load_measurements([path])
    (good,) = loaded.measurements
    assert good.options == {"fp8_recipe": "delayed"}
    (bad,) = loaded.problems
    assert "fp8_recipe='e5m2' is not one of" in bad


def test_a_throughput_in_the_wrong_unit_is_named_not_fitted(tmp_path) -> None:
    """A denormal throughput would overflow the fit's log ratio; it is refused with the
    step time it implies (a fuzz-campaign finding)."""
    path = tmp_path / "runs.csv"
    path.write_text(
        "model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu,"
        "step_time_s\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2,sp=true\",1e-320,\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,\"tp=2,sp=true\",,1e-9\n"
        f"{MODEL},{CLUSTER},16,128,8192,bf16,tp=1,9500,\n", encoding="utf-8")
    loaded = load_measurements([path])
    assert len(loaded.measurements) == 1
    assert len(loaded.problems) == 2
    assert all("means a step of" in p and "check the unit" in p for p in loaded.problems)


def test_unknown_csv_column_is_one_line_for_the_file(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("model,num_gpus,global_batch,seq_len,precision,layout,tokens,colour\n"
                    "x,8,8,8,bf16,tp=1,1,red\nx,8,8,8,bf16,tp=1,1,blue\n", encoding="utf-8")
    loaded = load_measurements([path])
    (problem,) = loaded.problems
    assert "colour" in problem and "tokens" in problem


def test_yaml_measurements_and_a_log_of_another_model(tmp_path) -> None:
    path = tmp_path / "runs.yaml"
    path.write_text("measurements:\n"
                    f"  - {{model: {MODEL}, cluster: {CLUSTER}, num_gpus: 16, global_batch: 128,"
                    " seq_len: 8192, precision: bf16, layout: 'tp=2,sp=true', step_time_s: 6.5,"
                    " moe_dispatcher: flex}\n", encoding="utf-8")
    (m,) = load_measurements([path]).measurements
    assert m.options == {"moe_dispatcher": "flex"}
    log = load_measurements([LOGS / "llama3_8b_tp2_pp2_complete.out"],
                            Defaults(model="llama3-70b", cluster=CLUSTER))
    rows, problems = prepare_measurements(log.measurements)
    assert rows == []
    (problem,) = problems
    assert "num_layers=32" in problem and "llama3-70b" in problem


def test_cli_calibrate_writes_a_profile_that_explain_takes(tmp_path, measurements) -> None:
    table = tmp_path / "runs.csv"
    lines = ["model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu"]
    lines += [f"{m.model},{m.cluster},{GPUS},{BATCH},{SEQ},bf16,\"{m.source}\","
              f"{m.tokens_per_s_per_gpu}" for m in measurements]
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "mine.yaml"
    result = run_cli("calibrate", "--measurements", str(table),
                     str(LOGS / "not_a_log.txt"), "--out", str(out), "--format", "json")
    assert result.code == 0, result.err
    report = json.loads(result.out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert report["mape_leave_one_out_after"] < report["mape_before"]
    (line,) = result.err.strip().splitlines()
    assert "left out: " in line and "not_a_log.txt" in line and "Traceback" not in line
    profile = load_efficiency_profile(str(out))
    shipped_gemm = efficiency_for_gpu("h100-sxm").get("gemm_efficiency.bf16")
    assert abs(profile.get("gemm_efficiency.bf16") - TRUE_GEMM) < abs(shipped_gemm - TRUE_GEMM)
    explain = ["explain", "--model", MODEL, "--cluster", CLUSTER, "--gpus", str(GPUS),
               "--layout", LAYOUTS[1], "--global-batch", str(BATCH), "--seq-len", str(SEQ),
               "--format", "json"]
    shipped = json.loads(run_cli(*explain).out)["tokens_per_s_per_gpu"]
    mine = json.loads(run_cli(*explain, "--efficiency", str(out)).out)["tokens_per_s_per_gpu"]
    measured = measurements[1].tokens_per_s_per_gpu
    assert abs(mine / measured - 1) < abs(shipped / measured - 1)


def test_cli_calibrate_with_nothing_usable_says_why_per_input(tmp_path) -> None:
    result = run_cli("calibrate", "--measurements", str(LOGS / "llama3_8b_died_in_warmup.out"),
                     str(LOGS / "not_a_log.txt"), "--model", MODEL, "--cluster", CLUSTER,
                     "--out", str(tmp_path / "p.yaml"))
    assert result.code == 2 and result.out == ""
    lines = result.err.strip().splitlines()
    assert "Traceback" not in result.err
    # the error first, then the reason of each input left out, indented (issue 35)
    assert lines[0].startswith("parsearch calibrate: error: no usable measurement")
    assert all(line.startswith("  ") for line in lines[1:]) and "all 2 input(s)" in lines[0]
    assert any("warm-up" in line for line in lines[1:])
    assert not (tmp_path / "p.yaml").exists()


def test_cli_calibrate_reads_megatron_logs(tmp_path) -> None:
    out = tmp_path / "p.yaml"
    result = run_cli("calibrate", "--measurements", str(LOGS / "llama3_8b_two_runs.out"),
                     str(LOGS / "llama3_8b_tp4_died.out"), "--model", MODEL,
                     "--cluster", CLUSTER, "--out", str(out), "--no-leave-one-out")
    on_bound = "(on its bound" in result.out
    # a factor on its bound is a warning, never a refusal (issue 33): exit 0, profile written
    assert result.code == 0, result.err
    assert ("warning:" in result.err) == (on_bound or "cluster-level factor" in result.out)
    assert result.out.count("llama3_8b_two_runs.out run") == 2
    assert "llama3_8b_tp4_died.out" in result.out
    assert out.is_file()


def test_plan_profiling_picks_distinct_layouts_with_launch_files(tmp_path) -> None:
    result = run_cli("plan-profiling", "--model", MODEL, "--cluster", CLUSTER, "--gpus",
                     str(GPUS), "--global-batch", str(BATCH), "--seq-len", str(SEQ), "--k", "3",
                     "--launch-dir", str(tmp_path), "--format", "json")
    assert result.code == 0, result.err
    plan = json.loads(result.out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    keys = [p["key"] for p in plan["picks"]]
    assert len(set(keys)) == 3
    assert plan["expected_misordered_pairs_after"] <= plan["expected_misordered_pairs_before"]
    assert len(plan["launch_files"]) == 3
    for pick, path in zip(plan["picks"], plan["launch_files"], strict=True):
        text = Path(path).read_text()
        assert f"--tensor-model-parallel-size {pick['layout']['tp']} " in text
        assert f"--train-iters {pick['iterations']}" in text
        # One run per script: Megatron-LM runs (with the script's data arguments),
        # the Megatron-Bridge alternative is commented out.
        assert '--log-throughput "$@"' in text
        assert all(line.startswith("#") for line in text.splitlines() if "run_recipe" in line)


def test_measurements_already_taken_tighten_the_plan(measurements) -> None:
    rows, _ = prepare_measurements(measurements)
    training = TrainingSpec(seq_len=SEQ, global_batch=BATCH)
    cm = build_cost_model(resolve_model(MODEL), training,
                          build_fabric(load_cluster(CLUSTER), GPUS))
    fresh = plan_profiling(cm, k=1)
    informed = plan_profiling(cm, k=1, measured=rows)
    gemm = "gemm_efficiency.bf16"
    assert informed.factor_sd_before[gemm] < fresh.factor_sd_before[gemm]


def test_planned_set_leaves_less_fit_error_than_random_sets_of_the_same_candidates() -> None:
    # The planner's design criterion, computed from the calibration's normal matrix
    # J'J + lam^2 I of the factors the fit will take: the planned set must beat most
    # sets of the same size drawn from the same candidates (a poor or random planner
    # sits near the middle of that distribution).
    k, candidates = 5, 12
    training = TrainingSpec(seq_len=SEQ, global_batch=BATCH)
    cm = build_cost_model(resolve_model(MODEL), training,
                          build_fabric(load_cluster(CLUSTER), GPUS))
    plan = plan_profiling(cm, k=k, candidates=candidates)
    table = require_layouts(cm.model, cm.training, GPUS)
    scan = scan_table(cm, table)
    rows = scan.feasible_rows[rank_feasible(scan, top=TARGET_SHAPES, diverse=True)]
    cols = {name: v[rows] for name, v in table.columns.items()}
    keys = [table.layout(int(r)).key() for r in rows[:candidates]]
    g = gradients(cm, cols, plan.factors)
    thresholds = np.array([threshold(name) for name in plan.factors])

    def error(chosen: list[int]) -> float:
        return fit_error(g[chosen], g, factor_limit(k), own=chosen, thresholds=thresholds)

    planned = error([keys.index(p.layout.key()) for p in plan.picks])
    rng = np.random.default_rng(0)
    drawn = [error(rng.choice(candidates, size=k, replace=False).tolist()) for _ in range(60)]
    assert planned < float(np.quantile(drawn, 0.25))


# --- the cluster's delivered bandwidth ------------------------------------------------------
#: The "true" cluster: the cluster file's NICs deliver half of what it says (a NIC trained at
#: HDR 200 Gb/s on an NDR 400 Gb/s cluster file); everything else as the file and profile say.
TRUE_NETWORK = 0.5
NET_GPUS = 32
#: Four runs whose context-parallel groups cross nodes, one inside a node.
NET_MEASURED = ("tp=4,cp=4,mbs=8,sp=true", "tp=8,cp=4,mbs=8,sp=true", "tp=8,cp=2,mbs=8,sp=true",
                "tp=2,mbs=2,sp=true", "tp=8,mbs=8,sp=true")
#: Held-out layouts that cross nodes (pipelined variants the fit never saw).
NET_HELD_OUT = ("tp=8,cp=2,pp=2,mbs=8,sp=true", "tp=4,cp=4,pp=2,mbs=8,sp=true",
                "tp=4,cp=4,pp=2,mbs=4,sp=true")


def _slow_cluster():
    nominal = load_cluster(CLUSTER)
    return replace(nominal, network_efficiency=nominal.network_efficiency * TRUE_NETWORK)


@pytest.fixture(scope="module")
def slow_network_runs() -> list[Measurement]:
    shipped = efficiency_for_gpu("h100-sxm")
    return [_measured(text, shipped, NET_GPUS, _slow_cluster()) for text in NET_MEASURED]


@pytest.fixture(scope="module")
def slow_network_result(slow_network_runs):
    rows, problems = prepare_measurements(slow_network_runs)
    assert problems == []
    return calibrate_user(rows)


def test_slower_network_is_recovered_and_held_out_error_drops(slow_network_result) -> None:
    result = slow_network_result
    # GEMM stays on the bound its shipped value sits on, and the runs agree: not a failure.
    assert NETWORK_FACTOR in result.fitted and result.on_bound == ()
    assert abs(result.cluster[NETWORK_FACTOR] - TRUE_NETWORK) < 0.05
    # The profile is the truth here: the network factor must not push GEMM off it.
    gemm = "gemm_efficiency.bf16"
    assert abs(result.profile.get(gemm) - result.base.get(gemm)) < 0.02
    held_out, _ = prepare_measurements(
        [_measured(text, result.base, NET_GPUS, _slow_cluster()) for text in NET_HELD_OUT])
    measured = np.array([r.measured for r in held_out])
    before = np.abs(predict(held_out, result.base) / measured - 1.0)
    fitted = FactorFit(result.profile, result.cluster, result.cluster_priors, result.fitted,
                       (), {}, "")
    after = np.abs(fitted.predict(held_out) / measured - 1.0)
    assert before.mean() > 0.05 and after.mean() < before.mean() / 10


def test_slower_nvlink_is_recovered_from_tensor_parallel_runs_on_one_node() -> None:
    # NVLink at 0.85 of the file (ring busbw 0.70 of line rate instead of 0.82): runs on
    # one node whose TP groups talk a lot, with nothing hiding that traffic (TP overlap off),
    # show it; the inter-node factor stays unfitted.
    nominal = load_cluster(CLUSTER)
    truth = replace(nominal, nvlink_efficiency=nominal.nvlink_efficiency * 0.85)
    shipped = efficiency_for_gpu("h100-sxm")
    texts = ("tp=8,mbs=8,sp=true", "tp=8,mbs=4,sp=true", "tp=8,mbs=2,sp=true",
             "tp=4,mbs=4,sp=true", "tp=2,mbs=2,sp=true")
    exposed = {"tp_comm_overlap": False}
    rows, _ = prepare_measurements([_measured(text, shipped, 8, truth, exposed)
                                    for text in texts])
    result = calibrate_user(rows, leave_one_out=False)
    assert NVLINK_FACTOR in result.fitted and NETWORK_FACTOR not in result.fitted
    assert abs(result.cluster[NVLINK_FACTOR] - 0.85) < 0.03
    assert result.mape_in_sample < result.mape_before / 10


def test_a_network_slower_than_the_cited_range_is_reported_on_its_bound() -> None:
    nominal = load_cluster(CLUSTER)
    far_slower = replace(nominal, network_efficiency=nominal.network_efficiency * 0.1)
    shipped = efficiency_for_gpu("h100-sxm")
    rows, _ = prepare_measurements([_measured(text, shipped, NET_GPUS, far_slower)
                                    for text in NET_MEASURED])
    result = calibrate_user(rows, leave_one_out=False)
    low = network_priors(nominal)[NETWORK_FACTOR].low
    assert result.cluster[NETWORK_FACTOR] == pytest.approx(low, abs=0.01)
    assert NETWORK_FACTOR in result.on_bound


def test_without_the_network_factor_the_same_runs_fit_worse(slow_network_runs,
                                                           slow_network_result) -> None:
    rows, _ = prepare_measurements(slow_network_runs)
    profile_only = calibrate_user(rows, network=False, leave_one_out=False)
    assert not set(profile_only.fitted) & {NETWORK_FACTOR, NVLINK_FACTOR}
    assert slow_network_result.mape_in_sample < profile_only.mape_in_sample / 5


def test_intra_node_runs_do_not_fit_the_network_and_say_why() -> None:
    # The NICs are slow, but no run crosses a node: nothing can show it.
    shipped = efficiency_for_gpu("h100-sxm")
    runs = [_measured(text, shipped, 8, _slow_cluster())
            for text in ("tp=1,mbs=1", "tp=2,sp=true,mbs=1", "tp=4,sp=true,mbs=2",
                         "tp=8,sp=true,mbs=4")]
    rows, _ = prepare_measurements(runs)
    result = calibrate_user(rows, leave_one_out=False)
    assert NETWORK_FACTOR not in result.fitted and result.cluster == {}
    assert result.cluster_file is None
    assert f"{NETWORK_FACTOR} not fitted: the runs barely cross nodes" in result.why
    assert result.sensitivity[NETWORK_FACTOR] < MIN_NETWORK_SENSITIVITY


@settings(max_examples=25, deadline=None)
@given(preset=st.sampled_from(["dgx-h100", "dgx-a100", "gb200-nvl72", "h100-roce"]),
       u_net=st.floats(0.0, 1.0), u_nvl=st.floats(0.0, 1.0), u_spine=st.floats(0.0, 1.0))
def test_corrected_cluster_file_loads_with_the_scaled_efficiencies(tmp_path_factory, preset,
                                                                  u_net, u_nvl, u_spine) -> None:
    nominal = load_cluster(preset)
    priors = network_priors(nominal)
    positions = {NETWORK_FACTOR: u_net, NVLINK_FACTOR: u_nvl, SPINE_FACTOR: u_spine}
    factors = {name: p.low + positions[name] * (p.high - p.low)
               for name, p in priors.items() if name in positions}
    path = tmp_path_factory.mktemp("cluster") / "mine.cluster.yaml"
    path.write_text(corrected_cluster_yaml(preset, factors, "# test\n"), encoding="utf-8")
    loaded = load_cluster(str(path))
    expected = corrected_cluster(nominal, factors)
    assert loaded.name == f"{preset}-calibrated"
    for name in ("network_efficiency", "nvlink_efficiency"):
        # Written to 4 significant digits, never above the line rate.
        assert getattr(loaded, name) == pytest.approx(getattr(expected, name), rel=1e-3)
        assert getattr(loaded, name) <= 1.0
    # The spine: the leaves' uplinks deliver the factor's share of the file's.
    assert nominal.leaf_oversubscription / loaded.leaf_oversubscription == pytest.approx(
        factors.get(SPINE_FACTOR, 1.0), rel=1e-3)
    same = replace(loaded, name=nominal.name, network_efficiency=nominal.network_efficiency,
                   nvlink_efficiency=nominal.nvlink_efficiency,
                   leaf_oversubscription=nominal.leaf_oversubscription)
    assert same == nominal


def test_cli_calibrate_writes_a_cluster_file_that_explain_takes(tmp_path,
                                                               slow_network_runs) -> None:
    table = tmp_path / "runs.csv"
    lines = ["model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu"]
    lines += [f"{m.model},{m.cluster},{NET_GPUS},{BATCH},{SEQ},bf16,\"{m.source}\","
              f"{m.tokens_per_s_per_gpu}" for m in slow_network_runs]
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "mine.yaml"
    result = run_cli("calibrate", "--measurements", str(table), "--out", str(out),
                     "--no-leave-one-out")
    assert result.code == 0, result.err
    cluster_file = tmp_path / "mine.cluster.yaml"
    assert cluster_file.is_file()
    assert f"--cluster {cluster_file}" in result.out and NETWORK_FACTOR in result.out
    assert "the inter-node network delivers 50% of what cluster dgx-h100 says" in result.out
    explain = ["explain", "--model", MODEL, "--gpus", str(NET_GPUS), "--layout",
               NET_HELD_OUT[1], "--global-batch", str(BATCH), "--seq-len", str(SEQ),
               "--format", "json"]
    nominal = json.loads(run_cli(*explain, "--cluster", CLUSTER).out)["tokens_per_s_per_gpu"]
    run = run_cli(*explain, "--cluster", str(cluster_file), "--efficiency", str(out))
    assert run.code == 0, run.err
    mine = json.loads(run.out)["tokens_per_s_per_gpu"]
    truth = _measured(NET_HELD_OUT[1], efficiency_for_gpu("h100-sxm"), NET_GPUS,
                      _slow_cluster()).tokens_per_s_per_gpu
    assert abs(mine / truth - 1) < 0.01 < abs(nominal / truth - 1)


def test_plan_makes_a_loose_network_identifiable() -> None:
    # On 32 GPUs few good layouts cross nodes; the plan must include enough of them for the
    # fit to take the network factor, and pin it (its spread shrinks), unless told the
    # calibration will not fit it.
    training = TrainingSpec(seq_len=SEQ, global_batch=BATCH)
    cm = build_cost_model(resolve_model(MODEL), training,
                          build_fabric(load_cluster(CLUSTER), NET_GPUS))
    plan = plan_profiling(cm, k=5, candidates=30)
    blind = plan_profiling(cm, k=5, candidates=30, network=False)

    def sensitivities(p) -> np.ndarray:
        cols = layout_columns([pick.layout for pick in p.picks])
        return np.abs(gradients(cm, cols, (NETWORK_FACTOR,))).ravel()

    assert sensitivities(plan).mean() >= MIN_NETWORK_SENSITIVITY
    # At least as many runs that move with the network as a plan blind to it picks (the
    # blind plan may happen on them too; the aware one must not pick fewer).
    def network_runs(p) -> int:
        return int((sensitivities(p) >= MIN_NETWORK_SENSITIVITY).sum())

    assert network_runs(plan) >= max(2, network_runs(blind))
    assert plan.factor_sd_after[NETWORK_FACTOR] < 0.6 * plan.factor_sd_before[NETWORK_FACTOR]
