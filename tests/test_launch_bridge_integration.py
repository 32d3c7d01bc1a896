"""Optional: apply the emitted overrides to real Megatron-Bridge recipes and read back the layout.

Skipped unless Megatron-Bridge (v0.6.0, the recorded release) and its pinned
Megatron-LM are importable.  Each case starts from a recipe whose own settings
fight the layout (its VPP, its mixed-precision and communication-overlap
objects), applies the overrides with Bridge's own
``process_config_with_overrides`` (what ``run_recipe.py`` does), runs Bridge's
mixed-precision and overlap setup the way ``ConfigContainer.validate`` does,
and checks the resolved config is the priced layout.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests.launch_cases import LAUNCH_CASES, LaunchCase

#: model preset -> (module, recipe function) of a Bridge v0.6.0 performance recipe
RECIPES: dict[str, tuple[str, str]] = {
    "llama3-70b": ("megatron.bridge.perf_recipes.llama.h100.llama3",
                   "llama3_70b_pretrain_64gpu_h100_bf16_config"),
    "llama3-8b": ("megatron.bridge.perf_recipes.llama.h100.llama3",
                  "llama3_8b_pretrain_8gpu_h100_fp8cs_config"),
    "deepseek-v3": ("megatron.bridge.perf_recipes.deepseek.gb200.deepseek_v3",
                    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config"),
    "qwen3-30b-a3b": ("megatron.bridge.perf_recipes.qwen.gb200.qwen3_moe",
                      "qwen3_30b_a3b_pretrain_8gpu_gb200_bf16_config"),
}


def _bridge() -> Any:
    try:
        return importlib.import_module("megatron.bridge.training.utils.omegaconf_utils")
    except Exception as error:  # any import failure means: not available here
        pytest.skip(f"Megatron-Bridge is not importable: {error}")


@pytest.mark.parametrize("case", [c for c in LAUNCH_CASES if c.model_name in RECIPES],
                         ids=lambda c: c.name)
def test_bridge_overrides_yield_the_priced_layout(case: LaunchCase) -> None:
    omegaconf_utils = _bridge()
    module, function = RECIPES[case.model_name]
    cfg = getattr(importlib.import_module(module), function)()
    launch = case.settings()
    cfg = omegaconf_utils.process_config_with_overrides(
        cfg, cli_overrides=list(launch.bridge_overrides))
    if cfg.mixed_precision is not None:  # what ConfigContainer.validate would copy over
        cfg.mixed_precision.setup(cfg.model, cfg.optimizer, cfg.ddp)
    model, lay, plan = cfg.model, case.layout, launch.plan
    assert cfg.mixed_precision is None and cfg.comm_overlap is None
    assert (model.tensor_model_parallel_size, model.pipeline_model_parallel_size,
            model.context_parallel_size) == (lay.tp, lay.pp, lay.cp)
    assert (model.virtual_pipeline_model_parallel_size or 1) == lay.vpp
    assert model.pipeline_model_parallel_layout == plan.pipeline_layout
    assert not model.account_for_embedding_in_pipeline_split
    assert model.sequence_parallel == lay.sp
    assert cfg.train.micro_batch_size == lay.mbs
    assert cfg.train.global_batch_size == case.training.global_batch
    assert cfg.dataset.seq_length == case.training.seq_len
    assert model.recompute_granularity == plan.recompute_granularity
    assert model.tp_comm_overlap == plan.tp_comm_overlap
    assert cfg.ddp.use_megatron_fsdp == plan.fsdp
    assert cfg.ddp.use_distributed_optimizer == plan.distributed_optimizer
    assert cfg.ddp.fp8_param_gather == (plan.fp8_param_gather and plan.precision == "fp8")
    assert model.fp8 == ({"mxfp8": "e4m3"}.get(plan.fp8_recipe or "", "hybrid")
                         if plan.precision == "fp8" else None)
    assert model.fp4 == ("e2m1" if plan.precision == "fp4" else None)
    assert str(model.params_dtype).endswith("bfloat16")
    if case.model.is_moe:
        assert model.expert_model_parallel_size == lay.ep
        assert model.moe_token_dispatcher_type == plan.moe_dispatcher
    for name, value in launch.env:
        assert str(cfg.env_vars[name]) == value
