"""vLLM's expert parallelism is all or nothing (rule S13): ``--enable-expert-parallel``
spreads the experts over every ``tp * dp`` rank, so an engine ``vllm`` search never ranks a
partial-EP layout that its own launch line would run at full EP."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.serve.explain import explain_serving
from parsearch.serve.launch import launch_settings
from parsearch.serve.space import enumerate_serving_layouts, serving_violations
from parsearch.serve.spec import ServingLayout, ServingWorkload

_MOE = st.sampled_from(["gpt-oss-120b", "qwen3-30b-a3b", "mixtral-8x7b"])
_GPUS = st.sampled_from([4, 8, 16])


@settings(max_examples=30, deadline=None)
@given(name=_MOE, gpus=_GPUS, engine=st.sampled_from(["vllm", "sglang", "trtllm"]))
def test_vllm_layouts_put_experts_on_all_ranks_or_none(name: str, gpus: int,
                                                       engine: str) -> None:
    model = get_preset(name)
    workload = ServingWorkload(isl=1000, osl=1000, engine=engine, max_batch=64)
    layouts = enumerate_serving_layouts(model, workload, gpus, 8, 8)
    assert layouts
    partial = [lay for lay in layouts if 1 < lay.ep < lay.stage_width]
    if engine == "vllm":
        assert not partial
        for lay in layouts:
            line = " ".join(launch_settings(name, lay, workload).vllm)
            assert ("--enable-expert-parallel" in line) == (lay.ep > 1)
    else:  # SGLang --ep-size and TensorRT-LLM's moe_expert_parallel_size take any divisor
        assert partial or all(lay.stage_width <= 2 for lay in layouts)


def test_the_rule_names_the_engine_and_the_way_out() -> None:
    model = get_preset("gpt-oss-120b")
    layout = ServingLayout(tp=8, pp=1, ep=2, attention_dp=1, batch=16)
    vllm = ServingWorkload(isl=1000, osl=1000, engine="vllm", max_batch=16)
    rules = [v.rule for v in serving_violations(model, vllm, layout, 8, 8, 8)]
    assert rules == ["S13"]
    sglang = ServingWorkload(isl=1000, osl=1000, engine="sglang", max_batch=16)
    assert not serving_violations(model, sglang, layout, 8, 8, 8)
    with pytest.raises(SpecError, match=r"S13.*--engine sglang or trtllm"):
        explain_serving(model=model, cluster="dgx-h200", num_gpus=8,
                        workload=ServingWorkload(isl=1000, osl=1000, precision="fp4",
                                                 engine="vllm"),
                        layout="tp=8,ep=2,batch=16")
