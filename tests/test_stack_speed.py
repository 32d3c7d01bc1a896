"""A software stack's own kernels (cost/stack_speed.py, cost_models/stacks/*.yaml)."""

from __future__ import annotations

import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cli import main
from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.stack_speed import load_stack_speed, parse_stack_speed, stack_profile
from parsearch.cost.stacks import MEGATRON_LINE, get_stack, require_model_support, stack_training
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.resources import data_dir
from parsearch.topology.cluster import load_cluster
from parsearch.topology.summary import fabric_from_spec
from parsearch.validation.published.published_runs import load_independent_runs
from parsearch.validation.published.runs import fabric_for, run_cost_model, training_spec

REFERENCES = Path(data_dir("cost_models")) / "references" / "microbenchmarks.yaml"


def test_torchtitan_hopper_attention_rate_is_the_cited_fa2_over_cudnn_ratio() -> None:
    # the FlashAttention-3 paper's forward figure, as recorded in the references:
    # head dim 128, causal, 16k tokens: "cuDNN 539, FA2 335"
    records = yaml.safe_load(REFERENCES.read_text())["entries"]
    note = next(r["note"] for r in records
                if r.get("shape") == "FA3, hdim=128, causal, seqlen=16k")
    cudnn = float(re.search(r"cuDNN (\d+)", note).group(1))  # type: ignore[union-attr]
    fa2 = float(re.search(r"FA2 (\d+)", note).group(1))  # type: ignore[union-attr]
    speed = load_stack_speed("torchtitan")
    assert speed is not None
    hopper = speed.attention_for("hopper")
    assert hopper.value == pytest.approx(fa2 / cudnn, abs=0.005)
    assert hopper.low <= hopper.value <= hopper.high
    assert speed.attention_for("ampere").value == 1.0  # FA2-class kernels on both stacks


def test_megatron_stacks_run_the_profiles_kernels() -> None:
    assert all(load_stack_speed(s.name) is None for s in MEGATRON_LINE)
    hopper = efficiency_for_gpu("h100-sxm")
    assert stack_profile("mcore-current", hopper) is hopper


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-sxm-80gb", "b200"])
def test_stack_profile_changes_attention_only(gpu: str) -> None:
    profile = efficiency_for_gpu(gpu)
    speed = load_stack_speed("torchtitan")
    assert speed is not None
    rate = speed.attention_for(profile.name).value
    titan = stack_profile("torchtitan", profile)
    assert titan.attention_forward_efficiency == pytest.approx(
        profile.attention_forward_efficiency * rate)
    assert titan.attention_backward_efficiency == pytest.approx(
        profile.attention_backward_efficiency * rate)
    unchanged = {f.name for f in fields(profile)} - {
        "attention_forward_efficiency", "attention_backward_efficiency", "uncertainty",
        "source"}
    for name in unchanged:
        assert getattr(titan, name) == getattr(profile, name), name
    # the estimate's range is the stack's own, never Megatron-Core's (on Ampere too)
    assert titan.uncertainty == speed.uncertainty


def _long_context_cost_models(seq_len: int):  # type: ignore[no-untyped-def]
    model = get_preset("llama3-8b")
    training = TrainingSpec(seq_len=seq_len, global_batch=8)
    fabric = fabric_from_spec(load_cluster("dgx-h100"), 8)
    mcore = build_cost_model(model, training, fabric)
    titan = build_cost_model(model, training, fabric,
                             profile=stack_profile("torchtitan", efficiency_for_gpu("h100-sxm")))
    return mcore, titan


@settings(max_examples=25, deadline=None)
@given(seq_len=st.sampled_from([2048, 8192, 32768]), tp=st.sampled_from([1, 2, 4, 8]),
       recompute=st.sampled_from(["none", "full"]))
def test_slower_attention_never_speeds_a_step_up_and_costs_at_most_its_share(
        seq_len: int, tp: int, recompute: str) -> None:
    mcore, titan = _long_context_cost_models(seq_len)
    layout = Layout(tp=tp, pp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, sp=tp > 1,
                    recompute=recompute, num_gpus=8)
    base, slow = estimate(mcore, layout), estimate(titan, layout)
    assert slow.step_time_s >= base.step_time_s
    # only attention slows, by 1/rate at most: the step cannot grow by more than that
    rate = load_stack_speed("torchtitan").attention_for("hopper").value  # type: ignore[union-attr]
    assert slow.step_time_s - base.step_time_s <= (1 / rate - 1) * base.time_s["compute"]
    assert slow.memory_bytes == base.memory_bytes


def test_attention_share_grows_with_sequence_so_does_the_gap() -> None:
    layout = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, sp=False,
                    recompute="full", num_gpus=8)
    gaps = []
    for seq_len in (4096, 16384, 65536):
        mcore, titan = _long_context_cost_models(seq_len)
        gaps.append(estimate(titan, layout).step_time_s / estimate(mcore, layout).step_time_s)
    assert 1.0 < gaps[0] < gaps[1] < gaps[2]


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d["attention_rate"]["hopper"].pop("source"), "no source"),
    (lambda d: d["attention_rate"]["hopper"].update(value=0.9), "low <= value <= high"),
    (lambda d: d["attention_rate"]["hopper"].update(low="fast"), "needs numbers"),
    (lambda d: d.pop("attention_rate"), "attention_rate"),
])
def test_a_broken_stack_speed_file_says_what_is_wrong(edit, words: str) -> None:  # type: ignore[no-untyped-def]
    path = data_dir("cost_models") / "stacks" / "torchtitan.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    with pytest.raises(SpecError, match=words):
        parse_stack_speed("custom.yaml", data)


def test_an_unlisted_generation_is_an_error_not_the_megatron_kernel() -> None:
    speed = load_stack_speed("torchtitan")
    assert speed is not None
    hopper = efficiency_for_gpu("h100-sxm")
    with pytest.raises(SpecError, match="no attention rate for GPU generation 'custom'"):
        stack_profile("torchtitan", replace(hopper, name="custom"))


def test_torchtitan_stack_shards_data_parallel_state_and_refuses_what_it_lacks() -> None:
    stack = get_stack("torchtitan")
    training = stack_training(stack, TrainingSpec(seq_len=8192, global_batch=64))
    assert training.fsdp and training.fsdp_shards_weights
    assert "selective" not in training.recompute_modes
    with pytest.raises(SpecError, match="selective recompute"):
        stack_training(stack, TrainingSpec(seq_len=8192, global_batch=64,
                                           recompute_modes=("selective",)),
                       explicit=frozenset({"recompute_modes"}))
    with pytest.raises(SpecError, match="MoE layers"):
        require_model_support(stack, get_preset("mixtral-8x7b"))


def _explain(capsys, *extra: str) -> dict:  # type: ignore[no-untyped-def]
    code = main(["explain", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--layout", "tp=1,mbs=1,recompute=full", "--global-batch", "8",
                 "--seq-len", "32768", "--format", "json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_explain_on_torchtitan_prices_its_attention_and_carries_its_band(capsys) -> None:  # type: ignore[no-untyped-def]
    mcore = _explain(capsys)
    titan = _explain(capsys, "--stack", "torchtitan")
    assert titan["time_s"]["compute"] > mcore["time_s"]["compute"]
    assert titan["tokens_per_s_per_gpu"] < mcore["tokens_per_s_per_gpu"]
    assert "torchtitan" in titan["tokens_per_s_per_gpu_range_basis"]
    assert "torchtitan.yaml" in titan["software_stack"]


def test_explain_refuses_a_layout_feature_the_stack_lacks(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["explain", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--layout", "tp=1,mbs=1,recompute=selective", "--global-batch", "8",
                 "--seq-len", "8192", "--stack", "torchtitan"])
    assert code != 0
    assert "does not have selective recompute" in capsys.readouterr().err


def test_torchtitan_runs_are_priced_with_their_stacks_kernels() -> None:
    runs = load_independent_runs()
    titan = next(r for r in runs if r.source_tag == "TORCHTITAN" and "H100" in r.gpu
                 and r.model_spec is not None and r.cluster is not None)
    other = next(r for r in runs if r.source_tag != "TORCHTITAN" and "H100" in r.gpu
                 and r.model_spec is not None and r.cluster is not None)
    hopper = efficiency_for_gpu("h100-sxm")
    cache: dict = {}
    for run, rate in ((titan, 0.62), (other, 1.0)):
        cm = run_cost_model(run, fabric_for(cache, run.cluster, run.num_gpus), CostOptions(),
                            training_spec(run))
        assert cm.profile.attention_forward_efficiency == pytest.approx(
            hopper.attention_forward_efficiency * rate)
