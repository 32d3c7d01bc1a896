"""The fused expert MLP as a searched feature: on wherever Megatron-Core runs it (etp = 1,
block-scaled precision on SM100, Megatron Core 0.18+), off elsewhere, pinned as given."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parsearch.cli import main
from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.cost.ep_overlap import pinned_feature_flags
from parsearch.cost.fused_mlp import fused_mlp_rows, fused_mlp_runnable
from parsearch.cost.options import DEFAULT_SEARCHED_FEATURES
from parsearch.cost.stacks import DEFAULT_STACK, get_stack, stack_options
from parsearch.launch import launch_for_cluster
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology import build_fabric, load_cluster
from parsearch.validation.published.published_runs import load_heldout_runs
from parsearch.validation.published.run_conventions import stack_of_source
from parsearch.validation.published.runs import validate_runs

SEARCHED = CostOptions(search_features=("fused_expert_mlp",))
MXFP8 = TrainingSpec(seq_len=4096, global_batch=512, precision="fp8")


def _cm(model: str, cluster: str, training: TrainingSpec, options: CostOptions, gpus: int = 16):  # type: ignore[no-untyped-def]
    return build_cost_model(get_preset(model), training, build_fabric(load_cluster(cluster), gpus),
                            options=options)


def test_searched_it_is_on_only_where_the_job_can_run_it() -> None:
    assert _cm("qwen3-30b-a3b", "dgx-b200", MXFP8, SEARCHED).options.fused_expert_mlp
    # Hopper has no block-scaled grouped GEMMs; BF16 has none to fuse into; a dense model
    # has no experts; an offloaded expert input is refused beside it
    assert not _cm("qwen3-30b-a3b", "dgx-h100", MXFP8, SEARCHED).options.fused_expert_mlp
    assert not _cm("qwen3-30b-a3b", "dgx-b200", replace(MXFP8, precision="bf16"),
                   SEARCHED).options.fused_expert_mlp
    assert not _cm("llama3-8b", "dgx-b200", MXFP8, SEARCHED).options.fused_expert_mlp
    assert not _cm("qwen3-30b-a3b", "dgx-b200", MXFP8,
                   replace(SEARCHED, fp8_recipe="tensorwise")).options.fused_expert_mlp
    assert not fused_mlp_runnable(get_preset("qwen3-30b-a3b"),
                                  replace(MXFP8, offload_modules=("expert_fc1",)), 10.0, "mxfp8")


@settings(max_examples=12, deadline=None)
@given(etp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([2, 4, 8]), mbs=st.sampled_from([1, 2]))
def test_it_only_removes_work_and_never_runs_with_expert_tp(etp: int, ep: int, mbs: int) -> None:
    assume(etp * ep <= 16)  # the expert mesh etp x ep x edp spans the 16 GPUs
    layout = Layout(num_gpus=16, tp=1, pp=1, ep=ep, etp=etp, mbs=mbs)
    on = estimate(_cm("qwen3-30b-a3b", "dgx-b200", MXFP8, SEARCHED), layout)
    off = estimate(_cm("qwen3-30b-a3b", "dgx-b200", MXFP8, CostOptions()), layout)
    if etp == 1:
        assert on.step_time_s < off.step_time_s
    else:  # Megatron-Core TEGroupedMLP._is_fused_impl_supported: no expert TP
        assert on.step_time_s == pytest.approx(off.step_time_s, rel=1e-12)
    assert on.memory_bytes["total"] == pytest.approx(off.memory_bytes["total"], rel=1e-12)
    plan = launch_for_cluster(get_preset("qwen3-30b-a3b"), MXFP8, layout,
                              load_cluster("dgx-b200"), options=on.options).plan
    assert plan.fused_expert_mlp == (etp == 1)


def test_per_layout_mask() -> None:
    etp = np.array([1.0, 2.0, 1.0])
    assert fused_mlp_rows(True, etp, MXFP8).tolist() == [True, False, True]
    assert fused_mlp_rows(np.array([True, True, False]), etp, MXFP8).tolist() == [
        True, False, False]
    assert fused_mlp_rows(True, etp, replace(MXFP8, offload_modules=("moe_act",))) is False


def test_only_the_stacks_from_megatron_core_018_have_it() -> None:
    assert DEFAULT_STACK == "mcore-current" and get_stack("mcore-current").fused_expert_mlp
    assert not get_stack("mcore-0.16").fused_expert_mlp
    options = CostOptions(search_features=DEFAULT_SEARCHED_FEATURES)
    assert "fused_expert_mlp" in stack_options(get_stack("mcore-current"), options).search_features
    old = stack_options(get_stack("mcore-0.16"), options)
    assert "fused_expert_mlp" not in old.search_features and not old.fused_expert_mlp
    # Megatron-Bridge 0.4 (NeMo 26.04) pins Megatron Core 0.17; 0.5 (NeMo 26.06) pins 0.18
    assert stack_of_source("Megatron-Bridge perf summary (NeMo 26.04.01 container)") == \
        "mcore-0.16"
    assert stack_of_source("Megatron-Bridge perf summary (NeMo 26.06 container)") == \
        "mcore-current"


def test_a_pinned_flag_on_a_stack_without_it_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "--model", "qwen3-30b-a3b", "--cluster", "dgx-b200", "--gpus", "8",
            "--layout", "ep=8,mbs=2", "--global-batch", "512", "--seq-len", "4096",
            "--precision", "fp8", "--fused-expert-mlp"]
    assert main([*args, "--stack", "mcore-0.16"]) == 2
    err = capsys.readouterr().err
    assert "mcore-0.16" in err and "drop --fused-expert-mlp" in err
    assert main(args) == 0
    assert "fused expert MLP" in capsys.readouterr().out


def test_a_pinned_flag_is_noted_where_the_layout_runs_without_it() -> None:
    model = get_preset("qwen3-30b-a3b")
    pinned = CostOptions(fused_expert_mlp=True)
    notes = pinned_feature_flags(model, pinned, Layout(num_gpus=16, ep=4, etp=2))
    assert any("--fused-expert-mlp is not run here" in n and "etp = 2" in n for n in notes)
    assert not pinned_feature_flags(model, pinned, Layout(num_gpus=16, ep=8, etp=1))
    assert not pinned_feature_flags(model, SEARCHED, Layout(num_gpus=16, ep=4, etp=2))


def test_gpt_oss_release_jump_with_the_fused_mlp_matches_its_measurement() -> None:
    # Megatron-Bridge's gpt-oss-120b rows on 64 GB200 (EP64, micro-batch 4): NeMo 26.04
    # without the fused expert MLP, 26.06 with it (run_setups.csv); both read from their
    # recipes.  Measured 15,938 -> 28,947 tokens/s per GPU (1.82x).
    runs = {r.id: r for r in load_heldout_runs() if r.id in ("i0163", "i0155")}
    rows = {r.id: r for r in validate_runs(runs.values(), deduplicate=False).rows}
    measured = (rows["i0155"].measured_tokens_per_s_per_gpu
                / rows["i0163"].measured_tokens_per_s_per_gpu)
    priced = (rows["i0155"].predicted_tokens_per_s_per_gpu
              / rows["i0163"].predicted_tokens_per_s_per_gpu)
    assert measured == pytest.approx(1.82, abs=0.01)
    assert priced == pytest.approx(measured, rel=0.10)


def test_the_search_table_names_it_per_layout() -> None:
    from parsearch.cli.search_cmds import feature_label

    on = _cm("qwen3-30b-a3b", "dgx-b200", MXFP8, SEARCHED).options
    labels = {}
    for etp in (1, 2):
        layout = Layout(num_gpus=16, ep=8, etp=etp, mbs=2)
        plan = launch_for_cluster(get_preset("qwen3-30b-a3b"), MXFP8, layout,
                                  load_cluster("dgx-b200"), options=on).plan
        labels[etp] = feature_label(plan)
    assert "fused-mlp" in labels[1] and "fused-mlp" not in labels[2]


def test_a_measured_table_row_can_say_it_ran_the_fused_expert_mlp() -> None:
    from parsearch.errors import SpecError
    from parsearch.validation.user.measurements import Defaults, measurement_from_row

    row = {"num_gpus": "8", "layout": "ep=8,mbs=2", "global_batch": "512", "seq_len": "4096",
           "precision": "fp8", "tokens_per_s_per_gpu": "20000", "fused_expert_mlp": "true"}
    defaults = Defaults(model="qwen3-30b-a3b", cluster="dgx-b200")
    assert measurement_from_row(row, "row 2", defaults).options["fused_expert_mlp"] is True
    with pytest.raises(SpecError, match="fused_expert_mlp"):
        measurement_from_row({**row, "fused_expert_mlp": "maybe"}, "row 2", defaults)
