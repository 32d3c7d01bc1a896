"""The engine's release as an input (``serve --engine-release``): TensorRT-LLM before 1.0
serves TensorRT engines (no attention DP, no overlap scheduler); engines without
release-specific pricing refuse a release instead of ignoring it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsearch.serve.engines import release_tuple, schedules_ahead, tensorrt_engine_release
from tests.cli_helpers import assert_one_line_error, run_cli

_PARTS = st.lists(st.integers(0, 99), min_size=1, max_size=4)


@given(parts=_PARTS, suffix=st.sampled_from(["", "rc1", "rc12", "post3", "a"]))
def test_a_release_reads_back_as_its_numbers(parts: list[int], suffix: str) -> None:
    text = ".".join(str(p) for p in parts) + suffix
    assert release_tuple(text) == tuple(parts)
    assert release_tuple("v" + text) == tuple(parts)


@pytest.mark.parametrize("bad", ["", "latest", "1.x", "1.2.", "rc1", "1..2"])
def test_a_release_that_is_no_version_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a version"):
        release_tuple(bad)


@pytest.mark.parametrize(("release", "engines"), [("0.13", True), ("0.21.0", True),
                                                  ("1.0", False), ("1.2.0rc2", False)])
def test_tensorrt_llm_before_1_0_serves_tensorrt_engines(release: str, engines: bool) -> None:
    assert tensorrt_engine_release("trtllm", release) is engines
    with pytest.raises(ValueError, match="no release-specific pricing for vllm"):
        tensorrt_engine_release("vllm", release)


def test_the_overlap_scheduler_is_the_pytorch_backends() -> None:
    assert schedules_ahead("trtllm") and not schedules_ahead("trtllm", tensorrt_engine=True)
    assert schedules_ahead("trtllm", True, tensorrt_engine=True)  # a setting given wins
    assert schedules_ahead("vllm", tensorrt_engine=True)  # only TensorRT-LLM has engines


def _layouts(*extra: str) -> list[dict[str, int]]:
    result = run_cli("serve", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus",
                     "8", "--isl", "1000", "--osl", "1000", "--precision", "fp8", "--engine",
                     "trtllm", "--top", "200", "--format", "json", *extra)
    assert result.code == 0, result.err
    return [row["layout"] for row in json.loads(result.out)["results"]]


def test_an_old_tensorrt_llm_release_offers_no_attention_dp() -> None:
    today = _layouts()
    old = _layouts("--engine-release", "0.13.0")
    assert any(lay["attention_dp"] > 1 for lay in today)
    assert old and all(lay["attention_dp"] == 1 for lay in old)


def test_a_release_without_pricing_is_refused_in_one_line() -> None:
    result = run_cli("serve", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus",
                     "8", "--isl", "1000", "--osl", "1000", "--engine", "sglang",
                     "--engine-release", "0.4")
    assert_one_line_error(result, "--engine-release", "no release-specific pricing for sglang")
