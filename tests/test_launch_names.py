"""Every emitted Megatron-LM flag and Megatron-Bridge field exists in the recorded parsers.

The record (``src/parsearch/data/launch_names.json``) was read off Megatron-LM's
argparse parser and Megatron-Bridge v0.6.0's ConfigContainer dataclasses at the
commits it names (``benchmarks/record_launch_names.py``).
"""

from __future__ import annotations

import re
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.launch.names import bridge_groups, bridge_top_level, launch_names
from parsearch.launch.names import megatron_lm_options as options_record
from tests.launch_cases import LAUNCH_CASES, LaunchCase

HYDRA_VALUE = re.compile(r'^(null|true|false|-?\d+(\.\d+)?|[A-Za-z0-9_.\-]+|"[^"]*"|\[[^\]]*\])$')


def _check_megatron_lm(args: tuple[str, ...]) -> None:
    record = options_record()
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag in record, f"{flag} is not a Megatron-LM argument at the recorded commit"
        nargs = record[flag]["nargs"]
        values = []
        j = i + 1
        while j < len(args) and not (args[j].startswith("--") and args[j] in record):
            values.append(args[j])
            j += 1
        if nargs == 0:
            assert not values, f"{flag} is a flag but got values {values}"
        elif nargs is None:
            assert len(values) == 1, f"{flag} takes one value, got {values}"
        elif nargs == "+":
            assert values, f"{flag} takes one or more values"
        choices = record[flag].get("choices")
        if choices:
            assert all(v in choices for v in values), f"{flag} {values} not among {choices}"
        i = j


def _check_bridge(overrides: tuple[str, ...]) -> None:
    groups, top = bridge_groups(), bridge_top_level()
    seen = set()
    for item in overrides:
        key, _, value = item.removeprefix("++").partition("=")
        assert key not in seen, f"{key} set twice"
        seen.add(key)
        assert HYDRA_VALUE.match(value), f"{item}: value is not in Hydra override form"
        head, _, field = key.partition(".")
        assert head in top, f"{head} is not a ConfigContainer field"
        if field and head != "env_vars":
            assert field in groups[head], f"{key} is not a field of Bridge's {head} config"


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_emitted_names_exist_in_the_recorded_parsers(case: LaunchCase) -> None:
    launch = case.settings()
    _check_megatron_lm(launch.megatron_lm_args)
    _check_bridge(launch.bridge_overrides)


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_shell_snippet_round_trips_through_the_shell(case: LaunchCase) -> None:
    launch = case.settings()
    assert shlex.split(launch.command_line()) == list(launch.megatron_lm_args)
    assert shlex.split(launch.bridge_command_line()) == list(launch.bridge_overrides)


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_both_spellings_say_the_same_layout(case: LaunchCase) -> None:
    launch = case.settings()
    args = list(launch.megatron_lm_args)
    bridge = dict(o.removeprefix("++").split("=", 1) for o in launch.bridge_overrides)
    lay = case.layout
    for flag, field, value in (
            ("--tensor-model-parallel-size", "model.tensor_model_parallel_size", lay.tp),
            ("--pipeline-model-parallel-size", "model.pipeline_model_parallel_size", lay.pp),
            ("--context-parallel-size", "model.context_parallel_size", lay.cp),
            ("--micro-batch-size", "train.micro_batch_size", lay.mbs),
            ("--global-batch-size", "train.global_batch_size", case.training.global_batch),
            ("--seq-length", "dataset.seq_length", case.training.seq_len)):
        assert args[args.index(flag) + 1] == str(value) == bridge[field]
    layout = launch.plan.pipeline_layout
    if layout is not None:
        assert args[args.index("--pipeline-model-parallel-layout") + 1] == layout
        assert bridge["model.pipeline_model_parallel_layout"] == f'"{layout}"'
    else:
        assert bridge["model.pipeline_model_parallel_layout"] == "null"
    assert bridge["model.virtual_pipeline_model_parallel_size"] == (
        str(lay.vpp) if lay.vpp > 1 else "null")
    assert ("--sequence-parallel" in args) == lay.sp
    assert bridge["model.sequence_parallel"] == ("true" if lay.sp else "false")
    for name, value in launch.env:
        assert bridge[f"env_vars.{name}"] == value


def test_record_names_its_commits() -> None:
    record = launch_names()
    assert re.fullmatch(r"[0-9a-f]{40}", record["megatron_lm"]["commit"])
    assert record["megatron_bridge"]["tag"] == "v0.6.0"
    assert record["megatron_bridge"]["megatron_lm_commit"] == record["megatron_lm"]["commit"]
    nested = record["megatron_bridge"]["nested_model"]
    assert re.fullmatch(r"[0-9a-f]{40}", nested["commit"])
    assert re.fullmatch(r"[0-9a-f]{40}", nested["megatron_lm_commit"])
    assert "transformer" in nested["outer"]
    assert "tensor_model_parallel_size" in nested["transformer"]


def test_name_checker_catches_a_misspelled_field() -> None:
    with pytest.raises(AssertionError, match="dataset"):
        _check_bridge(("dataset.sequence_lengthh=4096",))
    with pytest.raises(AssertionError, match="takes one value"):
        _check_megatron_lm(("--tensor-model-parallel-size",))


@settings(max_examples=40, deadline=None)
@given(text=st.text(alphabet="Et*|()L0123456789m", min_size=1, max_size=30))
def test_layout_strings_survive_hydra_quoting(text: str) -> None:
    from parsearch.launch.bridge import hydra_value

    quoted = hydra_value(text)
    assert HYDRA_VALUE.match(quoted)
    assert shlex.split(shlex.quote(f"model.pipeline_model_parallel_layout={quoted}")) == [
        f"model.pipeline_model_parallel_layout={quoted}"]
