"""Software stacks bound the layout space and the searched features (cost/stacks.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cli import main
from parsearch.cost.feature_search import feature_variants
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.cost.stacks import (
    DEFAULT_STACK,
    MEGATRON_LINE,
    STACKS,
    get_stack,
    stack_options,
    stack_training,
)
from parsearch.errors import SpecError
from parsearch.layout.rules import RECOMPUTE_CODES
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_MODES, TrainingSpec

STACK_NAMES = [s.name for s in STACKS]


def _training(**kw: object) -> TrainingSpec:
    return TrainingSpec(**{"seq_len": 4096, "global_batch": 256, **kw})  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(STACK_NAMES),
       sp=st.sampled_from(["both", "on", "off"]),
       modes=st.sets(st.sampled_from(RECOMPUTE_MODES), min_size=1),
       max_cp=st.one_of(st.none(), st.integers(1, 16)))
def test_stack_training_never_keeps_what_the_stack_lacks(name: str, sp: str, modes: set[str],
                                                         max_cp: int | None) -> None:
    stack = get_stack(name)
    training = _training(sequence_parallel=sp, recompute_modes=tuple(sorted(modes)),
                         max_cp=max_cp)
    try:
        out = stack_training(stack, training)
    except SpecError as error:  # only when nothing the user allowed is left
        assert modes == {"selective"} and not stack.selective_recompute
        assert name in str(error) and "--recompute" in str(error)
        return
    if not stack.sequence_parallel:
        assert out.sequence_parallel == "off"
    if not stack.selective_recompute:
        assert "selective" not in out.recompute_modes
    if not stack.context_parallel:
        assert out.max_cp == 1
    if not stack.distributed_optimizer:
        assert not out.distributed_optimizer
    # what the stack has is left as the user gave it
    assert set(out.recompute_modes) <= modes
    if stack.context_parallel:
        assert out.max_cp == max_cp


@pytest.mark.parametrize("name", STACK_NAMES)
def test_layouts_of_a_stack_use_only_what_it_has(name: str) -> None:
    stack = get_stack(name)
    model = get_preset("gpt3-175b")
    table = enumerate_layouts(model, stack_training(stack, _training(global_batch=64)), 64)
    cols = table.columns
    assert len(table) > 0
    if not stack.context_parallel:
        assert np.all(cols["cp"] == 1)
    if not stack.sequence_parallel:
        assert not np.any(cols["sp"])
    if not stack.selective_recompute:
        assert not np.any(cols["recompute"] == RECOMPUTE_CODES["selective"])
    if not stack.interleaved_schedule:
        assert np.all(cols["vpp"] == 1)


@pytest.mark.parametrize("name", STACK_NAMES)
def test_experts_take_the_model_tp_before_folding(name: str) -> None:
    """Megatron-Core before MoE parallel folding (7f22e210cd, 2024-11-23) shards the
    experts over the model's TP: a stack without a separate expert TP enumerates only
    etp == tp, one with it also etp != tp."""
    stack = get_stack(name)
    model = get_preset("mixtral-8x7b")
    if not stack.moe_dispatchers:
        return
    training = stack_training(stack, _training(global_batch=64))
    assert training.experts_follow_tp == (not stack.expert_tensor_parallel)
    cols = enumerate_layouts(model, training, 64).columns
    same = cols["etp"] == cols["tp"]
    if stack.expert_tensor_parallel:
        assert not np.all(same)
    else:
        assert np.all(same)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), etp=st.sampled_from([1, 2, 4, 8]))
def test_a_folded_layout_is_refused_by_name_before_folding(tp: int, etp: int) -> None:
    from parsearch.layout.rules import check_layout
    from parsearch.layout.spec import Layout

    model = get_preset("mixtral-8x7b")
    training = stack_training(get_stack("mcore-0.9"), _training(global_batch=64))
    layout = Layout(tp=tp, pp=1, cp=1, ep=8, etp=etp, vpp=1, mbs=1, sp=tp > 1,
                    recompute="none", num_gpus=64)
    messages = [v.message for v in check_layout(model, training, layout)]
    folded = [m for m in messages if "MoE parallel folding" in m]
    assert bool(folded) == (etp != tp)


def test_older_stacks_search_a_subset_of_newer_layouts() -> None:
    model = get_preset("gpt3-175b")
    sizes = [len(enumerate_layouts(model, stack_training(s, _training(global_batch=64)), 64))
             for s in MEGATRON_LINE]
    assert sizes == sorted(sizes)
    assert sizes[0] < sizes[-1]


@pytest.mark.parametrize("name", STACK_NAMES)
def test_searched_features_stay_within_the_stack(name: str) -> None:
    stack = get_stack(name)
    model = get_preset("deepseek-v3")
    options = stack_options(stack, CostOptions(search_features=SEARCHABLE_FEATURES))
    variants = feature_variants(model, options, compute_capability=9.0)
    if not stack.moe_dispatchers:
        return
    assert variants
    for variant in variants:
        assert variant.moe_dispatcher in stack.moe_dispatchers
        assert stack.moe_a2a_overlap or not variant.moe_a2a_overlap
        assert stack.moe_shared_expert_overlap or not variant.moe_shared_expert_overlap


@pytest.mark.parametrize("name", STACK_NAMES)
def test_memory_features_a_stack_lacks_leave_the_search(name: str) -> None:
    """Recompute modules beyond core_attn (Megatron-LM 2025-04), BF16 Adam moments
    (2024-12) and FP8 parameter gather (2024-09) are searched only where the stack has
    them; asked for by the user on a stack without them, the answer names the fix."""
    stack = get_stack(name)
    options = stack_options(stack, CostOptions(search_features=SEARCHABLE_FEATURES))
    for feature, available in (("recompute_modules", stack.recompute_modules),
                               ("bf16_moments", stack.precision_aware_optimizer),
                               ("fp8_param_gather", stack.fp8_param_gather),
                               ("activation_offload_layers", stack.cpu_offloading)):
        assert (feature in options.search_features) == available, feature
    if not stack.cpu_offloading:  # before Megatron-LM's CPU offload (2023-12)
        with pytest.raises(SpecError, match="CPU activation offloading"):
            stack_options(stack, CostOptions(activation_offload_layers=4),
                          explicit=frozenset({"activation_offload_layers"}))
        with pytest.raises(SpecError, match="drop --activation-offload-layers"):
            stack_training(stack, replace(_training(), activation_offload_layers=4))
    if not stack.precision_aware_optimizer:
        with pytest.raises(SpecError, match="BF16 Adam moments"):
            stack_options(stack, CostOptions(bf16_moments=True),
                          explicit=frozenset({"bf16_moments"}))
        assert not stack_options(stack, CostOptions(bf16_moments=True)).bf16_moments


def test_the_default_stack_changes_nothing() -> None:
    stack = get_stack(DEFAULT_STACK)
    options = CostOptions(search_features=SEARCHABLE_FEATURES)
    assert stack_options(stack, options) == options
    training = _training()
    assert stack_training(stack, training) == training


@pytest.mark.parametrize(("stack", "change", "needle"), [
    ("megatron-lm-2021", {"moe_a2a_overlap": True}, "moe a2a overlap"),
    ("mcore-0.11", {"moe_dispatcher": "flex"}, "--moe-dispatcher among alltoall, allgather"),
    ("mcore-0.14", {"moe_flex_backend": "hybridep"}, "--moe-flex-backend deepep"),
])
def test_asking_a_stack_for_what_it_lacks_names_the_fix(stack: str, change: dict[str, object],
                                                         needle: str) -> None:
    options = replace(CostOptions(), **change)  # type: ignore[arg-type]
    with pytest.raises(SpecError) as error:
        stack_options(get_stack(stack), options, explicit=frozenset(change))
    assert stack in str(error.value) and needle in str(error.value)


def test_unknown_stack_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match="mcore-current"):
        get_stack("megatron-2019")


def test_cli_stack_bounds_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "64",
            "--global-batch", "64", "--seq-len", "2048", "--format", "csv", "--top", "50"]
    assert main([*args, "--stack", "megatron-lm-2021"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:]]
    assert rows and all(r["cp"] == "1" and r["recompute"] != "selective" for r in rows)
    assert all(r["sp"] in ("no", "false", "False", "0") for r in rows)
    assert main([*args, "--stack", "megatron-lm-2021", "--sequence-parallel", "on"]) == 2
    err = capsys.readouterr().err
    assert "megatron-lm-2021" in err and "--sequence-parallel off" in err


def test_cli_max_cp_caps_context_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
                 "--global-batch", "128", "--seq-len", "16384", "--format", "csv",
                 "--top", "40", "--max-cp", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    cp_at = lines[0].split(",").index("cp")
    assert lines[1:] and all(int(line.split(",")[cp_at]) <= 2 for line in lines[1:])


def test_output_names_a_non_default_stack(capsys: pytest.CaptureFixture[str]) -> None:
    """explain and search say which stack bounded them and what it lacks; the default
    stack adds nothing."""
    explain = ["explain", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
               "--layout", "ep=16,mbs=1", "--global-batch", "256", "--seq-len", "4096"]
    assert main([*explain, "--stack", "mcore-0.11"]) == 0
    out = capsys.readouterr().out
    assert "software stack mcore-0.11" in out and "the flex (DeepEP) dispatcher" in out
    assert main(explain) == 0
    assert "software stack" not in capsys.readouterr().out
    assert main([*explain, "--stack", "mcore-0.11", "--format", "json"]) == 0
    assert "mcore-0.11" in json.loads(capsys.readouterr().out)["software_stack"]
    assert main(["search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "64",
                 "--global-batch", "64", "--seq-len", "2048", "--top", "2",
                 "--stack", "megatron-lm-2022"]) == 0
    out = capsys.readouterr().out
    assert "software stack megatron-lm-2022" in out and "MoE layers" in out
    assert "HybridEP" not in out  # no MoE features listed for a stack without MoE


def test_a_stack_without_moe_refuses_a_moe_model() -> None:
    from parsearch.cost.stacks import require_model_support

    with pytest.raises(SpecError, match="MoE layers"):
        require_model_support(get_stack("megatron-lm-2022"), get_preset("mixtral-8x7b"))
    require_model_support(get_stack("megatron-lm-2022"), get_preset("gpt3-175b"))
    require_model_support(get_stack("mcore-0.11"), get_preset("mixtral-8x7b"))
    assert main(["pareto", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                 "--max-gpus", "64", "--global-batch", "256", "--seq-len", "4096",
                 "--stack", "megatron-lm-2021"]) == 2


def test_the_stack_option_help_names_every_stack(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for stack in STACKS:
        assert stack.name in text, stack.name


def test_megascale_and_bloom_trial_rows_are_searched_on_their_own_stacks() -> None:
    """MegaScale's baseline is Megatron-LM 285068c810 (2023-01): the distributed optimizer
    and FlashAttention, no context parallelism; the BLOOM trial ran Megatron-DeepSpeed with
    ZeRO-1, whose pipeline engine has no interleaved schedule."""
    from parsearch.validation.published.run_conventions import stack_of_source
    mega = get_stack(stack_of_source("MegaScale (arXiv 2402.15627) Table 2"))
    bloom = get_stack(stack_of_source("BigScience BLOOM-176B layout trial"))
    assert mega.name == "megatron-lm-2023" and bloom.name == "megatron-deepspeed-2022"
    assert mega.distributed_optimizer and mega.flash_attention and not mega.context_parallel
    assert bloom.distributed_optimizer and not bloom.interleaved_schedule
    assert not bloom.sequence_parallel and not bloom.selective_recompute


def test_a_stack_without_interleaving_refuses_a_vpp_cap_above_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    common = ["search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "384",
              "--global-batch", "2048", "--seq-len", "2048", "--stack", "megatron-deepspeed-2022"]
    assert main([*common, "--max-vpp", "4"]) == 2
    assert "use --max-vpp 1" in capsys.readouterr().err
    assert main([*common, "--format", "json"]) == 0
    out = capsys.readouterr().out
    # no advice the stack cannot take: neither interleaving nor sequence parallelism
    assert "without interleaving" not in out and "without sequence parallelism" not in out
    assert main(["search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "384",
                 "--global-batch", "2048", "--seq-len", "2048", "--max-vpp", "1",
                 "--sequence-parallel", "off", "--format", "json"]) == 0


def test_interleaved_sends_are_overlapped_only_from_megatron_lm_mid_2023() -> None:
    """--overlap-p2p-comm arrived in Megatron-LM f9283c5a8a (2023-05-31): the 2021-2023
    stacks price every interleaved send as waited on, Megatron-Core releases overlap it."""
    for stack in STACKS:
        options = stack_options(stack, CostOptions())
        early = stack.name in ("megatron-lm-2021", "megatron-lm-2022", "megatron-lm-2023",
                               "megatron-deepspeed-2022")
        assert options.pp_p2p_overlap is not early, stack.name
